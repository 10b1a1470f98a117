"""bench_buffer.py's headline: single calls at 2^20, interleaved one by one between libraries.

A real learner does other work between two samples and a real actor steps its environment
between two adds, so a library's tree and rows are not in the cache because of its previous
call. Here every row of the table makes ONE call of each library in turn (ours, cpprb's, and
the peers importable in this interpreter), over and over, timing each call on its own; the
report gives the median (and min) of those single calls and the ratio their median / ours.

Rows (each library does the same work; benchmarks/_libraries.py says how the APIs map):

- sample(256); sample(256) out= (ours refills preallocated arrays, when our sample() takes
  out=; the others' column is their ordinary sample, their only way);
- learner step: sample(256) then an update of its indexes with fresh priorities;
- learner step, cold: the same after a 64 MiB memory sweep (untimed) before every call, as a
  network step leaves the cache;
- update(256): indexes of earlier samples, fresh priorities;
- add(1) (float32 obs arrays, Python scalars), add(1) with a priority (a Python float),
  add(64), add(64) with priorities (float32);
- cast inputs, ours and cpprb only: add(1) and add(64) with inputs that need a conversion
  (float64 obs and rewards into float32 columns, Python lists, numpy scalars, bool, a batch of
  one as arrays, strided arrays), each interleaved with ours on exact dtypes too, so the
  report's "/ exact" is measured in the same rounds.
"""

from __future__ import annotations

import gc
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

if __package__:
    from . import _common as common
    from . import _libraries as libraries
else:  # imported by a script run from this folder
    import _common as common
    import _libraries as libraries

EXPONENT = 20
SWEEP_BYTES = 64 << 20
BATCH = libraries.BATCH
POOL = libraries.POOL
UPDATE_SAMPLES = 256  # distinct samples whose indexes the update rows cycle through

#: How many rounds a row gets: as many as fit in budget_s, within [min_rounds, max_rounds].
FULL = {"budget_s": 4.0, "min_rounds": 300, "max_rounds": 5000,
        "cold_budget_s": 12.0, "cold_min_rounds": 100, "cold_max_rounds": 1000, "warmup": 50}
QUICK = {"budget_s": 0.3, "min_rounds": 30, "max_rounds": 400,
         "cold_budget_s": 1.0, "cold_min_rounds": 10, "cold_max_rounds": 60, "warmup": 10}

#: The cast-input rows: (label, rows per add, how the exact-dtype inputs are changed).
CAST_ROWS = (
    ("add(1) float64 obs and rew", 1, "float64"),
    ("add(1) Python lists", 1, "lists"),
    ("add(1) numpy scalars", 1, "numpy_scalars"),
    ("add(1) bool done", 1, "bool"),
    ("add(1) batch of one as arrays", 1, "batch_of_one"),
    ("add(1) strided obs", 1, "strided"),
    ("add(64) float64 obs and rew", 64, "float64"),
    ("add(64) act/rew/done as Python lists", 64, "lists"),
    ("add(64) bool done", 64, "bool"),
    ("add(64) strided obs", 64, "strided"),
)
CAST_TARGET = 1.5  # ours on cast inputs / ours on exact dtypes, at most

#: The issue's targets: (row, peer, their median / ours at least).
TARGETS = (
    ("sample(256)", "cpprb", 10.0),
    ("learner step", "cpprb", 10.0),
    ("learner step, cold", "cpprb", 7.0),
    ("learner step, cold", "tianshou", 6.0),
    ("update(256)", "cpprb", 4.0),
    ("add(1)", "cpprb", 10.0),
    ("add(1) with a priority", "cpprb", 10.0),
    ("add(64)", "cpprb", 5.0),
    ("add(64) with priorities", "cpprb", 5.0),
)
SIDES = ("ours", "cpprb", "tianshou", "torchrl")


# ---------------------------------------------------------------------------------------------
# Inputs, drawn before anything is timed


def exact_singles(rows: Dict[str, np.ndarray]) -> List[Dict[str, Any]]:
    """One-transition add() kwargs as an actor passes them: float32[4] arrays, Python scalars."""
    acts, rews, dones = rows["act"].tolist(), rows["rew"].tolist(), rows["done"].tolist()
    return [{"obs": rows["obs"][k].copy(), "act": acts[k], "rew": rews[k],
             "next_obs": rows["next_obs"][k].copy(), "done": dones[k]}
            for k in range(len(acts))]


def cast_single(row: Dict[str, Any], how: str) -> Dict[str, Any]:
    """The exact-dtype one-transition `row` as an input that needs a conversion."""
    out = dict(row)
    if how == "float64":
        out["obs"], out["next_obs"] = (row[key].astype(np.float64) for key in ("obs", "next_obs"))
        out["rew"] = np.float64(row["rew"])
    elif how == "lists":
        out["obs"], out["next_obs"] = row["obs"].tolist(), row["next_obs"].tolist()
    elif how == "numpy_scalars":
        out["act"] = np.int64(row["act"])
        out["rew"], out["done"] = np.float32(row["rew"]), np.float32(row["done"])
    elif how == "bool":
        out["done"] = bool(row["done"])
    elif how == "batch_of_one":
        out = {"obs": row["obs"][None], "act": np.array([row["act"]], np.int64),
               "rew": np.array([row["rew"]], np.float32), "next_obs": row["next_obs"][None],
               "done": np.array([row["done"]], np.float32)}
    elif how == "strided":
        out["obs"], out["next_obs"] = (_strided(row[key]) for key in ("obs", "next_obs"))
    else:
        raise ValueError(how)
    return out


def cast_batch(rows: Dict[str, np.ndarray], how: str) -> Dict[str, Any]:
    """The exact-dtype batch `rows` as an input that needs a conversion."""
    out: Dict[str, Any] = dict(rows)
    if how == "float64":
        for key in ("obs", "next_obs", "rew"):
            out[key] = rows[key].astype(np.float64)
    elif how == "lists":
        for key in ("act", "rew", "done"):
            out[key] = rows[key].tolist()
    elif how == "bool":
        out["done"] = rows["done"].astype(bool)
    elif how == "strided":
        out["obs"], out["next_obs"] = (_strided(rows[key]) for key in ("obs", "next_obs"))
    else:
        raise ValueError(how)
    return out


def _strided(array: np.ndarray) -> np.ndarray:
    """A copy of `array` as every other element of a twice-as-wide last axis (not contiguous)."""
    wide = np.zeros(array.shape[:-1] + (2 * array.shape[-1],), array.dtype)
    wide[..., ::2] = array
    view = wide[..., ::2]
    assert not view.flags.c_contiguous and np.array_equal(view, array)
    return view


class Inputs:
    """Every pool of inputs the rows cycle through, in numpy form (adapters convert them)."""

    def __init__(self, seed: int):
        rng = np.random.default_rng(seed)
        self.single_rows = common.random_rows(rng, POOL)
        self.singles = exact_singles(self.single_rows)
        self.batches = [common.random_rows(rng, 64) for _ in range(POOL)]
        self.priorities = [common.random_priorities(rng, BATCH) for _ in range(POOL)]
        self.single_priorities = common.random_priorities(rng, POOL).tolist()
        self.batch_priorities = [common.random_priorities(rng, 64) for _ in range(POOL)]


# ---------------------------------------------------------------------------------------------
# Rows


class Bench:
    """The filled buffers of one run and the calls of every row."""

    def __init__(self, ours: Any, cpprb: Any, peers: Dict[str, Any], inputs: Inputs):
        self.ours, self.cpprb, self.peers, self.inputs = ours, cpprb, peers, inputs
        self._peer_inputs: Dict[str, Dict[str, Any]] = {key: {} for key in peers}

    def peer_input(self, key: str, name: str) -> Any:
        """Peer `key`'s own form of input pool `name`, converted once."""
        cache = self._peer_inputs[key]
        if name not in cache:
            peer, inputs = self.peers[key], self.inputs
            if key == "tianshou":
                convert = {
                    "singles": lambda: peer.batches([inputs.single_rows])[0],
                    "batches": lambda: peer.batches(inputs.batches),
                    "priorities": lambda: inputs.priorities,
                    "single_priorities": lambda: inputs.single_priorities,
                    "batch_priorities": lambda: inputs.batch_priorities,
                }
            else:
                convert = {
                    "singles": lambda: [peer.single(inputs.single_rows, k) for k in range(POOL)],
                    "batches": lambda: [peer.tensordict(batch) for batch in inputs.batches],
                    "priorities": lambda: peer.tensors(inputs.priorities),
                    "single_priorities": lambda: [
                        peer.tensors([np.array([p], np.float32)])[0]
                        for p in inputs.single_priorities],
                    "batch_priorities": lambda: peer.tensors(inputs.batch_priorities),
                }
            cache[name] = convert[name]()
        return cache[name]

    def peer_add(self, key: str, rows: int, with_priorities: bool) -> Callable[[], Any]:
        """Peer `key`'s add of one row or of 64, with or without priorities."""
        peer = self.peers[key]
        if rows == 1:
            items = self.peer_input(key, "singles")
            priorities = self.peer_input(key, "single_priorities") if with_priorities else None
            if key == "tianshou":  # its add() takes one Batch per call: a batch of one here
                return peer.add([[item] for item in items], None if priorities is None else
                                [np.array([p], np.float32) for p in priorities])
            return peer.add(items, priorities)
        items = self.peer_input(key, "batches")
        priorities = self.peer_input(key, "batch_priorities") if with_priorities else None
        if key == "tianshou":
            return peer.add(items, priorities)
        return peer.add(items, priorities, batched=True)

    def rows(self) -> List[Tuple[str, str, Dict[str, Callable[[], Any]]]]:
        """(label, kind, {side: call}) for every row; kind is "warm", "cold" or "cast"."""
        ours, cpprb, inputs = self.ours, self.cpprb, self.inputs
        out: List[Tuple[str, str, Dict[str, Callable[[], Any]]]] = []

        def with_peers(calls: Dict[str, Callable[[], Any]],
                       peer_call: Callable[[str, Any], Callable[[], Any]]):
            for key, peer in self.peers.items():
                calls[key] = peer_call(key, peer)
            return calls

        out.append(("sample(256)", "warm", with_peers(
            {"ours": ours.sample(), "cpprb": cpprb.sample()}, lambda k, p: p.sample())))
        if ours.out_supported:
            out.append(("sample(256) out=", "warm", with_peers(
                {"ours": ours.sample_out(), "cpprb": cpprb.sample()}, lambda k, p: p.sample())))
        for label, kind in (("learner step", "warm"), ("learner step, cold", "cold")):
            out.append((label, kind, with_peers(
                {"ours": ours.learner_step(inputs.priorities),
                 "cpprb": cpprb.learner_step(inputs.priorities)},
                lambda k, p: p.learner_step(self.peer_input(k, "priorities")))))
        out.append(("update(256)", "warm", with_peers(
            {"ours": ours.update(inputs.priorities, UPDATE_SAMPLES),
             "cpprb": cpprb.update(inputs.priorities, UPDATE_SAMPLES)},
            lambda k, p: p.update(self.peer_input(k, "priorities"), UPDATE_SAMPLES))))
        for label, rows, with_priorities in (
                ("add(1)", 1, False), ("add(1) with a priority", 1, True),
                ("add(64)", 64, False), ("add(64) with priorities", 64, True)):
            pool = inputs.singles if rows == 1 else inputs.batches
            priorities = None
            if with_priorities:
                priorities = inputs.single_priorities if rows == 1 else inputs.batch_priorities
            out.append((label, "warm", with_peers(
                {"ours": ours.add(pool, priorities), "cpprb": cpprb.add(pool, priorities)},
                lambda k, p, n=rows, w=with_priorities: self.peer_add(k, n, w))))
        for label, rows, how in CAST_ROWS:
            if rows == 1:
                exact, cast = inputs.singles, [cast_single(row, how) for row in inputs.singles]
            else:
                exact, cast = inputs.batches, [cast_batch(batch, how) for batch in inputs.batches]
            out.append((label, "cast", {"ours": ours.add(cast), "ours_exact": ours.add(exact),
                                        "cpprb": cpprb.add(cast)}))
        return out


def plan_rounds(calls: Dict[str, Callable[[], Any]], kind: str, plan: Dict[str, Any],
                before: Optional[Callable[[], Any]]) -> int:
    """Warm every call up, then the number of rounds that fits the row's time budget."""
    warmup = plan["warmup"] if kind != "cold" else max(2, plan["warmup"] // 5)
    spent = common.one_by_one_times(calls, warmup, before)
    per_round = sum(min(series) for series in spent.values())
    if before is not None:
        per_round += len(calls) * common.summarize(
            common.one_by_one_times({"before": before}, 3)["before"])["min_us"] * 1e-6
    prefix = "cold_" if kind == "cold" else ""
    rounds = int(plan[prefix + "budget_s"] / max(per_round, 1e-9))
    return max(plan[prefix + "min_rounds"], min(plan[prefix + "max_rounds"], rounds))


def measure(label: str, kind: str, calls: Dict[str, Callable[[], Any]],
            plan: Dict[str, Any], sweep: Callable[[], Any]) -> Dict[str, Any]:
    """One row: single calls interleaved one by one; medians, minima and ratios."""
    before = sweep if kind == "cold" else None
    rounds = plan_rounds(calls, kind, plan, before)
    times = common.one_by_one_times(calls, rounds, before)
    result = row_result(label, kind, rounds, {side: common.summarize(series)
                                              for side, series in times.items()})
    # The spread of single calls, for the JSON: where a median moved, these show how.
    result["quantiles_us"] = {
        side: dict(zip(("p10", "p25", "p75", "p90"),
                       (1e6 * np.quantile(series, (0.1, 0.25, 0.75, 0.9))).round(3).tolist()))
        for side, series in times.items()}
    return result


def row_result(label: str, kind: str, rounds: int,
               stats: Dict[str, Dict[str, float]]) -> Dict[str, Any]:
    """A row's record from per-side stats (``{side: {"median_us", "min_us"}}``).

    ``ratios[peer]`` is the peer's time / ours (of the medians, and of the minima);
    ``vs_exact`` is ours / ours on exact dtypes (cast rows only).
    """
    ours = stats["ours"]
    result: Dict[str, Any] = {"row": label, "kind": kind, "rounds": rounds, "times": stats,
                              "ratios": {}}
    for side, their in stats.items():
        if side in ("ours", "ours_exact"):
            continue
        result["ratios"][side] = {"median": their["median_us"] / ours["median_us"],
                                  "min": their["min_us"] / ours["min_us"]}
    if "ours_exact" in stats:
        exact = stats["ours_exact"]
        result["vs_exact"] = {"median": ours["median_us"] / exact["median_us"],
                              "min": ours["min_us"] / exact["min_us"]}
    return result


def run(cpprb_ray: Any, cpprb: Any, peer_modules: Dict[str, Any], plan: Dict[str, Any],
        seed: int, progress: Callable[[str], None]) -> Tuple[List[Dict[str, Any]], Dict[str, Any]]:
    """Fill every buffer at 2^20 and measure every row: (rows, facts about the run)."""
    capacity = 2**EXPONENT
    facts: Dict[str, Any] = {"capacity": capacity, "timer_overhead_us": common.timer_overhead_us()}
    ours = libraries.make_ours(cpprb_ray, capacity, seed)
    name = ours.buffer.name
    facts["out_supported"] = ours.out_supported
    facts["ours_huge_page_bytes"] = ours.buffer.stats()["huge_page_bytes"]
    peers: Dict[str, Any] = {}
    try:
        theirs = libraries.make_cpprb(cpprb, capacity, seed)
        for key, module in peer_modules.items():
            progress(f"filling {key}'s buffer")
            peers[key] = libraries.make_peer(key, module, capacity, seed)
        bench = Bench(ours, theirs, peers, Inputs(seed + 1))
        sweep_array = np.ones(SWEEP_BYTES // 8, np.int64)

        def sweep():
            np.add(sweep_array, 1, out=sweep_array)

        results = []
        for label, kind, calls in bench.rows():
            results.append(measure(label, kind, calls, plan, sweep))
            progress(f"{label}: {results[-1]['rounds']} rounds")
            gc.collect()
    finally:
        ours.close()
        for peer in peers.values():
            peer.close()
        gc.collect()
    assert not common.segment_exists(name), f"/dev/shm/{name} left behind after close()"
    return results, facts


# ---------------------------------------------------------------------------------------------
# Report


def _ratio_cell(ratio: Optional[Dict[str, float]]) -> str:
    return "n/a" if ratio is None else f"{ratio['median']:.1f}x ({ratio['min']:.1f}x)"


def table(results: List[Dict[str, Any]], measured_peers: List[str]) -> str:
    """The headline as a Markdown table: ours µs and every ratio, median (min over min).

    A peer that did not run in this interpreter shows "not run"; "-" marks a row that is not
    measured for that side (the cast rows are ours and cpprb's only).
    """
    head = ["operation", "ours µs", "cpprb / ours", "tianshou / ours", "TorchRL / ours",
            "ours / exact dtypes"]
    rows = []
    for r in results:
        cells = [r["row"], f"{r['times']['ours']['median_us']:.2f} "
                           f"({r['times']['ours']['min_us']:.2f})"]
        for side in ("cpprb", "tianshou", "torchrl"):
            if side in r["ratios"]:
                cells.append(_ratio_cell(r["ratios"][side]))
            elif r["kind"] != "cast" and side != "cpprb" and side not in measured_peers:
                cells.append("not run")
            else:
                cells.append("-")
        cells.append(_ratio_cell(r["vs_exact"]) if "vs_exact" in r else "-")
        rows.append(cells)
    return common.markdown_table(head, rows, "lrrrrr")


def times_table(results: List[Dict[str, Any]]) -> str:
    """Every side's µs per call, median (min): where the ratios come from."""
    sides = ("ours", "ours_exact", "cpprb", "tianshou", "torchrl")
    names = ("ours", "ours, exact dtypes", "cpprb", "tianshou", "TorchRL")
    rows = []
    for r in results:
        rows.append([r["row"], str(r["rounds"])] + [
            f"{r['times'][s]['median_us']:.1f} ({r['times'][s]['min_us']:.1f})"
            if s in r["times"] else "-" for s in sides])
    return common.markdown_table(["operation", "rounds"] + [f"{n} µs" for n in names], rows,
                                 "lrrrrrr")


def summary(results: List[Dict[str, Any]], skipped: Dict[str, str]) -> List[str]:
    """One verdict line per target (common.verdict: median and minima ratios must agree)."""
    found = {r["row"]: r for r in results}
    lines = []
    for label, side, target in TARGETS:
        name = {"torchrl": "TorchRL"}.get(side, side)
        head = f"target {label} >= {target:g}x {name}"
        r = found.get(label)
        if r is None:
            lines.append(f"{head}: not measured (no such row in this run)")
            continue
        ratio = r["ratios"].get(side)
        if ratio is None:
            where = "; see the peer lines above" if side in skipped else ""
            lines.append(f"{head}: not measured ({name} not run here{where})")
            continue
        verdict = common.verdict(ratio["median"] >= target, ratio["min"] >= target)
        lines.append(f"{head}: {verdict} ({ratio['median']:.1f}x; {ratio['min']:.1f}x min "
                     f"over min)")
    for r in results:
        if "vs_exact" not in r:
            continue
        ratio = r["vs_exact"]
        verdict = common.verdict(ratio["median"] <= CAST_TARGET, ratio["min"] <= CAST_TARGET)
        lines.append(f"target {r['row']} within {CAST_TARGET:g}x of exact dtypes: {verdict} "
                     f"({ratio['median']:.2f}x; {ratio['min']:.2f}x min over min)")
    return lines
