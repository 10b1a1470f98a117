"""A Ray driver of its own (tests/test_metrics.py runs it in a fresh process, so that its Ray
runtime, started with a metrics export port, never meets the session's): a buffer exported
with cpprb_ray.metrics, some adds, samples and updates, then Ray's metrics endpoint read until
the buffer's figures are there. Prints one JSON object: the values read, by metric name.

    python tests/_metrics_driver.py NAME_PREFIX
"""

from __future__ import annotations

import json
import os
import re
import socket
import sys
import time
import urllib.request

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"   # loopback only (tests/conftest.py)
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import numpy as np  # noqa: E402
import ray  # noqa: E402

from cpprb_ray import PrioritizedReplayBuffer, SampleToInsertRatio, metrics  # noqa: E402

DEADLINE_S = 40.0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def scrape(port: int, name: str) -> dict:
    """{metric name: (value, tags)} of the series tagged buffer=`name` on Ray's endpoint (Ray
    names them with its own prefix, `ray_`, which is dropped here)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    found = {}
    for line in text.splitlines():
        match = re.match(r"^(?:ray_)?(cpprb_ray_\w+)\{([^}]*)\}\s+(\S+)$", line)
        if match and f'buffer="{name}"' in match.group(2):
            found[match.group(1)] = (float(match.group(3)), match.group(2))
    return found


def main() -> None:
    prefix = sys.argv[1]
    port = free_port()
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             configure_logging=False, _node_ip_address="127.0.0.1",
             _metrics_export_port=port,
             _system_config={"metrics_report_interval_ms": 500})
    try:
        limiter = SampleToInsertRatio(samples_per_insert=2.0, min_size_to_sample=10,
                                      error_buffer=200)
        with PrioritizedReplayBuffer(256, {"obs": {}}, name=prefix + "metrics",
                                     rate_limiter=limiter) as rb:
            exporter = metrics.export(rb, interval=0.2, tags={"job": "test"})
            rb.add(obs=np.arange(100.0))
            for _ in range(3):
                batch = rb.sample(32)
                rb.update_priorities(batch["indexes"], np.full(32, 2.0), batch["generations"])
            expected = {"cpprb_ray_inserts_total": 100.0, "cpprb_ray_samples_total": 96.0,
                        "cpprb_ray_updates_total": 96.0, "cpprb_ray_stored": 100.0}
            deadline = time.monotonic() + DEADLINE_S
            found: dict = {}
            while time.monotonic() < deadline:
                try:
                    found = scrape(port, rb.name)
                except OSError:
                    found = {}
                if all(found.get(key, (None,))[0] == value for key, value in expected.items()):
                    break
                time.sleep(0.5)
            exporter.stop()
            result = {"name": rb.name, "port": port, "readings": exporter.readings,
                      "running_after_stop": exporter.running,
                      "values": {key: value for key, (value, _) in found.items()},
                      "tags": {key: tags for key, (_, tags) in found.items()}}
    finally:
        ray.shutdown()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
