"""env_dict -> segment layout, and the self-describing layout JSON that lets attach work from
a name alone (and refuse anything foreign, truncated or corrupt before touching memory)."""

from __future__ import annotations

import json
import os
import secrets
import socket
import time
from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np

from cpprb_ray import _memory, _proc, _rules, _segment

DATA_ALIGN = 4096      # rows start on a page
LINE = 64              # the tree starts on a cache line; records never straddle one needlessly
GENERATION_BYTES = 8   # every record starts with its slot's uint64 generation
LANED_RECORD_START = 16  # ... and in a laned buffer its int32 link (_core.link_of), padded
LANE_BYTES = 64        # one lane's record in the lane table (_core.pxd's Lane)
MAX_SEGMENT_BYTES = 2**63 - 1   # the most a file offset (off_t) addresses
# Past this many slots the tree alone (more than 16 bytes a slot) outgrows MAX_SEGMENT_BYTES, and
# its int64 size arithmetic (_segment.tree_nbytes) would wrap.
_MAX_CAPACITY = 2**59
# sample()'s extra outputs, and add()'s own keyword arguments (a column named "self" or
# "timeout" could never be passed to add).
RESERVED_KEYS = ("indexes", "weights", "generations", "priorities", "self", "timeout")


def _align(value: int, to: int) -> int:
    return (value + to - 1) // to * to


class Column:
    """One env_dict entry: name, dtype, per-row shape, byte offset inside a row record."""

    __slots__ = ("name", "dtype", "shape", "row_bytes", "offset")

    def __init__(self, name: str, dtype: np.dtype, shape: Tuple[int, ...], offset: int = 0):
        self.name = name
        self.dtype = dtype
        self.shape = shape
        self.row_bytes = int(dtype.itemsize * int(np.prod(shape, dtype=np.int64)))
        self.offset = offset

    def to_json(self) -> Dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype.str, "shape": list(self.shape),
                "offset": self.offset, "row_bytes": self.row_bytes}


def parse_env_dict(env_dict: Mapping[str, Any]) -> List[Column]:
    """Validate cpprb's env_dict: {key: {"shape": int|tuple (1), "dtype": dtype (float32)}}."""
    if not isinstance(env_dict, Mapping):
        raise TypeError(f"env_dict must be a dict of column specs; got {type(env_dict).__name__}")
    if not env_dict:
        raise ValueError("env_dict must name at least one column; got an empty dict")
    columns = []
    for name, spec in env_dict.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"env_dict keys must be identifiers (they are keyword arguments "
                             f"of add); got {name!r}")
        if name in RESERVED_KEYS:
            raise ValueError(f"env_dict key {name!r} is reserved (sample()'s output or add()'s "
                             f"own argument)")
        if spec is None:
            spec = {}
        if not isinstance(spec, Mapping):
            raise TypeError(f"env_dict[{name!r}] must be a dict; got {type(spec).__name__}")
        # cpprb writes "add_shape" into the env_dict it is given; accept a dict it has seen.
        unknown = set(spec) - {"shape", "dtype", "add_shape"}
        if unknown:
            raise ValueError(f"env_dict[{name!r}] has unsupported keys {sorted(unknown)}; "
                             f"expected 'shape' and 'dtype'")
        dtype = _rules.column_dtype(spec.get("dtype", np.float32), name)
        shape = _rules.column_shape(spec.get("shape", 1), dtype, name)
        columns.append(Column(name, dtype, shape))
    return columns


class Layout:
    """Where everything of a buffer lives in its segment."""

    def __init__(self, capacity: int, prioritized: bool, columns: List[Column],
                 meta: Dict[str, Any], data_offset: int, row_stride: int, tree_offset: int,
                 total_size: int):
        self.capacity = capacity
        self.prioritized = prioritized
        self.columns = columns
        self.meta = meta
        self.data_offset = data_offset       # where the row records start
        self.row_stride = row_stride
        self.tree_offset = tree_offset
        self.total_size = total_size

    @property
    def token(self) -> Optional[str]:
        """The random identity the creating process put in the segment (None in segments made
        before tokens existed). Two segments with the same name have different tokens."""
        token = self.meta.get("token")
        return token if isinstance(token, str) else None

    def hot_regions(self) -> List[Tuple[int, int]]:
        """[(offset, bytes)] of the parts of the segment that every sample reads at random
        places, the most read first: the tree (each walk reads one line per level), then the
        rows. What a buffer asks 2 MiB pages for (_memory.create's `hot`,
        _memory.prefer_huge_pages).

        Examples
        --------
        >>> layout = plan(1024, parse_env_dict({"obs": {}}), True, "shm")
        >>> [offset for offset, _ in layout.hot_regions()] == [layout.tree_offset,
        ...                                                    layout.data_offset]
        True
        """
        return [(self.tree_offset, _segment.tree_nbytes(self.capacity)),
                (self.data_offset, self.capacity * self.row_stride)]

    def to_json(self) -> bytes:
        return json.dumps({"columns": [c.to_json() for c in self.columns],
                           "row_stride": self.row_stride, "meta": self.meta},
                          sort_keys=True).encode()


def record_stride(record_bytes: int) -> int:
    """Bytes per row record: a power of two up to a cache line, whole lines above, so that a
    record never straddles more lines than it must (a sampled row costs one miss if it fits)."""
    if record_bytes <= LINE:
        stride = 8
        while stride < record_bytes:
            stride *= 2
        return stride
    return _align(record_bytes, LINE)


# The keys of a layout's "meta" that say which segment this is and who owns it, as opposed to
# the buffer's own configuration (features such as "nstep"): a checkpoint leaves them out, and a
# loaded buffer gets new ones.
IDENTITY_META = ("backend", "owner_pid", "owner_parent_pid", "owner_start", "host", "created",
                 "token", "owner_pidns", "boot_id")


def plan(capacity: int, columns: List[Column], prioritized: bool, backend: str,
         extra_meta: Optional[Mapping[str, Any]] = None,
         lanes: Optional[Dict[str, Any]] = None) -> Layout:
    """Lay out a new segment for `capacity` rows of `columns`; `extra_meta` (JSON-able) goes
    into the layout's "meta" too (features record their config there, e.g. "nstep").

    `lanes` (cpprb_ray.frames' config of a laned buffer, with "count" lanes): each record gets
    a link after its generation, and the lane table follows the tree; its offset is added to
    the config, which goes into the meta as "lanes"."""
    if capacity > _MAX_CAPACITY:
        raise _too_large(capacity)
    # token: this segment's identity (a name can be removed and made again by somebody else);
    # owner_pidns and boot_id: where owner_pid means anything (see _orphans).
    meta = {"backend": backend, "owner_pid": os.getpid(), "owner_parent_pid": os.getppid(),
            "owner_start": _proc.process_start_time(os.getpid()), "host": socket.gethostname(),
            "created": time.time(), "token": secrets.token_hex(16),
            "owner_pidns": _proc.pid_namespace(), "boot_id": _proc.boot_id()}
    meta.update(extra_meta or {})
    # Fields in env_dict order, each aligned to its item size (at most 8) after the generation.
    offset = GENERATION_BYTES if lanes is None else LANED_RECORD_START
    for column in columns:
        alignment = min(column.dtype.alignment, 8)
        offset = _align(offset, max(alignment, 1))
        column.offset = offset
        offset += column.row_bytes
    row_stride = record_stride(offset)
    # The JSON holds the columns, the stride and the meta, all final here (not the section
    # offsets, which are in the header), so its length fixes where the rows start.
    lane_bytes = 0
    lane_meta: Dict[str, Any] = {}
    if lanes is not None:
        # Its offset is in the JSON, whose length decides where the rows start: settle the
        # offset's digits first (the tree's end can only move by a page when they change).
        lane_bytes = LANE_BYTES * int(lanes["count"])
        lane_meta = dict(lanes, offset=0)
        meta["lanes"] = lane_meta
        for _ in range(3):
            document = Layout(capacity, prioritized, columns, meta, 0, row_stride, 0, 0).to_json()
            data_offset = _align(_segment.LAYOUT_OFFSET + len(document), DATA_ALIGN)
            tree_offset = _align(data_offset + capacity * row_stride, LINE)
            lane_meta["offset"] = _align(tree_offset + _segment.tree_nbytes(capacity), LINE)
    document = Layout(capacity, prioritized, columns, meta, 0, row_stride, 0, 0).to_json()
    data_offset = _align(_segment.LAYOUT_OFFSET + len(document), DATA_ALIGN)
    tree_offset = _align(data_offset + capacity * row_stride, LINE)
    tree_end = tree_offset + _segment.tree_nbytes(capacity)
    if lanes is not None and lane_meta["offset"] != _align(tree_end, LINE):
        raise AssertionError("lane table offset did not settle")  # pragma: no cover
    total_size = _align(_align(tree_end, LINE) + lane_bytes, DATA_ALIGN)
    if total_size > MAX_SEGMENT_BYTES:
        raise _too_large(capacity)
    return Layout(capacity, prioritized, columns, meta, data_offset, row_stride, tree_offset,
                  total_size)


def _too_large(capacity: int) -> ValueError:
    return ValueError(f"size {_rules.shown(capacity)} makes a segment of more than 2**63 - 1 "
                      f"bytes, the most a file holds; make size smaller")


def corrupt(location: str, why: str) -> ValueError:
    return ValueError(f"{location!r} is not a valid cpprb_ray buffer: {why}")


def read(memory, size: int, location: str) -> Tuple[Dict[str, Any], Layout]:
    """Read and validate the header and layout of a mapped segment of `size` bytes."""
    if size < _segment.LAYOUT_OFFSET:
        raise corrupt(location, f"{size} bytes is smaller than a header")
    header = _segment.read_header(memory)
    if header["magic"] != _segment.MAGIC:
        raise corrupt(location, "bad magic (not a cpprb_ray segment, or not initialized)")
    if header["version"] != _segment.LAYOUT_VERSION:
        raise corrupt(location, f"layout version {header['version']}, this cpprb_ray reads "
                                f"{_segment.LAYOUT_VERSION}")
    if header["total_size"] > size:
        raise corrupt(location, f"header says {header['total_size']} bytes, segment has {size} "
                                f"(truncated)")
    capacity = header["capacity"]
    layout_end = header["layout_offset"] + header["layout_length"]
    if (capacity < 1 or header["layout_offset"] != _segment.LAYOUT_OFFSET
            or layout_end > header["data_offset"] or header["data_offset"] > size):
        raise corrupt(location, "inconsistent header fields")
    try:
        with memoryview(memory) as view:
            document = json.loads(bytes(view[header["layout_offset"]:layout_end]).decode())
        entries = document["columns"]
        # The same rules as for a user's env_dict: a crafted layout must not smuggle in an
        # object dtype (a gather would copy raw pointers) or a non-positive dimension.
        columns = parse_env_dict({str(entry["name"]): {"dtype": entry["dtype"],
                                                      "shape": tuple(entry["shape"])}
                                  for entry in entries})
        if len(columns) != len(entries):
            raise ValueError("duplicate column names")
        for column, entry in zip(columns, entries):
            column.offset = int(entry["offset"])
            if column.row_bytes != entry["row_bytes"]:
                raise ValueError("row size mismatch")
        meta = dict(document["meta"])
    # RecursionError: JSON nested thousands deep (the decoder recurses per level).
    except (ValueError, KeyError, TypeError, UnicodeDecodeError, RecursionError) as error:
        raise corrupt(location, f"unreadable layout ({error})") from None
    if not columns:
        raise corrupt(location, "no columns")
    total = header["total_size"]
    stride = header["row_stride"]
    if stride < GENERATION_BYTES or stride % 8 or document.get("row_stride") != stride:
        raise corrupt(location, f"bad row stride {stride}")
    for column in columns:
        if column.offset < GENERATION_BYTES or column.offset + column.row_bytes > stride:
            raise corrupt(location, f"column {column.name!r} lies outside its row record")
    rows_end = header["data_offset"] + capacity * stride
    if header["data_offset"] % 8 or rows_end > total:
        raise corrupt(location, "rows lie outside the segment")
    tree_end = header["tree_offset"] + _segment.tree_nbytes(capacity)
    if header["tree_offset"] % 8 or header["tree_offset"] < rows_end or tree_end > total:
        raise corrupt(location, "tree lies outside the segment")
    if header["next_index"] >= capacity or header["stored_size"] > capacity:
        raise corrupt(location, "ring indices out of range")
    lanes = meta.get("lanes")
    prioritized = bool(header["prioritized"])
    if lanes is not None:
        try:
            count, offset = int(lanes["count"]), int(lanes["offset"])
            uniform = bool(lanes["uniform"])
        except (KeyError, TypeError, ValueError):
            raise corrupt(location, "unreadable lanes") from None
        if not (1 <= count <= capacity and offset % 8 == 0 and offset >= tree_end
                and offset + count * LANE_BYTES <= total and header["prioritized"]):
            raise corrupt(location, "lane table lies outside the segment")
        if any(column.offset < LANED_RECORD_START for column in columns):
            raise corrupt(location, "a column overlaps the records' links")
        prioritized = not uniform   # a uniform laned buffer samples through a flat tree
    layout = Layout(capacity, prioritized, columns, meta, header["data_offset"],
                    stride, header["tree_offset"], total)
    return header, layout


# Far more layout JSON than any env_dict makes (1200 columns take about 100 KB): a header that
# says more is damaged, and reading what it says could mean reading the whole segment.
_LAYOUT_LIMIT = 64 << 20


def read_prefix(fd: int) -> bytearray:
    """The header and layout JSON of the segment open at `fd`, read without mapping it.

    ValueError when it does not start with a cpprb_ray header. When the fixed header is
    damaged so that its layout would run past the data, the file or any real layout, only the
    fixed header (padded to the layout's offset), which :func:`read` then refuses, saying why:
    a damaged length must not make a reader (the CLI, an owner's close) read gigabytes.
    """
    head = bytearray(os.pread(fd, _segment.LAYOUT_OFFSET, 0))
    if len(head) < _segment.HEADER_NBYTES or head[:8] != _segment.MAGIC:
        raise ValueError("not a cpprb_ray buffer")
    fixed = _segment.read_header(head)
    layout_end = int(fixed["layout_offset"]) + int(fixed["layout_length"])
    if not (fixed["layout_length"] <= _LAYOUT_LIMIT
            and fixed["layout_offset"] == _segment.LAYOUT_OFFSET
            and layout_end <= fixed["data_offset"] <= os.fstat(fd).st_size):
        return head.ljust(_segment.LAYOUT_OFFSET, b"\0")
    # The JSON can be long (one entry per column); read exactly up to its end.
    return bytearray(os.pread(fd, max(layout_end, _segment.LAYOUT_OFFSET), 0))


def token_at(backend: str, location: str) -> Optional[str]:
    """The identity token of the segment now at `location`, or None when there is none there,
    it is not a readable cpprb_ray buffer, or it belongs to another user.

    What an owner checks before unlinking a name, and how another process can tell whether the
    segment it sees is the one a handle describes.

    Examples
    --------
    >>> from cpprb_ray import ReplayBuffer
    >>> with ReplayBuffer(4, {"obs": {}}) as rb:
    ...     print(token_at(rb.backend, rb.name) == rb._layout.token)
    True
    >>> print(token_at(rb.backend, rb.name))  # closed by its owner: the name is gone
    None
    """
    try:
        fd = _memory.open_existing(backend, location)
    except (OSError, ValueError):
        return None
    try:
        if os.fstat(fd).st_uid != os.geteuid():
            return None
        data = read_prefix(fd)
        header = _segment.read_header(data)
        start = int(header["layout_offset"])
        document = json.loads(bytes(data[start:start + int(header["layout_length"])]).decode())
        token = document["meta"]["token"]
        return token if isinstance(token, str) else None
    except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError, RecursionError):
        return None
    finally:
        os.close(fd)
