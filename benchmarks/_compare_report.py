"""compare.py's report: the Markdown tables and the plots, from what the groups measured.

Every group (one process) measures cpprb_ray's buffer or tree beside its peers, call by call;
the report has one table per group and kind (buffers, trees), each line showing that process's
cpprb_ray figure and every peer's figure with its ratio to it: a ratio is always against the
cpprb_ray figure on its own line. The plots draw absolute times, cpprb_ray's from its home
process ("cpprb" for the buffer, "rllib" for the tree).
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Tuple

if __package__:
    from . import _common as common
    from . import _workloads as workloads
    from . import bench_apex, bench_writers
else:  # imported by a script run from this folder
    import _common as common
    import _workloads as workloads
    import bench_apex
    import bench_writers

#: The group whose figures stand for a library measured in several groups.
HOME = {key: (group,) for key, group in workloads.HOME_GROUP.items()}


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


def _spread(row: Dict[str, Any]) -> str:
    return f"{row['median_us']:.1f} [{row['min_us']:.1f}–{row['max_us']:.1f}]"


def group_rows(groups: Dict[str, Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Every row of every group, tagged with its group, in the report's order."""
    rows = [dict(row, group=group) for group, result in groups.items()
            for row in result["rows"]]
    return sorted(rows, key=lambda r: (
        list(workloads.GROUPS).index(r["group"]) if r["group"] in workloads.GROUPS else 99,
        workloads.OPERATIONS.index(r["operation"]), r["batch"], r["warmth"] != "warm",
        r["exponent"], list(workloads.LIBRARIES).index(r["library"])))


def group_table(rows: List[Dict[str, Any]], group: str, kind: str) -> str:
    """One process's table of one kind: per case, its cpprb_ray median [min–max] µs, then
    every peer's median [min–max] µs and (its median / that cpprb_ray median)."""
    mine = [row for row in rows if row["group"] == group
            and workloads.LIBRARIES[row["library"]].kind == kind]
    peers = [key for key in workloads.GROUPS.get(group, ())
             if workloads.LIBRARIES[key].kind == kind and workloads.LIBRARIES[key].reference
             and any(row["library"] == key for row in mine)]
    if not peers:
        return ""
    reference = workloads.LIBRARIES[peers[0]].reference
    found = {(row["library"], _case_key(row)): row for row in mine}
    head = ["operation", "capacity", "warmth",
            f"{workloads.LIBRARIES[reference].label} µs median [min–max]"]
    head += [f"{workloads.LIBRARIES[key].label} µs (ratio)" for key in peers]
    lines = []
    for case in _cases(mine):
        ours = found.get((reference, case))
        if ours is None or not any((key, case) in found for key in peers):
            continue
        operation, exponent, batch, warmth = case
        cells = [workloads.Case(operation, exponent, batch, warmth).label, f"2^{exponent}",
                 warmth, _spread(ours)]
        for key in peers:
            row = found.get((key, case))
            cells.append("-" if row is None else
                         f"{_spread(row)} ({row['median_us'] / ours['median_us']:.1f}x)")
        lines.append(cells)
    return common.markdown_table(head, lines, "lll" + "r" * (1 + len(peers)))


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


def shown(text: str) -> str:
    """A command or path as the report shows it: relative to the checkout, its temporary JSON
    files as FILE, so that a report pasted into the docs names no folder of this machine.

    >>> shown(os.path.join(common.REPO_ROOT, ".venv", "bin", "python") + " x --json "
    ...       + os.path.join(os.sep + "tmp", "cpprb_ray_compare_x1", "apex.json"))
    '.venv/bin/python x --json FILE'
    """
    words = []
    for word in text.split(" "):
        if "cpprb_ray_compare_" in word:
            word = "FILE"
        elif os.path.isabs(word):
            relative = os.path.relpath(word, common.REPO_ROOT)
            word = relative if not relative.startswith("..") else os.path.basename(word)
        words.append(word)
    return " ".join(words)


def _writers_table(result: Dict[str, Any]) -> str:
    """bench_writers.py's table (one line per library and K) and its target lines."""
    return _with_targets(bench_writers.table(result.get("summary", [])), result)


def _with_targets(table: str, result: Dict[str, Any]) -> str:
    """A benchmark's table, then its target lines and the libraries it skipped (other than
    those its command left out, and their targets)."""
    lines = [table, ""] + [f"- {line}" for line in result.get("verdicts", [])
                           if "(not asked for" not in line]
    lines += [f"- skipped: {library}: {why}" for library, why in result.get("skipped",
                                                                            {}).items()
              if "not asked for" not in why]
    return "\n".join(lines)


def _sequences_table(result: Dict[str, Any]) -> str:
    """bench_sequences.py's rows and its target lines (its peers' learner steps, the gathers
    against their copy floors), and the peers it skipped."""
    return _with_targets(_frames_table(result), result)


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
            "tensordict", "dm-reverb", "tensorflow-cpu") if name in versions)
        out.append(f"- process {group} ({shown(result['interpreter'])}, "
                   f"{result['wall_s']:.0f} s): "
                   f"{named}")
    for group, why in payload["skipped"].items():
        out.append(f"- skipped: group {group}: {shown(why)}")
    for group, result in payload["groups"].items():
        for key, why in result["skipped"].items():
            out.append(f"- skipped: {key} (in process {group}): {shown(why)}")
    out += ["", "µs per call, single calls interleaved one by one between the libraries of a "
            "process (cold: a 64 MiB cache sweep before every call), median [min–max] over the "
            "rounds. One table per process: each line's ratio is the peer's median over the "
            "cpprb_ray median on the same line, measured in the same process and rounds.", ""]
    rows = group_rows(payload["groups"])
    for kind, title in (("buffer", "Buffers"), ("tree", "Segment trees")):
        tables = []
        for group in payload["groups"]:
            table = group_table(rows, group, kind)
            if table:
                names = ", ".join(workloads.LIBRARIES[key].label
                                  for key in workloads.GROUPS.get(group, ())
                                  if workloads.LIBRARIES[key].kind == kind
                                  and workloads.LIBRARIES[key].reference)
                tables += [f"### {names} (process {group})", "", table, ""]
        if tables:
            out += [f"## {title}", ""] + tables
    extras = payload["extras"]
    for name, title, render in (("apex", "Ape-X ingest (bench_apex.py)", _apex_table),
                                ("multi_node", "Multi-node (bench_apex.py --remote)",
                                 _apex_table),
                                ("frames", "Frames (bench_frames.py)", _frames_table),
                                ("writers", "The learner under many writers (bench_writers.py)",
                                 _writers_table),
                                ("sequences", "Sequences against TorchRL "
                                 "(bench_sequences.py)", _sequences_table),
                                ("sequences_reverb", "Sequences against Reverb "
                                 "(bench_sequences.py)", _sequences_table)):
        record = extras.get(name)
        if record is None:
            continue
        out += [f"## {title}", ""]
        if "skipped" in record:
            out += [f"skipped: {record['skipped']}", ""]
        else:
            out += [f"`{shown(record['command'])}`", "", render(record["result"]), ""]
    if detail:
        if payload.get("plots"):
            out += ["## Plots", ""]
            out += [f"![{name}]({name})" for name in payload["plots"]] + [""]
        out += ["## Every figure", "", detail_table(rows), ""]
    return "\n".join(out)


def plot_name(operation: str) -> str:
    """The PNG of an operation.

    >>> plot_name("learner step"), plot_name("add(64)"), plot_name("add(1) with a priority")
    ('learner_step.png', 'add_64.png', 'add_1_with_a_priority.png')
    """
    slug = "".join(ch if ch.isalnum() else "_" for ch in operation).strip("_")
    return "_".join(part for part in slug.split("_") if part) + ".png"


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
    rows = canonical_rows(payload["groups"])
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
        # One legend for the figure, right of the panels: inside a panel it covered lines.
        legend: Dict[str, Any] = {}
        for axis in figure.axes:
            for handle, label in zip(*axis.get_legend_handles_labels()):
                legend.setdefault(label, handle)
        figure.tight_layout()
        figure.legend(list(legend.values()), list(legend), loc="center left",
                      bbox_to_anchor=(1.0, 0.5), fontsize="small", frameon=False)
        path = os.path.join(out_dir, plot_name(operation))
        figure.savefig(path, dpi=90, bbox_inches="tight")
        plt.close(figure)
        written.append(path)
    return written, ""
