"""Segments: create, attach, close and unlink one mapping per buffer, on two backends.

``"shm"``
    POSIX shared memory (``shm_open``), Python >= 3.8. We call ``_posixshmem`` -- the very
    module ``multiprocessing.shared_memory`` is built on -- instead of ``SharedMemory`` because
    on CPython < 3.13 every ``SharedMemory`` registers its segment with the resource tracker,
    which unlinks it when *that* process exits (bpo-38119 / gh-82300). A Ray worker or a
    multiprocessing child that attached would destroy the learner's buffer on its way out.
    Python 3.13's ``track=False`` fixes this; doing it ourselves fixes it everywhere.
``"mmap"``
    A regular file mapped ``MAP_SHARED``. The default file lives in /dev/shm when present (so it
    is RAM, like "shm"), else in the temp dir; or at a path the user chooses, which also allows a
    disk-backed buffer larger than RAM. This is the backend of CPython 3.7, which has no
    ``_posixshmem``.

Both create their object with mode 0600 and ``O_EXCL``, so a name is never silently reused, and
reserve every byte of it at creation (``posix_fallocate``): a tmpfs (Docker's 64 MiB /dev/shm) or
a disk that is too small fails right there with ENOSPC, instead of the sparse file that
``ftruncate`` alone makes, whose first write past the free space kills the writer with SIGBUS
(mid-add, holding the lock). Both attach only to an object that this user owns.
"""

from __future__ import annotations

import errno
import os
import pwd
import secrets
import tempfile
from typing import Any, Callable, List, Optional, Sequence, Tuple, Union

from cpprb_ray import _rules
from cpprb_ray._mapping import HUGE_PAGE, Mapping

try:  # CPython >= 3.8 on POSIX
    import _posixshmem  # type: ignore[import-not-found,unused-ignore]
except ImportError:  # pragma: no cover - exercised by the Python 3.7 leg
    _posixshmem = None

PREFIX = "cpprb_ray_"
SHM_DIR = "/dev/shm"
BACKENDS = ("shm", "mmap")

#: A file's (st_dev, st_ino): which file a name held when we created it.
Identity = Tuple[int, int]


def shm_available() -> bool:
    """Whether the "shm" backend exists on this Python."""
    return _posixshmem is not None


def resolve_backend(backend: str) -> str:
    """Map "auto" to a concrete backend and validate the name."""
    if backend == "auto":
        return "shm" if shm_available() else "mmap"
    if backend not in BACKENDS:
        raise ValueError(f"backend must be 'auto', 'shm' or 'mmap'; got {backend!r}")
    if backend == "shm" and not shm_available():
        raise ValueError("backend 'shm' needs Python >= 3.8 (multiprocessing.shared_memory); "
                         "use backend='mmap'")
    return backend


def new_name() -> str:
    """A fresh segment name: the prefix and a random token."""
    return PREFIX + secrets.token_hex(8)


def default_mmap_dir() -> str:
    return SHM_DIR if os.path.isdir(SHM_DIR) else tempfile.gettempdir()


def _check_shm_name(name: str) -> str:
    if not isinstance(name, str):
        raise TypeError(f"name must be a str; got {type(name).__name__}")
    if not name or "/" in name or "\0" in name or len(name) > 200 or name in (".", ".."):
        # (A NUL ended the name where the system read it: another buffer's name.)
        raise ValueError(f"name must be 1-200 characters without '/' or NUL; got "
                         f"{_rules.shown(repr(name), 60)}")
    return name


def check_path(path: Any, argument: str = "path") -> str:
    """`path` (str or os.PathLike) as a str, or TypeError / ValueError naming `argument` (a NUL
    in it: the system would read a shorter path, and os's own error names nothing)."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{argument} must be a str or path; got {type(path).__name__}")
    text = os.fspath(path)
    if not isinstance(text, str):
        raise TypeError(f"{argument} must be a str path; got {type(text).__name__}")
    if "\0" in text:
        raise ValueError(f"{argument} must not contain NUL; got {_rules.shown(repr(text), 60)}")
    return text


class Segment:
    """One mapped segment. ``location`` is the shm name ("shm") or the file path ("mmap")."""

    __slots__ = ("backend", "location", "size", "memory", "__weakref__")

    def __init__(self, backend: str, location: str, size: int, memory: Mapping) -> None:
        self.backend = backend
        self.location = location
        self.size = size
        self.memory = memory

    def close(self) -> None:
        """Unmap (raises BufferError while arrays still point into it)."""
        if self.memory is not None and not self.memory.closed:
            self.memory.close()

    @property
    def closed(self) -> bool:
        return self.memory is None or self.memory.closed


# What prefer_huge_pages may ask for per mapping: making a range huge copies its 4 KiB pages
# (0.3 to 2.7 ms per MiB measured here), so a 1 GiB segment takes up to about 3 s more to
# create; beyond it, rows are usually large enough that their TLB miss is small beside copying
# them.
HUGE_PAGE_BUDGET = 1 << 30


def prefer_huge_pages(segment: Segment, regions: Sequence[Tuple[int, int]],
                      budget: int = HUGE_PAGE_BUDGET) -> int:
    """Ask for 2 MiB pages over `regions` ((offset, bytes), the most read first), each whole
    region while their total stays within `budget`; returns the bytes the kernel made huge
    (``segment.memory.huge_bytes`` counts them all). Best effort (cpprb_ray/_mapping.pyx says
    when the kernel declines); the environment variable ``CPPRB_RAY_HUGE_PAGES=0`` turns it
    off.

    Examples
    --------
    >>> segment = create("mmap", 4096)
    >>> prefer_huge_pages(segment, [(0, 4096)])   # a 4 KiB segment holds no 2 MiB page
    0
    >>> segment.close()
    >>> unlink("mmap", segment.location)
    True
    """
    return sum(segment.memory.collapse(offset, length)
               for offset, length in _budgeted(regions, budget))


def _budgeted(regions: Sequence[Tuple[int, int]], budget: int) -> List[Tuple[int, int]]:
    """What prefer_huge_pages asks 2 MiB pages for: whole regions, in order, while their total
    stays within `budget`; none when ``CPPRB_RAY_HUGE_PAGES=0``."""
    if os.environ.get("CPPRB_RAY_HUGE_PAGES", "1").strip() == "0":
        return []
    chosen = []
    for offset, length in regions:
        if length > budget:
            break
        budget -= length
        chosen.append((offset, length))
    return chosen


def _prefer_huge_pages_first(fd: int, memory: Mapping,
                             regions: Sequence[Tuple[int, int]]) -> None:
    """prefer_huge_pages over a file not allocated yet: one page of each 2 MiB unit first
    (the kernel collapses no unit that holds none), written with pwrite, which a full
    filesystem answers with ENOSPC where a store through the mapping would be a SIGBUS."""
    for offset, length in _budgeted(regions, HUGE_PAGE_BUDGET):
        for unit in range(offset - offset % HUGE_PAGE, offset + length, HUGE_PAGE):
            if unit + HUGE_PAGE <= len(memory):   # a unit the end cuts cannot be huge
                os.pwrite(fd, b"\0", unit)
        memory.collapse(offset, length)


def _map(fd: int, size: int) -> Mapping:
    # Not mmap.mmap: a Mapping lies on a 2 MiB boundary, so its hot parts can get huge pages
    # (cpprb_ray/_mapping.pyx).
    return Mapping(fd, size)


def create(backend: str, size: int, name: Optional[str] = None,
           path: Optional[str] = None,
           on_open: Optional[Callable[[str, Identity], Any]] = None,
           hot: Sequence[Tuple[int, int]] = ()) -> Segment:
    """Create a zero-filled segment of `size` bytes (mode 0600, never reusing a name).

    `on_open(location, identity)` is called as soon as the file exists, before it is filled
    (for hundreds of MiB, a tenth of a second and more): the caller can claim it for freeing
    then, so that a SIGTERM while it is filled does not leave it behind. `identity` is the
    file's (device, inode); if create then fails, the file is gone when it raises.

    `hot` ((offset, bytes), the most read first) gets 2 MiB pages as prefer_huge_pages gives
    them, asked for before the rest of the file is allocated: a unit that holds one page is
    made huge by zero-filling the rest, where one whose 512 pages were allocated first is
    copied page by page (3 to 15 times as long: 18 to 21 against 50 to 285 ms for 64 MiB here).

    Examples
    --------
    >>> segment = create("mmap", 3 * HUGE_PAGE, hot=[(0, 3 * HUGE_PAGE)])
    >>> bytes(segment.memory[:4]), segment.memory.huge_bytes in (0, 3 * HUGE_PAGE)
    (b'\\x00\\x00\\x00\\x00', True)
    >>> segment.close()
    >>> unlink("mmap", segment.location)
    True
    """
    if backend == "shm":
        if path is not None:
            raise ValueError("path= is only for backend='mmap'")
        location = _check_shm_name(name) if name is not None else new_name()
        fd = _posixshmem.shm_open("/" + location, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600)
        unlink_on_error = lambda: _posixshmem.shm_unlink("/" + location)  # noqa: E731
    else:
        if path is None:
            base = _check_shm_name(name) if name is not None else new_name()
            location = os.path.join(default_mmap_dir(), base)
        else:
            if name is not None:
                raise ValueError("pass either name= or path=, not both")
            location = os.path.abspath(check_path(path))
        fd = os.open(location, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        unlink_on_error = lambda: os.unlink(location)  # noqa: E731
    try:
        if on_open is not None:
            stat = os.fstat(fd)
            on_open(location, (stat.st_dev, stat.st_ino))
        if hot:
            os.ftruncate(fd, size)
            memory = _map(fd, size)
            try:
                _prefer_huge_pages_first(fd, memory, hot)
                _reserve(fd, size)
            except BaseException:
                # Its pages freed now, not when the descriptor is closed: the free space that
                # a failure reports is what is left without this file.
                memory.close()
                os.ftruncate(fd, 0)
                raise
        else:
            _reserve(fd, size)
            memory = _map(fd, size)
    except BaseException as error:
        unlink_on_error()
        if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            # Free space is measured after the half-made object is gone, so it is what the user
            # actually has.
            raise no_space(size, file_of(backend, location)) from None
        raise
    finally:
        os.close(fd)
    return Segment(backend, location, size, memory)


# fallocate(2) is missing on some filesystems (older NFS, some FUSE mounts) or on a platform.
_NOT_SUPPORTED = (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)
_ZEROS = bytes(1 << 20)


def _reserve(fd: int, size: int) -> None:
    """Give the file `size` bytes of real storage now; OSError(ENOSPC) when there is none."""
    fallocate = getattr(os, "posix_fallocate", None)
    if fallocate is not None:
        try:
            fallocate(fd, 0, size)
            return
        except OSError as error:
            if error.errno not in _NOT_SUPPORTED:
                raise
    reserve_by_writing(fd, size)


def reserve_by_writing(fd: int, size: int) -> None:
    """The fallback of :func:`_reserve`: check the free space, then write zeros over the file.

    Writing is what makes a filesystem without fallocate allocate; the free-space check first
    makes a hopeless request fail at once instead of after writing gigabytes.

    Examples
    --------
    >>> import os, tempfile
    >>> with tempfile.TemporaryFile() as handle:
    ...     reserve_by_writing(handle.fileno(), 3 * 2**20 + 5)
    ...     print(os.fstat(handle.fileno()).st_size)
    3145733
    """
    stats = os.fstatvfs(fd)
    if stats.f_bavail * stats.f_frsize < size:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    os.ftruncate(fd, size)
    offset = 0
    while offset < size:
        chunk = min(len(_ZEROS), size - offset)
        offset += os.pwrite(fd, _ZEROS[:chunk] if chunk < len(_ZEROS) else _ZEROS, offset)


def mount_of(path: str) -> str:
    """The mount point that holds `path` (or would hold it, for a path that does not exist).

    Examples
    --------
    >>> mount_of("/")
    '/'
    """
    path = os.path.abspath(path)
    while not os.path.exists(path):
        path = os.path.dirname(path)
    while not os.path.ismount(path):
        path = os.path.dirname(path)
    return path


def _mib(size: int) -> str:
    return f"{size / 2**20:.1f} MiB"


def no_space(size: int, file: str) -> OSError:
    """The error for a segment that does not fit: the size asked, the space free, the mount,
    and what to do about it.

    Examples
    --------
    >>> error = no_space(2**30, "/dev/shm/cpprb_ray_example")
    >>> error.errno == errno.ENOSPC, "1024.0 MiB" in str(error), "/dev/shm" in str(error)
    (True, True, True)
    """
    mount = mount_of(os.path.dirname(file) or ".")
    try:
        stats = os.statvfs(mount)
        free = _mib(stats.f_bavail * stats.f_frsize)
    except OSError:
        free = "an unknown amount"
    return OSError(errno.ENOSPC,
                   f"no space for a {_mib(size)} buffer ({size} bytes) at {file}: {mount} has "
                   f"{free} free. Make {mount} larger (Docker: --shm-size; Kubernetes: an "
                   f"emptyDir with medium: Memory and a sizeLimit), make the buffer smaller, or "
                   f"put it on a filesystem with room: backend='mmap', path=...")


def locate(name_or_path: Union[str, os.PathLike[str]]) -> Tuple[str, str]:
    """(backend, location) for a name given to attach: a path means "mmap", a name "shm"."""
    text = check_path(name_or_path, "name_or_path")
    if "/" in text:
        return "mmap", os.path.abspath(text)
    if shm_available():
        return "shm", _check_shm_name(text)
    # Python 3.7: a bare name is a file in the default mmap directory.
    return "mmap", os.path.join(default_mmap_dir(), _check_shm_name(text))


def attach(backend: str, location: str) -> Segment:
    """Map an existing segment read-write. FileNotFoundError if it does not exist."""
    try:
        fd = open_existing(backend, location, os.O_RDWR)
    except PermissionError:
        # Its mode (0600) kept us out: say whose it is, as check_owner does for one we opened.
        try:
            check_owner(os.stat(file_of(backend, location)).st_uid, location)
        except FileNotFoundError:
            pass
        raise
    try:
        status = os.fstat(fd)
        check_owner(status.st_uid, location)
        size = status.st_size
        if size == 0:
            raise ValueError(f"{location!r} is empty: not a cpprb_ray buffer")
        memory = _map(fd, size)
    finally:
        os.close(fd)
    return Segment(backend, location, size, memory)


def _user_name(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def check_owner(uid: int, location: str) -> None:
    """PermissionError unless the object at `location` belongs to this (effective) user.

    Whatever its mode says: a segment of the same name made by somebody else -- after ours was
    removed, or before we looked -- would otherwise receive our rows, or feed us its own.

    Examples
    --------
    >>> check_owner(os.geteuid(), "mine")  # fine
    >>> check_owner(os.geteuid() + 1, "theirs")
    Traceback (most recent call last):
    ...
    PermissionError: [Errno 1] 'theirs' belongs to ...
    """
    if uid != os.geteuid():
        raise PermissionError(errno.EPERM,
                              f"{location!r} belongs to {_user_name(uid)}, not to this user "
                              f"({_user_name(os.geteuid())}); refusing another user's segment")


def open_existing(backend: str, location: str, flags: int = os.O_RDONLY) -> int:
    """A file descriptor on an existing segment (FileNotFoundError if there is none).

    Never waits: a FIFO under the name (anybody may make one once ours is gone) is opened
    without blocking, and then found not to be a buffer."""
    flags |= os.O_NONBLOCK
    if backend == "shm":
        if _posixshmem is None:
            return os.open(file_of(backend, location), flags)
        return _posixshmem.shm_open("/" + location, flags, mode=0o600)
    return os.open(location, flags)


def unlink(backend: str, location: str) -> bool:
    """Remove the segment's name; True if it existed. Mappings elsewhere stay valid."""
    try:
        if backend == "shm" and _posixshmem is not None:
            _posixshmem.shm_unlink("/" + location)
        else:
            # Python 3.7 has no _posixshmem; on Linux a POSIX shm object is a file in /dev/shm.
            os.unlink(file_of(backend, location))
        return True
    except FileNotFoundError:
        return False


def identity_at(backend: str, location: str) -> Optional[Identity]:
    """The (device, inode) of the file at `location` now; None when there is none."""
    try:
        stat = os.stat(file_of(backend, location))
    except FileNotFoundError:
        return None
    return (stat.st_dev, stat.st_ino)


def file_of(backend: str, location: str) -> str:
    """The file behind a segment (on Linux, POSIX shm objects are files in /dev/shm)."""
    return os.path.join(SHM_DIR, location) if backend == "shm" else location
