"""Load RLlib's pure-Python segment tree straight from the installed ray package.

``import ray.rllib`` pulls in RLlib's optional dependencies (gymnasium, ...), which a benchmark
machine need not have. The segment tree is one self-contained file, so it is loaded by path.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import types

RELATIVE_PATH = os.path.join("rllib", "execution", "segment_tree.py")


def rllib_segment_tree_path() -> str:
    """Path of ``ray/rllib/execution/segment_tree.py`` in the installed ray, found without
    importing ray.

    Raises
    ------
    RuntimeError
        If ray is not installed or its RLlib has no segment_tree.py.
    """
    spec = importlib.util.find_spec("ray")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("ray is not installed: pip install 'ray>=2.7' (the bench extra)")
    path = os.path.join(list(spec.submodule_search_locations)[0], RELATIVE_PATH)
    if not os.path.isfile(path):
        raise RuntimeError(f"this ray has no RLlib segment tree at {path}")
    return path


def _ray_imports(tree: ast.Module) -> list:
    """Top-level import statements that import from the ray package."""
    found = []
    for node in tree.body:
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            modules = [node.module or ""] if node.level == 0 else ["ray"]  # relative: inside ray
        else:
            continue
        if any(module == "ray" or module.startswith("ray.") for module in modules):
            found.append(node)
    return found


def _bound_names(node) -> set:
    if isinstance(node, ast.Import):
        return {alias.asname or alias.name.split(".")[0] for alias in node.names}
    return {alias.asname or alias.name for alias in node.names}


def load_rllib_segment_tree() -> types.ModuleType:
    """Return RLlib's segment_tree module (SumSegmentTree, MinSegmentTree) loaded by path.

    The file in ray 2.x imports only the standard library, and is then loaded as it is. Should a
    future version import other RLlib modules, those imports are removed before executing the
    source, but only when nothing in the file uses the names they bind; nothing is stubbed, so a
    file that really needs RLlib raises RuntimeError instead of being measured half-working.
    """
    path = rllib_segment_tree_path()
    with open(path, encoding="utf-8") as handle:
        source = handle.read()
    tree = ast.parse(source, filename=path)
    foreign = _ray_imports(tree)
    if not foreign:
        spec = importlib.util.spec_from_file_location("_rllib_segment_tree", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    foreign_ids = {id(node) for node in foreign}
    used = set()
    for node in ast.walk(tree):
        if id(node) in foreign_ids:
            continue
        if isinstance(node, ast.Name):
            used.add(node.id)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            used.add(node.value)  # string annotations such as "SampleBatch"
    needed = sorted(name for node in foreign for name in _bound_names(node) if name in used)
    if needed:
        raise RuntimeError(
            f"{path} uses names it imports from ray ({', '.join(needed)}); it cannot be loaded "
            "without importing ray.rllib"
        )
    # Unused imports only: drop them and run the rest unchanged.
    tree.body = [node for node in tree.body if id(node) not in foreign_ids]
    module = types.ModuleType("_rllib_segment_tree")
    module.__file__ = path
    exec(compile(tree, path, "exec"), module.__dict__)
    return module
