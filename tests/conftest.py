"""Shared fixtures: backends, one Ray runtime per session, and a leak check on every test."""

from __future__ import annotations

import json
import os
import re
import secrets
import sys
import tempfile
import time

import pytest

from cpprb_ray import _segment

SEGMENT_PREFIX = "cpprb_ray"

# The one Ray runtime the tests start on their own stays on loopback: Ray (2.60) binds a local
# instance to the machine's outward address, even given 127.0.0.1, unless this is "0". Set
# before any test module imports ray. (A second node cannot join such a node: the two-node
# harness, benchmarks/_two_nodes.py, removes it from its nodes' environment.)
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
LOOPBACK = "127.0.0.1"


def _segment_dirs() -> list[str]:
    dirs = [d for d in ("/dev/shm", tempfile.gettempdir()) if os.path.isdir(d)]
    return dirs


def _segments() -> set[str]:
    found = set()
    for directory in _segment_dirs():
        try:
            names = os.listdir(directory)
        except OSError:
            continue
        found.update(os.path.join(directory, n) for n in names if n.startswith(SEGMENT_PREFIX))
    return found


def available_backends() -> list[str]:
    backends = ["mmap"]
    if sys.version_info >= (3, 8):
        backends.insert(0, "shm")
    return backends


@pytest.fixture(params=available_backends())
def backend(request) -> str:
    """Every buffer test runs once per backend this Python has."""
    return request.param


# No env_dict makes more than a few MiB of layout JSON; a header that says more is damaged.
_LAYOUT_LIMIT = 64 << 20


def _meta(path: str):
    """The layout meta of the segment at `path`; None while it is not a readable buffer."""
    with open(path, "rb") as handle:
        head = handle.read(512)
        try:
            header = _segment.read_header(bytearray(head))
            if header["magic"] != _segment.MAGIC:
                return None
            if not 0 < header["layout_length"] <= _LAYOUT_LIMIT:
                return None   # damaged (another run's test of that makes one so), not read
            handle.seek(header["layout_offset"])
            return json.loads(handle.read(header["layout_length"]))["meta"]
        except (ValueError, KeyError, TypeError):
            return None


def ours(path: str) -> bool:
    """Whether a segment was made by this test process or one of its children.

    Other pytest runs on the same host (developers run suites side by side) make segments too;
    those are neither flagged nor removed. A file that is not a readable buffer is given 2 s to
    become one (another run's buffer being created: its space is reserved, then the header is
    written, the magic last) or to go away; after that it counts as ours only if its name
    carries our pid (the raw segments that tests make are named so): another run's raw test
    segment is no buffer either, and was removed under it when every such file counted as ours.
    """
    named_ours = re.search(rf"_{os.getpid()}(?![0-9])", os.path.basename(path)) is not None
    deadline = time.monotonic() + 2.0
    while True:
        try:
            meta = _meta(path)
        except FileNotFoundError:
            return False      # gone: nothing leaked
        except OSError:       # a directory (another run's temporary one), unreadable
            return named_ours
        if meta is not None:
            me = os.getpid()
            return meta.get("owner_pid") == me or meta.get("owner_parent_pid") == me
        if time.monotonic() > deadline:
            return named_ours
        time.sleep(0.05)


@pytest.fixture
def segment_prefix() -> str:
    """A name prefix for the buffers of one test: its sweeps of orphans (``rm --orphans
    --prefix``) take those and nothing else on the host, neither another run's test segments
    nor a user's crashed job waiting to be inspected."""
    return f"{SEGMENT_PREFIX}_test_{os.getpid()}_{secrets.token_hex(4)}_"


@pytest.fixture(autouse=True)
def no_leaked_segments():
    """Fail the test that leaves a cpprb_ray segment (shm or mmap file) behind."""
    before = _segments()
    yield
    leaked = {path for path in _segments() - before if ours(path)}
    for path in leaked:  # remove them so one leak does not fail every later test
        try:
            os.unlink(path)
        except OSError:
            pass
    assert not leaked, f"test leaked segments: {sorted(leaked)}"


@pytest.fixture(scope="session")
def ray_session():
    """One real Ray runtime (2 CPUs) for the whole session, started on first use."""
    import ray
    # address="local": a runtime of its own, never a cluster that RAY_ADDRESS names.
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             _node_ip_address=LOOPBACK)
    yield ray
    ray.shutdown()
