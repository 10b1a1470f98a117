"""What /proc says about processes and threads, in one place: whether a pid is alive, who it
is (its start time, so that a reused pid is not taken for the owner), whether it is a zombie
(or only its main thread is), whether it still maps a file, which filesystem a directory is,
and which pid namespace and boot a pid means something in.

Examples
--------
>>> import os
>>> from cpprb_ray import _proc
>>> _proc.process_start_time(os.getpid()) > 0, _proc.process_is_zombie(os.getpid())
(True, False)
>>> _proc.thread_exists(os.getpid()), _proc.is_memory_filesystem("/dev/shm")
(True, True)
"""

from __future__ import annotations

import os
from typing import List, Optional, Tuple


def _proc_stat(pid: int, task: Optional[int] = None) -> Optional[List[bytes]]:
    """Fields of /proc/PID/stat (or of its thread `task`) after the command name (state
    first), or None."""
    path = f"/proc/{pid}/stat" if task is None else f"/proc/{pid}/task/{task}/stat"
    try:
        with open(path, "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _exited(fields: Optional[List[bytes]]) -> bool:
    return fields is not None and bool(fields) and fields[0] in (b"Z", b"X")


def process_start_time(pid: int) -> Optional[int]:
    """Start time of `pid` in clock ticks (/proc), to tell a live owner from a reused pid."""
    fields = _proc_stat(pid)
    try:
        return int(fields[19]) if fields else None
    except (IndexError, ValueError):
        return None


def process_is_zombie(pid: int) -> bool:
    """True when `pid` has exited but was not reaped yet (state Z or X): it holds nothing."""
    return _exited(_proc_stat(pid))


def has_live_task(pid: int) -> bool:
    """Whether a thread of process `pid` has not exited: its main thread, or another one when
    the main thread called pthread_exit (the pid is then a zombie while the others run on)."""
    if not process_is_zombie(pid):
        return True
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return False
    for task in tasks:
        if task.isdigit() and int(task) != pid:
            fields = _proc_stat(pid, int(task))
            if fields and not _exited(fields):
                return True
    return False


def maps_file(pid: int, identity: Tuple[int, int]) -> bool:
    """Whether process `pid` maps the file (st_dev, st_ino) `identity`, as any of its threads
    sees it. False only on evidence: a thread's mappings, read and not empty, without the file
    (a process that exec'd another program). A thread that is exiting has none left to show,
    and mappings that cannot be read (not ours, or gone) prove nothing: both count as mapping
    it, so that an owner is never called dead on them."""
    device = f"{os.major(identity[0]):02x}:{os.minor(identity[0]):02x}".encode()
    inode = str(identity[1]).encode()
    try:
        tasks = [task for task in os.listdir(f"/proc/{pid}/task") if task.isdigit()]
    except OSError:
        return True
    seen_mappings = False
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/maps", "rb") as source:
                for line in source:
                    fields = line.split(None, 5)
                    if len(fields) >= 5:
                        seen_mappings = True
                        if fields[4] == inode and fields[3] == device:
                            return True
        except OSError:
            return True
    return not seen_mappings


def is_memory_filesystem(directory: str) -> bool:
    """Whether `directory` is mounted as tmpfs or ramfs, where a mapping's device and inode in
    /proc/PID/maps are the file's own (an overlay filesystem shows the layer's below)."""
    try:
        with open("/proc/self/mounts") as mounts:
            types = [fields[2] for fields in (line.split() for line in mounts)
                     if len(fields) > 2 and fields[1] == directory]
    except OSError:
        return False
    return bool(types) and types[-1] in ("tmpfs", "ramfs")


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
