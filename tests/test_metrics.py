"""cpprb_ray.metrics: a buffer's stats() published through ray.util.metrics, read back from a
real local Ray runtime's metrics endpoint (tests/_metrics_driver.py, in a process of its own),
and the exporter's checks without Ray."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from cpprb_ray import ReplayBuffer, metrics

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(TESTS_DIR)


def test_stats_reach_rays_metrics_endpoint(segment_prefix):
    pytest.importorskip("ray")
    # Ray's metrics agent (what serves the endpoint) comes with ray[default].
    pytest.importorskip("prometheus_client")
    pytest.importorskip("aiohttp")
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)
    completed = subprocess.run(
        [sys.executable, os.path.join(TESTS_DIR, "_metrics_driver.py"), segment_prefix],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120,
        stdin=subprocess.DEVNULL)
    assert completed.returncode == 0, completed.stderr[-4000:]
    result = json.loads(completed.stdout.strip().splitlines()[-1])
    values = result["values"]
    assert values.get("cpprb_ray_inserts_total") == 100, result
    assert values["cpprb_ray_samples_total"] == 96
    assert values["cpprb_ray_updates_total"] == 96
    assert values["cpprb_ray_stored"] == 100 and values["cpprb_ray_capacity"] == 256
    assert values["cpprb_ray_fill"] == pytest.approx(100 / 256)
    assert values["cpprb_ray_max_priority"] == 2.0
    # The limiter's: 100 inserts x 2 - 96 samples
    assert values["cpprb_ray_limiter_diff"] == 104
    assert values["cpprb_ray_limiter_can_sample"] == 1
    assert 'job="test"' in result["tags"]["cpprb_ray_stored"]
    assert result["readings"] >= 2 and result["running_after_stop"] is False


def test_bad_arguments_are_refused_by_name():
    with ReplayBuffer(8, {"obs": {}}) as rb:
        with pytest.raises(ValueError, match="interval must be > 0"):
            metrics.export(rb, interval=-1)
        with pytest.raises(TypeError, match="interval must be"):
            metrics.export(rb, interval="often")
    with pytest.raises(ValueError, match="closed buffer"):
        metrics.export(rb, interval=1.0)
