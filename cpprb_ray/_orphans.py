"""Find and remove this user's buffers, e.g. those of an owner killed with SIGKILL.

An owner that is killed cannot unlink its segment; the segment (and every view mapping it) goes
on working, and its name stays in /dev/shm until somebody removes it. Each segment records its
owner's pid and the start time of that process, so a pid reused by an unrelated process does not
count as the owner being alive.

A pid means something only in its pid namespace, and /dev/shm is often shared across them
(Docker ``--ipc=host``, pods sharing a memory volume): from here, a live owner in another
container looks like a missing pid, or like an unrelated process of ours with the same number.
So each segment also records its owner's pid namespace and the kernel's boot id; when either
differs from ours, the owner's state is "unknown", and ``remove_orphans`` leaves the buffer alone
unless forced.
"""

from __future__ import annotations

import json
import os
import stat
from typing import Any, Dict, List, Optional, Tuple

from cpprb_ray import _layout, _memory, _proc, _rules, _segment

ALIVE, DEAD, UNKNOWN = "alive", "dead", "unknown"


def _candidate_files() -> List[str]:
    directories = {_memory.default_mmap_dir(), _memory.SHM_DIR}
    files = []
    for directory in sorted(d for d in directories if os.path.isdir(d)):
        try:
            entries = os.scandir(directory)
        except OSError:
            continue
        with entries:
            for entry in entries:
                try:
                    if (entry.is_file(follow_symlinks=False)
                            and entry.stat(follow_symlinks=False).st_uid == os.geteuid()
                            and entry.stat(follow_symlinks=False).st_size
                            >= _segment.HEADER_NBYTES):
                        files.append(entry.path)
                except OSError:
                    continue
    return files


# The kernel's PID_MAX_LIMIT: no pid is larger (a damaged header may hold any 64-bit number).
_PID_LIMIT = 1 << 22


def _owner_pid(value: Any) -> int:
    """The recorded owner pid as a pid, or 0 when it cannot be one (damaged metadata)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= _PID_LIMIT:
        return 0
    return value


def _pid_alive(meta: Dict[str, Any], identity: Optional[Tuple[int, int]] = None) -> bool:
    """Whether owner_pid, read in THIS pid namespace, is the recorded owner process (and, given
    the segment file's `identity`, still maps it)."""
    pid = _owner_pid(meta.get("owner_pid", 0))
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    if not _proc.has_live_task(pid):
        return False
    started = meta.get("owner_start")
    if started is not None and _proc.process_start_time(pid) != started:
        return False
    # An owner that exec'd another program maps its segment no more: it cannot free it.
    return identity is None or _proc.maps_file(pid, identity)


def owner_status(meta: Dict[str, Any],
                 identity: Optional[Tuple[int, int]] = None) -> Tuple[str, str]:
    """(status, why) of a segment's owner: "alive", "dead", or "unknown" with the reason.

    Segments made before the namespace was recorded are judged by their pid alone. Given the
    segment file's (st_dev, st_ino) `identity`, an owner that no longer maps it (it exec'd
    another program, which cannot free it) is dead too.

    Examples
    --------
    >>> import os
    >>> from cpprb_ray import _layout
    >>> here = {"owner_pid": os.getpid(), "owner_pidns": _proc.pid_namespace(),
    ...         "boot_id": _proc.boot_id()}
    >>> owner_status(here)[0]
    'alive'
    >>> status, why = owner_status(dict(here, owner_pidns="pid:[1]"))
    >>> status, why.endswith("runs in another pid namespace (pid:[1]), e.g. another container")
    ('unknown', True)
    """
    recorded_boot = meta.get("boot_id")
    if recorded_boot is not None and recorded_boot != _proc.boot_id():
        return UNKNOWN, (f"its owner (pid {meta.get('owner_pid')}) ran under another kernel "
                         f"boot (another host sharing this directory, or before a reboot)")
    recorded_pidns = meta.get("owner_pidns")
    if recorded_pidns is not None and recorded_pidns != _proc.pid_namespace():
        return UNKNOWN, (f"its owner (pid {meta.get('owner_pid')}) runs in another pid "
                         f"namespace ({recorded_pidns}), e.g. another container")
    return (ALIVE, "") if _pid_alive(meta, identity) else (DEAD, "")


def _meta_of(data: bytearray) -> Dict[str, Any]:
    """What a segment's layout JSON says of its owner, read as far as it can be (the segment
    may be damaged, or of another version), with the fixed header's owner pid as a fallback."""
    header = _segment.read_header(data)
    meta: Dict[str, Any] = {"owner_pid": header["owner_pid"]}
    try:
        start = int(header["layout_offset"])
        document = json.loads(bytes(data[start:start + int(header["layout_length"])]).decode())
        recorded = document["meta"]
        meta.update({key: recorded[key] for key in _layout.IDENTITY_META if key in recorded})
    except (ValueError, KeyError, TypeError, IndexError, UnicodeDecodeError, RecursionError):
        pass
    return meta


def _describe(path: str) -> Dict[str, Any]:
    # Not following a symlink, not waiting on a FIFO: only a regular file is read.
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        status_of_file = os.fstat(fd)
        if not stat.S_ISREG(status_of_file.st_mode):
            raise ValueError(f"{path!r} is not a regular file, not a cpprb_ray buffer")
        data = _layout.read_prefix(fd)
    finally:
        os.close(fd)
    header = _segment.read_header(data)
    size = status_of_file.st_size
    # Where the owner's mappings name the file as stat does (tmpfs: /dev/shm), an owner that
    # no longer maps it is gone whatever its pid says; elsewhere (an overlay filesystem names
    # the file differently there) the pid and its start time decide alone.
    identity = ((status_of_file.st_dev, status_of_file.st_ino)
                if os.path.dirname(path) == _memory.SHM_DIR
                and _proc.is_memory_filesystem(_memory.SHM_DIR) else None)
    try:
        # Beyond the layout, the segment is only checked arithmetically.
        header, layout = _layout.read(data, size, path)
    except ValueError as error:
        # Our magic but unreadable: damaged, or made by an incompatible version. Still list it
        # (with what the fixed header says) so that it can be removed.
        # The owner's namespace and start time if the JSON still says them (another version's
        # buffer, its owner in another container, is not to be taken for an orphan).
        status, why = owner_status(_meta_of(data), identity)
        return {"name": os.path.basename(path) if path.startswith(_memory.SHM_DIR + "/") else path,
                "backend": "?", "size": size, "capacity": header["capacity"],
                "stored": header["stored_size"], "prioritized": bool(header["prioritized"]),
                "owner_pid": int(header["owner_pid"]), "owner_status": status,
                "owner_alive": status == ALIVE, "owner_why": why, "path": path,
                "valid": False, "problem": str(error)}
    backend = layout.meta.get("backend", "mmap")
    name = os.path.basename(path) if backend == "shm" else path
    status, why = owner_status(layout.meta, identity)
    return {"name": name, "backend": backend, "size": size, "capacity": layout.capacity,
            "stored": header["stored_size"], "prioritized": layout.prioritized,
            "owner_pid": _owner_pid(layout.meta.get("owner_pid", 0)), "owner_status": status,
            "owner_alive": status == ALIVE, "owner_why": why, "path": path, "valid": True,
            "problem": ""}


def check_prefix(prefix: Optional[str]) -> Optional[str]:
    """`prefix` as given, or TypeError / ValueError naming it: None (every buffer), or the
    start of a segment's file name (not a path: no '/'; no NUL, which would cut it)."""
    if prefix is None:
        return None
    if not isinstance(prefix, str):
        raise TypeError(f"prefix must be a str or None; got {type(prefix).__name__}")
    if not prefix or "/" in prefix or "\0" in prefix:
        raise ValueError(f"prefix must be the start of a buffer's file name: 1 or more "
                         f"characters without '/' or NUL; got {_rules.shown(repr(prefix), 60)}")
    return prefix


def _matches(path: str, prefix: Optional[str]) -> bool:
    return prefix is None or os.path.basename(path).startswith(prefix)


def list_buffers(prefix: Optional[str] = None) -> List[Dict[str, Any]]:
    """This user's cpprb_ray buffers on this host, as dicts; given `prefix`, only those whose
    file name (an shm buffer's name, an mmap file's name without its directory) starts with it.

    Keys: name, backend, size (bytes), capacity, stored, prioritized, owner_pid, owner_status
    ("alive", "dead", or "unknown" when the owner runs in another pid namespace or kernel boot,
    see :func:`owner_status`), owner_why (why it is unknown), owner_alive (status == "alive"),
    path, valid and problem (a buffer with our magic that cannot be attached -- damaged, or made
    by an incompatible version -- is listed with valid False, backend "?", so it can be removed).

    Examples
    --------
    >>> from cpprb_ray import ReplayBuffer, list_buffers
    >>> with ReplayBuffer(4, {"obs": {}}) as rb:
    ...     print(any(entry["name"] == rb.name for entry in list_buffers()))
    True
    """
    check_prefix(prefix)
    found = []
    for path in _candidate_files():
        if not _matches(path, prefix):
            continue
        try:
            found.append(_describe(path))
        except (OSError, ValueError):
            continue
    return found


def remove_buffer(name_or_path: str) -> bool:
    """Unlink a buffer by name (shm) or path (mmap); True if it existed. Views keep working.

    Refuses, with ValueError, anything that is not a cpprb_ray buffer (a directory included),
    and with PermissionError a buffer of another user.

    Examples
    --------
    >>> from cpprb_ray import ReplayBuffer, remove_buffer
    >>> rb = ReplayBuffer(4, {"obs": {}})
    >>> _ = rb.add(obs=1.0)
    >>> remove_buffer(rb.name)
    True
    >>> remove_buffer(rb.name)  # already gone
    False
    >>> rb.get_stored_size()  # the handle keeps working
    1
    >>> rb.close()
    """
    backend, location = _memory.locate(name_or_path)
    path = _memory.file_of(backend, location)
    try:
        status = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    if not stat.S_ISREG(status.st_mode):
        kind = "a directory" if stat.S_ISDIR(status.st_mode) else "not a regular file"
        raise ValueError(f"{path!r} is {kind}, not a cpprb_ray buffer")
    _memory.check_owner(status.st_uid, path)
    try:
        _describe(path)  # refuse to remove anything that is not a cpprb_ray buffer
    except OSError as error:
        raise ValueError(f"{path!r} cannot be read ({error.strerror})") from None
    return _memory.unlink(backend, location)


def _unlink_entry(entry: Dict[str, Any]) -> bool:
    if entry["backend"] == "shm":
        return _memory.unlink("shm", entry["name"])
    # mmap files, and unreadable segments (a POSIX shm object is a file too)
    return _memory.unlink("mmap", entry["path"])


def sweep_orphans(force: bool = False, prefix: Optional[str] = None,
                  ) -> Tuple[List[str], List[Tuple[str, str]]]:
    """Unlink the buffers whose owner is gone; returns (removed names, [(name, why) skipped]).

    Buffers whose owner's state cannot be known from here ("unknown") are skipped, with the
    reason, unless `force`; buffers whose owner is alive are never touched. Given `prefix`,
    only buffers whose file name starts with it are looked at (:func:`list_buffers`): one job's
    orphans, leaving another's, still to be inspected, alone.

    Examples
    --------
    >>> import os
    >>> from cpprb_ray import ReplayBuffer
    >>> job = "cpprb_ray_job_" + os.urandom(4).hex() + "_"   # the prefix of one job's buffers
    >>> with ReplayBuffer(4, {"obs": {}}, name=job + "learner") as rb:
    ...     print(sweep_orphans(prefix=job))   # its owner (this process) lives: kept
    ([], [])
    """
    if not isinstance(force, bool):
        raise TypeError(f"force must be a bool; got {type(force).__name__}")
    check_prefix(prefix)
    removed: List[str] = []
    skipped: List[Tuple[str, str]] = []
    for entry in list_buffers(prefix):
        if entry["owner_status"] == ALIVE:
            continue
        if entry["owner_status"] == UNKNOWN and not force:
            skipped.append((entry["name"], entry["owner_why"]))
            continue
        if _unlink_entry(entry):
            removed.append(entry["name"])
    return removed, skipped


def remove_orphans(force: bool = False, prefix: Optional[str] = None) -> List[str]:
    """Unlink every buffer whose owner process is gone; returns their names.

    An owner in another pid namespace or kernel boot (a container sharing /dev/shm) cannot be
    seen from here: such buffers are kept unless `force` (see :func:`sweep_orphans`). Given
    `prefix`, only buffers whose file name starts with it are looked at (one job's buffers,
    named by it with ``name=``); without it, every orphan of this user on this host goes.

    Examples
    --------
    >>> import os
    >>> from cpprb_ray import ReplayBuffer, remove_orphans
    >>> job = "cpprb_ray_job_" + os.urandom(4).hex() + "_"   # the prefix of one job's buffers
    >>> with ReplayBuffer(4, {"obs": {}}, name=job + "learner") as rb:
    ...     print(remove_orphans(prefix=job))  # a live owner's buffer stays
    []
    """
    return sweep_orphans(force, prefix)[0]
