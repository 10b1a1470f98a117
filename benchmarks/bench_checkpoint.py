"""Benchmark: save and load of a full buffer against writing and reading the same bytes with numpy.

Run from the repository root::

    python benchmarks/bench_checkpoint.py            # 2**20 rows, 7 interleaved rounds
    python benchmarks/bench_checkpoint.py --quick    # 2 rounds (a smoke run)
    python benchmarks/bench_checkpoint.py --dir /data --json results.json

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
    ``rb._image.dump()`` alone: how long a save holds the buffer's lock.

Both sides read files they have just written, so loads come from the page cache. The table gives
the median (min) milliseconds and the ratios ours/numpy (below 1: ours is faster).
"""

from __future__ import annotations

import argparse
import json
import os
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


def timed(call: Callable[[], Any]) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 rounds")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--dir", default=tempfile.gettempdir(),
                        help="where the files go (default: the temporary directory)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--exponent", type=int, default=20, help="capacity 2**EXPONENT")
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
        for _ in range(plan["rounds"]):
            times["save"].append(timed(lambda: rb.save(ours_file)))
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
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"info": info, "capacity": capacity, "sizes": sizes, "times_s": times,
                       "stats": stats, "ratios": ratios}, handle, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
