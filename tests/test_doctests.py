"""The examples in the docstrings of every module run and print what they claim.

Pure-Python modules go through doctest.testmod. Extension modules are collected by hand, because
doctest's finder does not see everything in them (Cython's __test__ dict, when present, covers
only some of the methods).
"""

from __future__ import annotations

import doctest
import importlib
import inspect

import pytest

MODULES = ["cpprb_ray", "cpprb_ray.buffer", "cpprb_ray.nstep", "cpprb_ray._orphans",
           "cpprb_ray._compat", "cpprb_ray.multiprocess",
           "cpprb_ray.rate_limiters", "cpprb_ray._memory", "cpprb_ray._layout",
           "cpprb_ray._ownership", "benchmarks._common", "cpprb_ray.checkpoint",
           "cpprb_ray._atomic", "cpprb_ray.remote", "cpprb_ray._client",
           "cpprb_ray._proxy", "benchmarks._two_nodes", "benchmarks._workloads",
           "benchmarks._compare_worker", "benchmarks._compare_report",
           "cpprb_ray.factory", "cpprb_ray.hindsight", "cpprb_ray.laber",
           "cpprb_ray.nstep_buffer", "cpprb_ray.reverse", "cpprb_ray.selective",
           "cpprb_ray.training", "cpprb_ray.util", "cpprb_ray.frames"]
EXTENSION_MODULES = ["cpprb_ray._segtree", "cpprb_ray._sync", "cpprb_ray._rules",
                     "cpprb_ray._columns", "cpprb_ray._store", "cpprb_ray._mapping"]
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
