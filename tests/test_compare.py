"""benchmarks/compare.py end to end, on a tiny grid (its hidden --smoke: 2^10, batch 256, a few
rounds, no other benchmarks): the report files, the ratio column, and skipped peers with their
reasons. Real processes and real libraries; the figures themselves are not judged here."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from benchmarks import _compare_report, _workloads

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMPARE = os.path.join(REPO_ROOT, "benchmarks", "compare.py")


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("compare")
    missing = str(out / "no-such-venv" / "bin" / "python")
    done = subprocess.run(
        [sys.executable, COMPARE, "--smoke", "--out", str(out),
         "--peer-python", f"tianshou={missing}"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
        env=dict(os.environ, RAY_USAGE_STATS_ENABLED="0"))
    assert done.returncode == 0, done.stdout + done.stderr
    with open(out / "results.json", encoding="utf-8") as handle:
        payload = json.load(handle)
    return out, done, payload, missing


def test_writes_the_report_files(smoke_run):
    out, done, payload, _ = smoke_run
    markdown = (out / "results.md").read_text(encoding="utf-8")
    assert "## Buffers" in markdown and "## Every figure" in markdown
    assert "## Buffers" in done.stdout  # the table goes to stdout too
    assert payload["info"]["machine"] and payload["groups"]["cpprb"]["versions"]["python"]


def test_table_has_the_ratio_column_and_every_figure(smoke_run):
    out, done, payload, _ = smoke_run
    pytest.importorskip("cpprb")  # the peer of the cpprb process, whose ratios are checked
    assert "### cpprb, cpprb MP (process cpprb)" in done.stdout
    assert "cpprb µs (ratio)" in done.stdout
    rows = [row for row in payload["rows"] if row["library"] == "cpprb"]
    operations = {row["operation"] for row in rows}
    # Every operation but the streamed adds, which only Reverb's process measures.
    assert operations == set(_workloads.OPERATIONS) - {"add(1) x1024 streamed"}
    for row in rows:
        assert row["reference"] == "cpprb_ray"
        assert 0 < row["min_us"] <= row["median_us"] <= row["max_us"]
        assert row["ratio"] > 0 and row["rounds"] >= 1
    ours = [row for row in payload["rows"] if row["library"] == "cpprb_ray"]
    assert ours and all(row["ratio"] is None and row["group"] == "cpprb" for row in ours)
    assert {row["warmth"] for row in ours} == {"warm", "cold"}


def test_each_ratio_is_against_the_cpprb_ray_figure_on_its_line(smoke_run):
    _, done, payload, _ = smoke_run
    pytest.importorskip("cpprb")
    ours = {(row["operation"], row["warmth"]): row for row in payload["rows"]
            if row["library"] == "cpprb_ray" and row["group"] == "cpprb"}
    table = done.stdout.split("### cpprb, cpprb MP (process cpprb)", 1)[1].split("\n#", 1)[0]
    lines = [line for line in table.splitlines() if line.startswith("| learner step")]
    assert lines
    for line in lines:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        label, _, warmth, reference, theirs = cells[:5]
        row = ours[("learner step", warmth)]
        assert reference.startswith(f"{row['median_us']:.1f} [")
        median = float(theirs.split(" [")[0])
        shown = float(theirs.rsplit("(", 1)[1].rstrip("x)"))
        assert shown == pytest.approx(median / row["median_us"], abs=0.06), line


def test_missing_peers_are_skipped_with_a_reason(smoke_run):
    _, done, payload, missing = smoke_run
    reason = payload["skipped"]["tianshou"]
    assert missing in reason and "not found" in reason
    assert f"group skipped: tianshou: interpreter {missing}" in done.stderr
    try:
        import torchrl  # noqa: F401
    except ImportError:
        skipped = payload["groups"]["torchrl"]["skipped"]
        assert "not importable" in skipped["torchrl"] and "torchrl" in skipped["torchrl"]
        assert "peer skipped: torchrl (torchrl): not importable" in done.stderr
    try:
        import cpprb  # noqa: F401
    except ImportError:
        assert "not importable" in payload["groups"]["cpprb"]["skipped"]["cpprb"]
    for name in ("apex", "multi_node", "frames", "writers", "sequences", "sequences_reverb"):
        assert payload["extras"][name] == {"skipped": "not run with --smoke"}
    # Each skip says how to get what is missing.
    assert "make bench-peers" in reason


def test_plots_one_png_per_operation(smoke_run):
    pytest.importorskip("matplotlib")
    out, _, payload, _ = smoke_run
    expected = {_compare_report.plot_name(row["operation"]) for row in payload["rows"]}
    assert set(payload["plots"]) == expected and len(expected) >= 5
    for name in expected:
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bad_peer_python_is_a_usage_error():
    done = subprocess.run([sys.executable, COMPARE, "--peer-python", "nobody=/usr/bin/python3"],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "--peer-python expects NAME=PATH with NAME one of cpprb, rllib, tianshou, torchrl, " \
           "reverb; got 'nobody=/usr/bin/python3'" in done.stderr


def test_help_names_make_bench_peers_and_what_it_downloads():
    done = subprocess.run([sys.executable, COMPARE, "--help"], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0
    text = " ".join(done.stdout.split())
    assert "make bench-peers" in text
    for venv in (".venv-tianshou", ".venv-torchrl", ".venv-reverb"):
        assert venv in text
    assert "GB" in text and "--quick" in text and "minutes" in text


def test_quick_budget_skips_a_section_that_does_not_fit_and_says_why(monkeypatch):
    from benchmarks import compare

    budget = compare.Budget(quick=True, started=0.0)
    spent = compare.QUICK_PROMISE_S - compare.REPORT_RESERVE_S - 50.0
    monkeypatch.setattr(compare.time, "perf_counter", lambda: spent)
    why = budget.why_not("reverb")
    assert why.startswith("not started: --quick promises") and "50 s were left" in why
    assert "--quick --sections reverb" in why
    assert budget.timeout(600) == pytest.approx(50.0 - compare.STOP_GRACE_S)
    monkeypatch.setattr(compare.time, "perf_counter", lambda: 0.0)
    assert budget.why_not("reverb") == ""
    assert compare.Budget(quick=False, started=0.0).why_not("reverb") == ""
    assert compare.Budget(quick=False, started=0.0, sections=["cpprb"]).why_not(
        "reverb") == "not asked for (--sections)"


def test_sequences_run_against_each_peer_in_its_interpreter(tmp_path):
    """bench_sequences.py once under the torchrl group's interpreter (--peers torchrl) and once
    under the reverb group's (--peers reverb reverb_grpc); without a Reverb interpreter, that
    one is skipped with how to get it."""
    from benchmarks import compare

    torchrl = str(tmp_path / "torchrl-python")
    reverb = str(tmp_path / "reverb-python")
    for path in (torchrl, reverb):
        with open(path, "w", encoding="utf-8") as handle:
            handle.write("#!/bin/sh\n")
        os.chmod(path, 0o755)
    commands = {name: (command, why) for name, command, _, why in compare.extra_commands(
        True, str(tmp_path), {"torchrl": torchrl, "reverb": reverb})}
    assert commands["sequences"][0][0] == torchrl
    assert commands["sequences"][0][-4:-2] == ["--peers", "torchrl"]
    assert commands["sequences_reverb"][0][0] == reverb
    assert commands["sequences_reverb"][0][-5:-2] == ["--peers", "reverb", "reverb_grpc"]
    assert "--quick" in commands["sequences_reverb"][0]
    without = {name: (command, why) for name, command, _, why in compare.extra_commands(
        False, str(tmp_path), {"torchrl": torchrl})}
    command, why = without["sequences_reverb"]
    assert command is None and "make bench-peers" in why and ".venv-reverb" in why
