"""Code that runs in other processes for the multi-process tests: multiprocessing targets (spawn,
forkserver and fork children import this module by name), Ray task bodies and a Ray actor.

The test modules put this directory on ``sys.path`` before importing ``_workers``; spawn and
forkserver children get the parent's ``sys.path`` and import it from there, Ray workers get it by
value (``ray.cloudpickle.register_pickle_by_value``).

Every row written here derives all of its columns from one serial number (see :func:`rows_of`), so
a row that mixes two writes ("torn") is recognised from its contents alone (:func:`torn`).
"""

from __future__ import annotations

import gc
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from typing import Any, Dict

import numpy as np

import cpprb_ray
from cpprb_ray._store import tree_problems  # noqa: F401 - the tests' check of the tree

WIDTH = 4
ENV = {
    "obs": {"shape": WIDTH, "dtype": np.float64},
    "act": {"dtype": np.int64},
    "rew": {"dtype": np.float32},
    "next_obs": {"shape": WIDTH, "dtype": np.float64},
    "done": {"dtype": np.float32},
}
_OFFSETS = np.arange(WIDTH, dtype=np.float64)


# -- rows derived from serial numbers --------------------------------------------------------------

def rows_of(serials: Any) -> Dict[str, np.ndarray]:
    """One row per serial s: obs = s + [0..3], act = s, rew = s / 2, next_obs = s + 1 + [0..3],
    done = s % 2 (cast to the column dtypes exactly as the buffer casts them)."""
    s = np.asarray(serials, dtype=np.int64).reshape(-1)
    f = s.astype(np.float64)[:, None]
    return {"obs": f + _OFFSETS, "act": s, "rew": (s * 0.5).astype(np.float32),
            "next_obs": f + 1.0 + _OFFSETS, "done": (s % 2).astype(np.float32)}


def rows(first: int, count: int) -> Dict[str, np.ndarray]:
    """Rows of serials first, first + 1, ..., first + count - 1."""
    return rows_of(np.arange(first, first + count, dtype=np.int64))


def serials_of(batch: Dict[str, np.ndarray]) -> np.ndarray:
    return np.asarray(batch["act"]).reshape(-1)


def torn(batch: Dict[str, np.ndarray]) -> np.ndarray:
    """Serials (act) of the rows of `batch` whose columns do not all derive from that serial.

    A never-written (all-zero) row is torn too: its obs would have to be [0, 1, 2, 3].
    """
    s = serials_of(batch)
    expected = rows_of(s)
    bad = np.zeros(len(s), dtype=bool)
    for key, value in expected.items():
        got = np.asarray(batch[key]).reshape(len(s), -1)
        bad |= (got != value.reshape(len(s), -1)).any(axis=1)
    return s[bad]


def check_sample(rb, batch: Dict[str, np.ndarray]) -> list:
    """Problems of one sample: torn rows, indexes out of range, odd generations, bad weights."""
    problems = []
    bad = torn(batch)
    if len(bad):
        problems.append(f"torn rows sampled: serials {bad[:8].tolist()}")
    indexes = batch["indexes"]
    stored = rb.get_stored_size()  # read after sampling: the tests never shrink a buffer
    if (indexes < 0).any() or (indexes >= stored).any():
        problems.append(f"index outside the {stored} stored rows: {indexes.tolist()[:8]}")
    if (batch["generations"] % 2).any():
        problems.append("sampled a slot with an odd generation")
    weights = batch.get("weights")
    if weights is not None and not (np.isfinite(weights).all() and (weights > 0).all()
                                    and (weights <= 1).all()):
        problems.append(f"weights outside (0, 1]: {weights[:8].tolist()}")
    return problems


class Children:
    """The processes a test started: ``with Children() as children``; on exit each one still
    alive is SIGKILLed by its pid, and every one is joined."""

    def __init__(self, context: Any = None) -> None:
        self.context = context  # where launch() makes its processes and pipes
        self.processes: list = []

    def start(self, process):
        """Start a multiprocessing Process (as a daemon) and keep it."""
        process.daemon = True
        process.start()
        self.processes.append(process)
        return process

    def launch(self, target, *args):
        """Start target(sender, *args) in a process of the context; (process, receiving end)."""
        receiver, sender = self.context.Pipe(duplex=False)
        process = self.start(self.context.Process(target=target, args=(sender,) + args))
        sender.close()
        return process, receiver

    def join(self, process, timeout: float = 60.0) -> None:
        process.join(timeout)
        assert not process.is_alive(), f"child {process.pid} did not finish within {timeout} s"

    def __enter__(self):
        return self

    def __exit__(self, *exc_info) -> None:
        for process in self.processes:
            if process.is_alive():
                os.kill(process.pid, signal.SIGKILL)
            process.join(10)


def open_buffer(handle: Any, how: str):
    """Turn what a child received into a buffer handle: the handle itself ("arg": unpickled by
    multiprocessing, or inherited by fork), pickled bytes ("pickled") or the name ("name":
    cpprb_ray.attach, "class": PrioritizedReplayBuffer.attach)."""
    if how == "arg":
        return handle
    if how == "pickled":
        return pickle.loads(handle)
    if how == "name":
        return cpprb_ray.attach(handle)
    if how == "class":
        return cpprb_ray.PrioritizedReplayBuffer.attach(handle)
    raise ValueError(how)


# -- multiprocessing children of test_processes ---------------------------------------------------

def process_child(conn, handle: Any, how: str, first: int, count: int, end: str) -> None:
    """Open the buffer, wait for the parent's second block, check what we see, add our rows.

    Protocol on `conn`: we send ("attached", info); the parent adds rows and sends
    (parent_serials_first, parent_serials_end); we check, add `count` rows from serial `first`
    and send ("done", result) or ("error", traceback). `end` is how we finish: "return",
    "exit" (sys.exit(0)), "close" (rb.close(), then return) or "drop" (del + gc, then return).
    """
    try:
        rb = open_buffer(handle, how)
        conn.send(("attached", {"pid": os.getpid(), "is_owner": rb.is_owner,
                                "type": type(rb).__name__, "stored": rb.get_stored_size()}))
        if not conn.poll(120):
            raise TimeoutError("the parent never sent its rows")
        parent_first, parent_end = conn.recv()
        result: Dict[str, Any] = {"pid": os.getpid(), "is_owner": rb.is_owner}
        seen = set(serials_of(rb.get_all_transitions()).tolist())
        result["missing_parent_rows"] = sorted(set(range(parent_first, parent_end)) - seen)[:8]
        batch = rb.sample(64)
        result["problems"] = check_sample(rb, batch)
        # Rows are only ever added here (no overwrite), so whatever we sampled is in a later
        # snapshot (other children add concurrently).
        later = set(serials_of(rb.get_all_transitions()).tolist())
        result["sampled_known"] = set(serials_of(batch).tolist()) <= later
        rb.add(**rows(first, count))
        if hasattr(rb, "update_priorities"):
            result["applied"] = rb.update_priorities(
                batch["indexes"], np.full(len(batch["indexes"]), 2.0), batch["generations"])
        result["stored"] = rb.get_stored_size()
        if end == "close":
            rb.close()
            rb.close()
            result["closed"] = rb.closed
        elif end == "drop":
            del rb, batch
            gc.collect()
        conn.send(("done", result))
    except BaseException:
        conn.send(("error", traceback.format_exc()))
        raise
    finally:
        conn.close()
    if end == "exit":
        sys.exit(0)


def sample_indexes(conn, rb, size: int) -> None:
    """Send the indexes of one sample of `size` rows."""
    conn.send(rb.sample(size)["indexes"].tolist())
    conn.close()


def outlive_the_owner(conn, rb) -> None:
    """Hold a view; once told the owner closed (and unlinked), keep adding and sampling."""
    try:
        conn.send(("attached", rb.get_stored_size()))
        if not conn.poll(120):
            raise TimeoutError("never told the owner closed")
        conn.recv()
        rb.add(**rows(5000, 20))
        problems = check_sample(rb, rb.sample(64))
        conn.send(("done", {"stored": rb.get_stored_size(), "problems": problems,
                            "owner": rb.is_owner}))
    except BaseException:
        conn.send(("error", traceback.format_exc()))
        raise
    finally:
        conn.close()


# -- stress (test_crash) --------------------------------------------------------------------------

def _wait_start(start, seconds: float) -> float:
    if not start.wait(120):
        raise TimeoutError("never told to start")
    return time.monotonic() + seconds


def stress_writer(conn, rb, writer: int, seconds: float, start, seed: int) -> None:
    """Add batches of 1..256 rows (sometimes one row without a batch axis, sometimes with
    explicit priorities) with serials writer << 36, +1, ... for `seconds`; report counts."""
    try:
        rng = np.random.default_rng(seed)
        base = (writer + 1) << 36
        added = calls = 0
        prioritized = hasattr(rb, "update_priorities")
        deadline = _wait_start(start, seconds)
        while time.monotonic() < deadline:
            count = int(rng.integers(1, 257))
            batch = rows(base + added, count)
            mode = int(rng.integers(0, 4))
            if mode == 0:
                count = 1
                rb.add(**{key: value[0] for key, value in rows(base + added, 1).items()})
            elif mode == 1 and prioritized:
                priorities = rng.random(count) * 4.0
                priorities[rng.random(count) < 0.05] = 0.0
                rb.add(priorities=priorities, **batch)
            else:
                rb.add(**batch)
            added += count
            calls += 1
        conn.send(("done", {"rows": added, "calls": calls, "base": base}))
    except BaseException:
        conn.send(("error", traceback.format_exc()))
        raise
    finally:
        conn.close()


def stress_sampler(conn, rb, seconds: float, start, seed: int) -> None:
    """Sample batches of 1..256 with random beta, check every row, update priorities with the
    sampled generations (sometimes without), for `seconds`; report counts and problems."""
    try:
        rng = np.random.default_rng(seed)
        samples = rows_seen = applied = updates = empty = 0
        problems: list = []
        deadline = _wait_start(start, seconds)
        while time.monotonic() < deadline:
            if rb.get_stored_size() == 0:
                empty += 1
                time.sleep(0.001)
                continue
            size = int(rng.integers(1, 257))
            batch = rb.sample(size, beta=float(rng.random()))
            samples += 1
            rows_seen += size
            found = check_sample(rb, batch)
            if found and len(problems) < 10:
                problems.extend(found)
            priorities = rng.random(size) * 4.0
            generations = batch["generations"] if rng.random() < 0.9 else None
            applied += rb.update_priorities(batch["indexes"], priorities, generations)
            updates += 1
        conn.send(("done", {"samples": samples, "rows": rows_seen, "applied": applied,
                            "updates": updates, "problems": problems, "empty": empty}))
    except BaseException:
        conn.send(("error", traceback.format_exc()))
        raise
    finally:
        conn.close()


# -- kill -9 (test_crash) --------------------------------------------------------------------------

def kill_writer(rb, first: int, batch: int, progress, ready) -> None:
    """Add `batch` rows at a time, serials `first`, `first` + 1, ..., until killed. After each
    add returns, `progress` (a shared int64) holds the serial after the last committed row.

    The rows are computed in place in reused arrays (the same values as :func:`rows`), so that
    nearly all of the time goes to add itself, and most kills land while it holds the lock."""
    steps = np.arange(batch, dtype=np.int64)
    base = steps.astype(np.float64)[:, None] + _OFFSETS
    columns = rows(0, batch)
    serial = first
    ready.set()
    while True:
        np.add(steps, serial, out=columns["act"])
        np.add(base, float(serial), out=columns["obs"])
        np.add(base, float(serial + 1), out=columns["next_obs"])
        np.multiply(columns["act"], 0.5, out=columns["rew"], casting="unsafe")
        np.remainder(columns["act"], 2, out=columns["done"], casting="unsafe")
        rb.add(**columns)
        serial += batch
        progress.value = serial


def kill_sampler(conn, rb, stop, control, beta: float) -> None:
    """Sample 256 rows at a time until `stop` is set; check every row; with a prioritized buffer
    update the sampled rows' priorities with their generations. Reports counts and problems.

    Pause handshake (so the parent can inspect a quiet buffer): while control[0] is odd, we
    write it to control[1] and stay out of the buffer until control[0] changes."""
    try:
        rng = np.random.default_rng()
        samples = applied = 0
        problems: list = []
        prioritized = hasattr(rb, "update_priorities")
        while not stop.is_set():
            request = control[0]
            if request % 2:
                control[1] = request
                while control[0] == request and not stop.is_set():
                    time.sleep(0.0005)
                continue
            batch = rb.sample(256, beta) if prioritized else rb.sample(256)
            samples += 1
            found = check_sample(rb, batch)
            if found and len(problems) < 10:
                problems.extend(found)
            if prioritized:
                applied += rb.update_priorities(batch["indexes"], rng.random(256) + 0.1,
                                                batch["generations"])
        conn.send(("done", {"samples": samples, "applied": applied, "problems": problems,
                            "repairs": int(rb._store.repairs)}))
    except BaseException:
        conn.send(("error", traceback.format_exc()))
        raise
    finally:
        conn.close()


def kill_updater(rb, ready) -> None:
    """Sample 4096 rows and update their priorities (with generations), until killed."""
    rng = np.random.default_rng()
    ready.set()
    while True:
        batch = rb.sample(4096)
        rb.update_priorities(batch["indexes"], rng.random(4096) * 3.0, batch["generations"])


def die_holding_the_lock(name: str, fields: Dict[str, int]) -> None:
    """Attach, take the segment's lock, write header `fields` as a holder does in the middle of
    an operation, and exit without unlocking: the state a SIGKILL at that point leaves.

    The header is the 8-byte magic, then 8-byte fields in ``_segment.HEADER_FIELDS`` order."""
    from cpprb_ray import _segment, _sync
    rb = cpprb_ray.attach(name)
    memory = rb._segment.memory
    start = _segment.MUTEX_OFFSET
    mutex = _sync.SharedMutex(memoryview(memory)[start:start + _sync.MUTEX_NBYTES])
    mutex.acquire()
    header = np.frombuffer(memory, dtype=np.uint64, count=_segment.HEADER_NBYTES // 8)
    for field, value in fields.items():
        header[1 + _segment.HEADER_FIELDS.index(field)] = value
    os._exit(0)


# -- threads in one process (test_processes) ------------------------------------------------------

def thread_writer(rb, first: int, count: int, batch: int) -> None:
    for start in range(first, first + count, batch):
        rb.add(**rows(start, min(batch, first + count - start)))


def thread_sampler(rb, stop: threading.Event, problems: list) -> int:
    samples = 0
    while not stop.is_set():
        if rb.get_stored_size() == 0:
            time.sleep(0.001)
            continue
        batch = rb.sample(64)
        problems.extend(check_sample(rb, batch))
        rb.update_priorities(batch["indexes"], np.full(64, 1.5), batch["generations"])
        samples += 1
    return samples


# -- Ray (test_ray) --------------------------------------------------------------------------------

def ray_fill(rb, first: int, count: int) -> Dict[str, Any]:
    """Ray task body: add rows in batches of 16, sample, check, update priorities in place."""
    for start in range(first, first + count, 16):
        rb.add(**rows(start, min(16, first + count - start)))
    batch = rb.sample(32)
    applied = rb.update_priorities(batch["indexes"], np.full(32, 3.0), batch["generations"])
    return {"pid": os.getpid(), "is_owner": rb.is_owner, "problems": check_sample(rb, batch),
            "applied": applied, "type": type(rb).__name__}


class BufferActor:
    """Ray actor holding a view of a buffer for its whole life."""

    def __init__(self, rb) -> None:
        self.rb = rb

    def info(self) -> Dict[str, Any]:
        return {"pid": os.getpid(), "is_owner": self.rb.is_owner, "name": self.rb.name}

    def add(self, first: int, count: int) -> int:
        self.rb.add(**rows(first, count))
        return self.rb.get_stored_size()

    def sample(self, size: int) -> list:
        batch = self.rb.sample(size)
        return check_sample(self.rb, batch)

    def add_forever(self, first: int, batch: int) -> None:
        """Add `batch` rows at a time until the actor is killed."""
        serial = first
        while True:
            self.rb.add(**rows(serial, batch))
            serial += batch
