"""The examples in the docstrings of every module run and print what they claim.

Pure-Python modules go through doctest.testmod. Extension modules are collected by hand, because
doctest's finder does not see everything in them (Cython's __test__ dict, when present, covers
only some of the methods).
"""

from __future__ import annotations

import doctest
import importlib
import importlib.util
import inspect
import pkgutil
from importlib.machinery import EXTENSION_SUFFIXES

import pytest

import cpprb_ray

# Every module of the package, found rather than listed, so that a new one cannot be left out:
# the Python ones go through doctest.testmod, the extension modules are collected by hand.
# Left out: the command line (its examples are the CLI tests') and the kernel-only extensions,
# which have no Python-level API.
_KERNEL_ONLY = {"cpprb_ray._core", "cpprb_ray._lanes"}
_PACKAGE = sorted(info.name for info in pkgutil.walk_packages(cpprb_ray.__path__, "cpprb_ray.")
                  if info.name not in _KERNEL_ONLY and info.name != "cpprb_ray.__main__")


def _is_extension(name: str) -> bool:
    origin = importlib.util.find_spec(name).origin or ""
    return origin.endswith(tuple(EXTENSION_SUFFIXES))


MODULES = ["cpprb_ray"] + [name for name in _PACKAGE if not _is_extension(name)] + [
    "benchmarks._common", "benchmarks._two_nodes", "benchmarks._workloads",
    "benchmarks._compare_worker", "benchmarks._compare_report"]
EXTENSION_MODULES = [name for name in _PACKAGE if _is_extension(name)]
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


@pytest.mark.parametrize("module_name", MODULES)
def test_docstring_examples(module_name):
    module = importlib.import_module(module_name)
    result = doctest.testmod(module, verbose=False, report=True, optionflags=FLAGS)
    assert result.attempted > 0, f"{module_name} has no docstring examples"
    assert result.failed == 0, f"{result.failed} docstring example(s) of {module_name} failed"


def docstrings_with_examples(module) -> dict:
    """{qualified name: docstring} for the module, its classes and their members with examples."""
    found = {}

    def add(name, obj):
        doc = getattr(obj, "__doc__", None)
        if isinstance(doc, str) and ">>>" in doc and doc not in found.values():
            found[name] = doc

    add(module.__name__, module)
    for name, obj in sorted(vars(module).items()):
        if getattr(obj, "__module__", None) != module.__name__:
            continue
        add(f"{module.__name__}.{name}", obj)
        if inspect.isclass(obj):
            for member in sorted(vars(obj)):
                if not member.startswith("__"):
                    add(f"{module.__name__}.{name}.{member}", getattr(obj, member))
    return found


EXTENSION_DOCSTRINGS = {
    name: (module_name, doc)
    for module_name in EXTENSION_MODULES
    for name, doc in docstrings_with_examples(importlib.import_module(module_name)).items()
}


def test_extension_docstrings_are_found():
    # Random, SegmentTree, SegmentTree.nbytes and SegmentTree.sample carry examples, and so does
    # SharedMutex: if none were found here, the collection above would be what broke.
    names = sorted(EXTENSION_DOCSTRINGS)
    assert sum(name.startswith("cpprb_ray._segtree.") for name in names) >= 4, names
    assert "cpprb_ray._segtree.SegmentTree.nbytes" in names, names
    assert any(name.startswith("cpprb_ray._sync.SharedMutex") for name in names), names


@pytest.mark.parametrize("name", sorted(EXTENSION_DOCSTRINGS))
def test_extension_docstring_examples(name):
    module_name, doc = EXTENSION_DOCSTRINGS[name]
    module = importlib.import_module(module_name)
    test = doctest.DocTestParser().get_doctest(doc, {}, name, module.__file__, 0)
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    report: list = []
    results = runner.run(test, out=report.append, clear_globs=True)
    assert results.failed == 0, "".join(report)
    assert results.attempted > 0
