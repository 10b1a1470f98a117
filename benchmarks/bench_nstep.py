"""Benchmark: the cost of N-step staging on add, against a plain add and against cpprb's Nstep.

Run from the repository root::

    python benchmarks/bench_nstep.py            # 2**20 rows, 21 interleaved rounds
    python benchmarks/bench_nstep.py --quick    # fewer, shorter rounds (a smoke run)
    python benchmarks/bench_nstep.py --json results.json

Four prioritized buffers of the transition of bench_buffer.py (obs float32[4], act int64, rew
float32, next_obs float32[4], done float32; alpha=0.6) at 2**20 rows, filled before timing:
cpprb_ray without and with ``Nstep={"size": 3, "gamma": 0.99, ...}``, cpprb without and with the
same. Each op is timed on all four in interleaved rounds (see benchmarks/_common.py):

add(1)
    One transition as an actor adds it (obs arrays, Python scalars), done=1 on 5% of the steps,
    and ``on_episode_end()`` after each of those, as cpprb's Nstep needs (ours commits on done
    by itself; the call is then a no-op).
add(1)+prio
    The same with a Python float priority per step (Ape-X actors).
add(64)
    Batches of 64 consecutive steps of one stream, same done rate and on_episode_end.

The table gives the median (min) microseconds per call and the ratios: ours with N-step against
ours without, and cpprb with N-step against ours with N-step.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Callable, Dict, List

import numpy as np

if __package__:
    from . import _common as common
else:  # run as a script: this file's folder is sys.path[0]
    import _common as common

NSTEP = {"size": 3, "gamma": 0.99, "rew": "rew", "next": "next_obs"}
OPS = ("add(1)", "add(1)+prio", "add(64)")
SIDES = ("ours", "ours nstep", "cpprb", "cpprb nstep")
FULL = {"rounds": 21, "target_s": 0.02}
QUICK = {"rounds": 3, "target_s": 0.005}
POOL = 4096
DONE_RATE = 0.05


def make_buffers(cpprb_ray, cpprb, capacity: int) -> Dict[str, Any]:
    def theirs(**extra):
        return cpprb.PrioritizedReplayBuffer(capacity, common.env_dict(), alpha=common.ALPHA,
                                             eps=common.EPS, **extra)

    def ours(**extra):
        return cpprb_ray.PrioritizedReplayBuffer(capacity, common.env_dict(), alpha=common.ALPHA,
                                                 eps=common.EPS, **extra)
    return {"ours": ours(), "ours nstep": ours(Nstep=dict(NSTEP)), "cpprb": theirs(),
            "cpprb nstep": theirs(Nstep=dict(NSTEP))}


def fill(buffers: Dict[str, Any], capacity: int, rng: np.random.Generator) -> None:
    """Fill every buffer to capacity (N-step ones through their own staging)."""
    for key, buffer in buffers.items():
        rows = common.random_rows(rng, 1 << 14)
        while buffer.get_stored_size() < capacity:
            buffer.add(**rows)
            buffer.on_episode_end()
        assert buffer.get_stored_size() == capacity, key


def single_pool(rng: np.random.Generator) -> List[Dict[str, Any]]:
    rows = common.random_rows(rng, POOL)
    dones = (rng.random(POOL) < DONE_RATE).astype(np.float32).tolist()
    return [{"obs": rows["obs"][k].copy(), "act": int(rows["act"][k]),
             "rew": float(rows["rew"][k]), "next_obs": rows["next_obs"][k].copy(),
             "done": dones[k]} for k in range(POOL)]


def op_calls(op: str, buffers: Dict[str, Any], rng: np.random.Generator
             ) -> Dict[str, Callable[[int], None]]:
    mask = POOL - 1
    if op == "add(64)":
        batches = []
        for _ in range(256):
            rows = common.random_rows(rng, 64)
            rows["done"] = (rng.random(64) < DONE_RATE).astype(np.float32)
            batches.append(rows)
        ends = [bool(b["done"][-1]) for b in batches]

        def batch_adder(buffer):
            add, end = buffer.add, buffer.on_episode_end

            def call(number):
                for k in range(number):
                    add(**batches[k & 255])
                    if ends[k & 255]:
                        end()
            return call
        return {key: batch_adder(buffer) for key, buffer in buffers.items()}

    pool = single_pool(rng)
    priorities = rng.uniform(0.01, 10.0, size=POOL).tolist()
    with_priorities = op.endswith("+prio")

    def adder(buffer):
        add, end = buffer.add, buffer.on_episode_end

        def call(number):
            for k in range(number):
                step = pool[k & mask]
                if with_priorities:
                    add(priorities=priorities[k & mask], **step)
                else:
                    add(**step)
                if step["done"]:
                    end()
        return call
    return {key: adder(buffer) for key, buffer in buffers.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer, shorter rounds")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--exponent", type=int, default=20, help="capacity 2**EXPONENT")
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else FULL
    cpprb_ray = common.import_cpprb_ray()
    import cpprb

    info = common.run_info(args.quick)
    print(common.header(info))
    capacity = 2**args.exponent
    rng = np.random.default_rng(args.seed)
    buffers = make_buffers(cpprb_ray, cpprb, capacity)
    results = []
    try:
        fill(buffers, capacity, rng)
        for op in OPS:
            calls = op_calls(op, buffers, rng)
            runs = {key: (call, common.calibrate(call, plan["target_s"]))
                    for key, call in calls.items()}
            times = common.interleaved_times(runs, plan["rounds"])
            row: Dict[str, Any] = {"op": op, "capacity": capacity}
            for key in SIDES:
                row[key] = common.summarize(times[key])
            for name, numerator, denominator in (("nstep/plain (ours)", "ours nstep", "ours"),
                                                 ("cpprb nstep/ours nstep", "cpprb nstep",
                                                  "ours nstep")):
                row[name] = {stat: row[numerator][stat] / row[denominator][stat]
                             for stat in ("median_us", "min_us")}
            results.append(row)
    finally:
        for key in ("ours", "ours nstep"):
            buffers[key].close()
    print(f"\ncapacity 2**{args.exponent}; median (min) us per call")
    print(f"{'op':<12}" + "".join(f"{key:>20}" for key in SIDES)
          + f"{'nstep/plain':>16}{'cpprb/ours nstep':>20}")
    for row in results:
        cells = "".join(f"{row[k]['median_us']:>11.2f} ({row[k]['min_us']:>6.2f})" for k in SIDES)
        ratio = row["nstep/plain (ours)"]
        versus = row["cpprb nstep/ours nstep"]
        print(f"{row['op']:<12}{cells}{ratio['median_us']:>9.2f} ({ratio['min_us']:.2f})"
              f"{versus['median_us']:>13.1f} ({versus['min_us']:.1f})")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"info": info, "results": results}, handle, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
