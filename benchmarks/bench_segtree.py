"""Benchmark: cpprb_ray's 8-ary segment tree against RLlib's pure-Python segment trees.

Run from the repository root (after ``python setup.py build_ext --inplace``, or with cpprb_ray
installed)::

    python benchmarks/bench_segtree.py            # full run
    python benchmarks/bench_segtree.py --quick    # fewer repeats
    python benchmarks/bench_segtree.py --json results.json

Both sides do the work one prioritized-replay step does with 256 items, at 2**10, 2**17, 2**20
and 2**22 leaves, all leaves holding a priority:

set(256)
    ours: ``tree.set(indices, values)`` (sum and min in one call). RLlib: ``sum_tree[i] = v`` and
    ``min_tree[i] = v`` for each of the 256 items, as its PrioritizedReplayBuffer does.
sample(256)
    ours: ``tree.sample(256, rng)``, stratified. RLlib: 256 stratified masses
    ``(k + random.random()) * total / 256`` and ``find_prefixsum_idx(mass)`` for each. (RLlib's
    own ``_sample_proportional`` draws independent masses and calls ``sum()`` once per item on
    top; computing the total once makes RLlib faster here, so the speedups are conservative.)

``--scaling`` times only our sample(256), on trees that differ in one thing each (how many leaves
are live, shared or private huge-page memory), to show where the cost of a 2**22 tree goes.

Every call gets fresh random indices/values; the median over repeats of the mean per call is
reported. RLlib's find_prefixsum_idx asserts on each call; it is measured as shipped (run without
``python -O``).
"""

from __future__ import annotations

import argparse
import gc
import glob
import importlib
import json
import mmap
import os
import platform
import random
import statistics
import sys
import time

import numpy as np

EXPONENTS = (10, 17, 20, 22)
BATCH = 256
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Calls timed together per side (ours take microseconds, RLlib's milliseconds), and rounds.
FULL = {"ours": 200, "rllib": 4, "rounds": 31}
QUICK = {"ours": 50, "rllib": 2, "rounds": 5}


def _common_module():
    """benchmarks/_common.py, whether this file runs as a script or as part of the package."""
    if __package__:
        return importlib.import_module(f"{__package__}._common")
    return importlib.import_module("_common")  # as a script, this file's folder is sys.path[0]


def import_targets():
    """Return (cpprb_ray._segtree, RLlib's segment_tree module).

    A cpprb_ray built in place in this checkout is preferred to an installed one, so that the
    benchmark measures the working tree it sits in.
    """
    if glob.glob(os.path.join(REPO_ROOT, "cpprb_ray", "_segtree*.so")):
        sys.path.insert(0, REPO_ROOT)
    if __package__:
        loader = importlib.import_module(f"{__package__}._rllib_tree")
    else:  # run as a script: this file's folder is sys.path[0]
        loader = importlib.import_module("_rllib_tree")
    return importlib.import_module("cpprb_ray._segtree"), loader.load_rllib_segment_tree()


# ---------------------------------------------------------------------------------------------
# Filling RLlib's trees


def rllib_levels(leaves: np.ndarray, reduce) -> list:
    """RLlib's internal ``value`` list for these leaves, built bottom-up with numpy.

    RLlib keeps a binary heap in one list of 2 * capacity entries: leaves in the second half,
    node i = op(node 2i, node 2i + 1), entry 0 unused. Filling 2**22 leaves through
    ``tree[i] = v`` would take minutes of Python; this computes the very same values (the same
    pairwise operations) in well under a second.
    """
    capacity = leaves.size
    value = np.empty(2 * capacity)
    value[capacity:] = leaves
    width = capacity // 2
    while width >= 1:
        value[width : 2 * width] = reduce(value[2 * width : 4 * width : 2],
                                          value[2 * width + 1 : 4 * width : 2])
        width //= 2
    value[0] = value[1]  # unused by RLlib; any float keeps the list homogeneous
    return value.tolist()


def fill_rllib(rllib, leaves: np.ndarray):
    """RLlib (sum tree, min tree) holding `leaves`."""
    capacity = leaves.size
    sum_tree, min_tree = rllib.SumSegmentTree(capacity), rllib.MinSegmentTree(capacity)
    sum_tree.value = rllib_levels(leaves, np.add)
    min_tree.value = rllib_levels(leaves, np.minimum)
    return sum_tree, min_tree


def check_fill(rllib) -> None:
    """The numpy fill equals filling through RLlib's own __setitem__ (on a small tree)."""
    leaves = np.random.default_rng(1).uniform(0.1, 10.0, size=64)
    sum_fast, min_fast = fill_rllib(rllib, leaves)
    sum_slow, min_slow = rllib.SumSegmentTree(64), rllib.MinSegmentTree(64)
    for index, value in enumerate(leaves.tolist()):
        sum_slow[index] = value
        min_slow[index] = value
    assert sum_fast.value[1:] == sum_slow.value[1:], "numpy fill differs from RLlib's sums"
    assert min_fast.value[1:] == min_slow.value[1:], "numpy fill differs from RLlib's mins"


# ---------------------------------------------------------------------------------------------
# Timing


def interleaved_times(runs: dict, rounds: int) -> dict:
    """Seconds per call of each ``runs[key] = (run_batch, number)``, one list entry per round,
    after one warm-up call of each; the rounds interleave the runs with the garbage collector off
    (benchmarks/_common.py), so that a burst of outside load hits ours and RLlib's alike and
    RLlib's 8M-entry lists are not traversed by whichever call triggers a collection."""
    for run_batch, _ in runs.values():
        run_batch(1)  # warm caches and any lazy initialization
    return _common_module().interleaved_times(runs, rounds)


def bench_capacity(segtree, rllib, exponent: int, plan: dict, seed: int) -> dict:
    capacity = 2**exponent
    rng = np.random.default_rng(seed + exponent)
    leaves = rng.uniform(0.1, 10.0, size=capacity)

    # Ours, in page-aligned memory like a shared-memory segment.
    memory = mmap.mmap(-1, segtree.SegmentTree.nbytes(capacity))
    tree = segtree.SegmentTree(memory, capacity)
    tree.set(np.arange(capacity), leaves)
    sum_tree, min_tree = fill_rllib(rllib, leaves)
    assert abs(tree.total() - sum_tree.sum()) <= 1e-9 * tree.total()
    assert tree.min() == min_tree.min()

    our_number, rllib_number = plan["ours"], plan["rllib"]
    # Fresh indices and priorities for every call, generated before timing.
    calls = max(our_number, rllib_number) + 1
    set_indices = rng.integers(0, capacity, size=(calls, BATCH))
    set_values = rng.uniform(0.1, 10.0, size=(calls, BATCH))
    set_lists = [
        (set_indices[k].tolist(), set_values[k].tolist()) for k in range(rllib_number + 1)
    ]

    def ours_set(number):
        for k in range(number):
            tree.set(set_indices[k], set_values[k])

    def rllib_set(number):
        for k in range(number):
            indices, values = set_lists[k]
            for index, value in zip(indices, values):
                sum_tree[index] = value
                min_tree[index] = value

    generator = segtree.Random(seed)

    def ours_sample(number):
        for _ in range(number):
            tree.sample(BATCH, generator)

    uniform = random.Random(seed).random

    def rllib_sample(number):
        for _ in range(number):
            stratum = sum_tree.sum() / BATCH
            [sum_tree.find_prefixsum_idx((k + uniform()) * stratum) for k in range(BATCH)]

    times = interleaved_times(
        {
            "ours_set": (ours_set, our_number),
            "rllib_set": (rllib_set, rllib_number),
            "ours_sample": (ours_sample, our_number),
            "rllib_sample": (rllib_sample, rllib_number),
        },
        plan["rounds"],
    )
    result = {"capacity": capacity, "exponent": exponent}
    for key, series in times.items():
        result[f"{key}_us"] = 1e6 * statistics.median(series)  # what the table shows
        result[f"{key}_min_us"] = 1e6 * min(series)  # the least disturbed round, for reference
    result["set_speedup"] = result["rllib_set_us"] / result["ours_set_us"]
    result["sample_speedup"] = result["rllib_sample_us"] / result["ours_sample_us"]
    tree.release()
    memory.close()
    return result


# ---------------------------------------------------------------------------------------------
# Where the cost of a large tree goes (--scaling)

# (label, exponent, live leaves, memory): our sample(256) on trees that differ in one thing each.
SCALING_CASES = (
    ("2^10, all leaves live (the reference)", 10, 2**10, "shared"),
    ("2^22, only 2^12 leaves live: 8 levels, every line cached", 22, 2**12, "shared"),
    ("2^22, only 2^18 leaves live: 8 levels, lines within L3", 22, 2**18, "shared"),
    ("2^22, all leaves live, shared memory (4 KiB pages)", 22, 2**22, "shared"),
    ("2^22, all leaves live, private memory with MADV_HUGEPAGE", 22, 2**22, "huge"),
)


def scaling_memory(nbytes: int, kind: str) -> mmap.mmap:
    """Anonymous memory: shared (as a segment; no huge pages where shmem_enabled is never) or
    private with MADV_HUGEPAGE where this Python and kernel offer it (transparent huge pages)."""
    if kind == "shared":
        return mmap.mmap(-1, nbytes)
    # 2 MiB of slack so that the kernel can align huge pages inside the mapping.
    memory = mmap.mmap(-1, nbytes + (2 << 20), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(memory, "madvise") and hasattr(mmap, "MADV_HUGEPAGE"):
        memory.madvise(mmap.MADV_HUGEPAGE)
    return memory


def scaling_breakdown(segtree, plan: dict, seed: int) -> list:
    """Our sample(256) for each of SCALING_CASES, timed in interleaved rounds.

    A 2**22 tree has 8 levels against 4 at 2**10, so even with every line in cache its sample
    does about twice the work; the other cases add what the cache and the TLB cost on top."""
    trees, memories, runs = [], [], {}
    try:
        for label, exponent, live, kind in SCALING_CASES:
            capacity = 2**exponent
            memory = scaling_memory(segtree.SegmentTree.nbytes(capacity), kind)
            memories.append(memory)
            tree = segtree.SegmentTree(memory, capacity)
            trees.append(tree)
            rng = np.random.default_rng(seed + exponent)
            tree.set(np.arange(live), rng.uniform(0.1, 10.0, size=live))
            generator = segtree.Random(seed)

            def run(number, tree=tree, generator=generator):
                for _ in range(number):
                    tree.sample(BATCH, generator)
            runs[label] = (run, plan["ours"])
        times = interleaved_times(runs, plan["rounds"])
    finally:
        for tree in trees:
            tree.release()
        for memory in memories:
            memory.close()
    reference = min(times[SCALING_CASES[0][0]])
    return [{"case": label, "median_us": 1e6 * statistics.median(times[label]),
             "min_us": 1e6 * min(times[label]), "ratio_of_minima": min(times[label]) / reference}
            for label, *_ in SCALING_CASES]


def scaling_table(rows: list) -> str:
    lines = ["| our sample(256) on | µs median (min) | / 2^10 (of the minima) |",
             "|:---|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['case']} | {r['median_us']:.2f} ({r['min_us']:.2f}) "
                     f"| {r['ratio_of_minima']:.2f}x |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Report


def table(results: list) -> str:
    """Markdown table: median (min) µs per call of 256 items; speedup = RLlib / ours medians."""
    header = (
        "| capacity | ours set µs | rllib set µs | set speedup "
        "| ours sample µs | rllib sample µs | sample speedup |"
    )
    lines = [header, "|" + "---:|" * 7]

    def cell(r, key, digits):
        return f"{r[key + '_us']:.{digits}f} ({r[key + '_min_us']:.{digits}f})"

    for r in results:
        lines.append(
            f"| 2^{r['exponent']} | {cell(r, 'ours_set', 1)} | {cell(r, 'rllib_set', 0)} "
            f"| {r['set_speedup']:.0f}x | {cell(r, 'ours_sample', 1)} "
            f"| {cell(r, 'rllib_sample', 0)} | {r['sample_speedup']:.0f}x |"
        )
    return "\n".join(lines)


def summary(results: list) -> list:
    """The scaling line and the issue's two targets, computed from `results`."""
    by_exponent = {r["exponent"]: r for r in results}
    lines = []
    if 10 in by_exponent and 22 in by_exponent:
        ratio = by_exponent[22]["ours_sample_us"] / by_exponent[10]["ours_sample_us"]
        of_minima = by_exponent[22]["ours_sample_min_us"] / by_exponent[10]["ours_sample_min_us"]
        lines.append(f"ours sample(256) at 2^22 / at 2^10 = {ratio:.2f} (of the minima: "
                     f"{of_minima:.2f})")
        lines.append(f"target sample(256) at 2^22 <= 2x its cost at 2^10: "
                     f"{_common_module().verdict(ratio <= 2.0, of_minima <= 2.0)}")
    if 20 in by_exponent:
        r = by_exponent[20]
        speedup = r["sample_speedup"]
        of_minima = r["rllib_sample_min_us"] / r["ours_sample_min_us"]
        lines.append(f"target sample(256) at 2^20 >= 100x faster than RLlib: "
                     f"{_common_module().verdict(speedup >= 100.0, of_minima >= 100.0)} "
                     f"({speedup:.0f}x; of the "
                     f"minima: {of_minima:.0f}x)")
    return lines


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats (a smoke run)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--seed", type=int, default=0, help="seed of all random inputs")
    parser.add_argument("--scaling", action="store_true",
                        help="only our tree: where the cost of sample(256) at 2^22 goes")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    segtree, rllib = import_targets()
    if args.scaling:
        rows = scaling_breakdown(segtree, QUICK if args.quick else FULL, args.seed)
        print(f"machine: {_common_module().machine()}; Python {platform.python_version()}; "
              f"load average {os.getloadavg()[0]:.2f}")
        print(scaling_table(rows))
        if args.json:
            with open(args.json, "w", encoding="utf-8") as handle:
                json.dump({"scaling": rows}, handle, indent=2)
        return 0
    check_fill(rllib)
    plan = QUICK if args.quick else FULL
    started = time.perf_counter()
    results = []
    for exponent in EXPONENTS:
        results.append(bench_capacity(segtree, rllib, exponent, plan, args.seed))
        gc.collect()  # free RLlib's lists before building the next, larger ones
        print(f"  2^{exponent} done ({time.perf_counter() - started:.0f} s)", file=sys.stderr)

    import ray  # only for its version, once everything is measured

    info = {
        "machine": _common_module().machine(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "ray": ray.__version__,
        "rllib_segment_tree": rllib.__file__,
        "command": " ".join(["python"] + sys.argv),
        "quick": args.quick,
        "plan": plan,
        "batch": BATCH,
        "load_average_1_5_15": os.getloadavg(),
    }
    print(f"machine: {info['machine']}; Python {info['python']}, numpy {info['numpy']}, "
          f"ray {info['ray']}; {'quick' if args.quick else 'full'} run; load average "
          f"{info['load_average_1_5_15'][0]:.2f}")
    print("µs per call of 256 items, median (min) over rounds; speedup = RLlib / ours medians")
    print(table(results))
    for line in summary(results):
        print(line)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump({"info": info, "results": results, "summary": summary(results)}, handle,
                      indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
