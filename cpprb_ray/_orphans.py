"""Find and remove this user's buffers, e.g. those of an owner killed with SIGKILL.

An owner that is killed cannot unlink its segment; the segment (and every view mapping it) goes
on working, and its name stays in /dev/shm until somebody removes it. Each segment records its
owner's pid and the start time of that process, so a pid reused by an unrelated process does not
count as the owner being alive.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List

from cpprb_ray import _layout, _memory, _store


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
                            and entry.stat(follow_symlinks=False).st_uid == os.getuid()
                            and entry.stat(follow_symlinks=False).st_size >= _store.HEADER_NBYTES):
                        files.append(entry.path)
                except OSError:
                    continue
    return files


def _owner_alive(meta: Dict[str, Any]) -> bool:
    pid = int(meta.get("owner_pid", 0))
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    if _layout.process_is_zombie(pid):
        return False
    started = meta.get("owner_start")
    return started is None or _layout.process_start_time(pid) == started


def _describe(path: str) -> Dict[str, Any]:
    with open(path, "rb") as handle:
        head = handle.read(_store.HEADER_NBYTES)
        if len(head) < _store.HEADER_NBYTES or head[:8] != _store.MAGIC:
            raise ValueError("not a cpprb_ray buffer")
        header = _store.read_header(bytearray(head))
        # Header and layout JSON come first; read exactly that much (the JSON can be long).
        wanted = min(int(header["layout_offset"]) + int(header["layout_length"]),
                     os.fstat(handle.fileno()).st_size)
        handle.seek(0)
        data = bytearray(handle.read(max(wanted, _store.LAYOUT_OFFSET)))
    size = os.path.getsize(path)
    try:
        # Beyond the layout, the segment is only checked arithmetically.
        header, layout = _layout.read(data, size, path)
    except ValueError as error:
        # Our magic but unreadable: damaged, or made by an incompatible version. Still list it
        # (with what the fixed header says) so that it can be removed.
        return {"name": os.path.basename(path) if path.startswith(_memory.SHM_DIR + "/") else path,
                "backend": "?", "size": size, "capacity": header["capacity"],
                "stored": header["stored_size"], "prioritized": bool(header["prioritized"]),
                "owner_pid": int(header["owner_pid"]),
                "owner_alive": _owner_alive({"owner_pid": header["owner_pid"]}), "path": path,
                "valid": False, "problem": str(error)}
    backend = layout.meta.get("backend", "mmap")
    name = os.path.basename(path) if backend == "shm" else path
    return {"name": name, "backend": backend, "size": size, "capacity": layout.capacity,
            "stored": header["stored_size"], "prioritized": layout.prioritized,
            "owner_pid": int(layout.meta.get("owner_pid", 0)),
            "owner_alive": _owner_alive(layout.meta), "path": path, "valid": True,
            "problem": ""}


def list_buffers() -> List[Dict[str, Any]]:
    """This user's cpprb_ray buffers on this host, as dicts.

    Keys: name, backend, size (bytes), capacity, stored, prioritized, owner_pid, owner_alive,
    path, valid and problem (a buffer with our magic that cannot be attached -- damaged, or made
    by an incompatible version -- is listed with valid False, backend "?", so it can be removed).

    Examples
    --------
    >>> from cpprb_ray import ReplayBuffer, list_buffers
    >>> with ReplayBuffer(4, {"obs": {}}) as rb:
    ...     print(any(entry["name"] == rb.name for entry in list_buffers()))
    True
    """
    found = []
    for path in _candidate_files():
        try:
            found.append(_describe(path))
        except (OSError, ValueError):
            continue
    return found


def remove_buffer(name_or_path: str) -> bool:
    """Unlink a buffer by name (shm) or path (mmap); True if it existed. Views keep working.

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
    if not os.path.exists(path):
        return False
    _describe(path)  # refuse to remove anything that is not a cpprb_ray buffer
    return _memory.unlink(backend, location)


def remove_orphans() -> List[str]:
    """Unlink every buffer whose owner process is gone; returns their names.

    Examples
    --------
    >>> from cpprb_ray import ReplayBuffer, remove_orphans
    >>> with ReplayBuffer(4, {"obs": {}}) as rb:
    ...     removed = remove_orphans()
    ...     print(isinstance(removed, list), rb.name in removed)  # a live owner's buffer stays
    True False
    """
    removed = []
    for entry in list_buffers():
        if not entry["owner_alive"]:
            backend = entry["backend"]
            if backend == "shm":
                gone = _memory.unlink("shm", entry["name"])
            else:  # mmap files, and unreadable segments (a POSIX shm object is a file too)
                gone = _memory.unlink("mmap", entry["path"])
            if gone:
                removed.append(entry["name"])
    return removed
