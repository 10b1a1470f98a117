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
    assert "cpprb µs (x cpprb_ray)" in done.stdout
    rows = [row for row in payload["rows"] if row["library"] == "cpprb"]
    operations = {row["operation"] for row in rows}
    assert operations == set(_workloads.OPERATIONS)
    for row in rows:
        assert row["reference"] == "cpprb_ray"
        assert 0 < row["min_us"] <= row["median_us"] <= row["max_us"]
        assert row["ratio"] > 0 and row["rounds"] >= 1
    ours = [row for row in payload["rows"] if row["library"] == "cpprb_ray"]
    assert ours and all(row["ratio"] is None and row["group"] == "cpprb" for row in ours)
    assert {row["warmth"] for row in ours} == {"warm", "cold"}


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
    for name in ("apex", "multi_node", "frames"):
        assert payload["extras"][name] == {"skipped": "not run with --smoke"}


def test_plots_one_png_per_operation(smoke_run):
    pytest.importorskip("matplotlib")
    out, _, payload, _ = smoke_run
    expected = {_compare_report.plot_name(operation) for operation in _workloads.OPERATIONS}
    assert set(payload["plots"]) == expected
    for name in expected:
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bad_peer_python_is_a_usage_error():
    done = subprocess.run([sys.executable, COMPARE, "--peer-python", "nobody=/usr/bin/python3"],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "--peer-python expects NAME=PATH with NAME one of cpprb, rllib, tianshou, torchrl; "\
           "got 'nobody=/usr/bin/python3'" in done.stderr
