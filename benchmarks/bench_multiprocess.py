"""Benchmark: 2 writer processes + 1 learner process on one buffer, cpprb_ray against cpprb.

Run from the repository root (after ``python setup.py build_ext --inplace``, or with cpprb_ray
installed)::

    python benchmarks/bench_multiprocess.py                  # 10 s per run, 3 runs per library
    python benchmarks/bench_multiprocess.py --quick          # 2 s, 1 run per library
    python benchmarks/bench_multiprocess.py --seconds 30 --writer-batch 1 --json mp.json

The Ape-X shape: writers only ``add`` batches of ``--writer-batch`` transitions; the learner only
``sample(256, beta=0.4)`` and ``update_priorities`` with those indexes and fresh random
priorities, in a loop. Every process runs flat out for ``--seconds`` after a common barrier, then
reports its count. cpprb runs its ``MPPrioritizedReplayBuffer(..., ctx=ctx,
backend="SharedMemory")``, which is built for exactly this (many explorers, one learner), handed to
the children as a Process argument; cpprb_ray's PrioritizedReplayBuffer is handed over the same
way (it pickles by name and re-attaches in place; a forked child keeps the inherited mapping).
Both use the same start method (``fork``, cpprb's default on Linux; ``--start-method spawn``
works for both, as a Ray worker would start) and the same pre-generated input pools, and both
buffers are filled to capacity before the clock starts.

Runs alternate between the libraries (ours, cpprb, ours, ...) so that drifting load from other
processes hits both alike; the median over runs is reported. With fewer than 3 free cores the
three processes time-share, which caps both libraries; the header shows the CPU count and load.
"""

from __future__ import annotations

import argparse
import gc
import multiprocessing
import os
import queue
import statistics
import sys
import time
from typing import Any, Dict, List

import numpy as np

if __package__:
    from . import _common as common
else:  # run as a script: this file's folder is sys.path[0]
    import _common as common

BATCH = 256
POOL = 1024  # pre-generated inputs per process; a power of two, cycled with `k & (POOL - 1)`
LIBRARIES = ("cpprb_ray", "cpprb")
# cpprb's default context on Linux. With spawn, each child's unpickling of cpprb's SharedMemory
# registers it with the resource tracker, which then warns at exit about "leaked" segments that
# cpprb has already unlinked: harmless noise, so spawn is an option rather than the default.
DEFAULT_START_METHOD = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"


# ---------------------------------------------------------------------------------------------
# Child processes (module level, so that spawn can import them)


def writer(buffer, batch: int, seconds: float, seed: int, barrier, results) -> None:
    """Add batches of `batch` rows for `seconds`; report (role, rows, elapsed, cpu seconds)."""
    rng = np.random.default_rng(seed)
    pool: List[Dict[str, Any]] = []
    for _ in range(POOL):
        rows = common.random_rows(rng, batch)
        if batch == 1:
            # One transition as an actor passes it: obs arrays and Python scalars.
            rows = {"obs": rows["obs"][0], "act": int(rows["act"][0]),
                    "rew": float(rows["rew"][0]), "next_obs": rows["next_obs"][0],
                    "done": float(rows["done"][0])}
        pool.append(rows)
    add = buffer.add
    mask = POOL - 1
    add(**pool[0])  # warm up (first-call imports, page mappings of this process)
    barrier.wait()
    cpu = time.process_time()
    start = time.perf_counter()
    deadline = start + seconds
    calls = 0
    now = start
    while now < deadline:
        add(**pool[calls & mask])
        calls += 1
        now = time.perf_counter()
    results.put(("writer", calls * batch, now - start, time.process_time() - cpu))
    _close(buffer)


def learner(buffer, seconds: float, seed: int, generations: bool, barrier, results) -> None:
    """sample(256) + update_priorities(256) for `seconds`; report (role, samples, elapsed, cpu)."""
    rng = np.random.default_rng(seed)
    priorities = [common.random_priorities(rng, BATCH) for _ in range(POOL)]
    sample, update = buffer.sample, buffer.update_priorities
    mask = POOL - 1
    sample(BATCH, common.BETA)  # warm up
    barrier.wait()
    cpu = time.process_time()
    start = time.perf_counter()
    deadline = start + seconds
    calls = 0
    now = start
    if generations:  # cpprb_ray only: skip rows that writers overwrote since the sample
        while now < deadline:
            batch = sample(BATCH, common.BETA)
            update(batch["indexes"], priorities[calls & mask], batch["generations"])
            calls += 1
            now = time.perf_counter()
    else:
        while now < deadline:
            batch = sample(BATCH, common.BETA)
            update(batch["indexes"], priorities[calls & mask])
            calls += 1
            now = time.perf_counter()
    results.put(("learner", calls, now - start, time.process_time() - cpu))
    _close(buffer)


def _close(buffer) -> None:
    """Close a cpprb_ray view (never frees: only the owner does); cpprb has nothing to close."""
    close = getattr(buffer, "close", None)
    if close is not None:
        close()


# ---------------------------------------------------------------------------------------------
# One run


def make_buffer(library: str, capacity: int, ctx, seed: int):
    """A fresh `library` buffer of `capacity` rows, filled with batched adds."""
    if library == "cpprb_ray":
        cpprb_ray = common.import_cpprb_ray()
        buffer = cpprb_ray.PrioritizedReplayBuffer(
            capacity, common.env_dict(), alpha=common.ALPHA, eps=common.EPS, seed=seed)
    else:
        import cpprb

        buffer = cpprb.MPPrioritizedReplayBuffer(
            capacity, common.env_dict(), alpha=common.ALPHA, eps=common.EPS, ctx=ctx,
            backend="SharedMemory")
    try:
        common.fill(buffer, capacity, np.random.default_rng(seed))
    except BaseException:
        _close(buffer)
        raise
    return buffer


def run_once(library: str, args: argparse.Namespace, ctx, seed: int) -> Dict[str, Any]:
    """One timed run of `args.writers` writers and one learner on a fresh, full buffer."""
    capacity = 2**args.exponent
    buffer = make_buffer(library, capacity, ctx, seed)
    name = getattr(buffer, "name", None)
    parties = args.writers + 1
    barrier = ctx.Barrier(parties + 1)  # the children and this process
    results = ctx.Queue()
    processes = [
        ctx.Process(target=writer, name=f"writer-{w}",
                    args=(buffer, args.writer_batch, args.seconds, seed + 1 + w, barrier,
                          results))
        for w in range(args.writers)
    ]
    processes.append(ctx.Process(
        target=learner, name="learner",
        args=(buffer, args.seconds, seed + 100, args.generations and library == "cpprb_ray",
              barrier, results)))
    reports = []
    try:
        for process in processes:
            process.start()
        # Children import numpy and build their pools first; spawn can take seconds for that.
        barrier.wait(timeout=120)
        for _ in processes:
            reports.append(results.get(timeout=args.seconds + 120))
        for process in processes:
            process.join(timeout=60)
    except (queue.Empty, multiprocessing.TimeoutError, RuntimeError) as error:
        raise RuntimeError(f"{library}: a child did not finish ({error!r}); exit codes "
                           f"{[p.exitcode for p in processes]}") from error
    finally:
        for process in processes:  # only the processes this run started
            if process.is_alive():
                process.terminate()
                process.join(timeout=10)
        _close(buffer)
        del buffer
        gc.collect()
    if name is not None:
        assert not common.segment_exists(name), f"/dev/shm/{name} left behind after close()"
    failed = [p.exitcode for p in processes if p.exitcode != 0]
    if failed:
        raise RuntimeError(f"{library}: children exited with {failed}")

    writers = [r for r in reports if r[0] == "writer"]
    (learner_report,) = [r for r in reports if r[0] == "learner"]
    samples, elapsed, learner_cpu = learner_report[1:]
    return {
        "library": library,
        "rows_added_per_s": sum(rows / seconds for _, rows, seconds, _ in writers),
        "samples_per_s": samples / elapsed,  # each sample is also one update_priorities(256)
        "writer_cpu_fraction": [cpu / seconds for _, _, seconds, cpu in writers],
        "learner_cpu_fraction": learner_cpu / elapsed,
    }


# ---------------------------------------------------------------------------------------------
# Report


def aggregate(runs: List[Dict[str, Any]]) -> Dict[str, Dict[str, float]]:
    """Per library: median and min over runs of the two rates."""
    out: Dict[str, Dict[str, float]] = {}
    for library in LIBRARIES:
        mine = [r for r in runs if r["library"] == library]
        if not mine:
            continue
        out[library] = {}
        for key in ("rows_added_per_s", "samples_per_s"):
            values = [r[key] for r in mine]
            out[library][f"{key}_median"] = statistics.median(values)
            out[library][f"{key}_min"] = min(values)
    return out


def table(stats: Dict[str, Dict[str, float]], args: argparse.Namespace) -> str:
    """The Markdown table printed at the end: one line per rate, ours / cpprb beside it."""
    rows = []
    for key, label in (("rows_added_per_s", f"rows added/s ({args.writers} writers, "
                                            f"batches of {args.writer_batch})"),
                       ("samples_per_s", f"sample({BATCH}) + update({BATCH}) per s "
                                         f"(1 learner)")):
        cells = [label]
        for library in LIBRARIES:
            s = stats.get(library)
            cells.append("-" if s is None else
                         f"{s[key + '_median']:,.0f} ({s[key + '_min']:,.0f})")
        if len(stats) == 2:
            ratio = stats["cpprb_ray"][key + "_median"] / stats["cpprb"][key + "_median"]
            cells.append(f"{ratio:.1f}x")
        else:
            cells.append("-")
        rows.append(cells)
    return common.markdown_table(
        ["rate", "cpprb_ray median (min)", "cpprb MP median (min)", "ours / cpprb"], rows,
        "lrrr")


def parse_args(argv=None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: --seconds 2 and 1 run per library unless given")
    parser.add_argument("--seconds", type=float, help="timed seconds per run (default 10)")
    parser.add_argument("--runs", type=int, help="runs per library (default 3)")
    parser.add_argument("--writers", type=int, default=2, help="writer processes (default 2)")
    parser.add_argument("--writer-batch", type=int, default=32,
                        help="rows per writer add() (default 32; 1 adds Python scalars)")
    parser.add_argument("--exponent", type=int, default=20, help="capacity 2**E (default 20)")
    parser.add_argument("--start-method", default=DEFAULT_START_METHOD,
                        choices=multiprocessing.get_all_start_methods(),
                        help=f"multiprocessing start method for both libraries (default "
                             f"{DEFAULT_START_METHOD})")
    parser.add_argument("--generations", action="store_true",
                        help="ours passes sample's generations to update_priorities (skips "
                             "overwritten rows; cpprb has no such argument)")
    parser.add_argument("--libraries", nargs="+", choices=LIBRARIES, default=list(LIBRARIES),
                        help="measure only these")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--seed", type=int, default=0, help="seed of all random inputs")
    args = parser.parse_args(argv)
    if args.seconds is None:
        args.seconds = 2.0 if args.quick else 10.0
    if args.runs is None:
        args.runs = 1 if args.quick else 3
    if args.writers < 1 or args.writer_batch < 1 or args.runs < 1 or args.seconds <= 0:
        parser.error("--writers, --writer-batch, --runs and --seconds must be positive")
    return args


def main(argv=None) -> int:
    """Run every run, print the report, write --json; returns the exit status."""
    args = parse_args(argv)
    ctx = multiprocessing.get_context(args.start_method)
    info = common.run_info(args.quick)
    info.update({key: getattr(args, key) for key in (
        "seconds", "runs", "writers", "writer_batch", "exponent", "start_method", "generations",
        "libraries")})
    info.update({"batch": BATCH, "pool": POOL, "alpha": common.ALPHA, "eps": common.EPS,
                 "beta": common.BETA})
    print(common.header(info), flush=True)
    runs = []
    for index in range(args.runs):
        for library in args.libraries:
            result = run_once(library, args, ctx, args.seed + 1000 * index)
            runs.append(result)
            # CPU time / wall time of each child: well below 1 means it waited (for the lock,
            # or for a core on a machine with fewer free cores than processes).
            shares = "/".join(f"{f:.2f}" for f in result["writer_cpu_fraction"] +
                              [result["learner_cpu_fraction"]])
            print(f"  run {index + 1}/{args.runs} {library}: "
                  f"{result['rows_added_per_s']:,.0f} rows added/s, "
                  f"{result['samples_per_s']:,.0f} samples/s; CPU share writers/learner "
                  f"{shares}", file=sys.stderr, flush=True)
    info["load_average_after"] = os.getloadavg()
    stats = aggregate(runs)
    print(f"{args.writers} writers + 1 learner, capacity 2^{args.exponent}, {args.seconds:g} s "
          f"per run, {args.runs} run(s) per library, start method {args.start_method}; "
          f"median (min) over runs")
    print(table(stats, args))
    common.write_json(args.json, {"info": info, "runs": runs, "stats": stats})
    return 0


if __name__ == "__main__":
    sys.exit(main())
