"""The soak (benchmarks/soak.py) at CI size: writers and a learner, one SIGKILLed and restarted
every ~2 s, for CPPRB_RAY_SOAK_SECONDS (default 20) seconds. Run the script by hand for an hour."""

from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_soak_with_kills_loses_tears_leaks_and_hangs_nothing(tmp_path):
    seconds = float(os.environ.get("CPPRB_RAY_SOAK_SECONDS", 20))
    report = tmp_path / "soak.json"
    result = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "soak.py"), "--seconds", str(seconds),
         "--writers", "3", "--kill-every", "2", "--json", str(report)],
        capture_output=True, text=True, timeout=seconds + 180, cwd=ROOT)
    print(result.stdout)
    figures = json.loads(report.read_text())
    assert figures["problems"] == [], result.stdout
    assert result.returncode == 0, result.stdout + result.stderr
    assert figures["lost_rows"] == 0 and figures["torn_rows_sampled"] == 0
    # It did soak: rows went in, the learner worked, processes were killed and came back, and
    # the writers' last commits were checked after the kills.
    assert figures["rows_added"] > 0 and figures["learner_batches"] > 0
    kills = figures["kills"]["writer"] + figures["kills"]["learner"]
    assert kills >= max(2, seconds // 4), figures["kills"]
    assert figures["checks"] == kills + 2
    if seconds >= 30:
        assert figures["kills"]["writer"] >= 2 and figures["kills"]["learner"] >= 2
        assert figures["repairs"] >= 1, figures   # some kills landed mid-operation
