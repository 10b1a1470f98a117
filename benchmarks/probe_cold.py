"""Where a cold call's time goes: the figures behind docs/benchmarks.md's "learner step, cold".

Run from the repository root (cpprb_ray built in place, e.g. by ``make venv``)::

    .venv/bin/python benchmarks/probe_cold.py            # about 1 minute
    .venv/bin/python benchmarks/probe_cold.py --quick    # a smoke run

Every call is timed alone after a 64 MiB in-place sweep (as the headline's cold row does), in
rounds that rotate through all the calls, so each finds the caches and the TLB as a learner
finds them after its network step. Printed: median, 25th percentile and minimum in µs of

- an empty method call of a buffer handle (what any cold call pays before doing anything);
- ``sample(1)`` and ``update_priorities`` of one index at 2^20 rows (the fixed part);
- ``sample(256)`` at 2^10 and at 2^20 rows, and ``update_priorities(256)`` of its indexes
  (what the buffer's size adds: the tree's lower levels and the rows miss in every cache);
- ``SegmentTree.sample(256)`` of the bare 2^20 tree in 4 KiB shared-memory pages (a file in
  /dev/shm mapped by ``mmap.mmap``, as a buffer's segment was before it asked for huge pages)
  and in an anonymous mapping with ``MADV_HUGEPAGE`` (2 MiB pages where transparent huge pages
  are allowed): the share of the TLB misses.

The buffers themselves ask for 2 MiB pages (docs/design.md, "Huge pages"); the first line
printed says how much of each they got (``CPPRB_RAY_HUGE_PAGES=0`` to compare without).
"""

from __future__ import annotations

import argparse
import gc
import mmap
import os
import sys
import time
from typing import Callable, Dict, List

import numpy as np

if __package__:
    from . import _common as common
else:  # run as a script: this file's folder is sys.path[0]
    import _common as common

from cpprb_ray import PrioritizedReplayBuffer
from cpprb_ray._segtree import Random, SegmentTree

SWEEP_BYTES = 64 << 20
HUGE = 2 << 20


def filled(capacity: int, seed: int) -> PrioritizedReplayBuffer:
    """A buffer of the benchmarks' transition, filled to `capacity` with random priorities."""
    buffer = PrioritizedReplayBuffer(capacity, common.env_dict(), alpha=common.ALPHA,
                                     eps=common.EPS, seed=seed)
    common.fill(buffer, capacity, np.random.default_rng(seed))
    return buffer


def page_setting() -> str:
    try:
        with open("/sys/kernel/mm/transparent_hugepage/shmem_enabled") as handle:
            shmem = handle.read().split("[")[1].split("]")[0]
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as handle:
            anon = handle.read().split("[")[1].split("]")[0]
    except (OSError, IndexError):
        return "transparent huge pages: unknown"
    return f"transparent huge pages: anonymous memory {anon}, shared memory {shmem}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a few rounds (a smoke run)")
    parser.add_argument("--rounds", type=int, default=None)
    args = parser.parse_args()
    rounds = args.rounds or (20 if args.quick else 400)

    big, small = filled(1 << 20, 1), filled(1 << 10, 2)
    location = f"/dev/shm/cpprb_ray-probe-{os.getpid()}"
    capacity = 1 << 20
    nbytes = SegmentTree.nbytes(capacity)
    descriptor = os.open(location, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    anonymous = mmap.mmap(-1, nbytes + HUGE)
    try:
        os.ftruncate(descriptor, nbytes)
        shared = mmap.mmap(descriptor, nbytes)
        if hasattr(mmap, "MADV_HUGEPAGE"):
            anonymous.madvise(mmap.MADV_HUGEPAGE)
        start = (-np.frombuffer(anonymous, np.uint8, count=1).ctypes.data) % HUGE
        trees = {"4 KiB pages (shm)": SegmentTree(shared, capacity),
                 "2 MiB pages (anon)": SegmentTree(memoryview(anonymous)[start:start + nbytes],
                                                   capacity)}
        weights = np.random.default_rng(3).random(capacity)
        for tree in trees.values():
            tree.set(np.arange(capacity), weights)
        rng = Random(4)
        priorities = common.random_priorities(np.random.default_rng(5), 256)
        big_batch, small_batch = big.sample(256), small.sample(256)
        calls: Dict[str, Callable[[], object]] = {
            "empty method call": big.get_buffer_size,
            "sample(1), 2^20": lambda: big.sample(1, 0.4),
            "update(1), 2^20": lambda: big.update_priorities(
                big_batch["indexes"][:1], priorities[:1], big_batch["generations"][:1]),
            "sample(256), 2^10": lambda: small.sample(256, 0.4),
            "sample(256), 2^20": lambda: big.sample(256, 0.4),
            "update(256), 2^10": lambda: small.update_priorities(
                small_batch["indexes"], priorities, small_batch["generations"]),
            "update(256), 2^20": lambda: big.update_priorities(
                big_batch["indexes"], priorities, big_batch["generations"]),
        }
        for name, tree in trees.items():
            calls[f"bare tree sample(256), {name}"] = (lambda tree=tree: tree.sample(256, rng))
        sweep = np.ones(SWEEP_BYTES // 8, np.int64)
        times: Dict[str, List[int]] = {name: [] for name in calls}
        names = list(calls)
        gc.disable()
        try:
            for round_ in range(rounds):
                for name in names[round_ % len(names):] + names[:round_ % len(names)]:
                    np.add(sweep, 1, out=sweep)
                    began = time.perf_counter_ns()
                    calls[name]()
                    times[name].append(time.perf_counter_ns() - began)
        finally:
            gc.enable()
        print(f"{rounds} rounds, each call after a {SWEEP_BYTES >> 20} MiB sweep; "
              f"{page_setting()}; buffers in 2 MiB pages: "
              f"{big.stats()['huge_page_bytes'] >> 20} MiB at 2^20, "
              f"{small.stats()['huge_page_bytes'] >> 20} MiB at 2^10; "
              f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        print("| call | median µs | p25 µs | min µs |\n|:---|---:|---:|---:|")
        for name in names:
            series = np.sort(np.array(times[name])) / 1000.0
            print(f"| {name} | {np.median(series):.1f} | {np.quantile(series, 0.25):.1f} | "
                  f"{series[0]:.1f} |")
        for tree in trees.values():
            tree.release()
        shared.close()
    finally:
        os.close(descriptor)
        os.unlink(location)
        anonymous.close()
        big.close()
        small.close()
    sys.stdout.flush()


if __name__ == "__main__":
    main()
