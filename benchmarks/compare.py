"""Every microbenchmark, side by side against every peer installed: one command, one report.

Run from the repository root (cpprb_ray built in place, e.g. by ``make venv``)::

    make bench-peers                                   # once: the peers' venvs (see below)
    python benchmarks/compare.py --quick               # under 7 minutes, every section
    python benchmarks/compare.py --out DIR             # the full grid (about 45 minutes)
    make compare COMPARE_FLAGS=--quick                 # the same, with make bench-peers' venvs

Libraries: cpprb_ray; cpprb 11's PrioritizedReplayBuffer and MPPrioritizedReplayBuffer;
tianshou's PrioritizedReplayBuffer; TorchRL's PrioritizedReplayBuffer (LazyTensorStorage);
DeepMind Reverb's prioritized table, its server in the benchmark's process and in a process
of its own (benchmarks/_reverb.py); and the segment trees: cpprb_ray's, RLlib's
(ray/rllib/execution/segment_tree.py) and TorchRL's C++ one (torchrl._torchrl).
benchmarks/_workloads.py defines the cases (sample, update, adds with and without priorities,
the learner step; capacities 2^10 to 2^22; batches 32, 256, 4096; warm, and cold after a
64 MiB cache sweep) and the process groups; the asv suite (benchmarks/asv_bench) uses the same
definitions.

Each group runs in a process of its own (benchmarks/_compare_worker.py), in its own venv where
``--peer-python GROUP=PATH`` gives one (groups: cpprb, rllib, tianshou, torchrl, reverb).
Without it, tianshou, torchrl and reverb use ``.venv-tianshou``, ``.venv-torchrl`` and
``.venv-reverb`` of this checkout or of the main worktree of its git repository when one
exists (``make bench-peers`` makes them), else this interpreter. A group that cannot run, or a
library that cannot be imported in its interpreter, is skipped with the reason and how to get
it. Every group measures cpprb_ray (its buffer, or its tree for the trees) interleaved with its
peers, call by call; each table line shows that in-process cpprb_ray figure and every peer's
ratio to it.

Then the workloads of the other benchmarks, through their own commands (short runs with
--quick), each skipped with the reason when it cannot run:

- Ape-X ingest: ``bench_apex.py --json FILE`` (rows added and learner steps per second);
- multi-node: ``bench_apex.py --remote --json FILE`` (writers on a second Ray node: needs
  root for its mount namespace);
- frames: ``bench_frames.py [--quick] --json FILE`` when benchmarks/bench_frames.py exists.
  The contract with it: FILE gets ``{"rows": [{"library": str, "operation": str,
  "median_us": float, "min_us": float, "max_us": float}, ...]}`` (other keys are kept in
  results.json as they are);
- the learner under many writers: ``bench_writers.py [--quick] --json FILE``, under
  .venv-reverb's interpreter when there is one (Reverb included), else this one;
- sequences: ``bench_sequences.py [--quick] --peers torchrl --json FILE``, under
  .venv-torchrl's interpreter when there is one (TorchRL's PrioritizedSliceSampler beside
  ours), else this one; and sequences_reverb: ``bench_sequences.py [--quick] --peers reverb
  reverb_grpc --json FILE`` under .venv-reverb's (Reverb's sequence items beside ours, its
  server in process and in a process of its own), skipped without it.

With --quick, each section starts only if what it takes (its estimate) fits in what is left of
the promised time, and is stopped at the promised end; a section not run says why.

Output: Markdown tables on stdout and in DIR/results.md (default DIR: ./compare-results),
DIR/results.json (machine, versions, every figure: median, min, max, rounds, ratios), and one
PNG per operation in DIR (cost against capacity, one line per library, log scales). A progress
bar (tqdm) runs on stderr when it is a terminal.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

if __package__:
    from . import _common as common
    from . import _compare_report as report
    from . import _workloads as workloads
else:  # run as a script: this file's folder is sys.path[0]
    import _common as common
    import _compare_report as report
    import _workloads as workloads

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "_compare_worker.py")

#: Time budgets per case (benchmarks/_headline.plan_rounds reads them); "kind" picks the
#: fill limits of benchmarks/_workloads.FILL_LIMITS.
FULL = {"kind": "full", "budget_s": 1.0, "min_rounds": 20, "max_rounds": 2000,
        "cold_budget_s": 2.0, "cold_min_rounds": 10, "cold_max_rounds": 300, "warmup": 10}
QUICK = {"kind": "quick", "budget_s": 0.15, "min_rounds": 15, "max_rounds": 300,
         "cold_budget_s": 0.4, "cold_min_rounds": 8, "cold_max_rounds": 60, "warmup": 5}
SMOKE = {"kind": "quick", "budget_s": 0.01, "min_rounds": 3, "max_rounds": 20,
         "cold_budget_s": 0.02, "cold_min_rounds": 2, "cold_max_rounds": 5, "warmup": 1}

#: Timeouts (seconds) of a group's process and of the other benchmarks' runs: quick, full.
GROUP_TIMEOUT_S = {True: 600, False: 4 * 3600}
EXTRA_TIMEOUT_S = {True: 240, False: 3600}

#: What --quick promises: every section within this many seconds on a quiet 2-core machine,
#: the report (tables and plots) included: the sections get all but REPORT_RESERVE_S of it.
QUICK_PROMISE_S = 420
REPORT_RESERVE_S = 30
#: How long a benchmark stopped at its timeout gets to clean up (SIGINT) before SIGKILL.
STOP_GRACE_S = 20
#: Each --quick section's duration on a quiet 2-core machine, seconds (a section starts only if
#: this fits in what is left): from runs at load average 6 to 7 (cpprb 9, rllib 13, tianshou
#: 64, torchrl 33, reverb 139, apex 55 s), scaled down, with a margin.
QUICK_ESTIMATE_S = {"cpprb": 10, "rllib": 12, "tianshou": 45, "torchrl": 28, "reverb": 85,
                    "apex": 40, "multi_node": 45, "frames": 20, "writers": 75,
                    "sequences": 30, "sequences_reverb": 60}

#: What --sections can name: the groups, then the other benchmarks.
SECTIONS = tuple(workloads.GROUPS) + ("apex", "multi_node", "frames", "writers", "sequences",
                                       "sequences_reverb")

#: The peer groups' venvs (``make bench-peers``), found by discover_pythons().
PEER_VENVS = ("tianshou", "torchrl", "reverb")


# ---------------------------------------------------------------------------------------------
# Interpreters


def main_worktree() -> Optional[str]:
    """The main worktree of this checkout's git repository (None: not a git checkout)."""
    try:
        common_dir = subprocess.run(
            ["git", "rev-parse", "--git-common-dir"],
            cwd=common.REPO_ROOT, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    common_dir = os.path.join(common.REPO_ROOT, common_dir)  # relative: to the repo root
    return os.path.dirname(common_dir) if common_dir.endswith(".git") else None


def discover_pythons() -> Dict[str, str]:
    """{group: python} of the peer venvs ``make bench-peers`` makes, where they exist."""
    roots = [common.REPO_ROOT]
    main_root = main_worktree()
    if main_root and os.path.realpath(main_root) != os.path.realpath(common.REPO_ROOT):
        roots.append(main_root)
    found = {}
    for group in PEER_VENVS:
        for root in roots:
            candidate = os.path.join(root, f".venv-{group}", "bin", "python")
            if os.access(candidate, os.X_OK):
                found[group] = candidate
                break
    return found


def parse_peer_pythons(values: List[str], parser: argparse.ArgumentParser) -> Dict[str, str]:
    """``NAME=PATH`` items as {group: path}; a bad item is a usage error naming it."""
    out = {}
    for value in values:
        name, sep, path = value.partition("=")
        if not sep or not path or name not in workloads.GROUPS:
            parser.error(f"--peer-python expects NAME=PATH with NAME one of "
                         f"{', '.join(workloads.GROUPS)}; got {value!r}")
        out[name] = path
    return out


# ---------------------------------------------------------------------------------------------
# Running the groups


def run_group(group: str, python: str, cases: List[workloads.Case], plan: Dict[str, Any],
              seed: int, work_dir: str, advance, timeout_s: float
              ) -> Tuple[Optional[Dict[str, Any]], str]:
    """Run one group's worker under `python`: (its result, "") or (None, why it did not run).

    `advance(label)` is called after every case the worker reports; a worker still running
    after `timeout_s` is killed (the group is then skipped with that reason).
    """
    if not (os.path.isfile(python) and os.access(python, os.X_OK)):
        how = workloads.GET_GROUP.get(group)
        return None, (f"interpreter {python} not found or not executable"
                      + (f"; to get it: {how}" if how else ""))
    spec_path = os.path.join(work_dir, f"{group}.spec.json")
    out_path = os.path.join(work_dir, f"{group}.out.json")
    common.write_json(spec_path, {"group": group, "libraries": list(workloads.GROUPS[group]),
                                  "cases": [list(case) for case in cases], "plan": plan,
                                  "seed": seed})
    env = dict(os.environ)
    # The worker measures this checkout's cpprb_ray (common.import_cpprb_ray prefers a build in
    # place here) even under a peer venv with another copy installed.
    env["PYTHONPATH"] = os.pathsep.join(
        [common.REPO_ROOT] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    started = time.perf_counter()
    process = subprocess.Popen([python, WORKER, spec_path, out_path], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, env=env)
    other: List[str] = []
    watchdog = threading.Timer(timeout_s, process.kill)
    watchdog.start()
    try:
        assert process.stdout is not None
        for line in process.stdout:
            if line.startswith("@progress "):
                advance(line[len("@progress "):].strip())
            else:
                other.append(line.rstrip("\n"))
        status = process.wait()
    finally:
        watchdog.cancel()
    if time.perf_counter() - started >= timeout_s:
        return None, f"its worker under {python} was killed after {timeout_s:g} s"
    if status != 0 or not os.path.isfile(out_path):
        tail = " | ".join(line for line in other[-6:] if line.strip())
        return None, f"its worker under {python} exited with status {status}: {tail}"
    with open(out_path, encoding="utf-8") as handle:
        result = json.load(handle)
    result["interpreter"] = python
    result["wall_s"] = time.perf_counter() - started
    result["output"] = other[-20:]
    return result, ""


def run_extra(name: str, command: List[str], json_path: str, timeout_s: float
              ) -> Dict[str, Any]:
    """Run another benchmark's command; {"command", "result"} or {"command", "skipped"}."""
    env = dict(os.environ)
    env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    record: Dict[str, Any] = {"command": " ".join(command)}
    started = time.perf_counter()
    # Its own session, so that a timeout ends the benchmark's children too (bench_writers.py's
    # writers, bench_apex.py's Ray processes), not only the process started here.
    process = subprocess.Popen(command, cwd=common.REPO_ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=env,
                               start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        # SIGINT first: the benchmark's own cleanup runs (bench_apex.py --remote ends the Ray
        # nodes it started, which live in sessions of their own); SIGKILL what is left.
        os.killpg(process.pid, signal.SIGINT)
        try:
            process.communicate(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
        record["skipped"] = f"did not finish within {timeout_s:.0f} s (stopped)"
        return record
    record["wall_s"] = time.perf_counter() - started
    if process.returncode != 0 or not os.path.isfile(json_path):
        lines = [line for line in (stderr + stdout).splitlines() if line.strip()]
        record["skipped"] = (f"{name} exited with status {process.returncode}: "
                             f"{' | '.join(lines[-4:])}")
        return record
    with open(json_path, encoding="utf-8") as handle:
        record["result"] = json.load(handle)
    record["report"] = stdout
    return record


def extra_commands(quick: bool, work_dir: str, pythons: Dict[str, str]
                   ) -> List[Tuple[str, Optional[List[str]], str, str]]:
    """(name, command or None, its JSON path, why not when None) of every other benchmark.

    `pythons`: the groups' interpreters; bench_writers.py runs under the reverb group's, so
    that Reverb is among its libraries where .venv-reverb exists, and bench_sequences.py
    under the torchrl group's (TorchRL's slice sampler beside ours) and, where it is not this
    interpreter, the reverb group's (Reverb's sequence items beside ours)."""
    python = sys.executable
    out = []
    apex = os.path.join(HERE, "bench_apex.py")
    short = ["--quick", "--seconds", "2", "--exponent", "16"] if quick else []
    for name, extra in (("apex", []), ("multi_node", ["--remote"])):
        path = os.path.join(work_dir, f"{name}.json")
        out.append((name, [python, apex] + extra + short + ["--json", path], path, ""))
    frames = os.path.join(HERE, "bench_frames.py")
    path = os.path.join(work_dir, "frames.json")
    if os.path.isfile(frames):
        out.append(("frames", [python, frames] + (["--quick"] if quick else []) +
                    ["--json", path], path, ""))
    else:
        out.append(("frames", None, path,
                    "benchmarks/bench_frames.py is not in this checkout (issue 11)"))
    path = os.path.join(work_dir, "writers.json")
    writers_python = pythons.get("reverb", python)
    if not os.access(writers_python, os.X_OK):
        writers_python = python
    out.append(("writers", [writers_python, os.path.join(HERE, "bench_writers.py")] +
                (["--quick"] if quick else []) + ["--json", path], path, ""))
    sequences = os.path.join(HERE, "bench_sequences.py")
    for name, peer, measured in (("sequences", "torchrl", ["torchrl"]),
                                 ("sequences_reverb", "reverb", ["reverb", "reverb_grpc"])):
        path = os.path.join(work_dir, f"{name}.json")
        peer_python = pythons.get(peer, python)
        if not os.access(peer_python, os.X_OK):
            peer_python = python
        command = ([peer_python, sequences] + (["--quick"] if quick else []) +
                   ["--peers"] + measured + ["--json", path])
        if peer == "reverb" and peer_python == python:
            out.append((name, None, path, f"no Reverb interpreter found (--peer-python "
                                          f"reverb=PATH); {workloads.GET_GROUP[peer]}"))
        else:
            out.append((name, command, path, ""))
    return out


# ---------------------------------------------------------------------------------------------


EPILOG = """\
peers: `make bench-peers` makes one venv per peer, each with cpprb and this package built in
place, downloading from PyPI (sizes: installed, as measured here):
  .venv-tianshou  tianshou 2.0.1 on torch 2.13.0: 1.5 GB with the CPU-only torch wheel from
                  the Makefile's TORCH_WHEELS folder; without it PyPI's torch and its CUDA
                  packages, about 5 GB more (it runs on the CPU all the same)
  .venv-torchrl   TorchRL 0.14.1, tensordict 0.14.3 on torch 2.14.1: 5.5 GB, most of it CUDA
                  packages (PyPI has no CPU-only 2.14.1; TorchRL's C++ tree does not load on
                  2.13); TORCH_INDEX=<PyTorch's CPU wheel index> make bench-peers takes the
                  CPU-only wheel from there instead, where that index can be reached
  .venv-reverb    dm-reverb 0.14.0, tensorflow-cpu 2.15.0, numpy < 2: 1.3 GB
cpprb and Ray (RLlib's tree) come with `make venv`. A peer that is missing is skipped and
the report says how to get it. Durations on a quiet 2-core machine: --quick under 7 minutes,
the full run about 45 minutes.
"""


def parse_args(argv=None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help=f"2^10, 2^16, 2^20, batch 256, short runs: every section within "
                             f"{QUICK_PROMISE_S // 60} minutes on a quiet 2-core machine, or "
                             f"the report says which it skipped and why")
    parser.add_argument("--out", metavar="DIR", default="compare-results",
                        help="where results.md, results.json and the plots go "
                             "(default: ./compare-results)")
    parser.add_argument("--peer-python", action="append", default=[], metavar="NAME=PATH",
                        help="run group NAME (cpprb, rllib, tianshou, torchrl, reverb) under "
                             "this interpreter; repeatable")
    parser.add_argument("--sections", nargs="+", metavar="NAME", choices=SECTIONS,
                        help=f"run only these (default: all): {', '.join(SECTIONS)}")
    parser.add_argument("--exponents", type=int, nargs="+", metavar="E",
                        help="capacities 2^E to measure instead of the plan's (every library "
                             "is then filled to them, Reverb included)")
    parser.add_argument("--seed", type=int, default=0, help="seed of all random inputs")
    # For the tests: 2^10 only, tiny budgets, no other benchmarks, no venv discovery.
    parser.add_argument("--smoke", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.pythons = parse_peer_pythons(args.peer_python, parser)
    return args


def plan_of(args: argparse.Namespace) -> Tuple[Dict[str, Any], List[workloads.Case]]:
    """The time budgets and the cases of this run."""
    if args.smoke:
        plan, cases = SMOKE, workloads.grid((10,), (256,), workloads.WARMTHS,
                                            workloads.OPERATIONS, ("learner step",))
    elif args.quick:
        plan, cases = QUICK, workloads.quick_grid()
    else:
        plan, cases = FULL, workloads.full_grid()
    if args.exponents:
        plan = dict(plan, kind="chosen")  # no fill limit: the capacities were asked for
        cases = [case._replace(exponent=exponent) for exponent in args.exponents
                 for case in cases if case.exponent == cases[0].exponent]
    return plan, cases


def progress_bar(total: int):
    """tqdm on stderr (silent when stderr is not a terminal), or None without tqdm."""
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, file=sys.stderr, disable=None, unit="case", dynamic_ncols=True)


class Budget:
    """What --quick promises: a section starts only if its estimate fits in what is left, and
    is given no more than what is left; without --quick, every section runs to its timeout."""

    def __init__(self, quick: bool, started: float, sections: Optional[List[str]] = None):
        self.quick, self.started, self.sections = quick, started, sections

    def left(self) -> float:
        """Seconds the sections may still take."""
        return QUICK_PROMISE_S - REPORT_RESERVE_S - (time.perf_counter() - self.started)

    def why_not(self, section: str) -> str:
        """"" when `section` may start, else why it is skipped."""
        if self.sections and section not in self.sections:
            return "not asked for (--sections)"
        if not self.quick:
            return ""
        estimate, left = QUICK_ESTIMATE_S.get(section, 30), self.left()
        if estimate <= left:
            return ""
        return (f"not started: --quick promises {QUICK_PROMISE_S} s in all and "
                f"{max(0.0, left):.0f} s were left for it, it takes about {estimate} s (the "
                f"machine is slower than a quiet 2-core one, or the sections before took "
                f"longer; run it alone: --quick --sections {section})")

    def timeout(self, default: float) -> float:
        """A section's timeout: `default`, or with --quick what is left (less the grace a
        stopped benchmark gets to clean up)."""
        return default if not self.quick else max(1.0, min(default,
                                                           self.left() - STOP_GRACE_S))


def main(argv=None) -> int:
    """Run every group and every other benchmark, write the report; returns the exit status."""
    args = parse_args(argv)
    started = time.perf_counter()
    budget = Budget(args.quick, started, args.sections)
    plan, cases = plan_of(args)
    pythons = {group: sys.executable for group in workloads.GROUPS}
    if not args.smoke:
        pythons.update(discover_pythons())
    pythons.update(args.pythons)
    os.makedirs(args.out, exist_ok=True)
    info: Dict[str, Any] = {"machine": common.machine(), "cpus": os.cpu_count(),
                            "command": " ".join(["python"] + sys.argv), "quick": args.quick,
                            "smoke": args.smoke, "plan": plan, "cases": len(cases),
                            "pythons": pythons, "load_average_1_5_15": os.getloadavg()}
    if args.quick:
        info["promise_s"] = QUICK_PROMISE_S
    groups: Dict[str, Any] = {}
    skipped: Dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="cpprb_ray_compare_") as work_dir:
        commands = [] if args.smoke else extra_commands(args.quick, work_dir, pythons)
        bar = progress_bar(len(workloads.GROUPS) * len(cases) + len(commands))

        def advance(label: str) -> None:
            if bar is not None:
                bar.set_postfix_str(label[:50])
                bar.update(1)

        for group, python in pythons.items():
            why = budget.why_not(group)
            result = None
            if not why:
                result, why = run_group(group, python, cases, plan, args.seed, work_dir,
                                        advance,
                                        budget.timeout(GROUP_TIMEOUT_S[args.quick or args.smoke]))
            if result is None:
                skipped[group] = why
                print(f"group skipped: {group}: {why}", file=sys.stderr, flush=True)
                if bar is not None:
                    bar.update(len(cases))
                continue
            groups[group] = result
            for key, reason in result["skipped"].items():
                print(f"peer skipped: {key} ({group}): {reason}", file=sys.stderr, flush=True)
        extra_results: Dict[str, Any] = {}
        for name, command, json_path, why_not in commands:
            advance(name)
            why_not = why_not or budget.why_not(name)
            if command is None or why_not:
                extra_results[name] = {"skipped": why_not}
            else:
                extra_results[name] = run_extra(name, command, json_path,
                                                budget.timeout(EXTRA_TIMEOUT_S[args.quick]))
            if "skipped" in extra_results[name]:
                print(f"workload skipped: {name}: {extra_results[name]['skipped']}",
                      file=sys.stderr, flush=True)
        if bar is not None:
            bar.close()
    if args.smoke:
        extra_results = {name: {"skipped": "not run with --smoke"}
                         for name in ("apex", "multi_node", "frames", "writers", "sequences",
                                      "sequences_reverb")}
    info["wall_s"] = time.perf_counter() - started
    info["load_average_after"] = os.getloadavg()
    payload = {"info": info, "groups": groups, "skipped": skipped,
               "rows": report.group_rows(groups), "extras": extra_results}
    plots, why_no_plots = report.plots(payload, args.out)
    if why_no_plots:
        print(f"plots skipped: {why_no_plots}", file=sys.stderr)
    payload["plots"] = [os.path.basename(path) for path in plots]
    text = report.markdown(payload, detail=False)
    print(text)
    with open(os.path.join(args.out, "results.md"), "w", encoding="utf-8") as handle:
        handle.write(report.markdown(payload, detail=True))
    common.write_json(os.path.join(args.out, "results.json"), payload)
    print(f"wrote {os.path.join(args.out, 'results.md')}, results.json and "
          f"{len(plots)} plots in {info['wall_s']:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
