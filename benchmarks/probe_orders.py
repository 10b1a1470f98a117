"""Three questions behind the headline's update(256) and cold rows (docs/benchmarks.md, "What
limits us"). Run from the repository root (cpprb_ray built in place, e.g. by
``make venv``)::

    .venv/bin/python benchmarks/probe_orders.py update             # about 1 minute
    .venv-tianshou/bin/python benchmarks/probe_orders.py cold      # about 2 minutes
    .venv-tianshou/bin/python benchmarks/probe_orders.py modes     # about 1 minute
    .venv/bin/python benchmarks/probe_orders.py update cold modes --quick   # a smoke run

``update``: what another library's call between two of ours costs an update(256). The
headline's row (ours, then cpprb's, one by one; the indexes of 256 earlier samples, cycled)
next to the same loop with cpprb's call left out; µs median, 25th percentile and minimum.

``cold``: whether the order of the cold rotation decides the ratios of a cold learner step (a
64 MiB sweep before every timed call), with tianshou when it is importable. Three orders:
``rotate`` (the headline's: one call of each side per round, the start shifted by one each
round), ``balanced`` (the same, every other group of rounds in the opposite direction, so that
each side follows each other side equally often) and ``own`` (each timed step after a sweep,
its own untimed step and a sweep: a learner's own sequence). Each order runs twice.

``modes``: whether a cold step's time follows what a cache miss costs at that moment. Each
round times, after a sweep each, a miss probe (numpy gathering 4096 random int64 from a 256 MiB
shared mapping in 4 KiB pages, as the buffer's segment is: no library code, only misses) and
every side's cold learner step, in the headline's rotated order; the rounds are then split into
quartiles by the probe's time, with each side's median and the ratios in each.
"""

from __future__ import annotations

import argparse
import gc
import mmap
import os
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
PROBE_BYTES = 256 << 20
PROBE_READS = 4096


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


def cold_steps(ours: Any) -> Dict[str, Callable[[], Any]]:
    """Every side's learner step (ours, cpprb's and tianshou's where it is importable)."""
    peers: Dict[str, Any] = {}
    try:
        import tianshou
        peers["tianshou"] = tianshou
    except ImportError:
        print("(tianshou is not importable here: ours and cpprb only)")
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
    return calls


def sweeper() -> Callable[[], None]:
    """The headline's sweep: 64 MiB added to in place, as a network step evicts the caches."""
    sweep_array = np.ones(SWEEP_BYTES // 8, np.int64)

    def sweep() -> None:
        np.add(sweep_array, 1, out=sweep_array)
    return sweep


def cold_call(sweep: Callable[[], None], call: Callable[[], Any]) -> int:
    """Nanoseconds of one `call` right after a sweep (not timed)."""
    sweep()
    start = time.perf_counter_ns()
    call()
    return time.perf_counter_ns() - start


def probe_cold(rounds: int) -> None:
    ours = libraries.make_ours(cpprb_ray, CAPACITY, SEED)
    try:
        calls = cold_steps(ours)
        sweep = sweeper()
        keys = list(calls)
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
                        times[key].append(cold_call(sweep, calls[key]))
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


def probe_modes(rounds: int) -> None:
    ours = libraries.make_ours(cpprb_ray, CAPACITY, SEED)
    mapping = mmap.mmap(-1, PROBE_BYTES)          # shared and anonymous: tmpfs pages, as /dev/shm
    try:
        calls = cold_steps(ours)
        sweep = sweeper()
        memory = np.frombuffer(mapping, np.int64)
        memory[:] = 1                               # every page touched before timing
        rng = np.random.default_rng(SEED)
        lines = rng.choice(PROBE_BYTES // 64, size=(64, PROBE_READS), replace=True)
        positions = [row * 8 for row in lines]     # one int64 per line, a new set every round
        gathered = np.empty(PROBE_READS, np.int64)
        keys = list(calls)
        times: Dict[str, List[int]] = {key: [] for key in ["probe"] + keys}
        clock = time.perf_counter_ns
        gc.collect()
        gc.disable()
        try:
            for round_number in range(rounds):
                sweep()
                start = clock()
                np.take(memory, positions[round_number % len(positions)], out=gathered)
                times["probe"].append(clock() - start)
                shift = round_number % len(keys)
                for key in keys[shift:] + keys[:shift]:
                    times[key].append(cold_call(sweep, calls[key]))
        finally:
            gc.enable()
        del memory
        series = {key: np.array(values) / 1000.0 for key, values in times.items()}
        quartile = np.digitize(series["probe"], np.quantile(series["probe"], (0.25, 0.5, 0.75)))
        print(f"{rounds} rounds; Spearman correlation with the miss probe: " + "  ".join(
            f"{key} {spearman(series['probe'], series[key]):+.2f}" for key in keys))
        for q in range(4):
            chosen = quartile == q
            medians = {key: float(np.median(values[chosen])) for key, values in series.items()}
            ratios = "  ".join(f"{key} / ours {medians[key] / medians['ours']:.2f}x"
                               for key in keys if key != "ours")
            print(f"probe quartile {q + 1}: probe {medians['probe']:.1f} µs; cold step "
                  + "  ".join(f"{key} {medians[key]:.1f}" for key in keys)
                  + f" µs (medians); {ratios}", flush=True)
    finally:
        ours.buffer.close()
        mapping.close()


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Rank correlation (ties are rare in nanosecond timings)."""
    return float(np.corrcoef(np.argsort(np.argsort(x)), np.argsort(np.argsort(y)))[0, 1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("probes", nargs="+", choices=("update", "cold", "modes"))
    parser.add_argument("--quick", action="store_true", help="a few rounds (a smoke run)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="rounds of every probe (default: 30000 update, 500 cold, 800 "
                             "modes; --quick: 200, 6, 8)")
    args = parser.parse_args()
    # Which build: an experiment's (benchmarks/experiments) comes first on PYTHONPATH.
    print(f"cpprb_ray from {os.path.dirname(cpprb_ray.__file__)}")
    for probe in args.probes:
        if probe == "update":
            probe_update(args.rounds or (200 if args.quick else 30000))
        elif probe == "cold":
            probe_cold(args.rounds or (6 if args.quick else 500))
        else:
            probe_modes(args.rounds or (8 if args.quick else 800))


if __name__ == "__main__":
    main()
