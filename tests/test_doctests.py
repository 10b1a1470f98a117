"""The examples in the docstrings of the pure-Python modules run and print what they claim.

(The Cython modules' docstrings are covered by tests/test_segtree.py.)
"""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = ["cpprb_ray", "cpprb_ray.buffer", "cpprb_ray._orphans"]


@pytest.mark.parametrize("module_name", MODULES)
def test_docstring_examples(module_name):
    module = importlib.import_module(module_name)
    result = doctest.testmod(module, verbose=False, report=True,
                             optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0, f"{module_name} has no docstring examples"
    assert result.failed == 0, f"{result.failed} docstring example(s) of {module_name} failed"
