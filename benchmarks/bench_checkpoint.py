"""Benchmark: save and load of a full buffer against writing and reading the same bytes with numpy.

Run from the repository root::

    python benchmarks/bench_checkpoint.py            # 2**20 rows, 7 interleaved rounds
    python benchmarks/bench_checkpoint.py --quick    # 2 rounds (a smoke run)
    python benchmarks/bench_checkpoint.py --dir /data --json results.json
    python benchmarks/bench_checkpoint.py --quick --no-busy --profile-load 3   # where it goes

One prioritized buffer of the transition of bench_buffer.py (obs float32[4], act int64, rew
float32, next_obs float32[4], done float32; alpha=0.6) at 2**20 rows, full, with random
priorities. In interleaved rounds (so that a burst of outside load hits every side alike):

save
    ``rb.save(file)``: the snapshot under the lock, checksums, a temporary file, fsync, rename,
    fsync of the directory.
numpy save
    The same information as arrays (the five columns, the generations, the leaf weights) written
    with ``np.save`` one after the other into one file, then fsync: the same durability, without
    checksums or atomic replacement.
numpy save, no fsync
    The same without the fsync (what ``np.save`` alone gives).
load
    ``PrioritizedReplayBuffer.load(file)``: read, verify the checksums, make a new shared-memory
    segment of 2**20 rows and restore into it (closing it afterwards is not timed).
numpy load
    ``np.load`` of the arrays back from their file (into private memory, no buffer made).
dump
    ``rb._image.dump()`` alone: the copy a save makes (in chunks of 4 MiB, each under its own
    hold of the buffer's lock, then one short hold for what was written meanwhile).

Then, unless ``--no-busy``, the save while the buffer is in use, as a learner saves for
preemption: a thread of this process samples 256 rows and updates their priorities in a loop
(the learner), and two writer processes add batches of 64 rows. Reported: the busy save's
median over the quiet one's (the goal: at most 1.5), with the saving thread's CPU time over
the quiet save's (the work a busy save adds: its waits for the lock, its hand-overs) and its
share of a core (CPU time over wall time: what the other busy processes left it), the
learner's steps per second during the saves over its pace without a save (at least 0.8), and
the longest single call (the learner's sample + update, a writer's add) while the saves ran
(at most 50 ms), beside the longest call of the same loops without a save (what the machine's
load alone gives). Load: its speed over
``np.load``'s for the same bytes is the inverse of the ratio "load / numpy load" (the goal: at
least 0.5). ``--profile-load N`` then profiles N more loads (cProfile, the functions that
took the most time of their own), to show where a load's time goes.

Both sides read files they have just written, so loads come from the page cache. The table gives
the median (min) milliseconds and the ratios ours/numpy (below 1: ours is faster).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List

import numpy as np

if __package__:
    from . import _common as common
else:  # run as a script: this file's folder is sys.path[0]
    import _common as common

FULL = {"rounds": 7}
QUICK = {"rounds": 2}
SIDES = ("save", "numpy save", "numpy save, no fsync", "load", "numpy load", "dump")
RATIOS = (("save / numpy save", "save", "numpy save"),
          ("load / numpy load", "load", "numpy load"))


def numpy_arrays(rb: Any) -> List[np.ndarray]:
    """The buffer's information as plain arrays: every column, the generations, the leaves."""
    columns = rb.get_all_transitions()
    generations = rb._store.generations_of(np.arange(rb.get_buffer_size()))
    _, leaves, _, _ = rb._store.check_tree()
    return list(columns.values()) + [generations, leaves]


def numpy_save(file: str, arrays: List[np.ndarray], sync: bool) -> None:
    with open(file, "wb") as handle:
        for array in arrays:
            np.save(handle, array)
        handle.flush()
        if sync:
            os.fsync(handle.fileno())


def numpy_load(file: str, count: int) -> List[np.ndarray]:
    with open(file, "rb") as handle:
        return [np.load(handle) for _ in range(count)]


def writer(rb: Any, seed: int, stop: Any, longest: Any, ready: Any) -> None:
    """A writer process: add 64 rows at a time until `stop`; `longest` gets the longest add
    (seconds) since it was last reset to 0 by the parent."""
    rng = np.random.default_rng(seed)
    batch = {name: rng.random((64,) + tuple(np.atleast_1d(spec.get("shape", 1))))
             .astype(spec.get("dtype", np.float32)) for name, spec in common.env_dict().items()}
    ready.set()
    while not stop.is_set():
        start = time.perf_counter()
        rb.add(**batch)
        took = time.perf_counter() - start
        if took > longest.value:
            longest.value = took
    rb.close()


def busy_saves(rb: Any, file: str, rounds: int, quiet_s: float, quiet_cpu_s: float,
               quiet_share: float) -> Dict[str, float]:
    """Saves while a learner thread samples and updates and two writer processes add; beside
    their time, the CPU time of the saving thread (on 2 cores, the three busy processes leave
    a save about 2/3 of a core: its CPU time over the quiet save's tells the work a busy save
    adds, its share of a core how much the machine gave it)."""
    import multiprocessing
    import threading

    ctx = multiprocessing.get_context("spawn")
    stop, halt = ctx.Event(), threading.Event()
    longest_adds = [ctx.Value("d", 0.0) for _ in range(2)]
    readies = [ctx.Event() for _ in range(2)]
    steps = [0]
    calls: List[float] = []

    def learner() -> None:
        rng = np.random.default_rng(1)
        while not halt.is_set():
            start = time.perf_counter()
            batch = rb.sample(256)
            rb.update_priorities(batch["indexes"], rng.random(256) + 0.1, batch["generations"])
            calls.append(time.perf_counter() - start)
            steps[0] += 1

    writers = [ctx.Process(target=writer, args=(rb, k, stop, longest_adds[k], readies[k]))
               for k in range(2)]
    for process in writers:
        process.start()
    thread = threading.Thread(target=learner)
    try:
        for ready in readies:
            ready.wait(120)
        thread.start()
        time.sleep(1.0)
        # Without a save: the learner's pace and the longest calls the machine's load gives.
        calls.clear()
        for value in longest_adds:
            value.value = 0.0
        first, began = steps[0], time.perf_counter()
        time.sleep(3.0)
        pace_alone = (steps[0] - first) / (time.perf_counter() - began)
        idle_call = max(calls + [0.0])
        idle_add = max(value.value for value in longest_adds)
        calls.clear()
        for value in longest_adds:
            value.value = 0.0
        saves: List[float] = []
        saves_cpu: List[float] = []
        first, spent = steps[0], 0.0
        for _ in range(rounds):
            saves.append(timed(lambda: rb.save(file), saves_cpu))
            spent += saves[-1]
        pace_saving = (steps[0] - first) / spent
        busy_call = max(calls + [0.0])
        busy_add = max(value.value for value in longest_adds)
    finally:
        halt.set()
        stop.set()
        if thread.is_alive():
            thread.join()
        for process in writers:
            process.join(60)
    return {"busy_save_median_ms": float(np.median(saves)) * 1e3,
            "busy_over_quiet": float(np.median(saves)) / quiet_s,
            "busy_cpu_over_quiet_cpu": float(np.median(saves_cpu)) / quiet_cpu_s,
            "busy_save_core_share": float(np.median(np.array(saves_cpu) / np.array(saves))),
            "quiet_save_core_share": quiet_share,
            "learner_pace": pace_saving / pace_alone,
            "longest_learner_call_ms": busy_call * 1e3, "longest_add_ms": busy_add * 1e3,
            "longest_learner_call_without_save_ms": idle_call * 1e3,
            "longest_add_without_save_ms": idle_add * 1e3}


def timed(call: Callable[[], Any], cpu: Any = None) -> float:
    """Seconds `call()` took; with `cpu` (a list), the CPU seconds of this thread it took too
    are appended to it."""
    start, start_cpu = time.perf_counter(), time.thread_time()
    call()
    took = time.perf_counter() - start
    if cpu is not None:
        cpu.append(time.thread_time() - start_cpu)
    return took


def profile_loads(cpprb_ray: Any, file: str, count: int) -> str:
    """The functions that took the most time of their own in `count` loads of `file` (closing
    each loaded buffer is not profiled); "" for 0 loads."""
    if count < 1:
        return ""
    profiler = cProfile.Profile()
    for _ in range(count):
        profiler.enable()
        loaded = cpprb_ray.PrioritizedReplayBuffer.load(file)
        profiler.disable()
        loaded.close()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(10)
    return "\n".join(line for line in text.getvalue().splitlines()
                     if line.strip() and not line.startswith(("   Ordered", "   List")))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 rounds")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--dir", default=tempfile.gettempdir(),
                        help="where the files go (default: the temporary directory)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--exponent", type=int, default=20, help="capacity 2**EXPONENT")
    parser.add_argument("--no-busy", action="store_true",
                        help="skip the saves while a learner and two writers run")
    parser.add_argument("--profile-load", type=int, default=0, metavar="N",
                        help="then profile N loads (cProfile: where a load's time goes)")
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else FULL
    cpprb_ray = common.import_cpprb_ray()
    info = common.run_info(args.quick)
    info["dir"] = args.dir
    print(common.header(info))
    capacity = 2**args.exponent
    rng = np.random.default_rng(args.seed)
    directory = tempfile.mkdtemp(prefix="bench_checkpoint_", dir=args.dir)
    ours_file = os.path.join(directory, "buffer.ckpt")
    numpy_file = os.path.join(directory, "arrays.npy")
    times: Dict[str, List[float]] = {side: [] for side in SIDES}
    rb = cpprb_ray.PrioritizedReplayBuffer(capacity, common.env_dict(), alpha=common.ALPHA,
                                           eps=common.EPS)
    try:
        common.fill(rb, capacity, rng)
        arrays = numpy_arrays(rb)

        loaded: List[Any] = []
        save_cpu: List[float] = []
        for _ in range(plan["rounds"]):
            times["save"].append(timed(lambda: rb.save(ours_file), save_cpu))
            times["numpy save"].append(timed(lambda: numpy_save(numpy_file, arrays, True)))
            times["numpy save, no fsync"].append(
                timed(lambda: numpy_save(numpy_file, arrays, False)))
            times["load"].append(timed(lambda: loaded.append(
                cpprb_ray.PrioritizedReplayBuffer.load(ours_file))))
            loaded.pop().close()   # not timed
            times["numpy load"].append(timed(lambda: numpy_load(numpy_file, len(arrays))))
            times["dump"].append(timed(rb._image.dump))
        sizes = {"checkpoint_bytes": os.path.getsize(ours_file),
                 "numpy_bytes": os.path.getsize(numpy_file)}
        busy = ({} if args.no_busy else
                busy_saves(rb, ours_file, plan["rounds"], float(np.median(times["save"])),
                           float(np.median(save_cpu)),
                           float(np.median(np.array(save_cpu) / np.array(times["save"])))))
        profile = profile_loads(cpprb_ray, ours_file, args.profile_load)
    finally:
        rb.close()
        for file in (ours_file, numpy_file):
            if os.path.exists(file):
                os.unlink(file)
        os.rmdir(directory)
    stats = {side: {"median_ms": float(np.median(values)) * 1e3,
                    "min_ms": float(np.min(values)) * 1e3} for side, values in times.items()}
    ratios = {name: {stat: stats[mine][stat] / stats[theirs][stat]
                     for stat in ("median_ms", "min_ms")}
              for name, mine, theirs in RATIOS}
    print(f"\ncapacity 2**{args.exponent}, files in {args.dir}: checkpoint "
          f"{sizes['checkpoint_bytes'] / 2**20:.1f} MiB, numpy {sizes['numpy_bytes'] / 2**20:.1f}"
          f" MiB; median (min) ms over {plan['rounds']} rounds")
    for side in SIDES:
        print(f"{side:<22}{stats[side]['median_ms']:>9.1f} ({stats[side]['min_ms']:.1f})")
    for name, ratio in ratios.items():
        print(f"{name:<22}{ratio['median_ms']:>9.2f} ({ratio['min_ms']:.2f})")
    print(f"{'load speed / np.load':<22}{1 / ratios['load / numpy load']['median_ms']:>9.2f} "
          f"({1 / ratios['load / numpy load']['min_ms']:.2f})   (goal: >= 0.5)")
    if busy:
        print(f"\nsaves while a learner thread samples + updates and two writers add "
              f"(median of {plan['rounds']}):")
        print(f"{'busy save, ms':<34}{busy['busy_save_median_ms']:>9.1f}")
        print(f"{'busy save / quiet save':<34}{busy['busy_over_quiet']:>9.2f}   (goal: <= 1.5)")
        print(f"{'its CPU time / quiet save CPU time':<34}"
              f"{busy['busy_cpu_over_quiet_cpu']:>9.2f}   (the work a busy save adds)")
        print(f"{'its share of a core (CPU / wall)':<34}{busy['busy_save_core_share']:>9.2f}   "
              f"({busy['quiet_save_core_share']:.2f} for a quiet save)")
        print(f"{'learner pace while saving':<34}{busy['learner_pace']:>9.2f}   (goal: >= 0.8)")
        print(f"{'longest learner call, ms':<34}{busy['longest_learner_call_ms']:>9.1f}   "
              f"(goal: <= 50; {busy['longest_learner_call_without_save_ms']:.1f} without a save)")
        print(f"{'longest writer add, ms':<34}{busy['longest_add_ms']:>9.1f}   "
              f"(goal: <= 50; {busy['longest_add_without_save_ms']:.1f} without a save)")
    if profile:
        print(f"\nwhere {args.profile_load} loads took their time (cProfile, own time):")
        print(profile)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"info": info, "capacity": capacity, "sizes": sizes, "times_s": times,
                       "stats": stats, "ratios": ratios, "busy": busy}, handle, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
