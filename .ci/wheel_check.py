"""Checks for `make wheel-check`.

    python .ci/wheel_check.py contents DIST   # what the sdist and the wheel in DIST hold
    python .ci/wheel_check.py smoke           # the installed wheel works without Cython

Runs on every Python the project supports (3.7+), with the standard library only (and numpy for
the smoke). Exits non-zero with one line per problem.
"""

import glob
import os
import sys
import tarfile
import zipfile

# Every extension module of the package (setup.py builds these); each ships with its .pyi stub.
EXTENSIONS = ("_segtree", "_sync", "_rules", "_segment", "_core", "_columns", "_lanes", "_outputs",
              "_store", "_lanestore", "_image", "_mapping", "_sequences", "_seqstore", "_digest")


def check_contents(dist):
    problems = []
    sdists = glob.glob(os.path.join(dist, "*.tar.gz"))
    wheels = glob.glob(os.path.join(dist, "*.whl"))
    if len(sdists) != 1 or len(wheels) != 1:
        return [f"expected one sdist and one wheel in {dist}; got {sdists + wheels}"]

    with tarfile.open(sdists[0]) as archive:
        names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    for name in EXTENSIONS:
        if f"cpprb_ray/{name}.pyx" not in names:
            problems.append(f"sdist lacks cpprb_ray/{name}.pyx")
    # Every Cython source of the checkout (run from its root): a missing .pxd or an included .pxi
    # fails the build from the sdist, far from the MANIFEST.in line that left it out.
    for pattern in ("*.pyx", "*.pxd", "*.pxi"):
        for path in sorted(glob.glob(os.path.join("cpprb_ray", pattern))):
            if path.replace(os.sep, "/") not in names:
                problems.append(f"sdist lacks {path} (MANIFEST.in)")
    for name in ("setup.py", "pyproject.toml", "README.md", "cpprb_ray/py.typed"):
        if name not in names:
            problems.append(f"sdist lacks {name}")
    for name in sorted(names):
        if name.endswith((".c", ".so")):
            problems.append(f"sdist holds generated file {name}")

    with zipfile.ZipFile(wheels[0]) as archive:
        names = set(archive.namelist())
    if "cpprb_ray/py.typed" not in names:
        problems.append("wheel lacks cpprb_ray/py.typed")
    for name in EXTENSIONS:
        if f"cpprb_ray/{name}.pyi" not in names:
            problems.append(f"wheel lacks the stub cpprb_ray/{name}.pyi")
        if not any(n.startswith(f"cpprb_ray/{name}.") and n.endswith(".so") for n in names):
            problems.append(f"wheel lacks the extension module cpprb_ray/{name}.*.so")
    for name in sorted(names):
        if name.endswith((".c", ".pyx", ".html")):
            problems.append(f"wheel holds source or build file {name}")

    print(f"sdist: {os.path.basename(sdists[0])}\nwheel: {os.path.basename(wheels[0])}")
    for name in sorted(names):
        print(f"  {name}")
    return problems


def smoke():
    import importlib.util

    problems = []
    if importlib.util.find_spec("Cython") is not None:
        problems.append("Cython is importable: the wheel check must run without it")

    import numpy as np

    import cpprb_ray
    from cpprb_ray import _segment, _segtree, _store, _sync

    here = os.path.realpath(os.getcwd())
    for module in (cpprb_ray, _segtree, _sync, _segment, _store):
        location = os.path.realpath(module.__file__)
        print(f"{module.__name__}: {location}")
        if "site-packages" not in location or location.startswith(here):
            problems.append(f"{module.__name__} was not imported from the installed wheel")

    tree = _segtree.SegmentTree(bytearray(_segtree.SegmentTree.nbytes(10)), 10)
    tree.set([0, 3, 9], [1.0, 2.0, 5.0])
    if tree.total() != 8.0 or tree.min() != 1.0:
        problems.append(f"SegmentTree: total {tree.total()} min {tree.min()}; want 8.0, 1.0")
    if tree.search([0.5, 1.5, 7.9]).tolist() != [0, 3, 9]:
        problems.append(f"SegmentTree.search: {tree.search([0.5, 1.5, 7.9]).tolist()}")
    samples = tree.sample(64, _segtree.Random(0))
    if not set(samples.tolist()) <= {0, 3, 9}:
        problems.append(f"SegmentTree.sample drew unset leaves: {sorted(set(samples.tolist()))}")

    mutex = _sync.SharedMutex(bytearray(_sync.MUTEX_NBYTES), initialize=True)
    if mutex.acquire() is not False:
        problems.append("SharedMutex.acquire() reported a dead owner on a new mutex")
    mutex.release()

    if _segment.tree_nbytes(10) != _segtree.SegmentTree.nbytes(10):
        problems.append("_segment.tree_nbytes disagrees with SegmentTree.nbytes")

    with cpprb_ray.PrioritizedReplayBuffer(16, {"obs": {"shape": 3}, "rew": {}}) as rb:
        rb.add(obs=np.ones((4, 3)), rew=np.arange(4.0))
        batch = rb.sample(8, beta=0.4)
        if batch["obs"].shape != (8, 3) or len(batch["indexes"]) != 8:
            problems.append(f"PrioritizedReplayBuffer.sample: obs shape {batch['obs'].shape}")
        rb.update_priorities(batch["indexes"], np.full(8, 2.0), batch["generations"])
    print(f"smoke: cpprb_ray {getattr(cpprb_ray, '__version__', '?')} on Python "
          f"{sys.version.split()[0]}, numpy {np.__version__}")
    return problems


def main(argv):
    if argv[:1] == ["contents"] and len(argv) == 2:
        problems = check_contents(argv[1])
    elif argv == ["smoke"]:
        problems = smoke()
    else:
        print(__doc__, file=sys.stderr)
        return 2
    for problem in problems:
        print(f"wheel-check: FAIL: {problem}", file=sys.stderr)
    if not problems:
        print(f"wheel-check {argv[0]}: ok")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
