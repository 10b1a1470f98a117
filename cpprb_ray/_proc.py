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


# cgroup v1 reports "no limit" as the largest multiple of the page size below 2**63.
_NO_CGROUP_LIMIT = 1 << 62


def _cgroup_limit(path: str, root: str) -> Optional[int]:
    """The least memory limit of the cgroup at `path` (a line's path of /proc/self/cgroup) and
    of those above it, under the hierarchy mounted at `root`; None when none is set."""
    least: Optional[int] = None
    relative = path.strip("/")
    while True:
        directory = os.path.join(root, relative) if relative else root
        for name in ("memory.max", "memory.limit_in_bytes"):
            try:
                with open(os.path.join(directory, name)) as handle:
                    text = handle.read().strip()
            except OSError:
                continue
            if text.isdigit() and int(text) < _NO_CGROUP_LIMIT:
                least = int(text) if least is None else min(least, int(text))
        if not relative:
            return least
        relative = os.path.dirname(relative)


def memory_limit(proc_cgroup: str = "/proc/self/cgroup",
                 cgroup_root: str = "/sys/fs/cgroup") -> Optional[int]:
    """The most memory this process may use, in bytes, or None where nothing says: the least of
    the machine's memory, the memory limits of the cgroups it runs in (v2 ``memory.max``, v1
    ``memory.limit_in_bytes``; its own and those above it: a container's limit) and its
    RLIMIT_AS and RLIMIT_DATA. What the outputs of one call may not exceed: past it the kernel's
    OOM killer ends the process (the machine's or the container's), or the allocation fails.

    Examples
    --------
    >>> limit = memory_limit()
    >>> limit is None or limit > 0
    True
    """
    limits: List[int] = []
    try:
        limits.append(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        pass
    try:
        with open(proc_cgroup) as handle:
            lines = handle.read().splitlines()
    except OSError:
        lines = []
    for line in lines:
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue
        if fields[1] == "":        # v2: "0::/path", at the root or (hybrid) under unified/
            root = cgroup_root
            if not os.path.exists(os.path.join(root, "cgroup.controllers")):
                root = os.path.join(cgroup_root, "unified")
        elif "memory" in fields[1].split(","):     # v1: "N:memory:/path"
            root = os.path.join(cgroup_root, "memory")
        else:
            continue
        found = _cgroup_limit(fields[2], root)
        if found is not None:
            limits.append(found)
    limits += _rlimits()
    return min(limits) if limits else None


def _rlimits() -> List[int]:
    """The soft RLIMIT_AS and RLIMIT_DATA that are set."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not POSIX
        return []
    found = []
    for which in ("RLIMIT_AS", "RLIMIT_DATA"):
        kind = getattr(resource, which, None)
        if kind is not None:
            soft = resource.getrlimit(kind)[0]
            if soft != resource.RLIM_INFINITY and soft > 0:
                found.append(soft)
    return found
