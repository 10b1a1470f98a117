"""``python -m cpprb_ray top``: the live view, on real buffers that each test makes under its own
name prefix (so it reads nothing else on the host), through the real command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from cpprb_ray import MinSize, PrioritizedReplayBuffer, ReplayBuffer, _top

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {"obs": {"shape": 2}}


def cli(*arguments, timeout=60):
    return subprocess.run([sys.executable, "-m", "cpprb_ray", *arguments], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def by_name(rows):
    return {row["name"]: row for row in rows}


def test_once_json_reads_every_kind_with_rates_and_leaves_them_as_they_were(segment_prefix):
    with ReplayBuffer(64, ENV, name=segment_prefix + "plain") as plain, \
            PrioritizedReplayBuffer(128, ENV, name=segment_prefix + "prio") as prio, \
            ReplayBuffer(64, ENV, name=segment_prefix + "laned", lanes=3) as laned, \
            ReplayBuffer(64, ENV, name=segment_prefix + "limited",
                         rate_limiter=MinSize(8)) as limited:
        plain.add(obs=np.zeros((10, 2)))
        laned.add(obs=np.zeros((4, 2)))   # claims one of its 3 lanes
        prio.add(obs=np.zeros((20, 2)))
        before = {rb.name: rb.stats() for rb in (plain, prio, laned, limited)}
        stop = threading.Event()
        blocked = []

        def held_back():   # the limiter holds this sample back until 8 rows are in
            blocked.append(limited.sample(2, timeout=30))

        def busy():
            while not stop.is_set():
                prio.add(obs=np.zeros((5, 2)))
                prio.sample(8)
                time.sleep(0.005)

        threads = [threading.Thread(target=held_back), threading.Thread(target=busy)]
        for thread in threads:
            thread.start()
        try:
            time.sleep(0.2)
            result = cli("top", "--once", "--json", "--interval", "0.5",
                         "--prefix", segment_prefix)
        finally:
            stop.set()
            threads[1].join()
        assert result.returncode == 0, result.stderr
        snapshot = json.loads(result.stdout)
        assert snapshot["interval_s"] == 0.5
        rows = by_name(snapshot["buffers"])
        assert sorted(rows) == sorted(rb.name for rb in (plain, prio, laned, limited))
        assert rows[plain.name]["kind"] == "plain"
        assert rows[prio.name]["kind"] == "prioritized"
        assert rows[laned.name]["kind"] == "laned"
        assert (rows[plain.name]["stored"], rows[plain.name]["capacity"]) == (10, 64)
        assert rows[plain.name]["owner"] == "alive"
        assert rows[plain.name]["owner_pid"] == os.getpid()
        assert (rows[laned.name]["lanes"], rows[laned.name]["lanes_in_use"]) == (3, 1)
        assert rows[plain.name]["lanes"] is None
        assert rows[prio.name]["added_per_s"] > 0 and rows[prio.name]["sampled_per_s"] > 0
        assert rows[plain.name]["added_per_s"] == 0 and rows[plain.name]["sampled_per_s"] == 0
        limiter = rows[limited.name]["rate_limiter"]
        assert limiter["kind"] == "MinSize" and limiter["can_sample"] is False
        assert rows[limited.name]["waiting"] == ["sample"]
        assert rows[plain.name]["rate_limiter"] is None and rows[plain.name]["waiting"] == []
        for name in ("repairs", "lock_waits", "updates"):
            assert isinstance(rows[plain.name][name], int)
        # Read-only: nothing but the busy buffer's own work changed anything.
        for rb in (plain, laned, limited):
            after = rb.stats()
            for key in ("inserts", "samples", "updates", "repairs", "stored", "next_index"):
                assert after[key] == before[rb.name][key], (rb.name, key)
        limited.add(obs=np.zeros((8, 2)))   # lets the held-back sample go
        threads[0].join(10)
        assert len(blocked) == 1


def test_the_table_refreshes(segment_prefix):
    with PrioritizedReplayBuffer(32, ENV, name=segment_prefix + "t") as rb:
        rb.add(obs=np.zeros((3, 2)))
        result = cli("top", "--once", "--interval", "0.2", "--prefix", segment_prefix)
        assert result.returncode == 0, result.stderr
        lines = result.stdout.splitlines()
        assert lines[0].startswith("cpprb_ray top: 1 buffer")
        assert lines[1].split()[:4] == ["NAME", "OWNER", "KIND", "ROWS"]
        # A name over 32 characters (an mmap buffer's path, Python 3.7) is shown by its end.
        shown = rb.name if len(rb.name) <= 32 else "..." + rb.name[-29:]
        assert lines[2].split()[:5] == [shown, str(os.getpid()), "alive", "prioritized", "3/32"]
        # The live view, here for two refreshes into a pipe (no screen clearing there)
        out = []

        class Stream:
            def write(self, text):
                out.append(text)

            def flush(self):
                pass

            def isatty(self):
                return False

        assert _top.run(segment_prefix, 0.1, False, False, iterations=2, stream=Stream()) == 0
        assert sum(text.startswith("cpprb_ray top: 1 buffer") for text in out) == 2


def test_a_dead_owners_buffer_is_shown_as_such(segment_prefix):
    name = segment_prefix + "orphan"
    code = ("import os, numpy as np; from cpprb_ray import ReplayBuffer; "
            f"rb = ReplayBuffer(16, {{'obs': {{}}}}, name={name!r}); rb.add(obs=np.ones(5)); "
            "os._exit(0)")   # no close: the segment stays behind
    subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, check=True, timeout=60)
    try:
        # Keyed by the name's last part: an mmap buffer's name is its file's path (Python 3.7).
        rows = {row["name"].rsplit("/", 1)[-1]: row for row in _top.read_buffers(segment_prefix)}
        assert rows[name]["owner"] == "dead" and rows[name]["stored"] == 5
    finally:
        assert cli("rm", name).returncode == 0


@pytest.mark.parametrize("arguments, message", [
    (["top", "--json"], "--json goes with --once"),
    (["top", "--once", "--interval", "0"], "--interval must be > 0"),
    (["top", "--once", "--prefix", "a/b"], "prefix must be"),
])
def test_bad_arguments(arguments, message):
    result = cli(*arguments)
    assert result.returncode == 2 and message in result.stderr, result.stderr
