"""Lanes and frame columns: cpprb's ``next_of`` and ``stack_compress``, with many writers.

A laned buffer's ring is split into ``lanes`` contiguous sub-rings under one tree. A handle
claims a free lane on its first add (or the lane of a dead owner) and is its writer until it
closes or its process ends; more concurrent writers than lanes get a clear error at that add.

Frame columns keep one plane per slot. ``next_of="obs"``: ``next_obs`` is not stored, it is the
obs of the slot after; ``stack_compress="obs"``: obs's last axis is a frame stack, and a slot
keeps only its newest frame. What is not in the lane already (a reset, a new episode, a next
stack that does not continue the obs) is written as filler slots, so ``sample`` returns every
column exactly as it was added; a row whose frames the ring overwrote is never returned. The
kernels are in :mod:`cpprb_ray._lanes`; docs/frames.md has the layout and the figures.

Examples
--------
>>> import numpy as np
>>> from cpprb_ray import ReplayBuffer
>>> env = {"obs": {"shape": (2, 2, 3), "dtype": np.uint8}, "act": {"dtype": np.int64}}
>>> frames = np.arange(10 * 4, dtype=np.uint8).reshape(10, 2, 2)
>>> stack = lambda t: np.stack([frames[t + j] for j in range(3)], axis=-1)
>>> with ReplayBuffer(64, env, next_of="obs", stack_compress="obs", seed=0) as rb:
...     for t in range(5):
...         _ = rb.add(obs=stack(t), act=t, next_obs=stack(t + 1))
...     batch = rb.sample(8)
...     exact = all((batch["obs"][k] == stack(a)).all() and
...                 (batch["next_obs"][k] == stack(a + 1)).all()
...                 for k, a in enumerate(batch["act"].ravel()))
...     print(rb.get_stored_size(), exact, sorted(rb.env_dict))
5 True ['act', 'next_obs', 'obs']
"""

from __future__ import annotations

import os
import secrets
from typing import Any, Collection, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from cpprb_ray import _proc, _rules
from cpprb_ray._layout import Column, parse_env_dict

MAX_STACK = 1024        # planes per stack (_lanes.pxd)
MAX_FRAME_COLUMNS = 8   # frame columns per buffer (_lanes.pxd)
MIN_LANE_SLOTS = 4      # a lane holds at least this many stacks' worth of slots
# One lane with frames holds cpprb's N rows in more slots: room for the filler slots of this
# many episode starts (or stream breaks) among its newest N rows, each up to 2 * stack - 1
# fillers, and the 2 * stack slots a write evicts ahead. Up to this many rows, every row may be
# an episode of its own (cpprb's worst case); past it, the extra is a fixed few thousand slots.
BOUNDED_EPISODES = 4096


def bounded_slots(rows: int, stack_max: int) -> int:
    """Slots of one frame lane that keeps `rows` rows (cpprb's size): see BOUNDED_EPISODES.

    Examples
    --------
    >>> bounded_slots(10, 1), bounded_slots(10, 3), bounded_slots(10**6, 4)
    (22, 66, 1028680)
    """
    return rows + (2 * stack_max - 1) * min(rows, BOUNDED_EPISODES) + 2 * stack_max

Names = Union[None, str, Sequence[str]]


def _names(value: Names, argument: str, known: Sequence[str]) -> List[str]:
    if value is None:
        return []
    # A collection, not any iterable: the names are read more than once (an iterator would
    # be empty the second time), and a dict or bytes is not a list of names.
    if not isinstance(value, str) and (not isinstance(value, Collection) or isinstance(
            value, (bytes, bytearray, Mapping))):
        raise TypeError(f"{argument} must be a str or a list of str (env_dict keys); got "
                        f"{type(value).__name__}")
    names = [value] if isinstance(value, str) else list(value)
    for name in names:
        if not isinstance(name, str) or name not in known:
            raise ValueError(f"{argument} must name env_dict keys ({sorted(known)}); got "
                             f"{name!r}")
    if len(set(names)) != len(names):
        raise ValueError(f"{argument} names a key twice: {names}")
    return names


def _pid_namespace_id() -> int:
    """This process's pid namespace as a number (0 where /proc does not say)."""
    text = _proc.pid_namespace() or ""
    digits = "".join(ch for ch in text if ch.isdigit())
    return int(digits) if digits else 0


def with_next_columns(columns: List[Column], next_of: Names) -> List[Column]:
    """`columns` and, for each next_of column that env_dict does not list, its next column
    (``next_<name>``, same shape and dtype): what add takes, what N-step may name.

    Examples
    --------
    >>> from cpprb_ray._layout import parse_env_dict
    >>> [c.name for c in with_next_columns(parse_env_dict({"obs": {}, "act": {}}), "obs")]
    ['obs', 'act', 'next_obs']
    """
    names = [c.name for c in columns]
    next_names = _names(next_of, "next_of", names)
    extra = [Column("next_" + c.name, c.dtype, c.shape) for c in columns
             if c.name in next_names and "next_" + c.name not in names]
    return list(columns) + extra


class FrameColumn:
    """One frame column: its public name, stack (planes per value), next column's name (or
    None) and public shape and dtype; the store keeps one plane of it per slot."""

    __slots__ = ("name", "stack", "next", "shape", "dtype")

    def __init__(self, name: str, stack: int, next_name: Optional[str],
                 shape: Tuple[int, ...], dtype: np.dtype):
        self.name = name
        self.stack = stack
        self.next = next_name
        self.shape = shape
        self.dtype = dtype

    @property
    def plane_shape(self) -> Tuple[int, ...]:
        return self.shape[:-1] if self.stack > 1 else self.shape


class LaneConfig:
    """A laned buffer's configuration: lanes, frame columns, and the public columns (what add
    takes and sample returns, in env_dict order: next columns included)."""

    def __init__(self, count: int, frames: List[FrameColumn], uniform: bool,
                 public: List[Tuple[str, Tuple[int, ...], np.dtype]], rows: int = 0):
        self.count = count
        self.frames = frames
        self.uniform = uniform
        self.public = public
        # One lane with frames (cpprb's next_of / stack_compress): the most rows it keeps, in
        # bounded_slots() slots; 0: no bound but the slots (several lanes, or none with frames).
        self.rows = rows

    def slots(self, capacity: int) -> int:
        """The ring's slots for a buffer of `capacity` (the size the user gave)."""
        if not self.rows:
            return capacity
        return bounded_slots(self.rows, max([f.stack for f in self.frames] + [1]))

    @classmethod
    def plan(cls, columns: List[Column], capacity: int, prioritized: bool, next_of: Names,
             stack_compress: Names, lanes: Any) -> Tuple[List[Column], Optional[LaneConfig]]:
        """(stored columns, config) for a new buffer; (columns, None) without lanes or frames.

        ``next_of`` names columns whose ``next_<name>`` is derived (it may be in env_dict too,
        with the same shape and dtype, as cpprb lets it be); ``stack_compress`` names columns
        whose last axis is a frame stack.

        Examples
        --------
        >>> from cpprb_ray._layout import parse_env_dict
        >>> columns = parse_env_dict({"obs": {"shape": (84, 84, 4), "dtype": "uint8"},
        ...                           "act": {}})
        >>> stored, config = LaneConfig.plan(columns, 1024, True, "obs", "obs", 2)
        >>> [(c.name, c.shape) for c in stored], config.count
        ([('obs', (84, 84)), ('act', (1,))], 2)
        >>> [name for name, _, _ in config.public]
        ['obs', 'act', 'next_obs']
        """
        names = [c.name for c in columns]
        next_names = _names(next_of, "next_of", names)
        stacked = _names(stack_compress, "stack_compress", names)
        # A column next_of derives is not stored: it cannot be a frame column itself.
        for argument, named in (("next_of", next_names), ("stack_compress", stacked)):
            for name in named:
                if name.startswith("next_") and name[5:] in next_names:
                    raise ValueError(f"{argument} names {name!r}, which next_of={name[5:]!r} "
                                     f"derives (it is not stored); name {name[5:]!r} instead")
        if lanes is None and not next_names and not stacked:
            return columns, None
        count = 1 if lanes is None else _rules.as_count(lanes, "lanes")
        if count < 1:
            raise ValueError(f"lanes must be >= 1; got {lanes}")
        by_name = {c.name: c for c in columns}
        frames: List[FrameColumn] = []
        for name in names:
            if name not in next_names and name not in stacked:
                continue
            column = by_name[name]
            stack = 1
            if name in stacked:
                if not column.shape or column.shape[-1] < 1:
                    raise ValueError(f"stack_compress: column {name!r} needs a last axis (its "
                                     f"frame stack); got shape {column.shape}")
                stack = column.shape[-1]
                if stack > MAX_STACK:
                    raise ValueError(f"stack_compress: column {name!r} stacks {stack} frames; "
                                     f"at most {MAX_STACK}")
            next_name = None
            if name in next_names:
                next_name = "next_" + name
                twin = by_name.get(next_name)
                if twin is not None and (twin.shape != column.shape or twin.dtype != column.dtype):
                    raise ValueError(f"next_of: env_dict[{next_name!r}] must match "
                                     f"env_dict[{name!r}] (shape {column.shape}, dtype "
                                     f"{column.dtype}); got {twin.shape} {twin.dtype}")
            frames.append(FrameColumn(name, stack, next_name, column.shape, column.dtype))
        if len(frames) > MAX_FRAME_COLUMNS:
            raise ValueError(f"at most {MAX_FRAME_COLUMNS} next_of/stack_compress columns; got "
                             f"{len(frames)}")
        stack_max = max([f.stack for f in frames] + [1])
        rows = capacity if count == 1 and frames else 0
        lane_slots = capacity // count if not rows else bounded_slots(rows, stack_max)
        needed = MIN_LANE_SLOTS * stack_max if frames else 1
        if lane_slots < needed:
            raise ValueError(f"size {capacity} with lanes={_rules.shown(count)} leaves "
                             f"{lane_slots} slots per lane; each lane needs at least {needed} "
                             f"(stack {stack_max}); use fewer lanes or a larger size")
        derived = {f.next for f in frames if f.next is not None}
        framed = {f.name: f for f in frames}
        public = [(c.name, c.shape, c.dtype) for c in columns]
        public += [(f.next, f.shape, f.dtype) for f in frames
                   if f.next is not None and f.next not in by_name]
        stored = [Column(c.name, c.dtype, framed[c.name].plane_shape) if c.name in framed
                  else c for c in columns if c.name not in derived]
        return stored, cls(count, frames, not prioritized, public, rows)

    def columns(self) -> List[Column]:
        """The public columns as Column objects (what add takes, N-step's view)."""
        return [Column(name, dtype, shape) for name, shape, dtype in self.public]

    def to_meta(self) -> Dict[str, Any]:
        return {"count": self.count, "uniform": self.uniform, "rows": self.rows,
                "frames": [{"name": f.name, "stack": f.stack, "next": f.next} for f in self.frames],
                "public": [{"name": name, "shape": list(shape), "dtype": dtype.str}
                           for name, shape, dtype in self.public]}

    @classmethod
    def from_meta(cls, meta: Mapping[str, Any], stored: List[Column],
                  location: str) -> Optional[LaneConfig]:
        """The config a segment's layout records, checked against its stored columns (the
        kernels index with it); None when it has no lanes."""
        lanes = meta.get("lanes")
        if lanes is None:
            return None
        by_name = {c.name: c for c in stored}
        try:
            # The rules of a user's env_dict: a crafted record must not smuggle in an object
            # dtype or a shape whose size overflows.
            entries = {str(e["name"]): {"shape": tuple(e["shape"]), "dtype": e["dtype"]}
                       for e in lanes["public"]}
            if len(entries) != len(lanes["public"]):
                raise ValueError("duplicate public columns")
            public = [(c.name, c.shape, c.dtype) for c in parse_env_dict(entries)]
            shapes = {name: (shape, dtype) for name, shape, dtype in public}
            frames = []
            for entry in lanes["frames"]:
                name, stack = str(entry["name"]), int(entry["stack"])
                next_name = None if entry["next"] is None else str(entry["next"])
                shape, dtype = shapes[name]
                frame = FrameColumn(name, stack, next_name, shape, dtype)
                column = by_name[name]
                if (not 1 <= stack <= MAX_STACK or (stack > 1 and shape[-1] != stack)
                        or column.shape != frame.plane_shape or column.dtype != dtype
                        or (next_name is not None and shapes.get(next_name) != (shape, dtype))):
                    raise ValueError(f"frame column {name!r} does not match its column")
                frames.append(frame)
            if len(frames) > MAX_FRAME_COLUMNS:
                raise ValueError("too many frame columns")
            # Every stored column is a public one (a frame column as its plane), and every
            # public one is stored or derived by next_of.
            framed = {f.name for f in frames}
            derived = {f.next for f in frames if f.next is not None}
            for column in stored:
                if column.name not in shapes or (column.name not in framed and shapes[
                        column.name] != (column.shape, column.dtype)):
                    raise ValueError(f"stored column {column.name!r} is not a public one")
            if set(shapes) != set(by_name) | derived or derived & set(by_name):
                raise ValueError("public columns do not match the stored ones")
            rows = int(lanes.get("rows", 0))
            if rows < 0 or (rows and (int(lanes["count"]) != 1 or not frames)):
                raise ValueError(f"a row bound of {rows}")
            config = cls(int(lanes["count"]), frames, bool(lanes["uniform"]), public, rows)
        except (KeyError, TypeError, ValueError, OverflowError) as error:
            raise ValueError(f"{location!r} is not a valid cpprb_ray buffer: unreadable lanes "
                             f"({error})") from None
        return config

    def store_specs(self, stored: List[Column]) -> List[Tuple[int, int, int, int, bool]]:
        """(store column, stack, plane bytes, item bytes, has next) per frame column, for
        ReplayStore.bind_lanes."""
        index = {c.name: k for k, c in enumerate(stored)}
        return [(index[f.name], f.stack, stored[index[f.name]].row_bytes, f.dtype.itemsize,
                 f.next is not None) for f in self.frames]

    def check_lane_size(self, capacity: int, location: str) -> None:
        stack_max = max([f.stack for f in self.frames] + [1])
        needed = MIN_LANE_SLOTS * stack_max if self.frames else 1
        if capacity // self.count < needed or (self.rows and capacity != bounded_slots(
                self.rows, stack_max)):
            raise ValueError(f"{location!r} is not a valid cpprb_ray buffer: lanes of "
                             f"{capacity // self.count} slots for stacks of {stack_max}")


class LaneWriter:
    """One handle's side of a laned buffer: its lane (claimed on the first add), the cached
    stacks that end it, and the staging of add's and sample's arrays."""

    def __init__(self, store: Any, config: LaneConfig, stored: List[Column], capacity: int):
        self._store = store
        self._capacity = capacity
        self._config = config
        self._stored = stored
        self._framed = {f.name: f for f in config.frames}
        self._next_names = {f.next for f in config.frames if f.next is not None}
        self._public_names = frozenset(name for name, _, _ in config.public)
        self._token = secrets.randbits(63) | 1
        self._lane: Optional[int] = None
        self._pid = os.getpid()
        self._cache_writes = np.zeros(1, dtype=np.uint64)
        self._caches = [np.empty(f.shape, dtype=f.dtype) for f in config.frames]
        self._chunk_size = self._chunk()
        self._store_order = [(c.name, c.name in self._framed) for c in stored]

    @property
    def public(self) -> List[Tuple[str, Tuple[int, ...], np.dtype]]:
        """The columns add takes and sample returns: (name, shape, dtype), env_dict order."""
        return self._config.public

    def columns(self) -> List[Column]:
        """The public columns as Column objects (what add takes)."""
        return self._config.columns()

    @property
    def lane(self) -> Optional[int]:
        """The lane this handle writes (None before its first add)."""
        return self._lane if self._pid == os.getpid() else None

    def rows_lost(self, slots: np.ndarray, generations: np.ndarray) -> bool:
        """Whether a run of rows this handle wrote (`slots`, as written with `generations`)
        was wiped since by a clear() (from any handle), which moves every slot's generation
        on: the first row tells (one load). A run longer than one piece overwrites its own
        first rows as it is written; that is never reported (writing it again would do the
        same)."""
        if not len(slots) or len(slots) > self._chunk_size:
            return False
        return bool(self._store.generation_at(int(slots[0])) != generations[0])

    @property
    def rows(self) -> int:
        """The most rows a bounded lane keeps (cpprb's size), or 0."""
        return self._config.rows

    def numbered_rows(self, room: int, since_clear: int) -> Tuple[Dict[str, np.ndarray],
                                                                   np.ndarray]:
        """A bounded lane's live rows (at most `room`) and each one's number as cpprb counts
        (rows added since the last clear, modulo the bound: its ring index), from the `since
        _clear` rows added. The lane keeps its newest rows in ring order, oldest at its head.
        (Read in three steps: exact while no add runs meanwhile.)"""
        rows, slots = self.all_rows(room, with_slots=True)
        head = int(self._store.lane_next_slots()[0])
        age = np.argsort((slots - head) % self._capacity, kind="stable")
        count = len(slots)
        numbers = np.empty(count, dtype=np.int64)
        numbers[age] = (since_clear - count + np.arange(count)) % self._config.rows
        return rows, numbers

    def next_slot(self) -> int:
        """The slot this handle's next add writes first: its lane's next slot; before its
        first add, that of the lane it would claim now (the lowest free one, or lane 0 when
        none is free: its add then takes a dead owner's lane or raises LaneError)."""
        lane = self.lane
        if lane is None:
            free = np.flatnonzero(self._store.lane_owners()[:, 0] == 0)
            lane = int(free[0]) if free.size else 0
        return int(self._store.lane_next_slots()[lane])

    # -- lanes ------------------------------------------------------------------------------

    def _claim(self) -> int:
        if self._pid != os.getpid():
            # A forked child: the lane and the cache are the parent's.
            self._pid = os.getpid()
            self._lane = None
            self._token = secrets.randbits(63) | 1
            self._cache_writes[0] = 0
        if self._lane is not None:
            return self._lane
        pid = os.getpid()
        start = _proc.process_start_time(pid) or 0
        namespace = _pid_namespace_id()
        dead = []
        for lane, (owner, owner_start, token, owner_namespace) in enumerate(
                self._store.lane_owners().tolist()):
            # An owner in another pid namespace (a container sharing /dev/shm) is invisible in
            # our /proc: it is never judged dead from here.
            if owner == 0 or owner_namespace != namespace:
                continue
            now = _proc.process_start_time(owner)
            if now is None or (owner_start and now != owner_start) or _proc.process_is_zombie(
                    owner):
                dead.append((lane, owner, owner_start, token))
        table = np.array(dead, dtype=np.uint64).reshape(-1, 4)
        self._lane = int(self._store.claim_lane(pid, start, self._token, namespace, table))
        self._cache_writes[0] = 0
        return self._lane

    def release(self) -> None:
        """Free this handle's lane (its rows stay); a no-op before the first add."""
        if self._lane is not None and self._pid == os.getpid():
            self._store.release_lane(self._lane, self._token)
        self._lane = None

    # -- add --------------------------------------------------------------------------------

    def _stage(self, name: str, value: Any, shape: Tuple[int, ...], dtype: np.dtype):
        value_type = type(value)
        # The common cases first: one row as an array of its exact dtype and shape (a frame
        # stack), and a Python number for a one-number column.
        if value_type is np.ndarray:
            if value.dtype is dtype and value.shape == shape and value.flags.c_contiguous:
                return value.reshape((1,) + shape)
            array = _rules.column_array(value, dtype, name)
        elif shape == (1,) and (value_type is float or value_type is int) and (
                dtype.kind == "f" or (value_type is int and dtype == np.int64)):
            # (An int into a narrower int column takes the general path: numpy's same_kind
            # cast, as every other add does; so does one too large for int64.)
            try:
                return np.array(((value,),), dtype=dtype)
            except OverflowError:
                array = _rules.column_array(value, dtype, name)
        else:
            array = _rules.column_array(value, dtype, name)
        rows = _rules.rows_of(array.shape, shape)
        if rows < 0:
            raise _rules.shape_error(name, shape, array.shape)
        return np.ascontiguousarray(array.reshape((rows,) + shape), dtype=dtype)

    def _chunk(self) -> int:
        """Transitions one kernel call takes: as many as the smallest lane holds in the worst
        case (each needs up to 2 * stack slots). A larger add goes in several calls; like a
        ring's, its later rows overwrite its earlier ones."""
        stack_max = max([f.stack for f in self._config.frames] + [1])
        worst = 2 * stack_max if self._config.frames else 1
        chunk = max(1, (self._capacity // self._config.count) // worst)
        # A bounded lane keeps its newest `rows`: a piece of more would evict its own rows.
        return min(chunk, self._config.rows) if self._config.rows else chunk

    def add(self, columns: Dict[str, Any], priorities: Any, timeout: Optional[float], *,
            incomplete: bool = False, out: Optional[Tuple[np.ndarray, np.ndarray]] = None,
            count: int = -1, admit: int = 0) -> int:
        """Add rows (returns the first row's slot). `incomplete`: N-step rows that wait for
        complete() (`columns` then are the staging's arrays, `count` rows of every public
        column but those N-step derives, of exact dtypes; `admit`: the rows the N-step add will
        complete, which a rate limiter must be ready to take before anything is written);
        `out`: (slots, generations) to fill."""
        if incomplete:
            staged = {name: np.ascontiguousarray(columns[name]) for name in columns}
            for column in self._stored:
                if column.name not in staged and column.name not in self._framed:
                    staged[column.name] = np.zeros((count,) + column.shape, dtype=column.dtype)
            return self._write(staged, count, None, timeout, True, out, admit)
        if len(columns) != len(self._public_names) or set(columns) != self._public_names:
            raise _rules.columns_error(self._public_names, columns)
        staged = {}
        count = -1
        for name, shape, dtype in self._config.public:
            array = self._stage(name, columns[name], shape, dtype)
            if count < 0:
                count = array.shape[0]
            elif array.shape[0] != count:
                raise ValueError(f"column {name!r} has {array.shape[0]} rows, the others "
                                 f"{count}")
            staged[name] = array
        if count == 0:
            raise ValueError("add needs at least one row")
        if priorities is not None:
            priorities = _rules.real_vector(priorities, count, "priorities")
        return self._write(staged, count, priorities, timeout, False, None)

    def _write(self, staged: Dict[str, np.ndarray], count: int, priorities: Any,
               timeout: Optional[float], incomplete: bool,
               out: Optional[Tuple[np.ndarray, np.ndarray]], admit: int = 0) -> int:
        chunk = self._chunk_size
        if count > chunk and not incomplete and self._store.limiter_record() is not None:
            # Several kernel calls, each admitted by the rate limiter on its own: a TimeoutError
            # (or a wait) after the first would leave part of the add committed.
            raise ValueError(f"an add of {count} rows goes into this laned buffer in pieces of "
                             f"at most {chunk} (a lane's worth); with a rate_limiter an add "
                             f"must go in one piece: add at most {chunk} rows at a time")
        lane = self._claim()
        first = -1
        for start in range(0, count, chunk):
            stop = min(start + chunk, count)
            part = staged if stop - start == count else {
                name: array[start:stop] for name, array in staged.items()}
            values = [None if framed else part[name] for name, framed in self._store_order]
            stacks = [(part[f.name], None if f.next is None else part[f.next], cache)
                      for f, cache in zip(self._config.frames, self._caches)]
            slot = self._store.add_lanes(
                lane, self._token, stop - start, values, stacks,
                None if priorities is None else priorities[start:stop], self._cache_writes,
                timeout, incomplete, None if out is None else out[0][start:stop],
                None if out is None else out[1][start:stop],
                # Incomplete steps: the first piece waits for the whole add's rows, if any.
                (admit if start == 0 else 0) if incomplete else stop - start)
            if first < 0:
                first = slot
        return first

    def complete(self, rows: Mapping[str, np.ndarray], priorities: Optional[np.ndarray],
                 slots: np.ndarray, generations: np.ndarray, last_slots: np.ndarray,
                 last_generations: np.ndarray, timeout: Optional[float] = None) -> int:
        """Complete N-step rows: `rows` has their n-step columns (others are kept as added).
        A rate limiter admits them as one add, waiting up to `timeout`."""
        values = [None if c.name in self._framed or c.name not in rows
                  else np.ascontiguousarray(rows[c.name], dtype=c.dtype) for c in self._stored]
        return int(self._store.complete_lanes(
            np.ascontiguousarray(slots, dtype=np.int64),
            np.ascontiguousarray(generations, dtype=np.uint64),
            np.ascontiguousarray(last_slots, dtype=np.int64),
            np.ascontiguousarray(last_generations, dtype=np.uint64), values,
            None if priorities is None else np.ascontiguousarray(priorities, dtype=np.float64),
            timeout))

    # -- sample -----------------------------------------------------------------------------

    def _outputs(self, batch: int, out: Optional[Mapping[str, np.ndarray]]):
        result: Dict[str, np.ndarray] = {}
        wanted = [(name, (batch,) + shape, dtype) for name, shape, dtype in self._config.public]
        wanted += [("indexes", (batch,), np.dtype(np.int64)),
                   ("weights", (batch,), np.dtype(np.float32)),
                   ("generations", (batch,), np.dtype(np.uint64))]
        if out is not None and not isinstance(out, Mapping):
            raise TypeError(f"out must be a dict of arrays; got {type(out).__name__}")
        if out is None:   # and the store's scratch double per row
            row_bytes = sum(float(np.prod(shape[1:])) * np.dtype(dtype).itemsize
                            for _, shape, dtype in wanted) + 8.0
            _rules.check_memory(row_bytes * batch, "batch_size", batch, "sample output")
        for name, shape, dtype in wanted:
            if out is None:
                result[name] = np.empty(shape, dtype=dtype)
                continue
            array = out.get(name)
            if (type(array) is not np.ndarray or array.shape != shape or array.dtype != dtype
                    or not array.flags.c_contiguous or not array.flags.writeable):
                raise ValueError(f"out[{name!r}] must be a writable C-contiguous {dtype} array "
                                 f"of shape {shape}")
            result[name] = array
        outputs = [None if c.name in self._framed else result[c.name] for c in self._stored]
        stacks = [(result[f.name], None if f.next is None else result[f.next])
                  for f in self._config.frames]
        return result, outputs, stacks

    def sample(self, batch: int, beta: float, out: Optional[Mapping[str, np.ndarray]],
               timeout: Optional[float]) -> Dict[str, np.ndarray]:
        result, outputs, stacks = self._outputs(batch, out)
        self._store.sample_lanes(batch, beta, outputs, stacks, result["indexes"],
                                 result["weights"], result["generations"], timeout)
        return result

    def all_rows(self, room: int, with_slots: bool = False) -> Any:
        """Every live row (at most `room`), in slot order; with `with_slots`, (rows, their
        slots)."""
        result, outputs, stacks = self._outputs(max(room, 1), None)
        found = 0
        if room > 0:
            found = self._store.sample_lanes(room, 0.0, outputs, stacks, result["indexes"],
                                             result["weights"], result["generations"],
                                             every_row=True)
        rows = {name: result[name][:found] for name, _, _ in self._config.public}
        return (rows, result["indexes"][:found]) if with_slots else rows
