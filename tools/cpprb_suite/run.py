"""Run cpprb's own test files against cpprb and against cpprb_ray, and print the per-file table.

``make cpprb-suite`` (or ``python tools/cpprb_suite/run.py``) runs pytest twice over the same
folder of cpprb's tests, each in its own process: once with the installed cpprb, once with
``import cpprb`` resolving to cpprb_ray (the stand-in package in ``shim/``, put first on the
path of that run only). Then it prints, per file, how many tests there are, how many pass on
each, and every test that passes on cpprb and not on cpprb_ray with the documented reason
(docs/migrating.md); one without a documented reason fails the run.

Where the tests come from: ``--tests PATH`` or the environment variable ``CPPRB_TESTS`` (a
checkout's ``test/`` folder, which also holds the ``v1/`` files that the save/load tests read),
else cpprb's source distribution from PyPI (``pip download --no-binary :all:``): cpprb 11.0.0's
ships ``test/*.py`` without ``test/v1/``, so the save/load tests that read those files fail on
both sides there.

Examples
--------
    CPPRB_TESTS=~/src/cpprb/test make cpprb-suite
    python tools/cpprb_suite/run.py --tests ~/src/cpprb/test -k test_HER.py
"""

from __future__ import annotations

import argparse
import glob
import os
import subprocess
import sys
import tarfile
import tempfile
import xml.etree.ElementTree as ElementTree
from typing import Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
SHIM = os.path.join(HERE, "shim")
CPPRB_VERSION = "11.0.0"
CACHE = os.path.join(os.path.dirname(os.path.dirname(HERE)), "build", "cpprb-suite")

# Tests that pass on cpprb and not on cpprb_ray, each for a documented reason: a difference kept
# on purpose (docs/migrating.md, the section named), or a part of cpprb that is not its API.
# Keys are pytest ids without the folder; a key ending in "::" covers every test under it.
_NSTEP_ENDS = ("N-step at episode ends: a window that reaches a terminal step has done=1 and "
               "the episode's last next_obs (cpprb: done=0, stale next_obs) "
               "[docs/migrating.md, 'Kept on purpose'; docs/nstep.md]")
_PRIORITY = ("priority= (for priorities=) is an unknown column, refused (cpprb ignores it) "
             "[docs/migrating.md, 'Kept on purpose']")
_IGNORED = ("cpprb's create_buffer(obs_shape=, act_dim=, is_discrete_action=) keywords: "
            "cpprb ignores them and makes a buffer without columns; refused here "
            "[docs/migrating.md, 'Kept on purpose']")
_INTERNALS = ("cpprb.multiprocessing's ctypes helpers: cpprb's internals, not its API "
              "[docs/migrating.md, 'Not provided']")
DIFFERENCES: Dict[str, str] = {
    "test_issue.py::TestIssue137::test_Nstep_discounts_with_done": _NSTEP_ENDS,
    "test_issue.py::TestIssue137::test_next_obs": _NSTEP_ENDS,
    "test_save_load.py::TestReplayBuffer::test_load_Nstep": _NSTEP_ENDS,
    "test_issue.py::TestIssue128::": _PRIORITY,
    "test_mp.py::TestPrioritizedReplayBuffer::test_multi_processing": _PRIORITY,
    "test_issue.py::TestIssue45::test_large_size": _IGNORED,
    "test_issue.py::TestIssue46::test_large_size": _IGNORED,
    "test_issue.py::TestIssue43::test_buffer_size": (
        "_encode_sample of rows never written: cpprb returns whatever the arrays hold, "
        "cpprb_ray an IndexError [docs/migrating.md, 'Kept on purpose']"),
    "test_features.py::TestFeatureHighDimensionalObs::test_BatchSampling": (
        "sample() of an empty buffer (its one step is still staged for N-step): cpprb returns "
        "rows that were never added, cpprb_ray a ValueError [docs/migrating.md, 'Kept on "
        "purpose']"),
    "test_features.py::TestMemmap::test_memmap": (
        "mmap_prefix: cpprb writes a file per column ({prefix}_{name}.dat), cpprb_ray one "
        "file for the buffer ({prefix}.cpprb_ray) [docs/migrating.md, 'Constructor "
        "arguments']"),
    "test_shm.py::": _INTERNALS,
}


def _ids_matching(test_id: str) -> Optional[str]:
    for key, reason in DIFFERENCES.items():
        if test_id == key or (key.endswith("::") and test_id.startswith(key)):
            return reason
    return None


def sdist_tests(version: str) -> Optional[str]:
    """The test folder of cpprb's source distribution, downloaded and unpacked under build/
    once; None when the sdist cannot be had or holds no tests."""
    target = os.path.join(CACHE, f"cpprb-{version}")
    found = glob.glob(os.path.join(target, "*", "test"))
    if found:
        return found[0]
    os.makedirs(target, exist_ok=True)
    # --no-build-isolation: pip prepares the sdist's metadata with this environment's
    # setuptools (an isolated build would compile numpy from source for it).
    download = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                "--no-build-isolation", f"cpprb=={version}", "-d", target]
    if subprocess.run(download, stdout=subprocess.DEVNULL, check=False).returncode != 0:
        return None
    for archive in glob.glob(os.path.join(target, "cpprb-*.tar.gz")):
        with tarfile.open(archive) as tar:
            members = [m for m in tar.getmembers()
                       if m.isfile() and "/test/" in m.name and ".." not in m.name
                       and not m.name.startswith("/")]
            tar.extractall(target, members=members)  # noqa: S202 (checked names above)
    found = glob.glob(os.path.join(target, "*", "test"))
    return found[0] if found and glob.glob(os.path.join(found[0], "test_*.py")) else None


def _which_cpprb(env: Dict[str, str]) -> Optional[str]:
    """Where ``import cpprb`` resolves in a process with `env`, or None when it does not."""
    probe = subprocess.run([sys.executable, "-c", "import cpprb; print(cpprb.__file__)"],
                           env=env, capture_output=True, text=True, check=False)
    return probe.stdout.strip() if probe.returncode == 0 else None


def run_side(tests: str, shim: bool, select: List[str], timeout: float,
             workdir: str) -> Tuple[Dict[str, str], str]:
    """Run pytest over `tests` in a child process; ({test id: outcome}, where cpprb came from).

    Outcomes: "passed", "failed" (a failure or an error) or "skipped"."""
    env = dict(os.environ)
    if shim:
        env["PYTHONPATH"] = os.pathsep.join([SHIM] + [p for p in [env.get("PYTHONPATH")] if p])
    origin = _which_cpprb(env)
    if origin is None:
        return {}, "not importable"
    if shim != origin.startswith(SHIM):
        raise SystemExit(f"import cpprb resolved to {origin} in the "
                         f"{'cpprb_ray' if shim else 'cpprb'} run")
    report = os.path.join(workdir, "cpprb_ray.xml" if shim else "cpprb.xml")
    command = [sys.executable, "-m", "pytest", tests, "-q", "-p", "no:cacheprovider",
               "-c", os.devnull, "--rootdir", tests, "--continue-on-collection-errors",
               "--junitxml", report] + select
    # Its own folder: cpprb's tests write files (mmap_prefix) into the current directory.
    cwd = tempfile.mkdtemp(dir=workdir)
    try:
        subprocess.run(command, env=env, cwd=cwd, timeout=timeout, check=False,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        print(f"warning: the {'cpprb_ray' if shim else 'cpprb'} run took over {timeout:g} s; "
              f"its report is what it wrote by then", file=sys.stderr)
    return (parse_report(report) if os.path.exists(report) else {}), origin


def parse_report(path: str) -> Dict[str, str]:
    """{file::Class::test: outcome} from pytest's JUnit XML (collection errors left out: a
    file that does not import has no tests to count)."""
    outcomes: Dict[str, str] = {}
    for case in ElementTree.parse(path).getroot().iter("testcase"):
        classname = case.get("classname", "")
        if not classname:
            continue
        module, _, cls = classname.partition(".")
        test_id = f"{module}.py::{cls + '::' if cls else ''}{case.get('name')}"
        kinds = {child.tag for child in case}
        outcome = ("failed" if kinds & {"failure", "error"} else
                   "skipped" if "skipped" in kinds else "passed")
        # A test whose teardown errors has two entries: the worse outcome counts.
        if outcomes.get(test_id) != "failed":
            outcomes[test_id] = outcome
    return outcomes


def table(theirs: Dict[str, str], ours: Dict[str, str]) -> Tuple[str, List[str], List[str]]:
    """The per-file table; the tests that pass on cpprb only, with reasons; those without."""
    files = sorted({t.split("::")[0] for t in list(theirs) + list(ours)})
    rows = [("file", "tests", "pass on cpprb", "pass on cpprb_ray", "pass on both")]
    totals = [0, 0, 0, 0]
    for name in files:
        ids = {t for t in list(theirs) + list(ours) if t.split("::")[0] == name}
        counts = [len(ids), sum(theirs.get(t) == "passed" for t in ids),
                  sum(ours.get(t) == "passed" for t in ids),
                  sum(theirs.get(t) == ours.get(t) == "passed" for t in ids)]
        totals = [a + b for a, b in zip(totals, counts)]
        rows.append((name, *map(str, counts)))
    rows.append(("total", *map(str, totals)))
    widths = [max(len(row[k]) for row in rows) for k in range(5)]
    lines = []
    for index, row in enumerate(rows):
        lines.append("| " + " | ".join(cell.ljust(widths[k]) if k == 0 else cell.rjust(widths[k])
                                       for k, cell in enumerate(row)) + " |")
        if index == 0:
            lines.append("| " + " | ".join("-" * w for w in widths) + " |")
    documented, unexpected = [], []
    for test_id in sorted(theirs):
        if theirs[test_id] == "passed" and ours.get(test_id) != "passed":
            reason = _ids_matching(test_id)
            if reason is None:
                unexpected.append(f"{test_id} ({ours.get(test_id, 'not run')})")
            else:
                documented.append(f"{test_id}: {reason}")
    return "\n".join(lines), documented, unexpected


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tests", default=os.environ.get("CPPRB_TESTS"),
                        help="cpprb's test folder (default: $CPPRB_TESTS, else cpprb's sdist)")
    parser.add_argument("--timeout", type=float, default=1800.0,
                        help="seconds for each side's run (default 1800)")
    parser.add_argument("select", nargs="*",
                        help="extra pytest arguments for both runs (e.g. -k test_HER.py)")
    args = parser.parse_args(argv)
    tests = args.tests
    if tests is None:
        tests = sdist_tests(CPPRB_VERSION)
        if tests is None:
            print(f"cpprb {CPPRB_VERSION}'s source distribution ships no tests (or could not be "
                  f"downloaded): give a checkout's test folder, CPPRB_TESTS=path/to/cpprb/test",
                  file=sys.stderr)
            return 2
    tests = os.path.abspath(os.path.expanduser(tests))
    if not glob.glob(os.path.join(tests, "test_*.py")):
        print(f"{tests} holds no test_*.py files", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="cpprb-suite-") as workdir:
        theirs, origin = run_side(tests, False, args.select, args.timeout, workdir)
        ours, _ = run_side(tests, True, args.select, args.timeout, workdir)
    print(f"cpprb's tests: {tests}")
    print(f"cpprb: {origin}")
    text, documented, unexpected = table(theirs, ours)
    print(text)
    if documented:
        print(f"\nPass on cpprb, not on cpprb_ray, by a documented difference ({len(documented)}):")
        print("\n".join("  " + line for line in documented))
    if unexpected:
        print(f"\nPass on cpprb, not on cpprb_ray, with no documented reason "
              f"({len(unexpected)}):")
        print("\n".join("  " + line for line in unexpected))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
