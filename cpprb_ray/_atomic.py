"""Atomic, durable replacement of a file, and the removal of what killed writers left.

A writer fills a temporary file in the target's directory (an unnamed O_TMPFILE where the
filesystem has one, else a named ``.<name>.<host>.<pid>.<random>.tmp``), fsyncs it, renames it
over the target and fsyncs the directory. Used by :mod:`cpprb_ray.checkpoint`.
"""

from __future__ import annotations

import os
import secrets
import socket
from typing import Any, List, Optional, Sequence, Set

__all__ = ["remove_stale_temporaries", "write_atomically"]

_TEMPORARY_SUFFIX = ".tmp"
# Write through an unnamed O_TMPFILE where the filesystem has it (tests turn it off to exercise
# the named temporary that other filesystems get).
_ANONYMOUS_TEMPORARY = True
# The temporaries this process is writing now. Any other of its own is stale: a Python
# exception from a signal handler (KeyboardInterrupt, SystemExit on SIGTERM) can land between
# any two steps of a save, even inside its cleanup, and a process that lives on would keep such
# a name for good, were only dead processes' temporaries removed.
# No lock guards it: set.add, set.discard and `in` are each atomic under the GIL, and a lock
# taken by `with` can be left held by a signal handler's exception that lands between its
# acquire and the block (the next save then waited for ever: seen on Python 3.7).
_WRITING: Set[str] = set()


def _temporary_prefix(base: str) -> str:
    return f".{base}."


def write_atomically(file: str, chunks: Sequence[Any]) -> None:
    """Replace `file` by the concatenated `chunks` (bytes-like), atomically and durably.

    A temporary file in `file`'s directory is written and fsynced, renamed over `file`, and the
    directory is fsynced: whenever this process dies, `file` is the old or the new file, whole.

    Examples
    --------
    >>> import os, tempfile
    >>> from cpprb_ray._atomic import write_atomically
    >>> with tempfile.TemporaryDirectory() as directory:
    ...     file = os.path.join(directory, "notes")
    ...     write_atomically(file, [b"old"])
    ...     write_atomically(file, [b"new ", memoryview(b"text")])
    ...     with open(file, "rb") as written:
    ...         print(written.read(), os.listdir(directory))
    b'new text' ['notes']
    """
    directory = os.path.dirname(os.path.abspath(file))
    base = os.path.basename(file)
    if not base:
        raise ValueError(f"file must name a file; got {file!r}")
    remove_stale_temporaries(file)
    temporary = os.path.join(directory, f"{_temporary_prefix(base)}{socket.gethostname()}."
                                        f"{os.getpid()}.{secrets.token_hex(4)}{_TEMPORARY_SUFFIX}")
    _WRITING.add(temporary)
    fd = _open_anonymous(directory)
    anonymous = fd is not None
    # `named` is set before each step that can give the temporary its name, never after: an
    # exception raised by a signal handler (SystemExit on SIGTERM, KeyboardInterrupt) between
    # the step and the assignment would otherwise leave the name behind in a live process.
    named = False
    try:
        if fd is None:
            named = True
            try:
                fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except OSError:
                named = False     # not created (EEXIST: another's file, left alone)
                raise
        for chunk in chunks:
            view = memoryview(chunk).cast("B")
            while len(view):
                view = view[os.write(fd, view):]
        os.fsync(fd)
        if anonymous:
            # The data are durable before the file gets a name; only a death in the next
            # microseconds (between link and rename) can leave the temporary name behind.
            named = True
            try:
                _name_anonymous(fd, temporary)
            except OSError:
                named = False     # not linked (EEXIST: another's file, left alone)
                raise
        os.replace(temporary, file)
        named = False
    finally:
        # Forgotten first, so that whatever is interrupted after it, the next save removes it.
        _WRITING.discard(temporary)
        if named:
            try:
                os.unlink(temporary)
            except OSError:
                pass
        if fd is not None:
            os.close(fd)
    _fsync_directory(directory)


def _open_anonymous(directory: str) -> Optional[int]:
    """An unnamed file in `directory` (O_TMPFILE), or None where the filesystem, the platform
    or a missing /proc (through which it gets its name) rules it out. A process killed while it
    writes one leaves nothing behind; a named temporary is left for a later save to remove."""
    if not (_ANONYMOUS_TEMPORARY and hasattr(os, "O_TMPFILE")
            and os.path.isdir("/proc/self/fd")):
        return None
    try:
        return os.open(directory, os.O_TMPFILE | os.O_WRONLY, 0o600)
    except OSError:   # EOPNOTSUPP, EISDIR on kernels and filesystems without it
        return None


def _name_anonymous(fd: int, name: str) -> None:
    # linkat(AT_SYMLINK_FOLLOW) of the /proc link, as open(2) documents for O_TMPFILE. Passing
    # src_dir_fd makes os.link call linkat with the flag: without it, CPython calls link(2),
    # which does not follow the link and fails with EXDEV.
    fds = os.open("/proc/self/fd", os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.link(str(fd), name, src_dir_fd=fds, follow_symlinks=True)
    finally:
        os.close(fds)


def _fsync_directory(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_stale_temporaries(file: Any) -> List[str]:
    """Remove the temporary files that saves to `file` left when they were killed; returns them.

    A save's temporary is ``.<name>.<host>.<pid>.<random>.tmp`` beside `file`; one is stale when
    it was made on this host by a process that no longer exists, or by this process and no save
    of it is writing it now (one that an exception from a signal handler interrupted). Every save
    does this first, so at most the temporaries of saves killed since the last save remain.
    Those of other live processes (a save in progress) and of other hosts are kept.

    Examples
    --------
    >>> import os, tempfile
    >>> from cpprb_ray import _atomic
    >>> with tempfile.TemporaryDirectory() as directory:
    ...     file = os.path.join(directory, "state.ckpt")
    ...     host = __import__("socket").gethostname()
    ...     dead = os.path.join(directory, f".state.ckpt.{host}.999999999.0a1b2c3d.tmp")
    ...     open(dead, "wb").close()
    ...     print([os.path.basename(path) for path in _atomic.remove_stale_temporaries(file)])
    ['.state.ckpt....999999999.0a1b2c3d.tmp']
    """
    file = os.fspath(file)
    directory = os.path.dirname(os.path.abspath(file))
    prefix = _temporary_prefix(os.path.basename(file))
    host = socket.gethostname()
    removed: List[str] = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    for name in names:
        if not (name.startswith(prefix) and name.endswith(_TEMPORARY_SUFFIX)):
            continue
        parts = name[len(prefix):-len(_TEMPORARY_SUFFIX)].rsplit(".", 2)
        if len(parts) != 3 or parts[0] != host or not parts[1].isdigit():
            continue
        path = os.path.join(directory, name)
        if int(parts[1]) == os.getpid():
            if path in _WRITING:
                continue              # a save of this process (another thread's) writes it
        elif _process_exists(int(parts[1])):
            continue
        try:
            os.unlink(path)
            removed.append(path)
        except OSError:
            pass
    return removed


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):
        return False
    except PermissionError:   # another user's process
        return True
    return True
