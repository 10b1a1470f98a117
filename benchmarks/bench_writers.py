"""The learner under many writers: one learner process and K writer processes on one buffer.

Run from the repository root (cpprb_ray built in place, e.g. by ``make venv``)::

    .venv-reverb/bin/python benchmarks/bench_writers.py            # every library, ~12 minutes
    .venv/bin/python benchmarks/bench_writers.py                   # without Reverb
    python benchmarks/bench_writers.py --quick                     # ~1 minute: 2 s per run, 2^16
    python benchmarks/bench_writers.py --writers 0 64 --seconds 20 --rounds 5 --json w.json

The complaint this answers: a learner that slows down as writers are added (one lock between
them all). The learner samples 256 rows with their importance weights and updates their 256
priorities, as fast as it can, for ``--seconds``; each of K writer processes adds a batch of
``--batch`` (16) rows with their priorities every ``batch / --rate`` seconds (``--rate`` rows
per second per writer, 1,000 by default: an actor stepping its environment), the writers'
phases spread over the period. K is each of ``--writers`` (0, 4, 16, 64). For every run: the
learner's steps per second, its median (p50) and 99th percentile (p99) step time, the rows the
writers added per second within the learner's window, and what the learner waited on: its
voluntary context switches per step (it slept: on a lock held by a writer, or on I/O), its
involuntary ones (a writer took its CPU), the CPU share it got, and for cpprb_ray the buffer's
``lock_waits`` (acquisitions, by anyone, that found the lock held) per learner step.

Libraries (buffer of 2^``--exponent`` rows, 2^18 by default, filled with random priorities
before the clock starts):

- ``cpprb_ray``: our PrioritizedReplayBuffer, the handle passed to every child (it pickles by
  name and re-attaches); writers ``add(priorities=p, **rows)``, the learner ``sample(256, 0.4)``
  and ``update_priorities(indexes, priorities)``;
- ``cpprb_ray_paired``: the control, what the lock costs: the learner alternates step by step
  between the writers' buffer and a second, identical buffer that no one writes to, each step
  timed on its own. Both kinds of step run at the same moments, under the same writers taking
  the same CPU; only the first shares a lock with them. The report gives the first kind's
  figures on the line, and the second's p50 and p99 beside them;
- ``cpprb_mp``: cpprb's ``MPPrioritizedReplayBuffer(..., ctx=ctx, backend="SharedMemory")``,
  built for exactly this (many explorers, one learner), the same calls;
- ``reverb``: a Reverb server in a process of its own (benchmarks/_reverb.py); the learner a
  gRPC client sampling through a prefetching ``TrajectoryDataset`` and calling
  ``mutate_priorities``, every writer a gRPC client with a trajectory writer (16 appends and
  items, then a flush that waits for the server's confirmation). Needs .venv-reverb.

Every child is forked by a fork server that has imported numpy, cpprb, cpprb_ray (and reverb)
once, so that 64 writers start in seconds and none carries the parent's threads. Runs go
round by round; within a round every K and every library, the libraries' order rotated each
round, so that drifting load from other processes hits them alike. The report gives each
figure's median over rounds and, for cpprb_ray, the target: at the largest K its learner keeps
>= 90 % of its steps per second at K = 0 and its p99 step time stays within 3x of that at
K = 0. On a machine with fewer cores than processes the writers and the learner share CPUs:
the header gives the CPU count and the load average.
"""

from __future__ import annotations

import argparse
import gc
import multiprocessing
import os
import resource
import statistics
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

if __package__:
    from . import _common as common
else:  # run as a script: this file's folder is sys.path[0]
    import _common as common

BATCH = 256
POOL = 256  # pre-drawn inputs per process, cycled
LIBRARIES = ("cpprb_ray", "cpprb_ray_paired", "cpprb_mp", "reverb")
LABELS = {"cpprb_ray": "cpprb_ray",
          "cpprb_ray_paired": "cpprb_ray, alternating with an untouched buffer",
          "cpprb_mp": "cpprb MPPrioritizedReplayBuffer", "reverb": "Reverb (gRPC clients)"}
STEADY_FRACTION = 0.9  # of K = 0's steps per second, at the largest K
P99_FACTOR = 3.0       # of K = 0's p99 step time, at the largest K
FULL = {"seconds": 10.0, "rounds": 3, "exponent": 18}
QUICK = {"seconds": 2.0, "rounds": 1, "exponent": 16}


# ---------------------------------------------------------------------------------------------
# Children (module level: the fork server imports this module to run them)


def _import_library(library: str) -> Any:
    if library == "reverb":
        if __package__:
            from . import _reverb
        else:
            import _reverb
        return _reverb
    if library == "cpprb_mp":
        import cpprb

        return cpprb
    return common.import_cpprb_ray()


def _rusage() -> Tuple[float, int, int]:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime, usage.ru_nvcsw, usage.ru_nivcsw


def learner(library: str, handle: Any, seconds: float, seed: int, barrier, results) -> None:
    """Learner steps for `seconds` after the barrier; puts its step times and counters.

    `handle`: the buffer (or Reverb's address); for cpprb_ray_paired a pair (the writers'
    buffer, an untouched one), stepped on in turn and timed apart."""
    rng = np.random.default_rng(seed)
    priorities = [common.random_priorities(rng, BATCH) for _ in range(POOL)]
    untouched = None
    if library == "cpprb_ray_paired":
        handle, untouched = handle
    stats = getattr(handle, "stats", None)
    if library == "reverb":
        _reverb = _import_library("reverb")
        reverb = _reverb.import_reverb()
        client = reverb.Client(handle)
        dataset = reverb.TrajectoryDataset.from_table_signature(
            server_address=handle, table=_reverb.TABLE,
            max_in_flight_samples_per_worker=2 * BATCH)
        iterator = dataset.batch(BATCH, drop_remainder=True).prefetch(4).as_numpy_iterator()
        mutate, table, weights = client.mutate_priorities, _reverb.TABLE, _reverb.importance_weights

        def step(k: int) -> None:
            sample = next(iterator)
            weights(sample.info, common.BETA)
            mutate(table, dict(zip(sample.info.key, priorities[k % POOL])))
    else:
        step = _buffer_step(handle, priorities)
    other = _buffer_step(untouched, priorities) if untouched is not None else None
    for k in range(20):  # warm up: imports, page mappings, the dataset's first batches
        step(k)
        if other is not None:
            other(k)
    gc.collect()
    gc.disable()
    barrier.wait()
    clock = time.perf_counter_ns
    times = np.zeros(1 << 22, np.int64)
    other_times = np.zeros(len(times) if other is not None else 0, np.int64)
    lock_waits = stats()["lock_waits"] if stats is not None else None
    usage = _rusage()
    start = clock()
    deadline = start + int(seconds * 1e9)
    now = start
    count = 0
    while now < deadline and count < len(times):
        step(count)
        after = clock()
        times[count] = after - now
        now = after
        if other is not None:
            other(count)
            after = clock()
            other_times[count] = after - now
            now = after
        count += 1
    usage_after = _rusage()
    record: Dict[str, Any] = {
        "role": "learner", "start_ns": start, "end_ns": now, "steps": count,
        "times_ns": times[:count].tolist(), "cpu_s": usage_after[0] - usage[0],
        "voluntary_switches": usage_after[1] - usage[1],
        "involuntary_switches": usage_after[2] - usage[2]}
    if lock_waits is not None:
        record["lock_waits"] = stats()["lock_waits"] - lock_waits
    if other is not None:
        record["untouched_times_ns"] = other_times[:count].tolist()
        _close(untouched)
    results.put(record)
    _close(handle)


def _buffer_step(buffer: Any, priorities: List[np.ndarray]) -> Any:
    """A learner step of a cpprb or cpprb_ray buffer: sample(256), update of its indexes."""
    sample, update = buffer.sample, buffer.update_priorities

    def step(k: int) -> None:
        update(sample(BATCH, common.BETA)["indexes"], priorities[k % POOL])
    return step


def writer(library: str, handle: Any, rate: float, batch: int, seconds: float, seed: int,
           phase: float, barrier, stop, results) -> None:
    """Add `batch` rows with priorities every batch / rate seconds until `stop` is set."""
    rng = np.random.default_rng(seed)
    rows = [common.random_rows(rng, batch) for _ in range(POOL)]
    priorities = [common.random_priorities(rng, batch) for _ in range(POOL)]
    if library == "reverb":
        _reverb = _import_library("reverb")
        reverb = _reverb.import_reverb()
        adder = _reverb.Writer(reverb.Client(handle))
        steps = [_reverb.steps(chunk) for chunk in rows]

        def add(k: int) -> None:
            adder.add(steps[k % POOL], priorities[k % POOL])
    else:
        buffer_add = handle.add

        def add(k: int) -> None:
            buffer_add(priorities=priorities[k % POOL], **rows[k % POOL])
    add(0)  # warm up
    period_ns = int(batch / rate * 1e9)
    clock = time.perf_counter_ns
    done: List[int] = []
    late = 0
    parent = os.getppid()
    barrier.wait()
    next_at = clock() + int(phase * period_ns)
    # Never longer than the run could last, and not past the driver: a writer whose driver
    # was killed must not go on adding (its fork server exits, and this process is adopted).
    give_up = clock() + int((3 * seconds + 120) * 1e9)
    k = 1
    while not stop.is_set() and clock() < give_up and os.getppid() == parent:
        now = clock()
        if now < next_at:
            time.sleep((next_at - now) * 1e-9)
        add(k)
        k += 1
        finished = clock()
        done.append(finished)
        next_at += period_ns
        if finished > next_at + period_ns:  # more than a period behind: skip, do not burst
            late += 1
            next_at = finished
    if library == "reverb":
        adder.close()
    results.put({"role": "writer", "done_ns": done, "late": late})
    _close(handle)


def _close(handle: Any) -> None:
    close = getattr(handle, "close", None)  # cpprb_ray: a view's close never frees
    if close is not None:
        close()


# ---------------------------------------------------------------------------------------------
# The driver


class Buffers:
    """The buffer (or server) of each library, made once per process and reused by every run."""

    def __init__(self, libraries: List[str], capacity: int, seed: int, ctx: Any):
        self.handles: Dict[str, Any] = {}
        self.owned: List[Any] = []
        self.skipped: Dict[str, str] = {}
        rng = np.random.default_rng(seed)
        for library in libraries:
            try:
                self.handles[library] = self._make(library, capacity, seed, rng, ctx)
            except ImportError as error:
                self.skipped[library] = f"not importable here ({error})"

    def _make(self, library: str, capacity: int, seed: int, rng: np.random.Generator,
              ctx: Any) -> Any:
        module = _import_library(library)
        if library in ("cpprb_ray", "cpprb_ray_paired"):
            made = []
            for _ in range(2 if library == "cpprb_ray_paired" else 1):
                buffer = module.PrioritizedReplayBuffer(
                    capacity, common.env_dict(), alpha=common.ALPHA, eps=common.EPS, seed=seed)
                self.owned.append(buffer)
                common.fill(buffer, capacity, rng)
                made.append(buffer)
            return tuple(made) if len(made) > 1 else made[0]
        if library == "cpprb_mp":
            buffer = module.MPPrioritizedReplayBuffer(
                capacity, common.env_dict(), alpha=common.ALPHA, eps=common.EPS, ctx=ctx,
                backend="SharedMemory")
            common.fill(buffer, capacity, rng)
            self.owned.append(buffer)
            return buffer
        server = module.ServerProcess(capacity, seed)
        self.owned.append(server)
        return server.address

    def for_learner(self, library: str) -> Any:
        handle = self.handles[library]
        return handle if library == "cpprb_ray_paired" else handle  # (writers', untouched)

    def for_writers(self, library: str) -> Any:
        handle = self.handles[library]
        return handle[0] if library == "cpprb_ray_paired" else handle

    def close(self) -> None:
        for owned in self.owned:
            close = getattr(owned, "close", None)
            if close is not None:
                close()
        self.owned.clear()


def one_run(ctx: Any, buffers: Buffers, library: str, writers: int, args: argparse.Namespace,
            seed: int) -> Dict[str, Any]:
    """One learner and `writers` writers for args.seconds; the run's figures."""
    barrier = ctx.Barrier(writers + 2)
    stop = ctx.Event()
    results = ctx.Queue()
    children = [ctx.Process(target=learner, args=(
        library, buffers.for_learner(library), args.seconds, seed, barrier, results))]
    for k in range(writers):
        children.append(ctx.Process(target=writer, args=(
            library, buffers.for_writers(library), args.rate, args.batch, args.seconds,
            seed + 1 + k,
            k / max(writers, 1), barrier, stop, results)))
    for child in children:
        child.start()
    records: List[Dict[str, Any]] = []
    try:
        barrier.wait(timeout=600)
        deadline = time.monotonic() + args.seconds + 120
        while not any(r["role"] == "learner" for r in records):
            records.append(results.get(timeout=max(1.0, deadline - time.monotonic())))
        stop.set()
        while len(records) < len(children):
            records.append(results.get(timeout=120))
    finally:
        stop.set()
        for child in children:
            child.join(timeout=60)
            if child.is_alive():
                child.kill()
                child.join()
    learned = next(r for r in records if r["role"] == "learner")
    times = np.asarray(learned["times_ns"], np.float64) / 1000.0
    window_s = (learned["end_ns"] - learned["start_ns"]) * 1e-9
    added = sum(sum(learned["start_ns"] <= t <= learned["end_ns"] for t in r["done_ns"])
                for r in records if r["role"] == "writer")
    steps = learned["steps"]
    run = {"library": library, "writers": writers, "seconds": window_s,
           "learner_steps_per_s": steps / window_s,
           "p50_us": float(np.median(times)) if steps else None,
           "p99_us": float(np.quantile(times, 0.99)) if steps else None,
           "max_us": float(times.max()) if steps else None,
           "rows_added_per_s": added * args.batch / window_s,
           "rows_wanted_per_s": writers * args.rate,
           "late_writes": sum(r["late"] for r in records if r["role"] == "writer"),
           "learner_cpu_share": learned["cpu_s"] / window_s,
           "voluntary_switches_per_step": learned["voluntary_switches"] / max(steps, 1),
           "involuntary_switches_per_step": learned["involuntary_switches"] / max(steps, 1),
           "load_average_1": os.getloadavg()[0]}
    if "lock_waits" in learned:
        run["lock_waits_per_step"] = learned["lock_waits"] / max(steps, 1)
    if "untouched_times_ns" in learned and steps:
        untouched = np.asarray(learned["untouched_times_ns"], np.float64) / 1000.0
        run["untouched_p50_us"] = float(np.median(untouched))
        run["untouched_p99_us"] = float(np.quantile(untouched, 0.99))
    return run


def summarize(runs: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Per (library, K): the median over rounds of every figure, and the rounds' range of the
    steps per second."""
    keys = list(dict.fromkeys((run["library"], run["writers"]) for run in runs))
    out = []
    for library, writers in keys:
        mine = [run for run in runs if run["library"] == library and run["writers"] == writers]
        row: Dict[str, Any] = {"library": library, "writers": writers, "rounds": len(mine)}
        for name in ("learner_steps_per_s", "p50_us", "p99_us", "rows_added_per_s",
                     "rows_wanted_per_s", "learner_cpu_share", "voluntary_switches_per_step",
                     "involuntary_switches_per_step", "lock_waits_per_step",
                     "untouched_p50_us", "untouched_p99_us"):
            values = [run[name] for run in mine if run.get(name) is not None]
            row[name] = statistics.median(values) if values else None
        rates = [run["learner_steps_per_s"] for run in mine]
        row["steps_per_s_range"] = [min(rates), max(rates)]
        # Each round's own figures: a round's K = 0 and largest K ran minutes apart at most.
        row["by_round"] = {str(run.get("round", k)): [run["learner_steps_per_s"], run["p99_us"]]
                           for k, run in enumerate(mine)}
        out.append(row)
    return out


def verdicts(summary: List[Dict[str, Any]], library: str = "cpprb_ray") -> List[str]:
    """The target lines: at the largest K, steps/s >= 90 % and p99 <= 3x of K = 0's.

    Judged on the medians over rounds and on every round's own pair (its K = 0 against its
    largest K): `met` when both meet the target, `NOT met` when neither does, else unsettled
    (benchmarks/_common.verdict): a machine whose load moves between rounds moves a median of
    one K against the other's.
    """
    mine = {row["writers"]: row for row in summary if row["library"] == library}
    if 0 not in mine or len(mine) < 2:
        return [f"target: not judged ({library} was not run at K = 0 and a larger K)"]
    top = max(mine)
    base, loaded = mine[0], mine[top]
    kept = loaded["learner_steps_per_s"] / base["learner_steps_per_s"]
    grown = loaded["p99_us"] / base["p99_us"]
    pairs = [(loaded["by_round"][r], base["by_round"][r]) for r in loaded.get("by_round", {})
             if r in base.get("by_round", {})]
    kept_rounds = [top_round[0] / zero[0] for top_round, zero in pairs] or [kept]
    grown_rounds = [top_round[1] / zero[1] for top_round, zero in pairs] or [grown]
    pair = "the medians over rounds and every round"
    kept_verdict = common.verdict(kept >= STEADY_FRACTION,
                                  all(k >= STEADY_FRACTION for k in kept_rounds), pair)
    grown_verdict = common.verdict(grown <= P99_FACTOR,
                                   all(g <= P99_FACTOR for g in grown_rounds), pair)
    lines = [
        f"target {library} learner at K = {top} keeps >= {STEADY_FRACTION:.0%} of its K = 0 "
        f"steps/s: {kept_verdict} ({kept:.1%}: {loaded['learner_steps_per_s']:,.0f} against "
        f"{base['learner_steps_per_s']:,.0f}; rounds: "
        f"{', '.join(f'{k:.0%}' for k in kept_rounds)})",
        f"target {library} learner's p99 step time at K = {top} within {P99_FACTOR:g}x of "
        f"K = 0's: {grown_verdict} ({grown:.2f}x: {loaded['p99_us']:.0f} against "
        f"{base['p99_us']:.0f} µs; rounds: {', '.join(f'{g:.2f}x' for g in grown_rounds)})"]
    paired = next((row for row in summary if row["library"] == "cpprb_ray_paired"
                   and row["writers"] == top and row.get("untouched_p50_us")), None)
    if paired is not None:
        lines.append(
            f"what the lock costs at K = {top}: a step on the writers' buffer takes "
            f"{paired['p50_us'] / paired['untouched_p50_us']:.2f}x (p50) and "
            f"{paired['p99_us'] / paired['untouched_p99_us']:.2f}x (p99) a step on an "
            f"untouched buffer at the same moments")
    return lines


def table(summary: List[Dict[str, Any]]) -> str:
    """The report's Markdown table: one line per library and K."""
    base = {row["library"]: row for row in summary if row["writers"] == 0}
    lines = []
    for row in summary:
        zero = base.get(row["library"])
        kept = ("-" if zero is None else
                f"{row['learner_steps_per_s'] / zero['learner_steps_per_s']:.0%}")
        low, high = row["steps_per_s_range"]
        waits = row.get("lock_waits_per_step")
        untouched = ("-" if row.get("untouched_p50_us") is None else
                     f"{row['untouched_p50_us']:.0f} / {row['untouched_p99_us']:.0f}")
        lines.append([
            LABELS.get(row["library"], row["library"]), str(row["writers"]),
            f"{row['learner_steps_per_s']:,.0f} [{low:,.0f}–{high:,.0f}]", kept,
            f"{row['p50_us']:.0f}", f"{row['p99_us']:.0f}", untouched,
            f"{row['rows_added_per_s']:,.0f} / {row['rows_wanted_per_s']:,.0f}",
            f"{row['learner_cpu_share']:.2f}",
            f"{row['voluntary_switches_per_step']:.3f} / "
            f"{row['involuntary_switches_per_step']:.3f}",
            "-" if waits is None else f"{waits:.3f}"])
    return common.markdown_table(
        ["library", "K writers", "learner steps/s [range]", "of K = 0", "p50 µs", "p99 µs",
         "untouched buffer's p50 / p99 µs", "rows added/s / wanted", "learner CPU share",
         "switches per step: slept / preempted", "lock_waits per step"], lines,
        "lrrrrrrrrrr")


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--writers", type=int, nargs="+", default=[0, 4, 16, 64],
                        help="the values of K (default 0 4 16 64)")
    parser.add_argument("--libraries", nargs="+", default=list(LIBRARIES), choices=LIBRARIES)
    parser.add_argument("--seconds", type=float, help="each run's learner window (10; 2 quick)")
    parser.add_argument("--rounds", type=int, help="runs per library and K (3; 1 quick)")
    parser.add_argument("--rate", type=float, default=1000.0, help="rows/s of each writer")
    parser.add_argument("--batch", type=int, default=16, help="rows per writer add")
    parser.add_argument("--exponent", type=int, help="capacity 2^E rows (18; 16 quick)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="2 s per run, 1 round")
    parser.add_argument("--json", metavar="PATH", help="write settings and every run as JSON")
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else FULL
    args.seconds = plan["seconds"] if args.seconds is None else args.seconds
    args.rounds = plan["rounds"] if args.rounds is None else args.rounds
    args.exponent = plan["exponent"] if args.exponent is None else args.exponent
    if min(args.writers) < 0 or args.seconds <= 0 or args.rounds < 1 or args.rate <= 0 \
            or args.batch < 1:
        parser.error("--writers >= 0, --seconds > 0, --rounds >= 1, --rate > 0, --batch >= 1")
    return args


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    common.import_cpprb_ray()  # puts this checkout first on sys.path, for the fork server too
    # cpprb's SharedMemory segments, attached by children of the fork server, are registered
    # with Python's resource tracker, which warns at exit about every one of them although
    # cpprb has unlinked them: noise, kept out of the report (the tracker process takes its
    # warning options from sys.warnoptions when it starts).
    sys.warnoptions.append("ignore::UserWarning:multiprocessing.resource_tracker")
    ctx = multiprocessing.get_context("forkserver")
    preload = ["numpy", "cpprb_ray"]
    try:
        import cpprb  # noqa: F401

        preload.append("cpprb")
    except ImportError:
        pass
    wanted = list(args.libraries)
    if "reverb" in wanted:
        try:
            _import_library("reverb").import_reverb()
            preload.append("reverb")
        except ImportError:
            pass  # Buffers reports it skipped
    ctx.set_forkserver_preload(preload)
    info = {"machine": common.machine(), "cpus": os.cpu_count(),
            "command": " ".join(["python"] + sys.argv), "load_average_1_5_15": os.getloadavg(),
            "settings": {key: getattr(args, key) for key in (
                "writers", "libraries", "seconds", "rounds", "rate", "batch", "exponent",
                "seed")}}
    print(f"machine: {info['machine']} ({info['cpus']} CPUs); load average "
          f"{' '.join(f'{x:.2f}' for x in info['load_average_1_5_15'])}", flush=True)
    buffers = Buffers(wanted, 1 << args.exponent, args.seed, ctx)
    for library, why in buffers.skipped.items():
        print(f"skipped: {library}: {why}", file=sys.stderr, flush=True)
    libraries = [library for library in wanted if library in buffers.handles]
    runs: List[Dict[str, Any]] = []
    try:
        for round_number in range(args.rounds):
            for writers in args.writers:
                shift = round_number % max(len(libraries), 1)
                for library in libraries[shift:] + libraries[:shift]:
                    run = one_run(ctx, buffers, library, writers, args,
                                  args.seed + 1000 * round_number)
                    run["round"] = round_number
                    runs.append(run)
                    print(f"round {round_number + 1}: {LABELS[library]}, K = {writers}: "
                          f"{run['learner_steps_per_s']:,.0f} steps/s, p99 "
                          f"{run['p99_us']:.0f} µs, {run['rows_added_per_s']:,.0f} rows/s "
                          f"(load {run['load_average_1']:.2f})", file=sys.stderr, flush=True)
    finally:
        buffers.close()
    summary = summarize(runs)
    info["wall_s"] = time.perf_counter() - started
    info["load_average_after"] = os.getloadavg()
    lines = verdicts(summary)
    print(table(summary))
    print()
    for line in lines:
        print(line)
    common.write_json(args.json, {"info": info, "skipped": buffers.skipped, "runs": runs,
                                  "summary": summary, "verdicts": lines})
    return 0


if __name__ == "__main__":
    sys.exit(main())
