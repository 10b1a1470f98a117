"""Checkpoints: a buffer's whole state in one file, written atomically and verified when read.

The file (docs/checkpoints.md)::

    0    prefix, 64 bytes, little-endian: magic b"CPPRBCKP", format version (u32), prefix size
         (u32), description length (u64), payload length (u64), crc32 of the description (u32),
         the payload's checksum (u64: XXH64 from version 4 on; versions 1 to 3 a crc32 and 4
         zero bytes), 16 reserved zero bytes, crc32 of the 60 bytes before (u32)
    64   description: UTF-8 JSON, padded with spaces to a multiple of 64 bytes
    ...  payload: the sections the description lists, each at a 64-byte aligned offset from the
         payload's start: a plain ring's buffer "rows" (the stored slots' records),
         "tail_generations", "leaves"; a laned buffer (its description has "lanes") "rows"
         (every slot's record), "leaves" (every slot's), "lanes" (the lane table); a sequence
         buffer ("lanes" and "sequence") the sections of a laned one

Every save writes version 4, whatever the buffer. Versions 1 to 3, which earlier releases wrote,
are read too: there the version gave the kind (1 a plain ring, 2 a laned buffer, 3 a sequence
buffer, so that a reader of 1 refused a laned file by its version), and the payload's checksum
was a crc32. A reader of versions 1 to 3 refuses a version 4 file by its version.

A save writes a temporary file in the target's directory, fsyncs it, renames it over the target
and fsyncs the directory, so a save killed at any moment leaves the previous checkpoint whole.
A load checks the sizes and the three checksums before it trusts a byte, checks the description
against this version's rules, and only then makes a new buffer and restores the state into it.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import stat
import struct
import sys
import zipfile
import zlib
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Type

import numpy as np

from cpprb_ray import (
    _compat,
    _digest,
    _layout,
    _memory,
    _parts,
    _proc,
    _rules,
    _segment,
    nstep,
    rate_limiters,
    sequences,
)
from cpprb_ray._atomic import remove_stale_temporaries, write_atomically

__all__ = ["FORMAT_VERSION", "MAGIC", "load", "read_file", "remove_stale_temporaries", "save",
           "write_file"]

MAGIC = b"CPPRBCKP"
FORMAT_VERSION = 4                         # what a save writes: the newest version read
# Versions 1 to 3 (a crc32 of the payload) were one per kind of buffer:
_RING_VERSION = 1                          # a plain ring's buffer
_LANED_VERSION = 2                         # a laned buffer (lanes, next_of, stack_compress)
_SEQUENCE_VERSION = 3                      # a sequence buffer (sequence=; laned)
_KIND_VERSIONS = (_RING_VERSION, _LANED_VERSION, _SEQUENCE_VERSION)
_READABLE = _KIND_VERSIONS + (FORMAT_VERSION,)
_PREFIX = struct.Struct("<8sIIQQIQ16sI")   # see the module docstring; 64 bytes
_ALIGN = 64
_CRC_CHUNK = 1 << 30                       # zlib.crc32 takes at most 4 GiB at once on some builds
# A load reads and checksums the payload in these: small enough that a chunk is still in the
# cache when the checksum's thread reads it, large enough that a chunk's hand-over is nothing.
_READ_CHUNK = 4 << 20
# No description is this long (an env_dict of thousands of columns makes a few MiB): a prefix
# that says more is refused before the description is read.
_DESCRIPTION_LIMIT = 64 << 20
_SECTIONS = ("rows", "tail_generations", "leaves")
_LANED_SECTIONS = ("rows", "leaves", "lanes")


_READS = f"versions {_READABLE[0]} to {_READABLE[-1]}"


def _align(value: int) -> int:
    return (value + _ALIGN - 1) // _ALIGN * _ALIGN


class _Crc32:
    """The payload's checksum of versions 1 to 3, behind _digest.Digest's interface."""

    def __init__(self) -> None:
        self.value = 0

    def update(self, data: Any) -> None:
        view = memoryview(data).cast("B")
        for start in range(0, len(view), _CRC_CHUNK):
            self.value = zlib.crc32(view[start:start + _CRC_CHUNK], self.value)

    def intdigest(self) -> int:
        return self.value


def _payload_digest(version: int) -> Any:
    """A new checksum of a payload of format `version` (update(bytes), intdigest())."""
    return _digest.Digest() if version == FORMAT_VERSION else _Crc32()


def refused(file: Any, why: str) -> ValueError:
    """The error a load raises for a file it will not restore: names the file and the reason."""
    return ValueError(f"{os.fspath(file)!r} is not a loadable cpprb_ray checkpoint: {why}")


# Errors that a crafted description (valid checksums, hostile contents) can raise while it is
# read; each becomes a refusal naming the file.
_DESCRIPTION_ERRORS = (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError,
                       OverflowError, RecursionError)

_FILE_TYPES = ((stat.S_ISFIFO, "FIFO"), (stat.S_ISCHR, "character device"),
               (stat.S_ISBLK, "block device"), (stat.S_ISSOCK, "socket"))


def _kind_of(mode: int) -> str:
    return next((name for test, name in _FILE_TYPES if test(mode)), "special file")


def path_of(file: Any, what: str = "a path (str, bytes or os.PathLike)") -> str:
    """`file` as a str path; TypeError naming the argument for anything else (an int is never
    taken as a file descriptor: open() would read it and close it)."""
    if not isinstance(file, (str, bytes, os.PathLike)):
        raise TypeError(f"file must be {what}; got {type(file).__name__}")
    return _memory.check_path(os.fsdecode(os.fspath(file)), "file")


def check_target(path: str) -> None:
    """Refuse to replace what is at `path` unless it is a regular file (or nothing, or a
    symbolic link, which the rename replaces and never follows): a save must not turn a FIFO,
    a device node or a live buffer's segment into a checkpoint. IsADirectoryError for a
    directory, ValueError naming the file otherwise."""
    try:
        status = os.lstat(path)
    except OSError:
        return      # nothing there (or unreachable: the write reports that)
    if stat.S_ISDIR(status.st_mode):
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
    if stat.S_ISLNK(status.st_mode):
        return
    if not stat.S_ISREG(status.st_mode):
        raise ValueError(f"file {path!r} is a {_kind_of(status.st_mode)}, not a regular file: "
                         f"a save replaces a regular file only")
    try:
        with open(path, "rb", buffering=0) as handle:
            head = handle.read(len(_segment.MAGIC))
    except OSError:
        return
    if head == _segment.MAGIC:
        raise ValueError(f"file {path!r} is a cpprb_ray buffer's segment, not a checkpoint: "
                         f"saving there would take its name from the buffer; save elsewhere")


def _open_regular(path: str, refusal: Callable[[str], Exception]) -> Any:
    """`path` opened for reading, without blocking on a FIFO; IsADirectoryError for a
    directory, `refusal(kind)` for anything else that is not a regular file. The check is
    made on what was opened (fstat), so nothing can be swapped in between."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
        if not stat.S_ISREG(mode):
            raise refusal(_kind_of(mode))
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb", buffering=0)
    except BaseException:
        os.close(fd)
        raise


def open_for_writing(path: str) -> Any:
    """`path` opened for writing from its start (made if absent), without blocking on a FIFO:
    IsADirectoryError for a directory, ValueError naming the file for a FIFO, a device or a
    socket, found on what was opened (fstat), so nothing can be swapped in between; nothing is
    written or truncated before that check.

    Examples
    --------
    >>> import os, tempfile
    >>> from cpprb_ray.checkpoint import open_for_writing
    >>> folder = tempfile.mkdtemp()
    >>> with open_for_writing(os.path.join(folder, "rows.npz")) as handle:
    ...     _ = handle.write(b"data")
    >>> fifo = os.path.join(folder, "fifo")
    >>> os.mkfifo(fifo)
    >>> open_for_writing(fifo)
    Traceback (most recent call last):
    ...
    ValueError: file '.../fifo' is a FIFO, not a regular file
    >>> import shutil; shutil.rmtree(folder)
    """
    flags = (os.O_WRONLY | os.O_CREAT | os.O_NONBLOCK | os.O_NOCTTY
             | getattr(os, "O_CLOEXEC", 0))
    try:
        fd = os.open(path, flags, 0o666)
    except OSError as error:
        if error.errno != errno.ENXIO:        # ENXIO: a FIFO that no process reads
            raise
        raise ValueError(f"file {path!r} is a {_kind_of(os.stat(path).st_mode)}, not a "
                         f"regular file") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise ValueError(f"file {path!r} is a {_kind_of(mode)}, not a regular file")
        os.ftruncate(fd, 0)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "wb")
    except BaseException:
        os.close(fd)
        raise


# -- the file format ------------------------------------------------------------------------------

def write_file(file: Any, description: Mapping[str, Any],
               sections: Sequence[Tuple[str, Any]], version: int = FORMAT_VERSION) -> None:
    """Write `description` (JSON-able) and `sections` (name, bytes-like) to `file`, atomically,
    as format `version` (an earlier one only to test that they are still read).

    The description gains a "sections" entry: ``{name: [offset, length]}`` within the payload.
    A temporary file in the same directory is written, fsynced and renamed over `file`, and the
    directory is fsynced: whenever this process dies, `file` is the old or the new file, whole.

    Examples
    --------
    >>> import os, tempfile
    >>> from cpprb_ray import checkpoint
    >>> with tempfile.TemporaryDirectory() as directory:
    ...     file = os.path.join(directory, "state.ckpt")
    ...     checkpoint.write_file(file, {"what": "demo"}, [("numbers", bytes(range(5)))])
    ...     description, sections = checkpoint.read_file(file)
    ...     print(description["what"], bytes(sections["numbers"]), os.listdir(directory))
    demo b'\\x00\\x01\\x02\\x03\\x04' ['state.ckpt']
    """
    offsets: Dict[str, List[int]] = {}
    payload_length = 0
    views = []
    for name, data in sections:
        view = memoryview(data).cast("B")
        payload_length = _align(payload_length)
        offsets[name] = [payload_length, len(view)]
        views.append((payload_length, view))
        payload_length += len(view)
    document = dict(description)
    document.pop("format_version", None)     # read_file's: the prefix says it
    document["sections"] = offsets
    text = json.dumps(document, allow_nan=False).encode()
    text += b" " * (_align(len(text)) - len(text))
    if version not in _READABLE:
        raise ValueError(f"version must be one of {_READABLE}; got {version!r}")
    chunks: List[Any] = []
    position = 0
    payload_digest = _payload_digest(version)
    for offset, view in views:
        padding = bytes(offset - position)
        payload_digest.update(padding)
        payload_digest.update(view)
        chunks += [padding, view]
        position = offset + len(view)
    head = _PREFIX.pack(MAGIC, version, _PREFIX.size, len(text), payload_length,
                        zlib.crc32(text), payload_digest.intdigest(), bytes(16), 0)[:-4]
    prefix = head + struct.pack("<I", zlib.crc32(head))
    write_atomically(path_of(file), [prefix, text] + chunks)


def read_file(file: Any, check: Optional[Callable[[Dict[str, Any]], Any]] = None,
              place: Optional[Callable[[Dict[str, int]], Mapping[str, Any]]] = None,
              check_payload: Optional[Callable[[Dict[str, Any]], Any]] = None,
              inspect: Optional[Mapping[str, Callable[[int, memoryview], Any]]] = None,
              ) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """(description, {section name: bytes}) of a checkpoint, after every check of the format;
    the description's "format_version" is the prefix's.

    `place({section name: length})`, called once the description is checked, may give
    sections their own memory ({name: a writable memoryview or a SegmentSpan of that length}:
    a load reads the rows straight into the new buffer's segment); the others are read into
    memory allocated here. The checksum covers them all; if it fails, the placed memory holds
    what was read. `check_payload(sections)` runs once every byte is read, while the last
    checksums are made; an Exception it raises is raised once the payload's checksum matches
    (a corrupt payload is reported as such, whatever its bytes look like).
    `inspect({section name: f})` calls f(start, chunk) with each chunk of that section (its
    offset in the section and a view of its bytes, valid during the call) right after the
    chunk is checksummed, on the checksum's thread, while the chunk is in the cache.

    ValueError naming `file` when it is truncated, longer than it says, not a checkpoint, of
    another format version, when a checksum (prefix, description, payload) does not match, or
    when its payload could not fit in the memory this process may use; OSError when it cannot
    be read at all. The description is read and checked first (`check(description)` too, which
    may refuse it), and only then is the payload allocated, at the size the description's
    sections account for; it is read and checksummed in chunks of 4 MiB.

    Examples
    --------
    >>> import os, tempfile
    >>> from cpprb_ray import checkpoint
    >>> with tempfile.TemporaryDirectory() as directory:
    ...     file = os.path.join(directory, "state.ckpt")
    ...     checkpoint.write_file(file, {}, [("numbers", bytes(100))])
    ...     with open(file, "r+b") as handle:
    ...         _ = handle.seek(-1, os.SEEK_END)
    ...         _ = handle.write(b"x")
    ...     checkpoint.read_file(file)
    Traceback (most recent call last):
    ...
    ValueError: '...state.ckpt' is not a loadable cpprb_ray checkpoint: the payload's checksum ...
    """
    with _open_regular(path_of(file),
                       lambda kind: refused(file, f"it is a {kind}, not a regular file")) as handle:
        size = os.fstat(handle.fileno()).st_size
        prefix = _read_exactly(handle, min(size, _PREFIX.size))
        if len(prefix) < _PREFIX.size:
            if not MAGIC.startswith(prefix[:len(MAGIC)]):
                raise refused(file, "it does not start with the checkpoint magic b'CPPRBCKP'")
            raise refused(file, f"truncated: {size} bytes, shorter than the "
                                f"{_PREFIX.size}-byte prefix")
        (magic, version, prefix_size, text_length, payload_length, text_crc, payload_check,
         _reserved, prefix_crc) = _PREFIX.unpack(prefix)
        if magic != MAGIC:
            raise refused(file, "it does not start with the checkpoint magic b'CPPRBCKP'")
        if zlib.crc32(prefix[:-4]) != prefix_crc:
            # A later version may lay the rest of its prefix out differently: name it too.
            raise refused(file, "the prefix's checksum does not match (corrupt prefix" + (
                "" if version in _READABLE else
                f", or the prefix of format version {version}, which this cpprb_ray cannot "
                f"read: it reads {_READS}") + ")")
        if version not in _READABLE:
            raise refused(file, f"format version {version}; this cpprb_ray reads {_READS}")
        if prefix_size != _PREFIX.size:
            raise refused(file, f"prefix size {prefix_size}, expected {_PREFIX.size}")
        expected = _PREFIX.size + text_length + payload_length
        if size < expected:
            raise refused(file, f"truncated: {size} bytes, the prefix says {expected}")
        if size > expected:
            raise refused(file, f"{size - expected} bytes past the end the prefix gives "
                                f"({expected})")
        if text_length > _DESCRIPTION_LIMIT:
            raise refused(file, f"its description would be {text_length} bytes; no checkpoint's "
                                f"is longer than {_DESCRIPTION_LIMIT}")
        text = _read_exactly(handle, text_length)
        if len(text) != text_length:
            raise refused(file, "truncated while it was read")
        if zlib.crc32(text) != text_crc:
            raise refused(file, "the description's checksum does not match (corrupt "
                                "description)")
        description, spans = _parse_description(file, text, payload_length)
        description["format_version"] = version
        if check is not None:
            check(description)
        placed = dict(place({name: length for name, (_, length) in spans.items()})
                      if place is not None else {})
        for name, target in placed.items():
            if len(target) != spans[name][1]:
                raise ValueError(f"place gave section {name!r} {len(target)} bytes, not "
                                 f"{spans[name][1]}")
        private = payload_length - sum(spans[name][1] for name in placed)
        try:
            _rules.check_memory(float(private), "file", os.fspath(file),
                                "memory for its payload")
        except ValueError as error:
            raise refused(file, str(error)) from None
        payload = np.empty(private, dtype=np.uint8).data
        sections: Dict[str, Any] = {}
        pieces: List[Any] = []   # where each byte of the payload goes, in the file's order
        failed: List[Exception] = []   # raised once the payload's checksum matches
        end = used = 0
        for name, (offset, length) in sorted(spans.items(), key=lambda item: item[1]):
            if offset > end:   # the padding that aligns a section: read, and checksummed
                pieces.append((payload[used:used + offset - end], None))
                used += offset - end
            if name in placed:
                sections[name] = placed[name]
            else:
                sections[name] = payload[used:used + length]
                used += length
            pieces.append((sections[name], _noting(failed, (inspect or {}).get(name))))
            end = offset + length

        def meanwhile() -> None:
            if check_payload is not None:
                _noting(failed, check_payload)(sections)

        digest = _payload_digest(version)
        got = _read_checksummed(handle, pieces, digest, meanwhile)
    if got != payload_length:
        raise refused(file, "truncated while it was read")
    if digest.intdigest() != payload_check:
        raise refused(file, "the payload's checksum does not match (corrupt payload)")
    if failed:
        raise failed[0]
    return description, sections


def _noting(failed: List[Exception], call: Optional[Callable[..., Any]]) -> Any:
    """`call`, made to append an Exception it raises to `failed` rather than raise it."""
    if call is None:
        return None

    def noting(*arguments: Any) -> None:
        try:
            call(*arguments)
        except Exception as error:  # noqa: BLE001 (the caller raises it, after the checksum)
            failed.append(error)
    return noting


def _parse_description(file: Any, text: bytes, payload_length: int,
                       ) -> Tuple[Dict[str, Any], Dict[str, Tuple[int, int]]]:
    """The description as JSON and its sections' (offset, length), which must lie one after
    the other at 64-byte aligned offsets and end where the payload ends, as write_file lays
    them: a payload that holds anything else is refused before it is read."""
    try:
        description = json.loads(text.decode())
        spans = {}
        for name, (offset, length) in description["sections"].items():
            offset, length = _integer(offset, "offset"), _integer(length, "length")
            if offset < 0 or length < 0 or offset + length > payload_length:
                raise ValueError(f"section {name!r} lies outside the payload")
            spans[str(name)] = (offset, length)
    except _DESCRIPTION_ERRORS as error:
        raise refused(file, f"unreadable description ({error})") from None
    if not isinstance(description, dict):
        raise refused(file, "the description is not a JSON object")
    end = 0
    for name, (offset, length) in sorted(spans.items(), key=lambda item: item[1]):
        if offset != _align(end):
            raise refused(file, f"its section {name!r} starts at {offset}, not at "
                                f"{_align(end)} where the one before it ends")
        end = offset + length
    if end != payload_length:
        raise refused(file, f"its payload is {payload_length} bytes, its sections {end}")
    return description, spans


class SegmentSpan:
    """`length` bytes of a mapped segment from `offset`: a section that a load reads straight
    into its new buffer's segment. Its memory is reached only through :meth:`window`, a view
    released when the ``with`` ends, so that no view (nor a frame of a traceback holding one)
    keeps the buffer from being closed when the load fails.

    Examples
    --------
    >>> span = SegmentSpan(bytearray(b"abcdef"), 2, 3)
    >>> with span.window(1, 2) as view:
    ...     bytes(view)
    b'de'
    """

    def __init__(self, memory: Any, offset: int, length: int) -> None:
        self.memory, self.offset, self.length = memory, offset, length

    def __len__(self) -> int:
        return self.length

    @contextlib.contextmanager
    def window(self, start: int, length: int) -> Iterator[memoryview]:
        """The bytes [start, start + length) of the span, as a view valid inside the ``with``."""
        begin = self.offset + start
        with memoryview(self.memory) as whole, whole[begin:begin + length] as part:
            yield part


def _window(piece: Any, start: int, length: int) -> Any:
    if isinstance(piece, SegmentSpan):
        return piece.window(start, length)
    return contextlib.nullcontext(piece[start:start + length])


# Where a record's generation (its first 8 bytes, native order) has its lowest bit.
_GENERATION_LOW_BYTE = 0 if sys.byteorder == "little" else 7


def _odd_generations(chunk: memoryview, start: int, stride: int) -> np.ndarray:
    """The records of `stride` bytes whose generation is odd (torn), of those whose generation's
    lowest byte lies in `chunk`, bytes [start, start + len(chunk)) of a section of records: their
    indexes in the section. A new array; no view of `chunk` outlives the call."""
    first = max(0, -(-(start - _GENERATION_LOW_BYTE) // stride))
    at = first * stride + _GENERATION_LOW_BYTE - start
    if at >= len(chunk):
        return np.empty(0, dtype=np.int64)
    low_bytes = np.frombuffer(chunk, dtype=np.uint8)[at::stride]
    try:
        return first + np.flatnonzero(low_bytes & 1)
    finally:
        del low_bytes


def _read_checksummed(handle: Any, pieces: Sequence[Tuple[Any, Any]], digest: Any,
                      meanwhile: Callable[[], Any] = lambda: None) -> int:
    """Fill `pieces` ((memoryview or SegmentSpan, inspect or None)) from `handle`, one after the
    other, in chunks, giving each chunk to `digest` (then to its piece's inspect(start, chunk)):
    the bytes read. A payload of more than two chunks is checksummed on a thread while the next
    chunk is read (the digests and readinto release the GIL; a chunk is still in the cache when
    its checksum reads it), and `meanwhile()` runs once the reads are done, while the last
    checksums are made: the read takes about as long as the slower of the two, not their sum."""
    chunks = [(piece, inspect, start, min(_READ_CHUNK, len(piece) - start))
              for piece, inspect in pieces for start in range(0, len(piece), _READ_CHUNK)]

    def absorb(piece: Any, inspect: Any, start: int, length: int) -> None:
        # One worker, first in first out: the chunks are checksummed in the file's order.
        with _window(piece, start, length) as chunk:
            digest.update(chunk)
            if inspect is not None:
                inspect(start, chunk)

    filled = 0
    worker = ThreadPoolExecutor(max_workers=1) if len(chunks) > 2 else None
    done: List[Any] = []
    try:
        for piece, inspect, start, length in chunks:
            with _window(piece, start, length) as chunk:
                got = _read_into(handle, chunk)
            if worker is None:
                absorb(piece, inspect, start, got)
            else:
                done.append(worker.submit(absorb, piece, inspect, start, got))
            filled += got
            if got < length:
                break
        if filled == sum(length for _, _, _, length in chunks):
            meanwhile()
    finally:
        if worker is not None:
            worker.shutdown(wait=True)   # no checksum reads any piece once this returns
    for future in done:
        future.result()
    return filled


def _read_exactly(handle: Any, length: int) -> bytes:
    buffer = bytearray(length)
    return bytes(buffer[:_read_into(handle, memoryview(buffer))])


def _read_into(handle: Any, view: memoryview) -> int:
    filled = 0
    while filled < len(view):
        got = handle.readinto(view[filled:])
        if not got:
            break
        filled += got
    return filled


# -- a buffer's state <-> a checkpoint ----------------------------------------------------------

# Features that record their configuration in the layout's meta and that a load restores.
_LANES = "lanes"        # a laned buffer's config (cpprb_ray.frames.LaneConfig.to_meta)
_SEQUENCE = "sequence"  # a sequence buffer's (cpprb_ray.sequences.SequenceConfig.to_meta)
_RESTORED_FEATURES = (nstep.META_KEY, _LANES, _SEQUENCE)


def _record_marks(rows: Any, capacity: int, stride: int,
                  ) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(generations, links, aheads) of a laned buffer's `capacity` records: each record's
    uint64 generation and, right after it, its two int32 links (_segment.pxd)."""
    at = _layout.GENERATION_BYTES
    return (np.ndarray((capacity,), np.uint64, rows, 0, (stride,)),
            np.ndarray((capacity,), np.int32, rows, at, (stride,)),
            np.ndarray((capacity,), np.int32, rows, at + 4, (stride,)))


def _live_rows(rows: Any, capacity: int, stride: int) -> np.ndarray:
    """Which of a laned buffer's records hold a committed row, the lane part's rule
    (_lanes.is_live_row): a row's link (>= 1), complete (its second link >= 0), not torn (an
    even generation)."""
    return _live(*_record_marks(rows, capacity, stride))


def _live(generations: np.ndarray, links: np.ndarray, aheads: np.ndarray) -> np.ndarray:
    return (links >= 1) & (aheads >= 0) & (generations & 1 == 0)


def save(buffer: Any, file: Any) -> None:
    """Write `buffer`'s whole state to `file` (see :meth:`ReplayBuffer.save`).

    Examples
    --------
    >>> import os, tempfile
    >>> from cpprb_ray import ReplayBuffer, checkpoint
    >>> with tempfile.TemporaryDirectory() as directory, ReplayBuffer(8, {"obs": {}}) as rb:
    ...     _ = rb.add(obs=[1.0, 2.0])
    ...     checkpoint.save(rb, os.path.join(directory, "rb.ckpt"))
    ...     description, _ = checkpoint.read_file(os.path.join(directory, "rb.ckpt"))
    >>> description["kind"], description["state"]["stored_size"]
    ('uniform', 2)
    """
    path = path_of(file)
    check_target(path)
    layout = buffer._layout
    features = {key: value for key, value in layout.meta.items()
                if key not in _layout.IDENTITY_META}
    unknown = sorted(set(features) - set(_RESTORED_FEATURES))
    if unknown:
        raise ValueError(f"cannot checkpoint this buffer: it uses {unknown}, which this "
                         f"cpprb_ray's checkpoints do not record")
    laned = _LANES in layout.meta
    sequence = layout.meta.get(_SEQUENCE)
    sections: List[Tuple[str, Any]]
    if laned:
        # Every record, every leaf and the lane table (owners cleared); the stored size is the
        # rows the records hold (staged N-step rows are not rows yet), in a sequence buffer the
        # committed sequences (open ones are not sequences yet).
        header, rows, leaves, lanes = buffer._image.dump()
        generations, links, _ = _record_marks(rows, layout.capacity, layout.row_stride)
        live = (_live_rows(rows, layout.capacity, layout.row_stride) if sequence is None
                else (links >= 1) & (generations & 1 == 0))
        stored = int(live.sum())
        opened = int((links == sequences.OPEN_LINK).sum())
        sections = [("rows", rows), ("leaves", leaves), ("lanes", lanes)]
    else:
        header, rows, tail, leaves = buffer._image.dump()
        stored = header["stored_size"]
        # Generations past the stored slots matter only up to the last slot ever written (a
        # clear leaves them odd-free but nonzero): an add there continues from them.
        written = np.flatnonzero(tail)
        tail = tail[:written[-1] + 1 if written.size else 0]
        sections = [("rows", rows), ("tail_generations", tail), ("leaves", leaves)]
    description = {
        "kind": "prioritized" if layout.prioritized else "uniform",
        "capacity": layout.capacity,
        "alpha": header["alpha"],
        "eps": header["eps"],
        "env_dict": {name: {"shape": list(spec["shape"]), "dtype": spec["dtype"].str}
                     for name, spec in buffer.env_dict.items()},
        "nstep": buffer.nstep,
        "columns": [column.to_json() for column in layout.columns],
        "row_stride": layout.row_stride,
        "state": {"stored_size": stored, "next_index": header["next_index"],
                  "max_priority": header["max_priority"], "rows_added": header["rows_added"]},
        # The limiter and its counts of the same moment (docs/rate_limiting.md), or None.
        "rate_limiter": None if header["rate_limiter"] is None else {
            key: header["rate_limiter"][key]
            for key in ("kind", "samples_per_insert", "min_size_to_sample", "min_diff",
                        "max_diff", "inserts", "samples")},
    }
    if laned:
        description[_LANES] = layout.meta[_LANES]
        # What a bounded lane numbers its rows by (cpprb's indexes), with or without a limiter.
        description["state"]["rows_since_clear"] = header["rows_since_clear"]
    if sequence is not None:
        # Its config; and the sequences open at the save (their starts' links say so), which
        # the copy keeps open: no writer of the copy continues their episodes.
        description[_SEQUENCE] = sequence
        description["state"]["open_sequences"] = opened
    write_file(path, description, sections)


class _Checkpoint:
    """A read checkpoint, checked against this version's rules before anything is made: its
    description (and whether `cls` can load it into a segment there is room for, given
    `backend` and `path`) before its payload is read, its payload's values after."""

    def __init__(self, file: Any, cls: Any = None, backend: str = "auto",
                 path: Any = None,
                 place: Optional[Callable[[_Checkpoint], Mapping[str, Any]]] = None) -> None:
        # place(self): read_file's, given this checkpoint once its description is checked.
        self.file = file
        self.cls, self.backend, self.path = cls, backend, path
        # A ring's torn records, found chunk by chunk as the rows are read (while each chunk
        # is in the cache), for _check_leaves.
        self.torn_records: List[np.ndarray] = []
        read_file(file, self._check_description, None if place is None else lambda _: place(self),
                  self._check_payload, {"rows": self._note_torn_records})

    def _note_torn_records(self, start: int, chunk: memoryview) -> None:
        if self.prioritized and self.lane_meta is None:   # what _check_leaves looks at
            self.torn_records.append(_odd_generations(chunk, start, self.row_stride))

    def _check_payload(self, sections: Dict[str, Any]) -> None:
        try:
            self._parse_payload(sections)
        except _DESCRIPTION_ERRORS as error:
            raise refused(self.file, f"its contents are inconsistent ({error})") from None

    def _check_description(self, description: Dict[str, Any]) -> None:
        try:
            self._parse(description)
        except _DESCRIPTION_ERRORS as error:
            raise refused(self.file, f"its contents are inconsistent ({error})") from None
        if self.cls is not None:
            self._check_target()

    def _check_target(self) -> None:
        """What load() needs before it reads the payload: a class for this kind, this
        version's layout, and room for the segment where it will be made."""
        file = self.file
        self.target = self.cls._target_class(self.prioritized)
        if self.target is None:
            kind = "prioritized" if self.prioritized else "uniform"
            right = "PrioritizedReplayBuffer" if self.prioritized else "ReplayBuffer"
            raise refused(file, f"it holds a {kind} buffer; load it with {right}.load()")
        if not self.layout_fits:
            raise refused(file, "its row layout differs from the one this cpprb_ray makes for "
                                "its env_dict (written by another version)")
        backend = _memory.resolve_backend(self.backend)
        directory = (os.path.dirname(os.path.abspath(_memory.check_path(self.path)))
                     if self.path is not None else _memory.default_mmap_dir())
        needed = self.segment_size
        try:
            stats = os.statvfs(directory)
            free: Optional[int] = stats.f_bavail * stats.f_frsize
        except OSError:
            free = None       # the constructor says what is wrong with the place
        if free is not None and needed > free:
            raise refused(file, f"its capacity {self.capacity} needs a segment of {needed} "
                                f"bytes, more than the {free} bytes free at {directory} "
                                f"(backend {backend!r})")
        if self.path is None or _proc.is_memory_filesystem(directory):
            try:
                _rules.check_memory(float(needed), "capacity", self.capacity,
                                    "shared memory for its segment")
            except ValueError as error:
                raise refused(file, str(error)) from None

    def _parse(self, description: Dict[str, Any]) -> None:
        kind = description["kind"]
        if kind not in ("prioritized", "uniform"):
            raise ValueError(f"unknown kind {kind!r}")
        self.prioritized = kind == "prioritized"
        self.capacity = _integer(description["capacity"], "capacity")
        if self.capacity < 1:
            raise ValueError(f"capacity {self.capacity}")
        self.alpha = _real(description["alpha"], "alpha")
        self.eps = _real(description["eps"], "eps")
        if not (0.0 <= self.alpha < float("inf") and 0.0 <= self.eps < float("inf")):
            raise ValueError(f"alpha {self.alpha}, eps {self.eps}")
        self.env_dict = {str(name): {"shape": tuple(spec["shape"]), "dtype": str(spec["dtype"])}
                         for name, spec in description["env_dict"].items()}
        self.nstep = description["nstep"]
        version = description["format_version"]
        self.lane_meta: Any = description.get(_LANES)
        self.sequence_meta: Any = description.get(_SEQUENCE)
        if self.sequence_meta is not None and self.lane_meta is None:
            raise ValueError("a sequence section without a lane section")
        if version in _KIND_VERSIONS:   # where the version said the kind, it must be the same
            if (self.lane_meta is None) != (version == _RING_VERSION):
                raise ValueError(f"format version {version} " + (
                    "without a lane section" if self.lane_meta is None
                    else "with a lane section"))
            if (self.sequence_meta is None) == (version == _SEQUENCE_VERSION):
                raise ValueError(f"format version {version} " + (
                    "without a sequence section" if self.sequence_meta is None
                    else "with a sequence section"))
        # The constructor's arguments: a laned buffer's lanes, next_of and stack_compress (a
        # sequence buffer's lanes and sequence), and the size it was given (a bounded frame
        # lane keeps that many rows in more slots).
        self.lane_options = {} if self.lane_meta is None else _lane_options(self.lane_meta)
        if self.sequence_meta is not None:
            self.lane_options[_SEQUENCE] = dict(self.sequence_meta)
        self.size = self.capacity
        if self.lane_meta is not None and self.lane_meta["rows"]:
            self.size = _integer(self.lane_meta["rows"], "lanes rows")
        # The same rules as the constructor's, so that a crafted description is refused here,
        # naming the file, and not by the constructor. The layout the constructor will make
        # (computed, nothing allocated): a file laid out otherwise is refused before a buffer
        # of its capacity is made.
        planned, _, _ = _parts.plan_layout(self.size, self.env_dict, self.prioritized, "shm",
                                           self.nstep, **self.lane_options)
        self.sequence = sequences.SequenceConfig.from_meta(planned.meta, "the file's layout")
        if (self.sequence is not None
                and json.loads(json.dumps(planned.meta[_SEQUENCE])) != self.sequence_meta):
            raise ValueError(f"sequence {self.sequence_meta} is not a config this cpprb_ray "
                             f"writes (length, period and eta)")
        self.columns = description["columns"]
        if [column["name"] for column in self.columns] != [c.name for c in planned.columns]:
            raise ValueError("its columns are not those of its env_dict")
        self.row_stride = _integer(description["row_stride"], "row_stride")
        self.layout_fits = self.matches(planned)
        self.segment_size = planned.total_size
        state = description["state"]
        self.stored_size = _integer(state["stored_size"], "stored_size")
        self.next_index = _integer(state["next_index"], "next_index")
        self.max_priority = _real(state["max_priority"], "max_priority")
        self.rows_added = _integer(state["rows_added"], "rows_added")
        if not 0 <= self.rows_added < 2**64:
            raise ValueError(f"rows added {self.rows_added}, not a uint64")
        if not 0 <= self.stored_size <= self.capacity:
            raise ValueError(f"stored size {self.stored_size} of {self.capacity} slots")
        if self.rows_added < self.stored_size:   # every stored row was added
            raise ValueError(f"rows added {self.rows_added} with {self.stored_size} rows "
                             f"stored")
        if not 0 <= self.next_index < self.capacity or (
                self.lane_meta is None and self.stored_size < self.capacity
                and self.next_index != self.stored_size):
            raise ValueError(f"next index {self.next_index} with {self.stored_size} of "
                             f"{self.capacity} slots stored")
        if not 0.0 <= self.max_priority < float("inf"):
            raise ValueError(f"max priority {self.max_priority}")
        if self.prioritized:   # the next add's default priority: its weight must fit the tree
            _rules.check_priorities(np.array([self.max_priority]), self.alpha, self.eps,
                                    self.capacity, "max_priority")
        lengths = {name: length for name, (_, length) in description["sections"].items()}
        missing = [name for name in (_SECTIONS if self.lane_meta is None else _LANED_SECTIONS)
                   if name not in lengths]
        if missing:
            raise ValueError(f"sections {missing} missing")
        self._parse_limiter(description.get("rate_limiter"))
        if self.lane_meta is not None:
            self._parse_since_clear(state)
            self._check_lane_lengths(lengths)
            if self.sequence is not None:
                self.open_sequences = _integer(state["open_sequences"], "open_sequences")
            return
        if self.row_stride < 8 or lengths["rows"] != self.stored_size * self.row_stride:
            raise ValueError(f"{lengths['rows']} bytes of rows for {self.stored_size} rows of "
                             f"{self.row_stride} bytes")
        if lengths["tail_generations"] > 8 * (self.capacity - self.stored_size):
            raise ValueError(f"{lengths['tail_generations']} bytes of generations past "
                             f"{self.stored_size} of {self.capacity} slots")
        expected = 8 * self.stored_size if self.prioritized else 0
        if lengths["leaves"] != expected:
            raise ValueError(f"{lengths['leaves']} bytes of leaves for {expected // 8} rows")

    def _check_lane_lengths(self, lengths: Dict[str, int]) -> None:
        """A laned file's sections: every slot's record and leaf, and a record per lane."""
        self.lane_count = _integer(self.lane_meta["count"], "lanes count")
        expected = {"rows": self.capacity * self.row_stride, "leaves": 8 * self.capacity,
                    "lanes": _layout.LANE_BYTES * self.lane_count}
        for name, length in expected.items():
            if lengths[name] != length:
                raise ValueError(f"{lengths[name]} bytes of {name} for {self.capacity} slots "
                                 f"in {self.lane_count} lanes (expected {length})")

    def _parse_payload(self, sections: Dict[str, memoryview]) -> None:
        if self.lane_meta is not None:
            self._parse_lanes(sections)
            return
        self.rows = sections["rows"]
        self.tail = _array(sections["tail_generations"], np.uint64, "tail_generations")
        if len(self.tail) > self.capacity - self.stored_size:
            raise ValueError(f"{len(self.tail)} generations past {self.stored_size} of "
                             f"{self.capacity} slots")
        self.leaves = _array(sections["leaves"], np.float64, "leaves")
        self._check_leaves()

    def _parse_limiter(self, saved: Any) -> None:
        """The rate limiter (rebuilt through its class, so its rules apply) and its counts;
        none in a file saved without one (or before limiters were saved)."""
        self.limiter: Optional[rate_limiters.RateLimiter] = None
        self.limiter_counts: Tuple[int, int] = (0, 0)
        if saved is None:
            return
        kind = saved["kind"]
        if kind == "MinSize":
            self.limiter = rate_limiters.MinSize(saved["min_size_to_sample"])
        elif kind == "SampleToInsertRatio":
            self.limiter = rate_limiters.SampleToInsertRatio(
                saved["samples_per_insert"], saved["min_size_to_sample"],
                (saved["min_diff"], saved["max_diff"]))
        else:
            raise ValueError(f"unknown rate limiter {kind!r}")
        self.limiter.check_capacity(self.size)
        inserts = _integer(saved["inserts"], "rate_limiter inserts")
        samples = _integer(saved["samples"], "rate_limiter samples")
        if not (0 <= inserts < 2**63 and 0 <= samples < 2**63):
            raise ValueError(f"rate limiter counts {inserts}, {samples}")
        # Its inserts count since the last clear: at least the rows stored (a clear empties
        # the buffer), at most the rows ever added.
        if not self.stored_size <= inserts <= self.rows_added:
            raise ValueError(f"rate limiter inserts {inserts} with {self.stored_size} rows "
                             f"stored and {self.rows_added} ever added")
        self.limiter_counts = (inserts, samples)

    def _parse_since_clear(self, state: Dict[str, Any]) -> None:
        """A laned file's rows added since the last clear, which the restore keeps (in the
        limiter record's base, which every clear moves) with or without a limiter."""
        since = _integer(state["rows_since_clear"], "rows_since_clear")
        if not self.stored_size <= since <= self.rows_added:
            raise ValueError(f"rows since the last clear {since} with {self.stored_size} rows "
                             f"stored and {self.rows_added} ever added")
        if self.limiter is not None and self.limiter_counts[0] != since:
            raise ValueError(f"rate limiter inserts {self.limiter_counts[0]}, rows since the "
                             f"last clear {since}")
        self.limiter_counts = (since, self.limiter_counts[1])

    def _check_leaves(self) -> None:
        expected = self.stored_size if self.prioritized else 0
        if len(self.leaves) != expected:
            raise ValueError(f"{len(self.leaves)} leaves for {expected} rows")
        if not self.prioritized:
            return
        leaves = self.leaves
        # What the kernels leave: a weight > 0, or -0.0 (unset: never sampled, never the
        # minimum). A NaN, an infinity, a negative or a +0.0 leaf would corrupt the sampling.
        self._check_leaf_values(None)
        torn = np.concatenate(self.torn_records + [np.empty(0, dtype=np.int64)])
        torn = torn[leaves[torn] != 0.0]
        if torn.size:
            raise ValueError(f"slot {int(torn.min())} is torn (odd generation) but has a "
                             f"weight")

    def _parse_lanes(self, sections: Dict[str, memoryview]) -> None:
        """A laned file's payload, checked as the kernels will index it: lanes without owners
        whose heads and fills fit them, links a write leaves, leaves that are weights on live
        rows and unset elsewhere, and as many live rows as the state says."""
        capacity, count = self.capacity, self.lane_count
        self.rows = sections["rows"]
        self.leaves = _array(sections["leaves"], np.float64, "leaves")
        self.lanes = sections["lanes"]
        table = _array(self.lanes, np.uint64, "lanes").reshape(count, _layout.LANE_BYTES // 8)
        # Lane i holds slots [i * capacity // count, (i + 1) * capacity // count) (_lanes).
        starts = np.array([lane * capacity // count for lane in range(count + 1)],
                          dtype=np.int64)
        sizes = np.diff(starts)
        owned = np.flatnonzero(table[:, [0, 1, 2, 6, 7]].any(axis=1))
        if owned.size:
            raise ValueError(f"lane {int(owned[0])} has an owner; a checkpoint's lanes have none")
        bad = np.flatnonzero((table[:, 3] >= sizes.astype(np.uint64))
                             | (table[:, 4] > sizes.astype(np.uint64)))
        if bad.size:
            lane = int(bad[0])
            raise ValueError(f"lane {lane}: head {int(table[lane, 3])} and fill "
                             f"{int(table[lane, 4])} do not fit its {int(sizes[lane])} slots")
        generations, links, aheads = _record_marks(self.rows, capacity, self.row_stride)
        if self.sequence is not None:
            live = sequences.check_image(generations, links, aheads, starts, table[:, 3],
                                         table[:, 4], self.sequence.length)
            opened = int((links == sequences.OPEN_LINK).sum())
            if opened != self.open_sequences:
                raise ValueError(f"{opened} open sequences in its slots, its state says "
                                 f"{self.open_sequences}")
        else:
            live = self._frame_rows(generations, links, aheads, starts, sizes)
        if int(live.sum()) != self.stored_size:
            raise ValueError(f"{int(live.sum())} " + (
                "rows" if self.sequence is None else "committed sequences")
                + f" in its slots, its state says {self.stored_size}")
        self._check_leaf_values(live)

    def _check_leaf_values(self, live: Optional[np.ndarray]) -> None:
        """Every leaf one a kernel leaves: a weight > 0 or unset where a row lies (`live`;
        None: every leaf), unset elsewhere, none so heavy that the tree's total overflows."""
        heaviest = _rules.max_leaf_weight(self.capacity)
        problem = _rules.leaf_problem(self.leaves, heaviest, live)
        if problem is None:
            return
        slot, what = problem
        value = float(self.leaves[slot])
        if what == "heavy":
            raise ValueError(f"leaf {slot} is {value!r}, more than the {heaviest:.3g} that "
                             f"keeps the total of {self.capacity} slots finite")
        raise ValueError(f"leaf {slot} is {value!r}, not " + (
            "a weight > 0 or unset" if what == "weight" else "unset (its slot holds no row)"))

    def _frame_rows(self, generations: np.ndarray, links: np.ndarray, aheads: np.ndarray,
                    starts: np.ndarray, sizes: np.ndarray) -> np.ndarray:
        """Which slots of a laned (not sequence) buffer hold a row; ValueError for a link or a
        next stack that no write leaves."""
        stack_max = max([_integer(entry["stack"], "stack") for entry in self.lane_meta["frames"]]
                        + [1])
        bad = np.flatnonzero((links < -2) | (links > stack_max))
        if bad.size:
            raise ValueError(f"slot {int(bad[0])}'s link is {int(links[bad[0]])}, which no "
                             f"write leaves (stacks of {stack_max})")
        lane_of = np.searchsorted(starts, np.arange(self.capacity), side="right") - 1
        bad = np.flatnonzero((links >= 1) & (aheads != -1) & (
            (aheads < 0) | (aheads > sizes[lane_of] // 2)))
        if bad.size:
            raise ValueError(f"slot {int(bad[0])}'s next stack is {int(aheads[bad[0]])} slots "
                             f"ahead, which no write leaves")
        return _live(generations, links, aheads)

    def restore_into(self, buffer: Any) -> None:
        """Replace `buffer`'s state (a new buffer of this file's layout) by this file's."""
        if self.lane_meta is not None:
            buffer._image.restore(self.rows, self.leaves, self.lanes, self.next_index,
                                  self.max_priority, self.rows_added, *self.limiter_counts)
        else:
            # Rows read into the buffer's segment already are restored where they lie.
            with _window(self.rows, 0, len(self.rows)) as rows:
                buffer._image.restore(rows, self.tail, self.leaves, self.next_index,
                                      self.max_priority, self.rows_added, *self.limiter_counts)

    def matches(self, layout: Any) -> bool:
        # A laned layout's lane config (lanes, frame columns, the lane table's offset) must be
        # the file's too, as the capacity its size gives.
        return (layout.row_stride == self.row_stride and layout.capacity == self.capacity
                and [column.to_json() for column in layout.columns] == self.columns
                and json.loads(json.dumps(layout.meta.get(_LANES))) == self.lane_meta
                and json.loads(json.dumps(layout.meta.get(_SEQUENCE))) == self.sequence_meta)


def _lane_options(lanes: Mapping[str, Any]) -> Dict[str, Any]:
    """The constructor's lanes, next_of and stack_compress for a laned buffer's config (its
    layout's "lanes" meta): a frame column with a next column is next_of's, one that stacks
    frames (or has no next column) stack_compress's (the same column either way when it has
    both and a stack of 1)."""
    entries = lanes["frames"]
    next_of = [str(entry["name"]) for entry in entries if entry["next"] is not None]
    stacked = [str(entry["name"]) for entry in entries
               if entry["next"] is None or _integer(entry["stack"], "stack") > 1]
    return {"lanes": _integer(lanes["count"], "lanes count"), "next_of": next_of or None,
            "stack_compress": stacked or None}


def _integer(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an integer; got {value!r}")
    return value


def _real(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number; got {value!r}")
    return float(value)


def _array(view: memoryview, dtype: Any, name: str) -> np.ndarray:
    if len(view) % np.dtype(dtype).itemsize:
        raise ValueError(f"section {name!r} is {len(view)} bytes, not whole {np.dtype(dtype)}")
    return np.frombuffer(view, dtype=dtype)


def load(cls: Type[Any], file: Any, *, backend: str = "auto", name: Optional[str] = None,
         path: Any = None, seed: Optional[int] = None, lock_timeout: float = 60.0) -> Any:
    """A new owner buffer holding the state saved in `file` (see :meth:`ReplayBuffer.load`).

    Examples
    --------
    >>> import os, tempfile
    >>> from cpprb_ray import PrioritizedReplayBuffer, checkpoint
    >>> with tempfile.TemporaryDirectory() as directory:
    ...     file = os.path.join(directory, "rb.ckpt")
    ...     with PrioritizedReplayBuffer(8, {"obs": {}}) as rb:
    ...         _ = rb.add(obs=[1.0, 2.0], priorities=[0.5, 4.0])
    ...         checkpoint.save(rb, file)
    ...     with checkpoint.load(PrioritizedReplayBuffer, file) as copy:
    ...         print(copy.get_stored_size(), copy.get_max_priority())
    2 4.0
    """
    made: List[Any] = []

    def place(saved: _Checkpoint) -> Dict[str, Any]:
        # The buffer, made once the description is checked and before the payload is read: a
        # ring's rows are read straight into its segment, where the restore leaves them.
        options = {"alpha": saved.alpha, "eps": saved.eps} if saved.prioritized else {}
        made.append(saved.target(saved.size, saved.env_dict, backend=backend, name=name,
                                 path=path, seed=seed, lock_timeout=lock_timeout,
                                 Nstep=saved.nstep, rate_limiter=saved.limiter,
                                 **saved.lane_options, **options))
        layout = made[0]._layout
        if not saved.matches(layout):
            raise refused(file, "its row layout differs from the one this cpprb_ray makes for "
                                "its env_dict (written by another version)")
        if saved.lane_meta is not None:
            return {}
        return {"rows": SegmentSpan(made[0]._segment.memory, layout.data_offset,
                                    saved.stored_size * layout.row_stride)}

    try:
        _Checkpoint(file, cls, backend, path, place).restore_into(made[0])
    except BaseException:
        for buffer in made:
            buffer.close()
        raise
    return made[0]


# -- cpprb's transitions files (ReplayBuffer.save_transitions / load_transitions) -----------------

_TRANSITIONS_FILE = "a path (str, bytes or os.PathLike) or a binary file object"
# What zipfile, zlib and numpy raise on damaged bytes (a member whose header says "encrypted" or
# an unknown compression: RuntimeError, NotImplementedError; a bad offset: OSError from a seek; a
# cut stream: EOFError, struct.error). The unpickler's refusal of a crafted pickle (one that
# names anything but numpy's array reconstruction) stays the pickle.UnpicklingError it is.
_DAMAGED_TRANSITIONS = (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError,
                        RuntimeError, OSError, struct.error, KeyError, IndexError, TypeError,
                        AttributeError, OverflowError, RecursionError)


def transitions_target(file: Any) -> Any:
    """`file` for save_transitions: a binary file object as it is, a path as the str of the
    file to write (".npz" appended as cpprb's np.savez does; open it with open_for_writing)."""
    if hasattr(file, "write") and not isinstance(file, (str, bytes, os.PathLike)):
        return file
    path = path_of(file, _TRANSITIONS_FILE)
    return path if path.endswith(".npz") else path + ".npz"


def read_transitions(file: Any) -> Tuple[Dict[str, np.ndarray], bool]:
    """:func:`cpprb_ray._compat.read_transitions`, with every way a hostile or damaged file
    can fail it (a cut, a flipped byte: zipfile's, zlib's, the unpickler's errors) turned into
    a ValueError naming the file. A file that cannot be opened gives open()'s OSError."""
    if not (hasattr(file, "read") and hasattr(file, "seek")):
        path = path_of(file, _TRANSITIONS_FILE)
        raw = _open_regular(path, lambda kind: ValueError(
            f"file {path!r} is a {kind}, not a regular file"))
        with io.BufferedReader(raw) as handle:   # zipfile reads in small pieces
            return _read_transitions(handle, file)
    return _read_transitions(file, file)


def _read_transitions(handle: Any, file: Any) -> Tuple[Dict[str, np.ndarray], bool]:
    try:
        return _compat.read_transitions(handle)
    except ValueError as error:   # already says why; name the file as the user gave it
        why = str(error)
        prefix = repr(handle)
        raise ValueError(f"{file!r}{why[len(prefix):]}" if why.startswith(prefix)
                         else f"{file!r} is not a loadable transitions file: {why}") from None
    except _DAMAGED_TRANSITIONS as error:
        raise ValueError(f"{file!r} is not a loadable transitions file: it is corrupt or cut "
                         f"short ({type(error).__name__}: {error})") from None
