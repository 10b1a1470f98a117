"""What /proc says about processes and threads, in one place: whether a pid is alive, who it
is (its start time, so that a reused pid is not taken for the owner), whether it is a zombie,
and which pid namespace and boot a pid means something in."""

from __future__ import annotations

import os
from typing import List, Optional


def _proc_stat(pid: int) -> Optional[List[bytes]]:
    """Fields of /proc/PID/stat after the command name (state first), or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None


def process_start_time(pid: int) -> Optional[int]:
    """Start time of `pid` in clock ticks (/proc), to tell a live owner from a reused pid."""
    fields = _proc_stat(pid)
    try:
        return int(fields[19]) if fields else None
    except (IndexError, ValueError):
        return None


def process_is_zombie(pid: int) -> bool:
    """True when `pid` has exited but was not reaped yet (state Z or X): it holds nothing."""
    fields = _proc_stat(pid)
    return fields is not None and bool(fields) and fields[0] in (b"Z", b"X")


def pid_namespace() -> Optional[str]:
    """This process's pid namespace, e.g. ``"pid:[4026531836]"`` (None where /proc lacks it).

    A pid means something only inside its namespace: a container that shares /dev/shm with the
    host (``--ipc=host``) or with another pod has its own pids and /proc.
    """
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def boot_id() -> Optional[str]:
    """The running kernel's boot id (shared by every container on the host; new every boot)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as source:
            return source.read().strip()
    except OSError:
        return None


def thread_exists(tid: int) -> bool:
    """Whether thread `tid` exists in this pid namespace (/proc lists every thread's tid)."""
    return os.path.exists(f"/proc/{tid}")
