"""compare.py's measuring process: one group of libraries, in one interpreter (its venv).

Not run by hand: compare.py starts ``PYTHON benchmarks/_compare_worker.py SPEC.json OUT.json``,
PYTHON being the group's interpreter (``--peer-python``). SPEC holds ``{"group", "libraries",
"cases": [[operation, exponent, batch, warmth], ...], "plan", "seed"}``; OUT gets ``{"group",
"versions", "skipped": {library: why}, "rows": [...]}``. After every case a line
``@progress <label>`` goes to stderr, so that compare.py can move its progress bar.

Every library of the group is filled at each capacity, then each case times ONE call of every
library in turn, over and over (benchmarks/_common.one_by_one_times, after a warm-up and with
as many rounds as the plan's time budget allows: benchmarks/_headline.plan_rounds), so that
outside load hits them alike; a row's ratio is its median over its reference's median
(cpprb_ray's buffer or tree) from those same rounds.
"""

from __future__ import annotations

import gc
import json
import os
import platform
import sys
import time
from typing import Any, Callable, Dict, List

if __package__:
    from . import _common as common
    from . import _headline as headline
    from . import _workloads as workloads
else:  # run as a script: this file's folder is sys.path[0]
    import _common as common
    import _headline as headline
    import _workloads as workloads

PROGRESS = "@progress "


def versions(modules: Dict[str, Any]) -> Dict[str, str]:
    """Python's and numpy's versions, and those of every library module measured here."""
    import numpy as np

    out = {"python": platform.python_version(), "numpy": np.__version__,
           "interpreter": sys.executable}
    for name in ("cpprb", "ray", "torch", "tianshou", "torchrl", "tensordict", "dm-reverb",
                 "tensorflow-cpu"):
        try:
            from importlib.metadata import version

            out[name] = version(name)
        except Exception:  # not installed here, or Python 3.7 without importlib.metadata
            continue
    if "cpprb_ray" in modules or "cpprb_ray_tree" in modules:
        package = common.import_cpprb_ray()
        out["cpprb_ray"] = getattr(package, "__version__", "unknown")
        out["cpprb_ray_path"] = os.path.dirname(package.__file__)
    if "torch" in out:
        import torch

        out["torch_threads"] = str(torch.get_num_threads())
    return out


def stats_of(series: List[float]) -> Dict[str, float]:
    """Median, min and max of per-call seconds, in µs."""
    out = common.summarize(series)
    out["max_us"] = 1e6 * max(series)
    return out


def measure_case(calls: Dict[str, Callable[[], Any]], warmth: str, plan: Dict[str, Any],
                 sweep: Callable[[], None]) -> Dict[str, Dict[str, float]]:
    """{library: median, min, max µs and rounds} of single calls interleaved one by one."""
    before = sweep if warmth == "cold" else None
    rounds = headline.plan_rounds(calls, warmth, plan, before)
    times = common.one_by_one_times(calls, rounds, before)
    out = {}
    for key, series in times.items():
        out[key] = stats_of(series)
        out[key]["rounds"] = rounds
    return out


def run_group(spec: Dict[str, Any], progress: Callable[[str], None]) -> Dict[str, Any]:
    """Measure every case of `spec` on the group's libraries that import here."""
    modules: Dict[str, Any] = {}
    skipped: Dict[str, str] = {}
    for key in spec["libraries"]:
        try:
            modules[key] = workloads.import_library(key)
        except Exception as error:  # ImportError, or a broken install raising anything
            how = workloads.GET_GROUP.get(spec["group"], "")
            skipped[key] = (f"not importable by {sys.executable} ({type(error).__name__}: "
                            f"{str(error).splitlines()[0] if str(error) else ''})"
                            + (f"; to get it: {how}" if how and "bench-peers" not in
                               str(error) else ""))
    for key in list(modules):
        reference = workloads.LIBRARIES[key].reference
        if reference is not None and reference not in modules:
            skipped[key] = f"its reference {reference} could not be measured here"
            del modules[key]
    # A reference no peer of this process refers to would be measured for nothing.
    for key in list(modules):
        if workloads.LIBRARIES[key].reference is None and not any(
                workloads.LIBRARIES[other].reference == key for other in modules):
            if spec["group"] != workloads.HOME_GROUP.get(key):
                skipped[key] = "no peer of it could be measured in this process"
                del modules[key]
    cases = [workloads.Case(*case) for case in spec["cases"]]
    rows: List[Dict[str, Any]] = []
    # Where a process's time goes (fills, input conversion, timing), for a run's own budget.
    seconds: Dict[str, float] = {}
    clock = time.perf_counter
    sweep = workloads.sweeper()
    inputs = workloads.Inputs(spec["seed"] + 1)
    for exponent in sorted({case.exponent for case in cases}):
        capacity = 2**exponent
        adapters: Dict[str, Any] = {}
        try:
            for key, module in modules.items():
                limit = workloads.FILL_LIMITS.get(key, {}).get(spec["plan"].get("kind", "full"))
                if limit is not None and exponent > limit:
                    skipped[f"{key} at 2^{exponent}"] = (
                        f"not filled: a fill makes one item per row through Python (about "
                        f"two minutes for 2^20 rows on a quiet 2-core machine); this run stops "
                        f"at 2^{limit}")
                    continue
                try:
                    began = clock()
                    adapters[key] = workloads.make(key, module, capacity, spec["seed"])
                    seconds[f"fill {key} 2^{exponent}"] = clock() - began
                except MemoryError as error:
                    skipped[f"{key} at 2^{exponent}"] = f"no memory to fill it ({error})"
            # Filled buffers and input pools (tianshou's Batches, RLlib's lists) are many
            # objects that live until the capacity is done: out of the collector's sight, so
            # that the collection before every timed series (common.one_by_one_times) does not
            # walk them each time.
            gc.collect()
            gc.freeze()
            peers_here = [key for key in adapters if workloads.LIBRARIES[key].reference]
            for case in (c for c in cases if c.exponent == exponent):
                calls = {key: workloads.call(key, adapter, case, inputs)
                         for key, adapter in adapters.items() if workloads.supports(key, case)}
                if peers_here and not any(key in calls for key in peers_here):
                    calls = {}  # no peer here has it: nothing to compare ours with
                began = clock()
                if calls:
                    rows.extend(case_rows(case, measure_case(calls, case.warmth, spec["plan"],
                                                             sweep)))
                label = f"{case.label} 2^{exponent} {case.warmth}"
                seconds[label] = clock() - began
                progress(f"{spec['group']}: {label}")
        finally:
            gc.unfreeze()
            for adapter in adapters.values():
                adapter.close()
            adapters.clear()
            gc.collect()
    return {"group": spec["group"], "versions": versions(modules), "skipped": skipped,
            "rows": rows, "seconds": seconds}


def case_rows(case: workloads.Case, stats: Dict[str, Dict[str, float]]
              ) -> List[Dict[str, Any]]:
    """One row per library of a measured case, with its ratio to its reference.

    >>> case = workloads.Case("sample", 10, 256, "warm")
    >>> rows = case_rows(case, {"cpprb_ray": {"median_us": 2.0, "min_us": 1.0, "max_us": 9.0,
    ...                                       "rounds": 5},
    ...                         "cpprb": {"median_us": 30.0, "min_us": 20.0, "max_us": 90.0,
    ...                                   "rounds": 5}})
    >>> [(row["library"], row["ratio"], row["ratio_min"]) for row in rows]
    [('cpprb_ray', None, None), ('cpprb', 15.0, 20.0)]
    """
    rows = []
    for key, figures in stats.items():
        reference = workloads.LIBRARIES[key].reference
        ratio = ratio_min = None
        if reference is not None and reference in stats:
            ratio = figures["median_us"] / stats[reference]["median_us"]
            ratio_min = figures["min_us"] / stats[reference]["min_us"]
        rows.append({"library": key, "label": case.label, "operation": case.operation,
                     "exponent": case.exponent, "capacity": 2**case.exponent,
                     "batch": case.batch, "warmth": case.warmth,
                     "median_us": figures["median_us"], "min_us": figures["min_us"],
                     "max_us": figures["max_us"], "rounds": figures["rounds"],
                     "reference": reference, "ratio": ratio, "ratio_min": ratio_min})
    return rows


def main(argv: List[str]) -> int:
    """Read SPEC, measure, write OUT; returns the exit status."""
    if len(argv) != 2:
        print("usage: _compare_worker.py SPEC.json OUT.json", file=sys.stderr)
        return 2
    with open(argv[0], encoding="utf-8") as handle:
        spec = json.load(handle)

    def progress(label: str) -> None:
        print(PROGRESS + label, file=sys.stderr, flush=True)

    result = run_group(spec, progress)
    common.write_json(argv[1], result)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
