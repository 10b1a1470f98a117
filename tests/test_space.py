"""Space: a segment that does not fit fails at creation with ENOSPC, never later with SIGBUS.

Docker's default /dev/shm is a 64 MiB tmpfs. These tests make one for real: a child runs in a
private mount namespace (``unshare -m``) with a small tmpfs mounted on /dev/shm (or on a
directory, for ``backend="mmap", path=...``), so nothing of the host's /dev/shm is touched. The
child reports what happened as JSON; a SIGBUS would show as its exit status.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys

import pytest

import cpprb_ray

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMEOUT = 120

# Both scripts print one JSON object. The env_dict makes 1088-byte row records, so 2**17 rows
# are 136 MiB: the buffer of the report, on a 64 MiB /dev/shm.
COMMON = """
import errno, json, os, sys
import numpy as np
import cpprb_ray
from cpprb_ray import _memory
ENV = {"obs": {"shape": 1024, "dtype": "uint8"}, "rew": {}}

def failure(make, directory):
    try:
        rb = make()
    except OSError as error:
        # "claims": the segments this process still holds the right to free (the failed one's
        # claim, taken when its file was opened, must be given up with it).
        return {"errno": error.errno, "message": str(error), "left": sorted(os.listdir(directory)),
                "claims": len(cpprb_ray._ownership._live)}
    rb.close()
    return {"errno": None}

def fill(directory):
    # Take every byte left on the filesystem, as another job's files would.
    path = os.path.join(directory, "filler")
    with open(path, "wb") as filler:
        chunk = bytes(1 << 20)
        try:
            while True:
                filler.write(chunk)
                filler.flush()
        except OSError as error:
            assert error.errno == errno.ENOSPC, error
    return path
"""

SHM_SCRIPT = COMMON + """
backend = sys.argv[1]
stats = os.statvfs("/dev/shm")
report = {"mount": _memory.mount_of("/dev/shm"), "free": stats.f_bavail * stats.f_frsize}
report["too_big"] = failure(
    lambda: cpprb_ray.PrioritizedReplayBuffer(2**17, ENV, backend=backend), "/dev/shm")
report["huge"] = failure(
    lambda: cpprb_ray.PrioritizedReplayBuffer(2**24, {"obs": {"shape": 4}}, backend=backend),
    "/dev/shm")

# A buffer that fits, then a full filesystem: every row of it is already there.
rb = cpprb_ray.PrioritizedReplayBuffer(2**14, ENV, backend=backend)
filler = fill("/dev/shm")
rb.clear()                                 # an empty buffer: touches every row record
rows = np.random.default_rng(0).integers(0, 255, (4096, 1024), dtype=np.uint8)
for first in range(0, 2**14, 4096):
    rb.add(obs=rows, rew=np.ones(4096))
batch = rb.sample(64)
same = (batch["obs"] == rows[batch["indexes"] % 4096]).all()
report["filled"] = [rb.get_stored_size(), int(same)]
rb.clear()
report["second"] = failure(lambda: cpprb_ray.ReplayBuffer(2**14, ENV, backend=backend), "/dev/shm")
os.unlink(filler)
report["after_filler"] = failure(lambda: cpprb_ray.ReplayBuffer(2**14, ENV, backend=backend),
                                 "/dev/shm")
rb.close()
report["left_at_end"] = sorted(os.listdir("/dev/shm"))
print(json.dumps(report))
"""

PATH_SCRIPT = COMMON + """
directory = sys.argv[1]
target = os.path.join(directory, "buffer")
report = {"mount": _memory.mount_of(target)}
report["too_big"] = failure(lambda: cpprb_ray.ReplayBuffer(2**15, ENV, backend="mmap",
                                                           path=target), directory)
with cpprb_ray.ReplayBuffer(2**12, ENV, backend="mmap", path=target) as rb:   # 4.3 MiB fits
    report["fits"] = [rb.name, os.stat(target).st_blocks * 512 >= os.path.getsize(target)]
    filler = fill(directory)
    rb.add(obs=np.ones((2**12, 1024), np.uint8), rew=np.ones(2**12))
    report["filled"] = rb.get_stored_size()
    os.unlink(filler)

# The fallback for filesystems without fallocate: check the free space, then write zeros.
fd = os.open(os.path.join(directory, "fallback"), os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
try:
    _memory.reserve_by_writing(fd, 64 << 20)
except OSError as error:
    report["fallback_too_big"] = error.errno
free_before = os.statvfs(directory).f_bavail * os.statvfs(directory).f_frsize
_memory.reserve_by_writing(fd, 8 << 20)
free_after = os.statvfs(directory).f_bavail * os.statvfs(directory).f_frsize
report["fallback"] = [os.fstat(fd).st_size, os.fstat(fd).st_blocks * 512,
                      free_before - free_after]
os.close(fd)
os.unlink(os.path.join(directory, "fallback"))
report["left_at_end"] = sorted(os.listdir(directory))
print(json.dumps(report))
"""


def child_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH")) if p)
    return env


def in_small_tmpfs(mount_point: str, size: str, script: str, *arguments: str) -> dict:
    """Run `script` in a private mount namespace with a `size` tmpfs on `mount_point`."""
    command = ('mount -t tmpfs -o size="$1" tmpfs "$2" && shift 2 && exec "$@"')
    result = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "bash", "-c", command, "bash", size,
         mount_point, sys.executable, "-c", script, *arguments],
        capture_output=True, text=True, env=child_env(), timeout=TIMEOUT)
    assert result.returncode != -signal.SIGBUS, f"the child died of SIGBUS:\n{result.stderr}"
    assert result.returncode == 0, f"child failed ({result.returncode}):\n{result.stderr}"
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def private_mounts() -> None:
    """Skip (saying why) only where the kernel or the container refuses mount namespaces."""
    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1) on this machine")
    probe = subprocess.run(["unshare", "-m", "--propagation", "private", "bash", "-c",
                            "mount -t tmpfs -o size=1m tmpfs /dev/shm"],
                           capture_output=True, text=True, timeout=TIMEOUT)
    if probe.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs in a private mount namespace: {probe.stderr.strip()}")


MIB = 2**20


def test_too_big_for_dev_shm_fails_at_creation(private_mounts, backend):
    report = in_small_tmpfs("/dev/shm", "64m", SHM_SCRIPT, backend)
    assert report["mount"] == "/dev/shm" and report["free"] == 64 * MIB

    too_big = report["too_big"]
    assert too_big["errno"] == 28 and too_big["left"] == []      # ENOSPC; nothing left behind
    assert too_big["claims"] == 0
    message = too_big["message"]
    total = cpprb_ray._layout.plan(
        2**17, cpprb_ray._layout.parse_env_dict({"obs": {"shape": 1024, "dtype": "uint8"},
                                                 "rew": {}}), True, backend).total_size
    assert f"{total / MIB:.1f} MiB buffer ({total} bytes)" in message, message
    assert "/dev/shm has 64.0 MiB free" in message, message
    assert "--shm-size" in message and "path=" in message, message

    assert report["huge"]["errno"] == 28 and report["huge"]["left"] == []
    assert report["huge"]["claims"] == 0
    assert "/dev/shm has 64.0 MiB free" in report["huge"]["message"]

    # A 17 MiB buffer on a full tmpfs: cleared empty, filled and sampled without a fault.
    assert report["filled"] == [2**14, 1]
    assert report["second"]["errno"] == 28 and len(report["second"]["left"]) == 2
    assert "MiB free" in report["second"]["message"]
    assert report["after_filler"]["errno"] is None
    assert report["left_at_end"] == []


def test_too_big_for_its_path_fails_at_creation(private_mounts, tmp_path):
    directory = str(tmp_path)
    report = in_small_tmpfs(directory, "16m", PATH_SCRIPT, directory)
    assert report["mount"] == directory
    too_big = report["too_big"]
    assert too_big["errno"] == 28 and too_big["left"] == [], too_big
    assert f"{directory} has 16.0 MiB free" in too_big["message"]
    assert report["fits"] == [os.path.join(directory, "buffer"), True]
    assert report["filled"] == 2**12
    assert report["fallback_too_big"] == 28
    size, allocated, taken = report["fallback"]
    assert size == 8 * MIB and allocated >= 8 * MIB and taken >= 8 * MIB
    assert report["left_at_end"] == []
    assert os.listdir(directory) == []          # the tmpfs was private to the child


def test_segments_are_allocated_not_sparse(backend):
    with cpprb_ray.PrioritizedReplayBuffer(2**14, {"obs": {"shape": 64}}, backend=backend) as rb:
        path = os.path.join("/dev/shm", rb.name) if backend == "shm" else rb.name
        status = os.stat(path)
        assert status.st_size > 4 * MIB
        assert status.st_blocks * 512 >= status.st_size


def test_no_space_message_names_size_free_and_mount():
    error = cpprb_ray._memory.no_space(136 * MIB, "/dev/shm/cpprb_ray_x")
    assert error.errno == 28
    free = os.statvfs("/dev/shm").f_bavail * os.statvfs("/dev/shm").f_frsize
    assert f"at /dev/shm/cpprb_ray_x: /dev/shm has {free / MIB:.1f} MiB free" in str(error)
    assert "136.0 MiB buffer (142606336 bytes)" in str(error)
