"""Helpers shared by bench_buffer.py and bench_multiprocess.py (not a benchmark itself).

Both scripts compare cpprb_ray with cpprb on the same transition layout, report the same machine
information and write the same JSON shape, so those pieces live here.
"""

from __future__ import annotations

import gc
import glob
import importlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHM_DIR = "/dev/shm"

#: The transition of the issue: a CartPole-like step. Every column's dtype is explicit so that
#: both libraries store the same bytes (cpprb's default dtype is float32 too). Pass env_dict()
#: rather than this: cpprb adds an "add_shape" key to the dict it is given, which cpprb_ray
#: (rightly) rejects as unknown.
ENV_DICT: Dict[str, Dict[str, Any]] = {
    "obs": {"shape": 4, "dtype": np.float32},
    "act": {"dtype": np.int64},
    "rew": {"dtype": np.float32},
    "next_obs": {"shape": 4, "dtype": np.float32},
    "done": {"dtype": np.float32},
}
ALPHA = 0.6
EPS = 1e-4
BETA = 0.4


def env_dict() -> Dict[str, Dict[str, Any]]:
    """A fresh copy of ENV_DICT, for one buffer."""
    return {key: dict(spec) for key, spec in ENV_DICT.items()}


def import_cpprb_ray():
    """Import cpprb_ray, preferring a build in place in this checkout to an installed copy.

    The benchmark then measures the working tree it sits in, with or without ``PYTHONPATH=.``.
    """
    if glob.glob(os.path.join(REPO_ROOT, "cpprb_ray", "_store*.so")) and (
        REPO_ROOT not in sys.path
    ):
        sys.path.insert(0, REPO_ROOT)
    return importlib.import_module("cpprb_ray")


def machine() -> str:
    """The CPU model, as ``lscpu | grep 'Model name'`` reports it."""
    try:
        output = subprocess.run(
            ["lscpu"], capture_output=True, text=True, check=True, env={"LC_ALL": "C"}
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return platform.processor() or platform.machine()
    for line in output.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return platform.machine()


def versions() -> Dict[str, str]:
    """Versions of Python and of every library the numbers depend on."""
    import cpprb  # noqa: F401  (imported for its presence; the version comes from metadata)

    try:
        from importlib.metadata import version

        cpprb_version = version("cpprb")
    except Exception:  # Python 3.7 without importlib.metadata, or an unusual install
        cpprb_version = "unknown"
    cpprb_ray = import_cpprb_ray()
    return {
        "python": platform.python_version(),
        "numpy": np.__version__,
        "cpprb": cpprb_version,
        "cpprb_ray": getattr(cpprb_ray, "__version__", "unknown"),
        "cpprb_ray_path": os.path.dirname(cpprb_ray.__file__),
    }


def header(info: Dict[str, Any]) -> str:
    """The first line of a report: machine, versions and load (the machine may be shared)."""
    load = info["load_average_1_5_15"]
    return (
        f"machine: {info['machine']} ({info['cpus']} CPUs); Python {info['python']}, "
        f"numpy {info['numpy']}, cpprb {info['cpprb']}, cpprb_ray {info['cpprb_ray']}; "
        f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
    )


def run_info(args_quick: bool) -> Dict[str, Any]:
    """Everything about the run that is not a measurement."""
    info: Dict[str, Any] = {"machine": machine(), "cpus": os.cpu_count()}
    info.update(versions())
    info["command"] = " ".join(["python"] + sys.argv)
    info["quick"] = args_quick
    info["load_average_1_5_15"] = os.getloadavg()
    return info


def random_rows(rng: np.random.Generator, count: int) -> Dict[str, np.ndarray]:
    """`count` random transitions, each column in its ENV_DICT dtype (batch axis first)."""
    obs = rng.standard_normal((count, 4), dtype=np.float32)
    return {
        "obs": obs,
        "act": rng.integers(0, 2, size=count, dtype=np.int64),
        "rew": rng.standard_normal(count, dtype=np.float32),
        "next_obs": obs + rng.standard_normal((count, 4), dtype=np.float32) * np.float32(0.01),
        "done": (rng.random(count) < 0.05).astype(np.float32),
    }


def random_priorities(rng: np.random.Generator, count: int) -> np.ndarray:
    """`count` positive priorities, float32 like |TD error| from a float32 network."""
    return rng.uniform(0.01, 10.0, size=count).astype(np.float32)


def fill(buffer: Any, capacity: int, rng: np.random.Generator, chunk: int = 1 << 16) -> None:
    """Fill `buffer` to `capacity` rows with large batched adds and random priorities.

    The same call works for cpprb and cpprb_ray (their add() has the same signature). One chunk
    of rows is reused so that filling 2**22 rows does not hold 2**22 random rows in memory; only
    the priorities, which decide what is sampled, are fresh for every chunk.
    """
    rows = random_rows(rng, min(chunk, capacity))
    added = 0
    while added < capacity:
        count = min(chunk, capacity - added)
        batch = rows if count == chunk else {k: v[:count] for k, v in rows.items()}
        buffer.add(priorities=random_priorities(rng, count), **batch)
        added += count
    if getattr(buffer, "nstep", None):
        # N-step staging holds the last steps back until their episode ends: end it.
        buffer.on_episode_end()
    assert buffer.get_stored_size() == capacity, "the buffer did not fill"


def calibrate(call: Callable[[int], None], target_s: float) -> int:
    """How many calls of ``call(number)`` take about `target_s` seconds (at least 1).

    Each timed batch then lasts long enough for perf_counter's resolution and the loop's own
    overhead not to matter, while slow sides (cpprb at 2**22) are not run thousands of times.
    """
    number = 1
    while True:
        start = time.perf_counter()
        call(number)
        elapsed = time.perf_counter() - start
        if elapsed >= target_s / 4 or number >= 1 << 20:
            return max(1, int(number * target_s / max(elapsed, 1e-9)))
        number *= 4


def interleaved_times(
    runs: Dict[str, Tuple[Callable[[int], None], int]], rounds: int
) -> Dict[str, List[float]]:
    """Seconds per call of each ``runs[key] = (call, number)``, one list entry per round.

    Each round times every run once, in turn, so that a burst of load from other processes on a
    shared machine hits both libraries alike instead of one side's whole series. The garbage
    collector is off while timing, as in timeit, so that a collection triggered by one library's
    allocations is not charged to whichever call happens to run it.
    """
    times: Dict[str, List[float]] = {key: [] for key in runs}
    enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        for _ in range(rounds):
            for key, (call, number) in runs.items():
                start = time.perf_counter()
                call(number)
                times[key].append((time.perf_counter() - start) / number)
    finally:
        if enabled:
            gc.enable()
    return times


def one_by_one_times(
    calls: Dict[str, Callable[[], Any]],
    rounds: int,
    before: Optional[Callable[[], Any]] = None,
) -> Dict[str, List[float]]:
    """Seconds of single calls, interleaved one by one: ``{key: [seconds of each call]}``.

    Each round makes ONE call of every ``calls[key]``, in an order rotated by one every round,
    so that no library always runs right after the same other one (whose leftovers in the
    cache would then help or hurt it alike every time) and a burst of outside load hits them
    all. Between two calls of one library the others run, as other work runs between two
    calls in a real program, so nobody's tree and rows are kept warm by its own previous call.
    `before`, when given, runs before every call, untimed (the cold rows' cache sweep). The
    garbage collector is off while timing, as in :func:`interleaved_times`.

    >>> order = []
    >>> times = one_by_one_times({"a": lambda: order.append("a"),
    ...                           "b": lambda: order.append("b")}, 3)
    >>> order, [len(series) for series in times.values()]
    (['a', 'b', 'b', 'a', 'a', 'b'], [3, 3])
    """
    keys = list(calls)
    times: Dict[str, List[float]] = {key: [] for key in keys}
    clock = time.perf_counter_ns
    enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        for round_number in range(rounds):
            shift = round_number % len(keys)
            for key in keys[shift:] + keys[:shift]:
                call = calls[key]
                if before is not None:
                    before()
                start = clock()
                call()
                times[key].append((clock() - start) * 1e-9)
    finally:
        if enabled:
            gc.enable()
    return times


def timer_overhead_us(count: int = 2000) -> float:
    """Median µs that :func:`one_by_one_times` measures for a call that does nothing.

    Every single-call time includes it (two clock reads and a Python call); it is reported,
    not subtracted, so that every ratio errs against the faster side.
    """
    return summarize(one_by_one_times({"nothing": lambda: None}, count)["nothing"])["median_us"]


def summarize(series: Sequence[float]) -> Dict[str, float]:
    """Median and min of per-call seconds, in microseconds."""
    return {"median_us": 1e6 * statistics.median(series), "min_us": 1e6 * min(series)}


def verdict(median_meets: bool, minima_meet: bool, pair: str = "median and minima") -> str:
    """A target's verdict from the ratio of the medians and the ratio of the minima.

    Noise on a shared machine only ever adds time, and it can move either ratio past a target
    on its own (a slow 2^10 median once made 2^22 look 1.5x of it, with 2.6x of the minima).
    So a target is "met" only when both ratios meet it, "NOT met" when neither does, and
    otherwise "unsettled", which asks for another run rather than a claim. `pair` names the
    two ratios in that message when they are not medians and minima.

    >>> verdict(True, True), verdict(False, False), verdict(True, False)
    ('met', 'NOT met', 'unsettled (median and minima disagree: noise; run again)')
    """
    if median_meets and minima_meet:
        return "met"
    if not median_meets and not minima_meet:
        return "NOT met"
    return f"unsettled ({pair} disagree: noise; run again)"


def markdown_table(head: Sequence[str], rows: Sequence[Sequence[str]], align: str) -> str:
    """A Markdown table; `align` has one of "l"/"r" per column."""
    rule = "|" + "|".join("---:" if a == "r" else ":---" for a in align) + "|"
    lines = ["| " + " | ".join(head) + " |", rule]
    lines.extend("| " + " | ".join(row) + " |" for row in rows)
    return "\n".join(lines)


def write_json(path: str | None, payload: Dict[str, Any]) -> None:
    """Write `payload` to `path` as indented JSON (nothing when `path` is empty)."""
    if path:
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(payload, handle, indent=2)


def segment_exists(name: str) -> bool:
    """Whether the shm segment `name` (a cpprb_ray buffer's name) is still in /dev/shm."""
    return os.path.exists(os.path.join(SHM_DIR, name.lstrip("/")))
