"""Two questions behind the headline's update(256) and cold rows (docs/benchmarks.md, "fourth
session"). Run from the repository root (cpprb_ray built in place, e.g. by ``make venv``)::

    .venv/bin/python benchmarks/probe_orders.py update             # about 1 minute
    .venv-tianshou/bin/python benchmarks/probe_orders.py cold      # about 2 minutes
    .venv/bin/python benchmarks/probe_orders.py update cold --quick   # a smoke run

``update``: what another library's call between two of ours costs an update(256). The
headline's row (ours, then cpprb's, one by one; the indexes of 256 earlier samples, cycled)
next to the same loop with cpprb's call left out; µs median, 25th percentile and minimum.

``cold``: whether the order of the cold rotation decides the ratios of a cold learner step (a
64 MiB sweep before every timed call), with tianshou when it is importable. Three orders:
``rotate`` (the headline's: one call of each side per round, the start shifted by one each
round), ``balanced`` (the same, every other group of rounds in the opposite direction, so that
each side follows each other side equally often) and ``own`` (each timed step after a sweep,
its own untimed step and a sweep: a learner's own sequence). Each order runs twice.
"""

from __future__ import annotations

import argparse
import gc
import time
from typing import Any, Callable, Dict, List

import cpprb
import numpy as np

import cpprb_ray

if __package__:
    from . import _headline as headline
    from . import _libraries as libraries
else:  # run as a script: this file's folder is sys.path[0]
    import _headline as headline
    import _libraries as libraries

SEED = 7
CAPACITY = 1 << 20
SWEEP_BYTES = 64 << 20
ORDERS = ("rotate", "balanced", "own")


def microseconds(series: List[int]) -> str:
    values = np.array(series) / 1000.0
    return (f"{np.median(values):.2f} (p25 {np.quantile(values, 0.25):.2f}, "
            f"min {values.min():.2f})")


def probe_update(rounds: int) -> None:
    ours = libraries.make_ours(cpprb_ray, CAPACITY, SEED)
    try:
        theirs = libraries.make_cpprb(cpprb, CAPACITY, SEED)
        inputs = headline.Inputs(SEED + 1)
        mine = ours.update(inputs.priorities, headline.UPDATE_SAMPLES)
        other = theirs.update(inputs.priorities, headline.UPDATE_SAMPLES)
        clock = time.perf_counter_ns
        for _ in range(min(rounds, 2000)):
            mine()
            other()
        for between in (True, False):
            ours_times: List[int] = []
            their_times: List[int] = []
            gc.collect()
            gc.disable()
            try:
                for _ in range(rounds):
                    start = clock()
                    mine()
                    middle = clock()
                    if between:
                        other()
                        their_times.append(clock() - middle)
                    ours_times.append(middle - start)
            finally:
                gc.enable()
            if between:
                print(f"update(256), cpprb's call between two of ours: ours "
                      f"{microseconds(ours_times)} µs, cpprb {microseconds(their_times)} µs")
            else:
                print(f"update(256), ours alone: {microseconds(ours_times)} µs")
    finally:
        ours.buffer.close()


def probe_cold(rounds: int) -> None:
    peers: Dict[str, Any] = {}
    try:
        import tianshou
        peers["tianshou"] = tianshou
    except ImportError:
        print("(tianshou is not importable here: ours and cpprb only)")
    ours = libraries.make_ours(cpprb_ray, CAPACITY, SEED)
    try:
        theirs = libraries.make_cpprb(cpprb, CAPACITY, SEED)
        made = {key: libraries.make_peer(key, module, CAPACITY, SEED)
                for key, module in peers.items()}
        inputs = headline.Inputs(SEED + 1)
        bench = headline.Bench(ours, theirs, made, inputs)
        calls: Dict[str, Callable[[], Any]] = {
            "ours": ours.learner_step(inputs.priorities),
            "cpprb": theirs.learner_step(inputs.priorities)}
        for key, peer in made.items():
            calls[key] = peer.learner_step(bench.peer_input(key, "priorities"))
        sweep_array = np.ones(SWEEP_BYTES // 8, np.int64)

        def sweep() -> None:
            np.add(sweep_array, 1, out=sweep_array)

        keys = list(calls)
        clock = time.perf_counter_ns
        for order in ORDERS + ORDERS:
            times: Dict[str, List[int]] = {key: [] for key in keys}
            gc.collect()
            gc.disable()
            try:
                for round_number in range(rounds):
                    shift = round_number % len(keys)
                    sequence = keys[shift:] + keys[:shift]
                    if order == "balanced" and (round_number // len(keys)) % 2:
                        sequence = sequence[::-1]
                    for key in sequence:
                        if order == "own":
                            sweep()
                            calls[key]()
                        sweep()
                        start = clock()
                        calls[key]()
                        times[key].append(clock() - start)
            finally:
                gc.enable()
            medians = {key: float(np.median(series)) for key, series in times.items()}
            sides = "  ".join(f"{key} {medians[key] / 1000:.1f} ({min(times[key]) / 1000:.1f})"
                              for key in keys)
            ratios = "  ".join(f"{key} / ours {medians[key] / medians['ours']:.2f}x"
                               for key in keys if key != "ours")
            print(f"learner step, cold, order {order:8s}: {sides} µs median (min); {ratios}",
                  flush=True)
    finally:
        ours.buffer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("probes", nargs="+", choices=("update", "cold"))
    parser.add_argument("--quick", action="store_true", help="a few rounds (a smoke run)")
    args = parser.parse_args()
    for probe in args.probes:
        if probe == "update":
            probe_update(200 if args.quick else 30000)
        else:
            probe_cold(6 if args.quick else 500)


if __name__ == "__main__":
    main()
