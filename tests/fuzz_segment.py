"""Fuzz the store with hostile and corrupt segments: no crash, no hang, only clean exceptions.

Each case makes a small real buffer (uniform or prioritized, sometimes with N-step, shm or
mmap), adds rows, then corrupts its segment the way a stray write or a hostile process could:
header fields (every one; boundary values, 2**63, 2**64-1, NaN/inf bit patterns), the lock word
(a thread that does not exist, FUTEX_WAITERS, OWNER_DIED, a live unrelated thread, our own),
the rest of the mutex, the layout JSON (byte flips, truncation, valid JSON with bad values, deep
nesting), tree nodes (leaves, inner nodes, min nodes, padding: NaN, inf, negative, huge) and row
generations. Then a fresh view attaches and both it and the owner (attached before the damage)
run add, sample, update, get_all_transitions, clear and close.

Cases run in child processes, many per child. Before each operation the child writes the case
and the operation to a progress file, so the runner knows where a crash (the child dies of a
signal) or a hang (no progress for lock_timeout + margin) happened; it then restarts a child at
the next case. A Python exception of an expected kind (ValueError, TimeoutError, OSError,
IndexError, MemoryError) is a pass; any other exception, a crash or a hang is a failure, and
so is a sample that returns weights outside (0, 1] (NaN, inf, 0) instead of the corrupt-segment
error.

Cases are deterministic: case N of seed S is always the same mutation of the same buffer (byte
positions in the layout JSON are fractions of its length, which varies by a few bytes with the
pid and the time).

    python tests/fuzz_segment.py --seconds 30              # what CI runs (tests/test_fuzz.py)
    python tests/fuzz_segment.py --seconds 3600 --seed 7   # by hand
    python tests/fuzz_segment.py --seed 0 --case 1234      # replay one case here, verbosely
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import math
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

import cpprb_ray
from cpprb_ray import _memory, _segment, _top

LOCK_TIMEOUT_S = 0.3
ATTACH_CHECK_S = 0.5       # how long attach watches a lock word naming a thread that is gone
EXPECTED = (ValueError, TimeoutError, OSError, IndexError, MemoryError, cpprb_ray.LaneError)


class BadWeights(Exception):
    """A sample gave weights that no tree a writer left gives (NaN, inf, <= 0 or > 1): a
    corrupt node must be the corrupt-segment error instead. Not in EXPECTED: a finding."""


class TopMissed(Exception):
    """`top` left a buffer out, or listed another: a finding."""


FUTEX_WAITERS = 0x80000000
FUTEX_OWNER_DIED = 0x40000000
OP_CODES = {"none": 0, "add": 1, "update": 2, "clear": 3}
DOUBLE_FIELDS = ("alpha", "eps", "max_priority", "pending_old_max_priority")
CATEGORIES = ("header", "repair", "lock", "mutex", "layout", "tree", "rows", "multi")
CATEGORY_WEIGHTS = (24, 12, 10, 4, 18, 18, 4, 10)
ENV = {"obs": {"shape": 3}, "act": {"dtype": "int64"}, "rew": {}, "next_obs": {"shape": 3},
       "done": {"dtype": "uint8"}}
NSTEP = {"size": 3, "gamma": 0.9, "rew": "rew", "next": "next_obs"}
DEAD_TID = 4194303         # above the default pid_max of most hosts: no such thread


# -- what to corrupt ------------------------------------------------------------------------------

def u64_values(capacity: int) -> List[int]:
    return [0, 1, 2, capacity - 1, capacity, capacity + 1, 2 * capacity, 2**31, 2**32,
            2**40, 2**62, 2**63 - 1, 2**63, 2**64 - 1]


def double_bits(value: float) -> int:
    return struct.unpack("<Q", struct.pack("<d", value))[0]


DOUBLES = [math.nan, -math.nan, math.inf, -math.inf, -1.0, -0.0, 0.0, 5e-324, 1e-300, 1.0,
           2.0**53, 1e300, 1.7976931348623157e308, -1e300]


def random_double(rng: random.Random) -> float:
    if rng.random() < 0.7:
        return rng.choice(DOUBLES)
    return struct.unpack("<d", struct.pack("<Q", rng.getrandbits(64)))[0]


def tree_levels(capacity: int) -> Tuple[List[Tuple[int, int, int]], int]:
    """[(offset, live count, padded count)] per sum level (doubles), and the sum levels' size:
    the layout of _segtree.tree_doubles."""
    levels, count, total = [], capacity, 0
    while True:
        padded = (count + 7) // 8 * 8
        levels.append((total, count, padded))
        total += padded
        if count == 1:
            return levels, total
        count = (count + 7) // 8


GUARD_BYTES = 1 << 20      # deeper than any walk of the capacities below can stray
PAGE = 4096


class GuardedMapping(np.ndarray):
    """A segment mapped between two inaccessible 1 MiB guards: what _memory maps in the fuzz
    children (Guards), so that a read or write outside a segment faults at once instead of
    landing, unseen, in a neighbouring mapping (mappings are usually adjacent). The same file,
    MAP_SHARED; used like the _mapping.Mapping it stands for (buffer, slices, close, closed)."""

    # The fuzz is about wild accesses, not speed: its segments keep their 4 KiB pages.
    huge_bytes = 0

    def collapse(self, offset: int, length: int) -> int:
        return 0

    def close(self) -> None:
        if not self.closed:
            Guards.libc().munmap(self.reserve, self.span)
            self.reserve = 0

    @property
    def closed(self) -> bool:
        return not getattr(self, "reserve", 0)


class Guards:
    """Puts every mapping _memory makes in this process between guard pages."""

    _libc: Any = None

    @classmethod
    def libc(cls) -> Any:
        if cls._libc is None:
            import ctypes
            libc = ctypes.CDLL(None, use_errno=True)
            libc.mmap.restype = ctypes.c_void_p
            libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                                  ctypes.c_int, ctypes.c_long]
            libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
            cls._libc = libc
        return cls._libc

    def __init__(self) -> None:
        self.guarded = self.unguarded = 0
        self.original = _memory._map
        _memory._map = self.map

    def map(self, fd: int, size: int) -> Any:
        import ctypes
        libc = self.libc()
        span = (size + PAGE - 1) // PAGE * PAGE + 2 * GUARD_BYTES
        # PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE: the whole span, guards included
        reserve = libc.mmap(None, span, 0, 0x02 | 0x20 | 0x4000, -1, 0)
        if reserve is None or reserve == 2**64 - 1:
            self.unguarded += 1
            return self.original(fd, size)
        # PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED: the file between the guards
        address = libc.mmap(reserve + GUARD_BYTES, size, 0x1 | 0x2, 0x01 | 0x10, fd, 0)
        if address != reserve + GUARD_BYTES:
            libc.munmap(reserve, span)
            raise OSError(ctypes.get_errno(), "mmap between guard pages failed")
        memory = np.ctypeslib.as_array((ctypes.c_uint8 * size).from_address(address))
        memory = memory.view(GuardedMapping)
        memory.reserve, memory.span = reserve, span
        self.guarded += 1
        return memory


class Segment:
    """Where things are in a freshly made segment (read before it is corrupted)."""

    def __init__(self, memory: Any) -> None:
        self.memory = memory
        self.header = _segment.read_header(memory)
        self.capacity = int(self.header["capacity"])
        self.fields = ("magic",) + _segment.HEADER_FIELDS
        self.lanes: Dict[str, Any] = {}     # a laned segment's lane table (run_case)

    def field_offset(self, name: str) -> int:
        return 8 * self.fields.index(name)

    def put_u64(self, offset: int, value: int) -> None:
        struct.pack_into("<Q", self.memory, offset, value & (2**64 - 1))

    def put_u32(self, offset: int, value: int) -> None:
        struct.pack_into("<I", self.memory, offset, value & (2**32 - 1))

    def put_bytes(self, offset: int, data: bytes) -> None:
        struct.pack_into(f"{len(data)}s", self.memory, offset, data)

    def put_double(self, offset: int, value: float) -> None:
        struct.pack_into("<d", self.memory, offset, value)


Mutation = Callable[[Segment], str]    # corrupts the segment, returns what it did


def header_mutation(rng: random.Random, capacity: int) -> Mutation:
    field = rng.choice(("magic",) + _segment.HEADER_FIELDS)
    if field in DOUBLE_FIELDS and rng.random() < 0.8:
        value = random_double(rng)
        return lambda s: (s.put_double(s.field_offset(field), value), f"{field} = {value!r}")[1]
    bits = (rng.choice(u64_values(capacity)) if rng.random() < 0.8 else
            double_bits(random_double(rng)) if rng.random() < 0.5 else rng.getrandbits(64))
    return lambda s: (s.put_u64(s.field_offset(field), bits), f"{field} = {bits:#x}")[1]


def repair_mutation(rng: random.Random, capacity: int) -> Mutation:
    """A holder that "died" mid-operation with hostile pending fields: OWNER_DIED in the lock
    word makes the next locker run the repair over them."""
    fields: Dict[str, int] = {"op": rng.choice([1, 1, 2, 3, rng.getrandbits(64)])}
    for name in ("pending_start", "pending_count", "pending_old_next", "pending_old_stored",
                 "pending_old_rows_added", "stored_size", "next_index"):
        if rng.random() < 0.6:
            fields[name] = rng.choice(u64_values(capacity))
    old_max = random_double(rng)
    word = FUTEX_OWNER_DIED | (FUTEX_WAITERS if rng.random() < 0.3 else 0) | (
        DEAD_TID if rng.random() < 0.5 else 0)

    def apply(s: Segment) -> str:
        for name, value in fields.items():
            s.put_u64(s.field_offset(name), value)
        s.put_double(s.field_offset("pending_old_max_priority"), old_max)
        s.put_u32(_segment.MUTEX_OFFSET, word)
        return f"dead holder: {fields}, pending_old_max_priority={old_max!r}, lock {word:#x}"
    return apply


def lock_mutation(rng: random.Random, live_tids: List[int]) -> Mutation:
    kind = rng.choice(["random", "waiters", "owner_died", "dead", "dead_waiters", "live",
                       "live_waiters", "own", "tid_bits"])
    word = {"random": rng.getrandbits(32), "waiters": FUTEX_WAITERS,
            "owner_died": FUTEX_OWNER_DIED | rng.choice([0, DEAD_TID, rng.getrandbits(30)]),
            "dead": DEAD_TID, "dead_waiters": FUTEX_WAITERS | DEAD_TID,
            "tid_bits": rng.getrandbits(30)}.get(kind)
    pick = rng.randrange(1 << 30)

    def apply(s: Segment) -> str:
        value = word
        if value is None:   # a live thread: chosen at apply time (tids differ per child)
            tid = os.getpid() if kind == "own" else live_tids[pick % len(live_tids)]
            value = tid | (FUTEX_WAITERS if kind == "live_waiters" else 0)
        s.put_u32(_segment.MUTEX_OFFSET, value)
        return f"lock word ({kind}) = {value:#x}"
    return apply


def mutex_mutation(rng: random.Random) -> Mutation:
    """Any other 4 bytes of the mutex: count, owner, users, kind, spins, list pointers."""
    offset = rng.randrange(4, 40, 4)
    value = rng.choice([0, 1, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, rng.getrandbits(32),
                        rng.getrandbits(8)])

    def apply(s: Segment) -> str:
        s.put_u32(_segment.MUTEX_OFFSET + offset, value)
        return f"mutex bytes {offset}..{offset + 4} = {value:#x}"
    return apply


def bad_json_value(rng: random.Random) -> Any:
    return rng.choice([None, -1, 0, 2**63, 2**64 + 5, -(2**63) - 1, 1e308, math.nan, "x", "",
                       [], [0], [-1], [2**32, 2**32], [1.5], {}, {"a": 1}, True, "|O", "<f8",
                       "V8", "<U4", "S0", [[1]], 3.5, "discounts"])


def layout_mutation(rng: random.Random) -> Mutation:
    kind = rng.choice(["flip", "flip", "truncate", "length", "value", "value", "value", "nest",
                       "garbage"])
    where, byte, path_pick = rng.random(), rng.randrange(256), rng.random()
    value = bad_json_value(rng)
    length = rng.choice([0, 1, 2**32, 2**63, 2**64 - 1, rng.randrange(1, 5000)])

    def apply(s: Segment) -> str:
        start, size = int(s.header["layout_offset"]), int(s.header["layout_length"])
        data = bytes(s.memory[start:start + size])
        room = int(s.header["data_offset"]) - start
        if kind == "flip":
            position = int(where * size)
            s.put_bytes(start + position, bytes([data[position] ^ (byte or 1)]))
            return f"layout byte {position} ^= {byte or 1:#x}"
        if kind == "truncate":
            s.put_u64(s.field_offset("layout_length"), int(where * size))
            return f"layout_length {size} -> {int(where * size)}"
        if kind == "length":
            s.put_u64(s.field_offset("layout_length"), length)
            return f"layout_length = {length}"
        if kind == "garbage":
            text = bytes(rng.getrandbits(8) for _ in range(size))
        elif kind == "nest":
            depth = min(room // 2, 200 + int(where * 5000))
            text = b"[" * depth + b"]" * depth
        else:
            try:
                document = json.loads(data)
            # An earlier mutation of this case broke it already (RecursionError: nested
            # thousands deep by a "nest" mutation).
            except (ValueError, RecursionError):
                return "layout value: skipped (the JSON is already unreadable)"
            target, label = replace_somewhere(document, path_pick, value)
            text = json.dumps(target).encode()
            kind_label = f"value {label} = {value!r}"
        text = text[:room]
        s.put_bytes(start, text)
        s.put_u64(s.field_offset("layout_length"), len(text))
        return kind_label if kind == "value" else f"layout {kind} ({len(text)} bytes)"
    return apply


def replace_somewhere(document: Any, pick: float, value: Any) -> Tuple[Any, str]:
    """Replace one node of the JSON tree (chosen by `pick`) with `value`."""
    paths: List[Tuple[Any, ...]] = []

    def walk(node: Any, path: Tuple[Any, ...]) -> None:
        paths.append(path)
        if isinstance(node, dict):
            for key in node:
                walk(node[key], path + (key,))
        elif isinstance(node, list):
            for index, item in enumerate(node):
                walk(item, path + (index,))
    walk(document, ())
    path = paths[int(pick * len(paths))]
    if not path:
        return value, "<root>"
    node = document
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return document, "/".join(str(key) for key in path)


def tree_mutation(rng: random.Random, count: int) -> Mutation:
    picks = [(rng.choice(["leaf", "leaf_padding", "inner", "inner_padding", "min", "min_padding",
                          "root", "steer"]), rng.random(), random_double(rng))
             for _ in range(count)]

    def apply(s: Segment) -> str:
        levels, sum_doubles = tree_levels(s.capacity)
        base = int(s.header["tree_offset"])
        done = []
        if any(where == "steer" for where, _, _ in picks):
            # Weight in a padding node that the root counts: a search is steered into it.
            level = max(len(levels) - 2, 0)
            offset, live, padded = levels[level]
            node = padded - 1 if padded > live else live - 1
            s.put_double(base + 8 * (offset + node), 1e12)
            s.put_double(base + 8 * levels[-1][0], 2e12)
            done.append(f"steer: level {level} node {node} = 1e12, root = 2e12")
            picks[:] = [pick for pick in picks if pick[0] != "steer"]
        for where, fraction, value in picks:
            level = 0 if where.startswith("leaf") else (
                len(levels) - 1 if where == "root" else
                1 + int(fraction * max(len(levels) - 1, 1)) % max(len(levels) - 1, 1))
            if level >= len(levels):
                level = len(levels) - 1
            offset, live, padded = levels[level]
            if where.endswith("padding") and padded > live:
                node = live + int(fraction * (padded - live))
            else:
                node = int(fraction * live)
            index = offset + node
            if where.startswith("min") and level >= 1:
                index = sum_doubles + offset - levels[1][0] + node
            s.put_double(base + 8 * index, value)
            done.append(f"{where} level {level} node {node} = {value!r}")
        return "tree: " + "; ".join(done)
    return apply


def rows_mutation(rng: random.Random) -> Mutation:
    fraction = rng.random()
    value = rng.choice([1, 3, 2**63 + 1, 2**64 - 1, 2**64 - 2, rng.getrandbits(64)])

    def apply(s: Segment) -> str:
        slot = int(fraction * s.capacity)
        offset = int(s.header["data_offset"]) + slot * int(s.header["row_stride"])
        s.put_u64(offset, value)
        return f"generation of slot {slot} = {value:#x}"
    return apply


INT32_VALUES = [-2**31, -1000, -3, -2, -1, 0, 1, 2, 3, 4, 5, 7, 1000, 2**31 - 1]


def lane_mutation(rng: random.Random, capacity: int) -> Mutation:
    """A laned segment's own state: a lane record's field, a record's link or its ahead (the
    int32 that says where an N-step row's next stack ends), or the add in flight's lane."""
    what = rng.choice(["lane", "lane", "link", "ahead", "pending"])
    lane = rng.randint(0, 2)
    field = rng.randint(0, 7)
    value = rng.choice(u64_values(capacity)) if rng.random() < 0.8 else rng.getrandbits(64)
    small = rng.choice(INT32_VALUES)
    fraction = rng.random()

    def apply(s: Segment) -> str:
        slot = int(fraction * s.capacity)
        record = int(s.header["data_offset"]) + slot * int(s.header["row_stride"])
        if what == "lane":
            lanes = int(s.lanes["count"])
            s.put_u64(int(s.lanes["offset"]) + (lane % lanes) * 64 + 8 * field, value)
            return f"lane {lane % lanes} field {field} = {value:#x}"
        if what in ("link", "ahead"):
            struct.pack_into("<i", s.memory, record + (8 if what == "link" else 12), small)
            return f"{what} of slot {slot} = {small}"
        s.put_u64(s.field_offset("pending_lane"), value)
        s.put_u64(s.field_offset("op"), 1)
        s.put_u32(_segment.MUTEX_OFFSET, FUTEX_OWNER_DIED | DEAD_TID)
        return f"dead holder mid-add in lane {value:#x}"
    return apply


def make_mutations(rng: random.Random, category: str, capacity: int,
                   live_tids: List[int]) -> List[Mutation]:
    if category == "header":
        return [header_mutation(rng, capacity)]
    if category == "repair":
        return [repair_mutation(rng, capacity)]
    if category == "lock":
        return [lock_mutation(rng, live_tids)]
    if category == "mutex":
        return [mutex_mutation(rng)]
    if category == "layout":
        return [layout_mutation(rng)]
    if category == "tree":
        return [tree_mutation(rng, rng.choice([1, 1, 2, 3, 8]))]
    if category == "rows":
        return [rows_mutation(rng) for _ in range(rng.randint(1, 4))]
    chosen: List[Mutation] = []
    for _ in range(rng.randint(2, 4)):
        sub = rng.choice(["header", "header", "header", "repair", "layout", "tree", "rows"])
        chosen += make_mutations(rng, sub, capacity, live_tids)
    return chosen


# -- one case -------------------------------------------------------------------------------------

class Case:
    """Case `case_id` of `seed`: the buffer to make, the rows to add, what to corrupt."""

    def __init__(self, seed: int, case_id: int, live_tids: List[int]) -> None:
        rng = random.Random(f"{seed}:{case_id}")
        self.case_id = case_id
        self.category = rng.choices(CATEGORIES, CATEGORY_WEIGHTS)[0]
        self.prioritized = rng.random() < 0.75
        self.nstep = rng.random() < 0.15
        self.capacity = rng.choice([1, 2, 7, 8, 9, 16, 33, 64, 65, 100, 513, 4097])
        self.backend = rng.choice(["shm", "mmap"]) if _memory.shm_available() else "mmap"
        self.fill = rng.choice([0, 1, self.capacity // 2, self.capacity, self.capacity + 3])
        self.priorities = self.prioritized and rng.random() < 0.5
        self.alpha = rng.choice([0.6, 0.0, 1.0, 3.0])
        self.eps = rng.choice([1e-4, 0.0, 1.0])
        self.beta = rng.choice([0.4, 0.0, 1.0])
        self.mutations = make_mutations(rng, self.category, self.capacity, live_tids)
        self.values_seed = rng.getrandbits(32)
        # Laned buffers (lanes, next_of, stack_compress): drawn after everything above, so
        # that the cases of earlier runs stay what they were. Their own state is corrupted too.
        self.lanes = 0
        self.frames = False
        if rng.random() < 0.3:
            self.lanes = rng.choice([1, 2]) if self.capacity >= 2 else 1
            # A stack of 3 needs lanes of at least 12 slots.
            self.frames = rng.random() < 0.7 and self.capacity >= 12 * self.lanes
            self.mutations += [lane_mutation(rng, self.capacity)
                               for _ in range(rng.choice([0, 1, 1, 2, 3]))]
        # Sequence buffers (drawn last, for the same reason): a laned segment whose records'
        # links say which slots start a sequence and how many of its steps are real, so the
        # link and lane mutations above reach what their draw, gather and repair trust.
        self.sequence: Optional[Dict[str, int]] = None
        if rng.random() < 0.25 and not self.nstep and not self.frames:
            length = rng.choice([1, 2, 3, 5])
            lanes = self.lanes or rng.choice([1, 2])
            if self.capacity // lanes >= length:
                self.lanes = lanes
                self.sequence = {"length": length, "period": rng.randint(1, length)}
                self.mutations += [lane_mutation(rng, self.capacity)
                                   for _ in range(rng.choice([1, 2, 3]))]


def make_rows(env_dict: Dict[str, Dict[str, Any]], count: int, rng: np.random.Generator
              ) -> Dict[str, np.ndarray]:
    rows = {}
    for name, spec in env_dict.items():
        shape = spec.get("shape", 1)
        shape = (count,) + (tuple(shape) if isinstance(shape, (tuple, list)) else (shape,))
        dtype = np.dtype(spec.get("dtype", np.float32))
        if dtype.kind in "fc":
            rows[name] = rng.standard_normal(shape).astype(dtype)
        elif dtype.kind == "b":
            rows[name] = rng.integers(0, 2, shape).astype(dtype)
        else:
            rows[name] = np.ones(shape, dtype)
    return rows


def handle_ops(handle: Any, case: Case, rng: np.random.Generator) -> List[Tuple[str, Callable]]:
    """The operations run on one handle, in order; each may raise."""
    prioritized = isinstance(handle, cpprb_ray.PrioritizedReplayBuffer)
    state: Dict[str, Any] = {}

    def env() -> Dict[str, Dict[str, Any]]:
        spec = handle.env_dict
        spec.pop("discounts", None)    # N-step's own column, never given to add
        return spec

    def add(count: int) -> Callable[[], Any]:
        def run() -> Any:
            rows = make_rows(env(), count, rng)
            if count == 1:
                rows = {name: value[0] for name, value in rows.items()}
            if prioritized and case.priorities:
                return handle.add(priorities=rng.random(count) * 3, **rows)
            return handle.add(**rows)
        return run

    def sample() -> Any:
        batch = handle.sample(5, case.beta) if prioritized else handle.sample(5)
        state["batch"] = batch
        weights = batch.get("weights")
        if weights is not None and not (np.isfinite(weights).all() and (weights > 0).all()
                                        and (weights <= 1).all()):
            raise BadWeights(f"weights {weights.tolist()} of slots {batch['indexes'].tolist()}")
        return batch

    def update() -> Any:
        batch = state.get("batch")
        if not prioritized:
            return None
        if batch is None:
            return handle.update_priorities([0], [1.0])
        generations = batch["generations"] if rng.random() < 0.5 else None
        return handle.update_priorities(batch["indexes"], rng.random(5) * 2, generations)

    def counters() -> Any:
        return (handle._store.counters(), len(handle), handle.get_next_index(), repr(handle))

    return [("counters", counters), ("sample", sample), ("update", update),
            ("transitions", handle.get_all_transitions), ("add1", add(1)),
            ("addN", add(case.capacity + 3)), ("sample", sample), ("update", update),
            ("episode_end", handle.on_episode_end), ("clear", handle.clear), ("add1", add(1)),
            ("sample", sample), ("update", update), ("transitions", handle.get_all_transitions)]


def top_lists(location: str) -> None:
    rows = _top.read_buffers(location)
    if not rows:
        with open(_memory.file_of("shm", location), "rb") as file:
            if struct.unpack("<Q", file.read(8).ljust(8, b"\0"))[0] != _segment.MAGIC:
                return          # its magic is gone: no longer a buffer of ours to list
    # A buffer it cannot open is listed by its file's path.
    if [os.path.basename(row["name"]) for row in rows] != [location]:
        raise TopMissed(f"top listed {[row['name'] for row in rows]}, not {location!r}")


class Report:
    """Writes "B case op" before and "E case op outcome seconds" after every operation, so the
    runner sees the case and operation a crash or a hang happened in."""

    def __init__(self, fd: Optional[int], verbose: bool = False) -> None:
        self.fd = fd
        self.verbose = verbose
        self.last = ""     # the outcome of the last operation

    def line(self, text: str) -> None:
        if self.fd is not None:
            os.write(self.fd, (text + "\n").encode())
        if self.verbose:
            print(text, flush=True)

    def run(self, case_id: int, op: str, call: Callable[[], Any]) -> Tuple[bool, Any]:
        self.line(f"B {case_id} {op}")
        start = time.monotonic()
        try:
            result, outcome, ok = call(), "ok", True
        except EXPECTED as error:
            result, outcome, ok = None, type(error).__name__, False
            if self.verbose:
                print(f"    {outcome}: {error}", flush=True)
        except Exception as error:   # a kind no rule gives: a finding
            text = "".join(traceback.format_exception_only(type(error), error)).strip()
            self.line(f"X {case_id} {op} {json.dumps(text[:400])}")
            result, outcome, ok = None, "unexpected:" + type(error).__name__, False
            if self.verbose:
                traceback.print_exc()
        self.line(f"E {case_id} {op} {outcome} {time.monotonic() - start:.3f}")
        self.last = outcome
        return ok, result


def run_case(seed: int, case_id: int, shm_prefix: str, directory: str, live_tids: List[int],
             report: Report, guards: Guards) -> None:
    case = Case(seed, case_id, live_tids)
    rng = np.random.default_rng(case.values_seed)
    cls = cpprb_ray.PrioritizedReplayBuffer if case.prioritized else cpprb_ray.ReplayBuffer
    options: Dict[str, Any] = {"lock_timeout": LOCK_TIMEOUT_S, "seed": case_id}
    if case.prioritized:
        options.update(alpha=case.alpha, eps=case.eps)
    if case.nstep:
        options["Nstep"] = NSTEP
    if case.lanes:
        options["lanes"] = case.lanes
        if case.frames:
            options.update(next_of="obs", stack_compress="obs")
        if case.sequence:
            options["sequence"] = case.sequence
    if case.backend == "shm":
        options.update(backend="shm", name=f"{shm_prefix}_{case_id}")
    else:
        options.update(backend="mmap", path=os.path.join(directory, f"case_{case_id}"))
    report.line(f"C {case_id} {case.category}")
    owner = cls(case.capacity, ENV, **options)
    location = owner.name
    view = None
    try:
        if case.fill:
            rows = make_rows(ENV, case.fill, rng)
            if case.priorities:
                owner.add(priorities=rng.random(case.fill) * 3, **rows)
            else:
                owner.add(**rows)
            owner.on_episode_end()
        segment = Segment(owner._segment.memory)
        segment.lanes = owner._layout.meta.get("lanes") or {"count": 1, "offset": 0}
        for mutate in case.mutations:
            report.line(f"M {case_id} {json.dumps(mutate(segment))}")
        if case.backend == "shm":
            # `top` reads every buffer it lists without writing: it must list this one, damaged
            # or not (with its problem), and raise nothing.
            report.run(case_id, "top", lambda: top_lists(location))
        ok, view = report.run(case_id, "attach", lambda: cpprb_ray.attach(
            location, lock_timeout=LOCK_TIMEOUT_S, seed=case_id))
        for handle_name, handle in (("view", view), ("owner", owner)):
            if handle is None:
                continue
            timeouts = 0
            for op, call in handle_ops(handle, case, rng):
                # A lock nobody releases makes every operation wait lock_timeout: three such
                # waits show it is bounded; the rest would only slow the fuzzer down.
                if timeouts < 3:
                    ok, result = report.run(case_id, f"{handle_name}.{op}", call)
                    timeouts += report.last == "TimeoutError"
    finally:
        if view is not None:
            report.run(case_id, "view.close", view.close)
        report.run(case_id, "owner.close", owner.close)
        # The owner frees only a segment whose layout still carries its token: one corrupted
        # there stays, and is removed here.
        _memory.unlink(case.backend, location)


def child_main(args: argparse.Namespace) -> int:
    stop = threading.Event()
    idler = threading.Thread(target=stop.wait, daemon=True)   # a live thread that holds nothing
    idler.start()
    live_tids = [os.getppid()]
    if hasattr(threading, "get_native_id"):
        live_tids.append(idler.native_id)
    fd = os.open(args.progress, os.O_WRONLY | os.O_APPEND) if args.progress else None
    report = Report(fd, verbose=args.case is not None)
    guards = Guards()
    if args.case is not None:
        run_case(args.seed, args.case, args.shm_prefix, args.mmap_dir, live_tids, report, guards)
        return 0
    end = time.monotonic() + args.seconds
    case_id = args.first
    while time.monotonic() < end:
        run_case(args.seed, case_id, args.shm_prefix, args.mmap_dir, live_tids, report, guards)
        case_id += 1
    report.line(f"D {case_id} {guards.guarded} {guards.unguarded}")
    return 0


# -- the runner -----------------------------------------------------------------------------------

class Findings:
    def __init__(self) -> None:
        self.cases = 0
        self.ops = 0
        self.outcomes: Dict[str, int] = collections.Counter()
        self.categories: Dict[str, int] = collections.Counter()
        self.failures: List[Dict[str, Any]] = []
        self.slowest = (0.0, "")
        self.children = 0
        self.guarded = self.unguarded = 0


def parse_line(line: str, state: Dict[str, Any], findings: Findings) -> None:
    kind, _, rest = line.partition(" ")
    if kind == "C":
        case_id, category = rest.split()
        state.update(case=int(case_id), op="making the case", mutations=[], category=category)
        findings.cases += 1
        findings.categories[category] += 1
    elif kind == "M":
        state["mutations"].append(json.loads(rest.split(" ", 1)[1]))
    elif kind == "B":
        state["op"] = rest.split()[1]
    elif kind == "E":
        _, op, outcome, seconds = rest.split()
        findings.ops += 1
        findings.outcomes[f"{op.split('.')[-1]}:{outcome}"] += 1
        state["op"] = f"after {op}"
        if float(seconds) > findings.slowest[0]:
            findings.slowest = (float(seconds), f"case {state['case']} {op}")
    elif kind == "D":
        _, guarded, unguarded = rest.split()
        findings.guarded += int(guarded)
        findings.unguarded += int(unguarded)
    elif kind == "X":
        _, op, text = rest.split(" ", 2)
        fail(findings, state, "unexpected exception", f"{op}: {json.loads(text)}")


def fail(findings: Findings, state: Dict[str, Any], kind: str, detail: str) -> None:
    findings.failures.append({"kind": kind, "case": state.get("case"), "op": state.get("op"),
                              "category": state.get("category"), "detail": detail,
                              "mutations": list(state.get("mutations", []))})


def remove_leftovers(shm_prefix: str, directory: str) -> None:
    for path in glob.glob(f"/dev/shm/{shm_prefix}_*") + glob.glob(f"{directory}/case_*"):
        try:
            os.unlink(path)
        except OSError:
            pass


def run(seed: int, seconds: float, margin: float, first: int = 0) -> Findings:
    findings = Findings()
    directory = tempfile.mkdtemp(prefix="fuzz_segments_")
    shm_prefix = f"cpprb_ray_fuzz_{os.getpid()}"
    progress = os.path.join(directory, "progress")
    hang_s = LOCK_TIMEOUT_S + ATTACH_CHECK_S + margin
    end = time.monotonic() + seconds
    next_case = first
    try:
        while time.monotonic() < end - 1:
            open(progress, "w").close()
            child = subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "--child", "--seed", str(seed),
                 "--first", str(next_case), "--seconds", str(end - time.monotonic()),
                 "--progress", progress, "--shm-prefix", shm_prefix, "--mmap-dir", directory],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            findings.children += 1
            state: Dict[str, Any] = {"case": next_case, "op": "start"}
            hung = False
            with open(progress) as lines:
                last_progress = time.monotonic()
                buffered = ""
                while True:
                    exited = child.poll() is not None
                    chunk = lines.read()
                    if chunk:
                        last_progress = time.monotonic()
                        buffered += chunk
                        *complete, buffered = buffered.split("\n")
                        for line in complete:
                            parse_line(line, state, findings)
                    if exited:
                        break
                    # Between two lines of a started child: hang_s (an operation, or the
                    # making and corrupting of a case); the interpreter's start-up: a minute.
                    limit = hang_s if state.get("op") != "start" else 60.0
                    if time.monotonic() - last_progress > limit:
                        hung = True
                        child.kill()
                        child.wait()
                        break
                    time.sleep(0.05)
            stderr = child.stderr.read().decode(errors="replace") if child.stderr else ""
            if child.stderr:
                child.stderr.close()
            if hung:
                fail(findings, state, "hang", f"no progress for {hang_s:.1f} s")
            elif child.returncode != 0:
                why = (f"killed by {signal.Signals(-child.returncode).name}"
                       if child.returncode < 0 else f"exit status {child.returncode}")
                fail(findings, state, "crash", why + "\n" + stderr[-2000:])
            remove_leftovers(shm_prefix, directory)
            if child.returncode == 0 and not hung:
                break
            next_case = int(state.get("case", next_case)) + 1
    finally:
        remove_leftovers(shm_prefix, directory)
        shutil.rmtree(directory, ignore_errors=True)
    return findings


def summary(findings: Findings, seed: int, seconds: float) -> Dict[str, Any]:
    return {"seed": seed, "seconds": seconds, "cases": findings.cases, "ops": findings.ops,
            "children": findings.children, "guarded_mappings": findings.guarded,
            "unguarded_mappings": findings.unguarded, "categories": dict(findings.categories),
            "outcomes": dict(sorted(findings.outcomes.items())),
            "slowest_op_s": findings.slowest[0], "slowest_op": findings.slowest[1],
            "failures": findings.failures}


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float,
                        default=float(os.environ.get("CPPRB_RAY_FUZZ_SECONDS", 60)))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--first", type=int, default=0, help="first case id")
    parser.add_argument("--case", type=int, help="replay this one case here, verbosely")
    parser.add_argument("--margin", type=float, default=5.0,
                        help="seconds past lock_timeout + attach's check that count as a hang")
    parser.add_argument("--json", help="write the summary here")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--progress", help=argparse.SUPPRESS)
    parser.add_argument("--shm-prefix", help=argparse.SUPPRESS)
    parser.add_argument("--mmap-dir", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.case is not None and not args.child:
        args.mmap_dir = tempfile.mkdtemp(prefix="fuzz_segments_")
        args.shm_prefix = f"cpprb_ray_fuzz_{os.getpid()}"
        try:
            return child_main(args)
        finally:
            remove_leftovers(args.shm_prefix, args.mmap_dir)
            shutil.rmtree(args.mmap_dir, ignore_errors=True)
    if args.child:
        return child_main(args)
    start = time.monotonic()
    findings = run(args.seed, args.seconds, args.margin, args.first)
    result = summary(findings, args.seed, round(time.monotonic() - start, 1))
    print(f"fuzz_segment: seed {args.seed}, {result['cases']} cases, {result['ops']} operations "
          f"in {result['seconds']} s ({result['children']} child processes); slowest operation "
          f"{result['slowest_op_s']:.2f} s ({result['slowest_op']}); mappings between guard "
          f"pages: {findings.guarded} of {findings.guarded + findings.unguarded}")
    print("  cases per category:", json.dumps(result["categories"], sort_keys=True))
    for failure in findings.failures:
        print(f"FAIL {failure['kind']}: case {failure['case']} ({failure['category']}) at "
              f"{failure['op']}: {failure['detail']}\n    mutations: {failure['mutations']}\n"
              f"    replay: python {os.path.relpath(__file__)} --seed {args.seed} "
              f"--case {failure['case']}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(result, out, indent=1, sort_keys=True)
    return 1 if findings.failures else 0


if __name__ == "__main__":
    sys.exit(main())
