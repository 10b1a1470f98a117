"""The package's import rules (docs/design.md, "The parts and what each may import"), read from
the sources: every import, at the top of a module or inside a function, ``cimport`` included.

- Every module belongs to one layer, and imports only from its own layer or the ones below:
  nothing below the public layer imports ``cpprb_ray.buffer``; the kernels import no boundary
  module; the segment format imports no store.
- No import circle anywhere in the package, lazy imports included.

A new module must be given its layer here (the test fails until it is), which is the point: its
place in the architecture is decided, not drifted into.
"""

from __future__ import annotations

import ast
import pathlib
import re
from typing import Dict, List, Set

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "cpprb_ray"

# Bottom up. A module may import from its own layer and the layers below it.
LAYERS: List[Set[str]] = [
    # 0. what the operating system says of processes and memory (/proc, cgroups, rlimits)
    {"_proc"},
    # 1. kernels: nogil C over raw memory, and the one place for rules and the format
    {"_segtree", "_sync", "_prefetch", "_limiter", "_convert", "_rules", "_segment", "_core",
     "_lanes", "_columns", "_outputs", "_mapping", "_sequences", "_digest"},
    # 2. the store: lifetime, the one driver, the ring's operations; the parts that drive it
    {"_store", "_lanestore", "_image", "_seqstore"},
    # 3. what a segment is on the host: files, layouts, ownership
    {"_memory", "_atomic", "_layout", "_ownership", "_orphans", "_open", "rate_limiters",
     "_compat"},
    # 4. the parts a handle is made of, and the features over them
    {"frames", "nstep", "sequences", "_parts", "checkpoint"},
    # 5. remote handles: client, proxy actor, pickling glue (never the public classes)
    {"remote", "remote._client", "remote._proxy", "remote._pickling"},
    # 6. the public classes and what is built on them
    {"_handle", "buffer", "multiprocess", "factory", "hindsight", "laber", "nstep_buffer",
     "reverse", "selective", "training", "util", "__init__", "__main__", "prefetch",
     "_top", "metrics"},
]
KERNELS = LAYERS[1]
STORE = LAYERS[2]


def module_name(path: pathlib.Path) -> str:
    relative = path.relative_to(PACKAGE).with_suffix("")
    parts = list(relative.parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts = parts[:-1]
    return ".".join(parts)


def is_module(name: str) -> bool:
    path = PACKAGE.joinpath(*name.split("."))
    return path.is_dir() or any(path.with_suffix(suffix).exists()
                                for suffix in (".py", ".pyx", ".pxd"))


def python_imports(path: pathlib.Path) -> Set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and (
                node.module == "cpprb_ray" or node.module.startswith("cpprb_ray.")):
            base = node.module[len("cpprb_ray"):].lstrip(".")
            for alias in node.names:
                # from cpprb_ray[.package] import x: the module x where x is one, else the
                # module (or package) it comes from
                name = f"{base}.{alias.name}" if base else alias.name
                found.add(name if is_module(name) else base)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("cpprb_ray."):
                    found.add(alias.name[len("cpprb_ray."):])
    return found


CYTHON_IMPORT = re.compile(r"^\s*from\s+cpprb_ray\.([\w.]+)\s+c?import\b|"
                           r"^\s*from\s+cpprb_ray\s+c?import\s+([\w, ]+)|"
                           r"^\s*c?import\s+cpprb_ray\.([\w.]+)", re.MULTILINE)


def cython_imports(path: pathlib.Path) -> Set[str]:
    found = set()
    for match in CYTHON_IMPORT.finditer(path.read_text()):
        if match.group(1):
            found.add(match.group(1))
        elif match.group(2):
            found.update(name.strip() for name in match.group(2).split(",") if name.strip())
        else:
            found.add(match.group(3))
    return found


def import_graph() -> Dict[str, Set[str]]:
    """{module: modules of the package it imports}; a .pyx, .pxd and .pxi of one name are one
    module (an include is part of the module that includes it)."""
    graph: Dict[str, Set[str]] = {}
    for path in sorted(PACKAGE.rglob("*")):
        if path.suffix == ".py":
            graph.setdefault(module_name(path), set()).update(python_imports(path))
        elif path.suffix in (".pyx", ".pxd"):
            graph.setdefault(module_name(path), set()).update(cython_imports(path))
    graph.setdefault("_store", set()).update(cython_imports(PACKAGE / "_admission.pxi"))
    for module, imported in graph.items():
        # "remote" is the package: `from cpprb_ray.remote import _client` names remote._client.
        imported.discard(module)
    return graph


def layer_of(module: str) -> int:
    for index, layer in enumerate(LAYERS):
        if module in layer:
            return index
    raise AssertionError(f"cpprb_ray.{module} has no layer in tests/test_architecture.py: "
                         f"decide where it belongs")


def upward_imports(graph: Dict[str, Set[str]]) -> List[str]:
    return [f"{module} (layer {layer_of(module)}) imports {target} (layer {layer_of(target)})"
            for module, imported in sorted(graph.items()) for target in sorted(imported)
            if target in graph and layer_of(target) > layer_of(module)]


def import_circles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    state: Dict[str, int] = {}
    stack: List[str] = []
    circles: List[List[str]] = []

    def visit(module: str) -> None:
        state[module] = 1
        stack.append(module)
        for target in sorted(graph.get(module, ())):
            if target not in graph:
                continue
            if state.get(target) == 1:
                circles.append(stack[stack.index(target):] + [target])
            elif target not in state:
                visit(target)
        stack.pop()
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)
    return circles


def test_every_module_has_a_layer_and_imports_only_downwards():
    graph = import_graph()
    assert {"_store", "_segment", "_core", "buffer", "_parts", "remote._proxy"} <= set(graph)
    upward = upward_imports(graph)
    assert not upward, "imports pointing up:\n" + "\n".join(upward)


def test_nothing_below_the_public_layer_imports_buffer():
    graph = import_graph()
    public = LAYERS[-1]
    offenders = sorted(module for module, imported in graph.items()
                       if "buffer" in imported and module not in public)
    assert not offenders, offenders


def test_kernels_import_no_boundary_module_and_the_format_no_store():
    graph = import_graph()
    for module in KERNELS:
        beyond = graph.get(module, set()) - KERNELS - LAYERS[0]
        assert not beyond, (module, beyond)
    assert not graph["_segment"] & (STORE | {"_core", "_lanes", "_columns", "_outputs"})


def test_no_import_circle_anywhere_in_the_package():
    circles = import_circles(import_graph())
    assert not circles, "import circles: " + "; ".join(" -> ".join(c) for c in circles)


def test_the_checks_catch_what_they_look_for():
    # The graph is read from the real sources; an import that broke a rule would show. Here
    # two such imports are added to it (as a regression would add them): both are caught.
    graph = import_graph()
    graph["_segment"].add("_store")        # the format importing a store: upwards
    graph["_parts"].add("remote._proxy")   # a part importing the proxy, which imports _parts
    assert any(line.startswith("_segment (layer 1) imports _store") for line in
               upward_imports(graph))
    assert ["_parts", "remote._proxy", "_parts"] in import_circles(graph)
