"""The scripts of examples/, loaded as modules by their tests (examples/ is not a package)."""

from __future__ import annotations

import importlib.util
import os
from types import ModuleType

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")


def load(name: str) -> ModuleType:
    """examples/`name`.py, executed as a module of that name (not put in sys.modules)."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(EXAMPLES, f"{name}.py"))
    assert spec is not None and spec.loader is not None, name
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
