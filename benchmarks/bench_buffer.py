"""Benchmark: cpprb_ray's PrioritizedReplayBuffer against cpprb's, one operation at a time.

Run from the repository root (after ``python setup.py build_ext --inplace``, or with cpprb_ray
installed)::

    python benchmarks/bench_buffer.py            # full run
    python benchmarks/bench_buffer.py --quick    # fewer, shorter rounds (a smoke run)
    python benchmarks/bench_buffer.py --json results.json

Both buffers hold the same transition (obs float32[4], act int64, rew float32, next_obs
float32[4], done float32), use alpha=0.6, eps=1e-4, and are filled to capacity with large batched
adds and random priorities before anything is timed. At each capacity (2**10, 2**17, 2**20,
2**22) every operation below is timed on both, in the same process, in interleaved rounds:

sample(256)
    ``sample(256, beta=0.4)``.
update(256)
    ``update_priorities(indexes, priorities)``: indexes from an earlier sample of the same buffer,
    fresh random float32 priorities on every call.
update(256)+gen
    Ours with the ``generations`` of that sample too (skips rows overwritten since; cpprb has no
    such argument, so its column repeats its plain update).
sample+update(256)
    One learner step: ``sample(256, beta=0.4)``, then ``update_priorities`` of the sampled
    indexes with fresh random float32 priorities. cpprb defers part of an update's tree work to
    its next sample, so its update alone can look cheaper or dearer than its share of this step
    (its update-alone time moves between about 16 and 70 µs at 2**20 with its internal state);
    this op charges every deferred cost to someone.
add(1) py
    One transition as an RL actor adds it: obs/next_obs float32[4] arrays, act/rew/done Python
    scalars.
add(1) np
    The same with numpy scalars (np.int64 act, np.float32 rew and done).
add(64)
    A batch of 64 transitions, every column an array of its dtype.

Inputs are drawn before timing into pools that the calls cycle through, so random number
generation is timed for neither library. Each round times a batch of calls sized to last about
``target`` seconds; the table shows the median (and min) over rounds of the mean per call.
Adds go into the full buffer, overwriting the oldest rows, as in a running experiment.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from typing import Any, Dict, List

import numpy as np

if __package__:
    from . import _common as common
else:  # run as a script: this file's folder is sys.path[0]
    import _common as common

EXPONENTS = (10, 17, 20, 22)
BATCH = 256
OPS = ("sample(256)", "update(256)", "update(256)+gen", "sample+update(256)", "add(1) py",
       "add(1) np", "add(64)")
FULL = {"rounds": 21, "target_s": 0.02}
QUICK = {"rounds": 3, "target_s": 0.005}
POOL = 4096  # inputs per pool; a power of two so that `k & (POOL - 1)` cycles through it

# The targets at 2**20: cpprb's time / ours must be at least this.
TARGETS = {"sample(256)": 10.0, "update(256)": 3.0, "add(1) py": 10.0, "add(64)": 5.0}
SCALING_TARGET = 2.0  # ours sample(256) at 2**22 / at 2**10


def make_buffers(cpprb_ray, cpprb, capacity: int, seed: int):
    """(ours, cpprb's) PrioritizedReplayBuffer, both filled to `capacity` with the same rows."""
    ours = cpprb_ray.PrioritizedReplayBuffer(
        capacity, common.env_dict(), alpha=common.ALPHA, eps=common.EPS, seed=seed
    )
    try:
        theirs = cpprb.PrioritizedReplayBuffer(
            capacity, common.env_dict(), alpha=common.ALPHA, eps=common.EPS
        )
        common.fill(ours, capacity, np.random.default_rng(seed))
        common.fill(theirs, capacity, np.random.default_rng(seed))
    except BaseException:
        ours.close()
        raise
    return ours, theirs


def check_same_output(ours, theirs) -> None:
    """Both samples have the same keys, shapes and dtypes, so the same work is being timed."""
    a, b = ours.sample(BATCH, beta=common.BETA), theirs.sample(BATCH, beta=common.BETA)
    for key in list(common.ENV_DICT) + ["weights"]:
        assert a[key].shape == b[key].shape, (key, a[key].shape, b[key].shape)
        assert a[key].dtype == b[key].dtype, (key, a[key].dtype, b[key].dtype)
    assert a["indexes"].shape == b["indexes"].shape == (BATCH,)


def single_pools(rng: np.random.Generator, numpy_scalars: bool) -> List[Dict[str, Any]]:
    """POOL one-transition add() kwargs, as an actor passes them."""
    rows = common.random_rows(rng, POOL)
    if numpy_scalars:
        acts, rews, dones = list(rows["act"]), list(rows["rew"]), list(rows["done"])
    else:
        acts, rews = rows["act"].tolist(), rows["rew"].tolist()
        dones = rows["done"].tolist()
    return [
        {"obs": rows["obs"][k].copy(), "act": acts[k], "rew": rews[k],
         "next_obs": rows["next_obs"][k].copy(), "done": dones[k]}
        for k in range(POOL)
    ]


def batch_pool(rng: np.random.Generator, rows: int, count: int) -> List[Dict[str, np.ndarray]]:
    """`count` add() kwargs of `rows` transitions each (separate, contiguous arrays)."""
    return [common.random_rows(rng, rows) for _ in range(count)]


def op_calls(op: str, ours, theirs, rng: np.random.Generator) -> Dict[str, Any]:
    """{"ours": call, "cpprb": call}, where ``call(number)`` runs `op` `number` times.

    Pools are built here, outside any timed region. Update pools take their indexes from samples
    of the same buffer, drawn right before the update is timed.
    """
    mask = POOL - 1
    if op == "sample(256)":
        def sampler(buffer):
            sample = buffer.sample

            def call(number):
                for _ in range(number):
                    sample(BATCH, common.BETA)
            return call
        return {"ours": sampler(ours), "cpprb": sampler(theirs)}

    if op.startswith("update"):
        count = 256  # distinct samples to draw indexes from; each used POOL / count times
        priorities = [common.random_priorities(rng, BATCH) for _ in range(POOL)]
        ours_samples = [ours.sample(BATCH, beta=common.BETA) for _ in range(count)]
        theirs_indexes = [theirs.sample(BATCH, beta=common.BETA)["indexes"]
                          for _ in range(count)]
        ours_indexes = [s["indexes"] for s in ours_samples]
        generations = [s["generations"] for s in ours_samples]
        with_generations = op.endswith("+gen")

        def ours_call(number):
            update = ours.update_priorities
            if with_generations:
                for k in range(number):
                    update(ours_indexes[k % count], priorities[k & mask],
                           generations[k % count])
            else:
                for k in range(number):
                    update(ours_indexes[k % count], priorities[k & mask])

        def theirs_call(number):
            update = theirs.update_priorities
            for k in range(number):
                update(theirs_indexes[k % count], priorities[k & mask])
        return {"ours": ours_call, "cpprb": theirs_call}

    if op == "sample+update(256)":
        priorities = [common.random_priorities(rng, BATCH) for _ in range(POOL)]

        def stepper(buffer):
            sample, update = buffer.sample, buffer.update_priorities

            def call(number):
                for k in range(number):
                    update(sample(BATCH, common.BETA)["indexes"], priorities[k & mask])
            return call
        return {"ours": stepper(ours), "cpprb": stepper(theirs)}

    if op.startswith("add(1)"):
        pool = single_pools(rng, numpy_scalars=op.endswith("np"))
    elif op == "add(64)":
        pool = batch_pool(rng, 64, POOL)
    else:
        raise ValueError(op)

    def adder(buffer):
        add = buffer.add

        def call(number):
            for k in range(number):
                add(**pool[k & mask])
        return call
    return {"ours": adder(ours), "cpprb": adder(theirs)}


def bench_capacity(cpprb_ray, cpprb, exponent: int, plan: Dict[str, Any], seed: int) -> list:
    """Fill both buffers at 2**`exponent` rows, time every op in OPS; one result row per op."""
    capacity = 2**exponent
    rng = np.random.default_rng(seed + 1000 * exponent)
    ours, theirs = make_buffers(cpprb_ray, cpprb, capacity, seed + exponent)
    name = ours.name
    results = []
    try:
        check_same_output(ours, theirs)
        for op in OPS:
            calls = op_calls(op, ours, theirs, rng)
            runs = {}
            for side, call in calls.items():
                call(min(64, POOL))  # warm up: caches, lazy imports, branch predictors
                runs[side] = (call, common.calibrate(call, plan["target_s"]))
            times = common.interleaved_times(runs, plan["rounds"])
            row: Dict[str, Any] = {"op": op, "capacity": capacity, "exponent": exponent}
            for side, series in times.items():
                stats = common.summarize(series)
                row[f"{side}_median_us"] = stats["median_us"]
                row[f"{side}_min_us"] = stats["min_us"]
                row[f"{side}_calls_per_round"] = runs[side][1]
            row["speedup"] = row["cpprb_median_us"] / row["ours_median_us"]
            # The least disturbed rounds of each side: steadier than the median under load.
            row["speedup_min"] = row["cpprb_min_us"] / row["ours_min_us"]
            results.append(row)
    finally:
        ours.close()
        del theirs
        gc.collect()
    # close() frees the segment; a leftover one would be a cpprb_ray bug worth reporting.
    assert not common.segment_exists(name), f"/dev/shm/{name} left behind after close()"
    return results


# ---------------------------------------------------------------------------------------------
# Report


def table(results: list) -> str:
    """The Markdown table printed at the end: one line per (op, capacity)."""
    rows = []
    for op in OPS:
        for r in results:
            if r["op"] != op:
                continue
            rows.append([
                op, f"2^{r['exponent']}",
                f"{r['ours_median_us']:.2f} ({r['ours_min_us']:.2f})",
                f"{r['cpprb_median_us']:.2f} ({r['cpprb_min_us']:.2f})",
                f"{r['speedup']:.1f}x",
            ])
    return common.markdown_table(
        ["op", "capacity", "ours µs median (min)", "cpprb µs median (min)", "speedup"],
        rows, "lrrrr")


def summary(results: list) -> list:
    """The issue's targets, computed from `results` (only those the run measured).

    Each verdict needs the ratio of the medians and the ratio of the minima to agree (see
    _common.verdict); both are shown.
    """
    found = {(r["op"], r["exponent"]): r for r in results}
    lines = []
    for op, target in TARGETS.items():
        r = found.get((op, 20))
        if r is not None:
            verdict = common.verdict(r["speedup"] >= target, r["speedup_min"] >= target)
            lines.append(f"target {op} at 2^20 >= {target:g}x faster than cpprb: {verdict} "
                         f"({r['speedup']:.1f}x; {r['speedup_min']:.1f}x min over min)")
    low, high = found.get(("sample(256)", 10)), found.get(("sample(256)", 22))
    if low is not None and high is not None:
        ours = high["ours_median_us"] / low["ours_median_us"]
        theirs = high["cpprb_median_us"] / low["cpprb_median_us"]
        ours_min = high["ours_min_us"] / low["ours_min_us"]
        verdict = common.verdict(ours <= SCALING_TARGET, ours_min <= SCALING_TARGET)
        lines.append(f"target sample(256) at 2^22 <= {SCALING_TARGET:g}x its cost at 2^10: "
                     f"{verdict} (ours {ours:.2f}x, {ours_min:.2f}x min over min; "
                     f"cpprb {theirs:.2f}x)")
    return lines


def parse_args(argv=None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer, shorter rounds (smoke run)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--seed", type=int, default=0, help="seed of all random inputs")
    parser.add_argument("--exponents", type=int, nargs="+", default=list(EXPONENTS),
                        metavar="E", help="capacities 2**E to measure (default: 10 17 20 22)")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    """Run the benchmark, print the report, write --json; returns the exit status."""
    args = parse_args(argv)
    cpprb_ray = common.import_cpprb_ray()
    import cpprb

    plan = dict(QUICK if args.quick else FULL)
    info = common.run_info(args.quick)
    info.update({"plan": plan, "batch": BATCH, "pool": POOL, "alpha": common.ALPHA,
                 "eps": common.EPS, "beta": common.BETA})
    print(common.header(info), flush=True)
    started = time.perf_counter()
    results: list = []
    for exponent in args.exponents:
        results.extend(bench_capacity(cpprb_ray, cpprb, exponent, plan, args.seed))
        print(f"  2^{exponent} done ({time.perf_counter() - started:.0f} s)", file=sys.stderr)
    info["load_average_after"] = os.getloadavg()
    print(f"{'quick' if args.quick else 'full'} run: {plan['rounds']} rounds of "
          f"~{1e3 * plan['target_s']:g} ms per op and side; µs per call, median (min) over rounds;"
          f" speedup = cpprb median / ours median")
    print(table(results))
    for line in summary(results):
        print(line)
    common.write_json(args.json, {"info": info, "results": results, "summary": summary(results)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
