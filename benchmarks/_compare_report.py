"""compare.py's report: the Markdown tables and the plots, from what the groups measured.

Every library's figures come from one group: cpprb_ray's buffer from the "cpprb" group and its
tree from the "rllib" group (each measured in this interpreter), every peer from its own
group. A peer's ratio is the one its group measured against its own in-process cpprb_ray.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Tuple

if __package__:
    from . import _common as common
    from . import _workloads as workloads
    from . import bench_apex
else:  # imported by a script run from this folder
    import _common as common
    import _workloads as workloads
    import bench_apex

#: The group whose figures stand for a library measured in several groups.
HOME = {key: (group,) for key, group in workloads.HOME_GROUP.items()}
BUFFERS = [key for key, library in workloads.LIBRARIES.items() if library.kind == "buffer"]
TREES = [key for key, library in workloads.LIBRARIES.items() if library.kind == "tree"]


def _case_key(row: Dict[str, Any]) -> Tuple[str, int, int, str]:
    return (row["operation"], row["exponent"], row["batch"], row["warmth"])


def canonical_rows(groups: Dict[str, Dict[str, Any]]) -> List[Dict[str, Any]]:
    """One row per (library, case), each tagged with its group: a library measured in several
    groups (cpprb_ray, as every group's reference) is taken from the first group of HOME that
    measured it.

    >>> row = {"library": "cpprb_ray", "operation": "sample", "exponent": 10, "batch": 256,
    ...        "warmth": "warm", "median_us": 1.0}
    >>> [r["group"] for r in canonical_rows({"tianshou": {"rows": [dict(row)]},
    ...                                      "cpprb": {"rows": [dict(row)]}})]
    ['cpprb']
    """
    chosen: Dict[Tuple[str, Tuple[str, int, int, str]], Dict[str, Any]] = {}
    rank: Dict[Tuple[str, Tuple[str, int, int, str]], int] = {}
    for group, result in groups.items():
        for row in result["rows"]:
            key = (row["library"], _case_key(row))
            order = HOME.get(row["library"], ())
            place = order.index(group) if group in order else len(order)
            if key not in chosen or place < rank[key]:
                chosen[key] = dict(row, group=group)
                rank[key] = place
    return sorted(chosen.values(), key=lambda r: (
        workloads.OPERATIONS.index(r["operation"]), r["batch"], r["warmth"] != "warm",
        r["exponent"], list(workloads.LIBRARIES).index(r["library"])))


def _cases(rows: List[Dict[str, Any]]) -> List[Tuple[str, int, int, str]]:
    return list(dict.fromkeys(_case_key(row) for row in rows))


def _cell(row: Optional[Dict[str, Any]], reference: bool) -> str:
    if row is None:
        return "-"
    if reference:
        return f"{row['median_us']:.1f} [{row['min_us']:.1f}–{row['max_us']:.1f}]"
    return f"{row['median_us']:.1f} ({row['ratio']:.1f}x)"


def summary_table(rows: List[Dict[str, Any]], keys: List[str]) -> str:
    """One line per case: the reference's median [min–max] µs, every peer's median µs and
    (its ratio to the reference measured in its own process)."""
    present = [key for key in keys if any(row["library"] == key for row in rows)]
    if not present:
        return ""
    found = {(row["library"], _case_key(row)): row for row in rows}
    head = ["operation", "capacity", "warmth"]
    for key in present:
        label = workloads.LIBRARIES[key].label
        reference = workloads.LIBRARIES[key].reference
        head.append(f"{label} µs median [min–max]" if reference is None else
                    f"{label} µs (x {workloads.LIBRARIES[reference].label})")
    lines = []
    for case in _cases([row for row in rows if row["library"] in present]):
        operation, exponent, batch, warmth = case
        label = workloads.Case(operation, exponent, batch, warmth).label
        cells = [label, f"2^{exponent}", warmth]
        for key in present:
            cells.append(_cell(found.get((key, case)),
                               workloads.LIBRARIES[key].reference is None))
        lines.append(cells)
    return common.markdown_table(head, lines, "lll" + "r" * len(present))


def detail_table(rows: List[Dict[str, Any]]) -> str:
    """Every figure: one line per library and case."""
    lines = []
    for row in rows:
        ratio = "-" if row["ratio"] is None else f"{row['ratio']:.2f}x ({row['ratio_min']:.2f}x)"
        lines.append([workloads.LIBRARIES[row["library"]].label, row["group"],
                      workloads.Case(row["operation"], row["exponent"], row["batch"],
                                     row["warmth"]).label, f"2^{row['exponent']}",
                      row["warmth"], f"{row['median_us']:.2f}", f"{row['min_us']:.2f}",
                      f"{row['max_us']:.2f}", str(row["rounds"]), ratio])
    return common.markdown_table(
        ["library", "process", "operation", "capacity", "warmth", "median µs", "min µs",
         "max µs", "rounds", "ratio to cpprb_ray (of the minima)"], lines, "lllllrrrrr")


def _apex_table(result: Dict[str, Any]) -> str:
    """bench_apex.py's ways, with the shared buffer's rates over each (bench_apex.ratios:
    of the totals, and of the medians of the per-second rates in brackets)."""
    results = result.get("results", {})
    rows = []
    for way, figures in results.items():
        ratio = bench_apex.ratios(results, way) if way != "shared" else None
        cells = [bench_apex.LABELS.get(way, way), f"{figures['rows_added_per_s']:,.0f}",
                 f"{figures['learner_steps_per_s']:,.1f}"]
        for key in bench_apex.RATES:
            cells.append("-" if ratio is None else
                         f"{ratio[key]['total']:.1f}x ({ratio[key]['median']:.1f}x)")
        rows.append(cells)
    return common.markdown_table(["way", "rows added/s", "learner steps/s",
                                  "shared / this, rows", "shared / this, steps"], rows, "lrrrr")


def _frames_table(result: Dict[str, Any]) -> str:
    rows = [[str(row["library"]), str(row.get("class", "")), str(row["operation"]),
             f"{row['median_us']:.2f}", f"{row['min_us']:.2f}", f"{row['max_us']:.2f}"]
            for row in result.get("rows", [])]
    return common.markdown_table(["library", "class", "operation", "median µs", "min µs",
                                  "max µs"], rows, "lllrrr")


def markdown(payload: Dict[str, Any], detail: bool) -> str:
    """The report: header, skips, the buffer and tree tables, the other workloads; with
    `detail`, the plots and every figure too (results.md)."""
    info = payload["info"]
    kind = "smoke" if info.get("smoke") else "quick" if info["quick"] else "full"
    out = [f"# cpprb_ray against its peers ({kind} run)", ""]
    load = info["load_average_1_5_15"]
    out.append(f"machine: {info['machine']} ({info['cpus']} CPUs); load average {load[0]:.2f} "
               f"{load[1]:.2f} {load[2]:.2f}; {info['wall_s']:.0f} s in all")
    for group, result in payload["groups"].items():
        versions = result["versions"]
        named = ", ".join(f"{name} {versions[name]}" for name in (
            "python", "numpy", "cpprb_ray", "cpprb", "ray", "torch", "tianshou", "torchrl",
            "tensordict") if name in versions)
        out.append(f"- process {group} ({result['interpreter']}, {result['wall_s']:.0f} s): "
                   f"{named}")
    for group, why in payload["skipped"].items():
        out.append(f"- skipped: group {group}: {why}")
    for group, result in payload["groups"].items():
        for key, why in result["skipped"].items():
            out.append(f"- skipped: {key} (in process {group}): {why}")
    out += ["", "µs per call, single calls interleaved one by one between the libraries of a "
            "process (cold: a 64 MiB cache sweep before every call). A peer's ratio is its "
            "median / the median of the cpprb_ray buffer or tree measured in the SAME process "
            "and rounds; the cpprb_ray columns come from process cpprb (buffer) and rllib "
            "(tree), so a ratio need not be the quotient of two columns.", ""]
    rows = payload["rows"]
    for title, keys in (("Buffers", BUFFERS), ("Segment trees", TREES)):
        table = summary_table(rows, keys)
        if table:
            out += [f"## {title}", "", table, ""]
    extras = payload["extras"]
    for name, title, render in (("apex", "Ape-X ingest (bench_apex.py)", _apex_table),
                                ("multi_node", "Multi-node (bench_apex.py --remote)",
                                 _apex_table),
                                ("frames", "Frames (bench_frames.py)", _frames_table)):
        record = extras.get(name)
        if record is None:
            continue
        out += [f"## {title}", ""]
        if "skipped" in record:
            out += [f"skipped: {record['skipped']}", ""]
        else:
            out += [f"`{record['command']}`", "", render(record["result"]), ""]
    if detail:
        if payload.get("plots"):
            out += ["## Plots", ""]
            out += [f"![{name}]({name})" for name in payload["plots"]] + [""]
        out += ["## Every figure", "", detail_table(rows), ""]
    return "\n".join(out)


def plot_name(operation: str) -> str:
    """The PNG of an operation.

    >>> plot_name("learner step"), plot_name("add(64)")
    ('learner_step.png', 'add_64.png')
    """
    slug = "".join(ch if ch.isalnum() else "_" for ch in operation).strip("_")
    return f"{slug}.png"


def plots(payload: Dict[str, Any], out_dir: str) -> Tuple[List[str], str]:
    """One PNG per operation (paths, ""), or ([], why not) without matplotlib.

    Each has one panel per (batch, warmth) measured: µs per call against capacity, log-log,
    one line per library (dashed: segment trees)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as error:
        return [], f"matplotlib is not importable ({error})"
    rows = payload["rows"]
    written = []
    for operation in workloads.OPERATIONS:
        mine = [row for row in rows if row["operation"] == operation]
        batches = sorted({row["batch"] for row in mine})
        warmths = [w for w in workloads.WARMTHS if any(row["warmth"] == w for row in mine)]
        if not mine:
            continue
        # A row of panels per batch, a column per warmth.
        figure, axes = plt.subplots(len(batches), len(warmths), squeeze=False,
                                    figsize=(5.5 * len(warmths), 4.2 * len(batches)))
        for (row_index, batch), (column, warmth) in (
                (b, w) for b in enumerate(batches) for w in enumerate(warmths)):
            axis = axes[row_index][column]
            if not any(row["batch"] == batch and row["warmth"] == warmth for row in mine):
                axis.set_visible(False)  # e.g. --quick: only the learner step is cold
                continue
            for key, library in workloads.LIBRARIES.items():
                points = sorted((row["capacity"], row["median_us"]) for row in mine
                                if row["library"] == key and row["batch"] == batch
                                and row["warmth"] == warmth)
                if points:
                    axis.plot([p[0] for p in points], [p[1] for p in points], marker="o",
                              linestyle="--" if library.kind == "tree" else "-",
                              label=library.label)
            axis.set_xscale("log", base=2)
            axis.set_yscale("log")
            axis.set_xlabel("capacity (rows)")
            axis.set_ylabel("µs per call (median)")
            axis.set_title(f"{workloads.Case(operation, 10, batch, warmth).label}, {warmth}")
            axis.grid(True, which="both", alpha=0.3)
            axis.legend(fontsize="small")
        figure.tight_layout()
        path = os.path.join(out_dir, plot_name(operation))
        figure.savefig(path, dpi=90)
        plt.close(figure)
        written.append(path)
    return written, ""
