"""The client side of a remote handle: RemoteStore, ReplayStore's methods served by the buffer's
proxy actor (:mod:`cpprb_ray.remote._proxy`), with the adds batched here. See
:mod:`cpprb_ray.remote`.

Examples
--------
>>> from cpprb_ray.remote import _client
>>> _client.proxy_name("shm", "cpprb_ray_0123", "ab12")
'cpprb_ray:shm:cpprb_ray_0123:ab12'
"""

from __future__ import annotations

import atexit
import secrets
import sys
import threading
import time
import warnings
import weakref
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from cpprb_ray import _rules, nstep
from cpprb_ray._outputs import SampleOutputs
from cpprb_ray._store import LaneError
from cpprb_ray.remote import _proxy

NAMESPACE = "cpprb_ray"        # the proxy actors' Ray namespace, whatever the job's
PING_SECONDS = 1.0             # how often a waiting call checks that its actor is alive
PROXY_CONCURRENCY = 32         # calls one proxy serves at once (waiting ones included)
EXIT_SECONDS = 5.0             # the longest an exiting process tries to send its queues

_settings: Dict[str, float] = {"flush_rows": 1024, "flush_bytes": 8 << 20,
                               "flush_seconds": 0.05, "call_timeout": 60.0,
                               "writer_lease": 60.0}


class RemoteBufferError(ConnectionError):
    """A remote handle's call could not reach the buffer: its proxy actor or the owner's node is
    gone (the owner closed the buffer or died), or no answer came within the call timeout.

    Examples
    --------
    >>> from cpprb_ray.remote import RemoteBufferError
    >>> issubclass(RemoteBufferError, ConnectionError)
    True
    """


def proxy_name(backend: str, location: str, token: Optional[str]) -> str:
    """The proxy actor's name: the buffer's backend, name and identity token (a buffer made
    again under the same name gets another proxy).

    Examples
    --------
    >>> from cpprb_ray.remote import proxy_name
    >>> proxy_name("shm", "cpprb_ray_0123", "ab12")
    'cpprb_ray:shm:cpprb_ray_0123:ab12'
    """
    return f"cpprb_ray:{backend}:{location}:{token}"


def _ray() -> Any:
    """Ray, when this process is part of a Ray job (else None); never imports it."""
    ray = sys.modules.get("ray")
    if ray is None or not getattr(ray, "is_initialized", lambda: False)():
        return None
    return ray


# The client


_live_stores: weakref.WeakSet[RemoteStore] = weakref.WeakSet()
_exit_hook = [False]


def _release_all_at_exit() -> None:
    """Send every remote handle's queue as this process exits, for at most EXIT_SECONDS: some
    Ray versions cannot make calls from an exiting worker (Ray 2.7.2 hangs in them after
    ``exit_actor()``), and an exit must not hang on that."""
    stores = list(_live_stores)
    if not stores:
        return
    def send() -> None:
        for store in stores:
            store.release()
    sender = threading.Thread(target=send, name="cpprb_ray-exit-flush", daemon=True)
    sender.start()
    sender.join(min(EXIT_SECONDS, _settings["call_timeout"]))
    if sender.is_alive():
        lost = sum(store._queued for store in stores if not store._closed)
        for store in stores:
            store._closed = True   # abandoned: nothing else may wait on them now
        sys.stderr.write(f"cpprb_ray: could not send {lost} queued row(s) of remote handles "
                         f"at exit within {EXIT_SECONDS:g} s; they are lost\n")


class RemoteStore:
    """ReplayStore's methods, served by the buffer's proxy actor; the adds batched here.

    Made by unpickling (:func:`client`); see the module's description. `columns`: what a
    sample returns (a laned buffer's public columns). Of a laned buffer, the handle's writer
    lives in the proxy (:meth:`lane_parts`): the queue's batches go to it, under this handle's
    client id.
    """

    is_remote = True

    def __init__(self, backend: str, location: str, token: Optional[str],
                 state: Dict[str, Any], columns: Sequence[Any]) -> None:
        self.state = state
        self.backend, self.location, self.token = backend, location, token
        self.prioritized = bool(state["prioritized"])
        self.capacity = int(state["capacity"])
        self._columns = [c for c in columns]   # what the queue holds (the writer's add's)
        self._outputs = SampleOutputs([c.name for c in columns], [c.shape for c in columns],
                                      [c.dtype for c in columns], weights=self.prioritized)
        # A laned buffer's handle: its id in the proxy, whose writer it has (its first add
        # went), and when its last call to that writer went (the keepalive's clock).
        self._client: Optional[int] = None
        self._writer_made = False
        self._writer_called = 0.0
        self._limited = bool(state["limited"])
        self._alpha, self._eps = float(state["alpha"]), float(state["eps"])
        self._row_bytes = sum(c.row_bytes for c in columns)
        self._lock = threading.RLock()           # the queue
        self._connect_lock = threading.Lock()    # the actor handle
        self._wake = threading.Condition(self._lock)
        self._actor: Any = None
        self._closed = False
        self._failure: Optional[BaseException] = None   # a background flush's, raised next
        self._queue: Optional[List[np.ndarray]] = None
        self._queue_priorities: Optional[np.ndarray] = None   # NaN: the row came without one
        self._queued = 0
        self._oldest = 0.0
        self._flusher: Optional[threading.Thread] = None
        _live_stores.add(self)
        if not _exit_hook[0]:
            _exit_hook[0] = True
            atexit.register(_release_all_at_exit)

    # -- the actor ----------------------------------------------------------------------------

    def _connect(self) -> Any:
        with self._connect_lock:
            return self._actor if self._actor is not None else self._start()

    def _start(self) -> Any:
        """Find the buffer's proxy, or start it on the owner's node."""
        ray = self._ray_or_fail()
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        self._actor = _proxy.proxy_class(ray).options(
            name=proxy_name(self.backend, self.location, self.token), namespace=NAMESPACE,
            get_if_exists=True, lifetime="detached", num_cpus=0, max_restarts=0,
            max_concurrency=PROXY_CONCURRENCY,
            scheduling_strategy=NodeAffinitySchedulingStrategy(self.state["node"], soft=False),
        ).remote(self.backend, self.location, self.token)
        return self._actor

    def _ray_or_fail(self) -> Any:
        ray = _ray()
        if ray is None:
            raise RemoteBufferError(f"buffer {self.location!r}: this process is no longer part "
                                    f"of a Ray job (ray.shutdown?)")
        return ray

    def _gone(self, why: str) -> RemoteBufferError:
        self._actor = None   # the next call starts (or finds) a proxy again
        return RemoteBufferError(
            f"buffer {self.location!r} (owner's node {self.state['node'][:12]}...): {why}")

    def _result(self, ray: Any, ref: Any, timeout: Optional[float]) -> Any:
        """ray.get(ref) within `timeout` seconds; the actor's own errors (bad input, a rate
        limiter's TimeoutError) as they are, every other failure as RemoteBufferError."""
        try:
            return ray.get(ref, timeout=timeout)
        except ray.exceptions.RayTaskError as error:
            cause = getattr(error, "cause", None)
            if isinstance(cause, (ValueError, TypeError, TimeoutError, IndexError, KeyError,
                                  LaneError)):
                raise cause from None
            raise self._gone(f"the proxy actor failed: {error}") from None
        except ray.exceptions.GetTimeoutError:
            raise self._gone(f"no answer within {timeout:g} s (the owner's node or its proxy "
                             f"actor is unreachable)") from None
        except ray.exceptions.RayError as error:
            raise self._gone(f"the proxy actor is gone (the owner closed the buffer or died, "
                             f"or its node is down): {type(error).__name__}: "
                             f"{_gist(str(error))}") from None

    def _call(self, method: str, *args: Any, waits: bool = False) -> Any:
        """One call of the proxy. `waits`: the call may legitimately block (a rate limiter):
        then it is given as long as it takes, checking every second that the actor answers."""
        ray = self._ray_or_fail()
        call_timeout = _settings["call_timeout"]
        actor = self._connect()
        ref = getattr(actor, method).remote(*args)
        if not waits:
            return self._result(ray, ref, call_timeout)
        while True:
            ready, _ = ray.wait([ref], timeout=PING_SECONDS)
            if ready:
                return self._result(ray, ref, call_timeout)
            self._result(ray, actor.ping.remote(), call_timeout)

    # -- validation (the local store's rules, before anything is queued) ---------------------

    def check_priorities(self, priorities: Any, name: str = "priorities") -> None:
        """The local store's priority rule (ValueError naming `name`), before anything is
        queued: finite, >= 0, and a weight that keeps the tree's total finite."""
        values = np.ascontiguousarray(priorities, dtype=np.float64).reshape(-1)
        _rules.check_priorities(values, self._alpha, self._eps, self.capacity, name)

    def weights_of(self, priorities: Any, name: str = "priorities") -> np.ndarray:
        """ReplayStore.weights_of: checked here; the owner's store weighs what it receives
        (NaN: a row without a priority), so the weights are only a placeholder."""
        self.check_priorities(priorities, name)
        return np.full(len(priorities), np.nan)

    @property
    def closed(self) -> bool:
        return self._closed

    def _stage(self, values: Union[Sequence[Any], Dict[str, Any]], priorities: Any,
               checked: bool = False) -> Tuple[List[np.ndarray], int, Optional[np.ndarray]]:
        # `values`, as the local store takes them: a dict of exactly the columns (a handle's
        # add; a laned buffer's: the steps its writer in the proxy takes), or a list in column
        # order (staged N-step rows, whose priorities were `checked` when they were staged, a
        # NaN for a step without one).
        if not isinstance(values, dict):
            values = dict(zip((c.name for c in self._columns), values))
        arrays, count = _rules.stage_rows(self._columns, values)
        if priorities is not None:
            _rules.check_priorities_allowed(self.prioritized)
            priorities = _rules.real_vector(priorities, count, "priorities")
            if not checked:
                self.check_priorities(priorities, "priorities")
        return arrays, count, priorities

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError("operation on a closed buffer")
        failure = self._failure
        if failure is not None:
            self._failure = None
            raise failure

    # -- add and the queue --------------------------------------------------------------------

    def add(self, values: Union[Sequence[Any], Dict[str, Any]], priorities: Any = None,
            timeout: Optional[float] = None, weights: Any = None) -> Optional[int]:
        """Queue one transition or a batch (checked here, as add checks); with a rate limiter,
        send it at once and wait for it. Returns None, or with a limiter the first slot.
        `weights` (ReplayStore.add's, with priorities that an N-step staging checked): the
        owner's store weighs the priorities again; a NaN priority is a row without one."""
        seconds = _rules.as_timeout(timeout)
        if self._limited:
            # Sent at once, and waited for WITHOUT the queue's lock: a sampler thread of this
            # process may be what the limiter waits for.
            self._check_open()
            arrays, count, priorities = self._stage(values, priorities, weights is not None)
            wait = None if seconds < 0 else seconds   # as_timeout: -1 for None
            if self._client is not None:
                first = self._writer_call("lane_add", self._by_name(arrays), priorities, wait,
                                          waits=True)
                with self._lock:
                    self._start_flusher()   # (the writer's keepalive)
                return None if first is None else int(first)
            first, _ = self._call("add", arrays, priorities, wait, waits=True)
            return int(first)
        with self._lock:
            self._check_open()
            arrays, count, priorities = self._stage(values, priorities, weights is not None)
            self._enqueue(arrays, count, priorities)
            if (self._queued >= _settings["flush_rows"]
                    or self._queued * self._row_bytes >= _settings["flush_bytes"]
                    # A laned buffer's first add is sent at once: it claims the handle's lane
                    # (LaneError, with nothing added, when every lane has a writer).
                    or (self._client is not None and not self._writer_made)):
                self._flush_locked(None)
            self._start_flusher()
        return None

    def _start_flusher(self) -> None:
        """(Under the lock) The background thread that sends the queue by age and keeps a
        laned handle's writer in the proxy alive; started on the first add."""
        if self._flusher is None:
            self._flusher = threading.Thread(target=_flush_by_age, args=(weakref.ref(self),),
                                             name="cpprb_ray-flush", daemon=True)
            self._flusher.start()
        else:
            self._wake.notify()

    def _by_name(self, arrays: List[np.ndarray]) -> Dict[str, np.ndarray]:
        return {column.name: array for column, array in zip(self._columns, arrays)}

    def _enqueue(self, arrays: List[np.ndarray], count: int,
                 priorities: Optional[np.ndarray]) -> None:
        """Copy the rows into the queue (the caller may reuse its arrays at once)."""
        need = self._queued + count
        if self._queue is None or need > self._queue[0].shape[0]:
            room = max(need, 2 * (0 if self._queue is None else self._queue[0].shape[0]),
                       min(int(_settings["flush_rows"]), 4096))
            grown = [np.empty((room,) + c.shape, dtype=c.dtype) for c in self._columns]
            grown_priorities = np.full(room, np.nan)
            if self._queue is not None and self._queue_priorities is not None:
                for new, old in zip(grown, self._queue):
                    new[:self._queued] = old[:self._queued]
                grown_priorities[:self._queued] = self._queue_priorities[:self._queued]
            self._queue, self._queue_priorities = grown, grown_priorities
        assert self._queue_priorities is not None
        for queue, array in zip(self._queue, arrays):
            queue[self._queued:need] = array
        self._queue_priorities[self._queued:need] = np.nan if priorities is None else priorities
        if self._queued == 0:
            self._oldest = time.monotonic()
        self._queued = need

    def _flush_locked(self, timeout: Optional[float]) -> int:
        """Send the queue as ONE call, which the proxy adds as ONE store add (a NaN priority:
        a row that came without one)."""
        count = self._queued
        if not count:
            return 0
        assert self._queue is not None and self._queue_priorities is not None
        arrays = [queue[:count] for queue in self._queue]
        given: Optional[np.ndarray] = self._queue_priorities[:count]
        if given is not None and np.isnan(given).all():
            given = None
        # The queue is handed over (Ray serializes it before .remote returns); the next add
        # starts a new one, and a failed flush drops these rows, as the docs say.
        self._queue = None
        self._queue_priorities = None
        self._queued = 0
        if self._client is not None:
            self._writer_call("lane_add", self._by_name(arrays), given, timeout)
        else:
            self._call("add", arrays, given, timeout)
        return count

    def flush(self, timeout: Optional[float] = None) -> int:
        """Send the queued rows now; returns how many."""
        with self._lock:
            self._check_open()
            return self._flush_locked(None)

    def _flush_if_old(self) -> bool:
        """The background thread's step: send the queue once its oldest row is old enough;
        keep a laned handle's writer in the proxy alive (a call every quarter of its lease,
        so that only a dead handle's writer is closed). False once the store is closed."""
        with self._lock:
            if self._closed:
                return False
            if self._queued:
                age = time.monotonic() - self._oldest
                if age >= _settings["flush_seconds"]:
                    try:
                        self._flush_locked(None)
                    except Exception as error:  # noqa: BLE001 - raised by the next call
                        self._failure = error
                else:
                    self._wake.wait(_settings["flush_seconds"] - age)
                return True
            beat = _settings["writer_lease"] / 4
            if not self._writer_made or time.monotonic() - self._writer_called < beat:
                self._wake.wait(min(1.0, beat))
                return True
            try:
                self._writer_called = time.monotonic()
                # False: the proxy closed the writer (this process was stopped past the
                # lease): the next add makes a new one, sent at once.
                self._writer_made = bool(self._call("lane_touch", self._client))
            except Exception:  # noqa: BLE001 - the handle's next call reports a lost proxy
                pass
        return True

    # -- a laned buffer's writer in the proxy -------------------------------------------------

    def lane_parts(self, config: Any, nstep_config: Any,
                   episodes: bool = False) -> Tuple[Any, Any]:
        """(writer, sampler) of a remote handle of a laned buffer (:func:`cpprb_ray._parts
        .choose` asks): its writer, N-step staging included, lives in the proxy, one per
        handle; draws go through the proxy's sampler. The queue holds the columns that writer's
        add takes. `episodes`: that writer keeps an episode which on_episode_end ends, without
        N-step too (a sequence buffer's)."""
        if self._client is None:
            self._client = secrets.randbits(63) | 1
        public = config.columns()
        self._columns = [c for c in public
                         if nstep_config is None or c.name != nstep.DISCOUNTS]
        self._row_bytes = sum(c.row_bytes for c in self._columns)
        return (RemoteLaneWriter(self, public, config.rows or self.capacity,
                                 nstep_config is not None, episodes), RemoteLaneSampler(self))

    def sequence_outputs(self, length: int) -> None:
        """A sequence buffer's handle (:mod:`cpprb_ray.sequences`): what a sample returns (and
        out= must hold) is every column as `length` steps, then "mask"."""
        names = [c.name for c in self._columns]
        self._outputs = SampleOutputs(
            names + ["mask"], [(length,) + tuple(c.shape) for c in self._columns] + [(length,)],
            [c.dtype for c in self._columns] + [np.dtype(np.bool_)], weights=self.prioritized)

    def _writer_call(self, method: str, *args: Any, waits: bool = False) -> Any:
        """A call of this handle's writer in the proxy (made there by the first), with this
        process's lease for it."""
        result = self._call(method, self._client, *args, _settings["writer_lease"], waits=waits)
        self._writer_made = True
        self._writer_called = time.monotonic()
        return result

    def writer_call(self, method: str, *args: Any, waits: bool = False) -> Any:
        """After sending the queue: a call of this handle's writer in the proxy."""
        with self._lock:
            self._check_open()
            self._flush_locked(None)
        return self._writer_call(method, *args, waits=waits)

    def lane_state(self) -> Tuple[int, int]:
        """(next slot, staged steps) of this handle's writer in the proxy."""
        state = self._flushed_call("lane_state", self._client)
        return int(state[0]), int(state[1])

    def forget_staged(self) -> None:
        """Drop the steps this handle's writer in the proxy staged (clear())."""
        if self._writer_made:
            self._flushed_call("lane_forget", self._client)

    @property
    def limited(self) -> bool:
        return self._limited

    # -- the rest: one Ray call each, after sending the queue ----------------------------------

    def _flushed_call(self, method: str, *args: Any, waits: bool = False) -> Any:
        with self._lock:
            self._check_open()
            self._flush_locked(None)
        return self._call(method, *args, waits=waits)

    def sample(self, batch: int, beta: float, out: Optional[Dict[str, np.ndarray]] = None,
               timeout: Optional[float] = None) -> Dict[str, np.ndarray]:
        seconds = _rules.as_timeout(timeout)
        wait = None if seconds < 0 else seconds   # as_timeout: -1 for None
        arrays = None if out is None else self._outputs.out_arrays(out, batch)
        result = self._flushed_call("sample", batch, beta, wait, waits=self._limited)
        if arrays is None:
            # Arrays from the object store are read-only views of it; a sample is the caller's.
            return {key: np.array(value) for key, value in result.items()}
        for array, key in zip(arrays, self._outputs.names):
            np.copyto(array, result[key])
        return dict(zip(self._outputs.names, arrays))

    def update(self, indexes: Any, priorities: Any, generations: Any = None) -> int:
        return int(self._flushed_call("update", indexes, priorities, generations))

    def counters(self) -> Dict[str, Any]:
        return dict(self._flushed_call("counters"))

    def limiter_record(self) -> Optional[Tuple[str, float, int, float, float]]:
        record = self._flushed_call("limiter_record")
        return None if record is None else tuple(record)

    @property
    def stored_size(self) -> int:
        return int(self._flushed_call("position")[0])

    @property
    def next_index(self) -> int:
        return int(self._flushed_call("position")[1])

    @property
    def max_priority(self) -> float:
        return float(self._flushed_call("position")[2])

    @property
    def rows_added(self) -> int:
        return int(self.counters()["inserts"])

    def clear(self) -> None:
        self._flushed_call("clear")

    def snapshot(self, outputs: Sequence[np.ndarray], indexes: np.ndarray,
                 leaves: np.ndarray) -> int:
        """ReplayStore.snapshot, through the proxy: the rows, their slots and leaf weights."""
        rows, slots, weights = self._flushed_call("snapshot", len(indexes))
        copied = len(slots)
        for output, row in zip(outputs, rows):
            output[:copied] = row
        indexes[:copied] = slots
        leaves[:copied] = weights
        return int(copied)

    def dump(self) -> Any:
        return self._flushed_call("dump")

    def lock_owner(self) -> int:
        return int(self.counters()["lock_holder"])

    def release(self) -> None:
        """Send what is queued and close (idempotent); a laned buffer's handle then closes its
        writer in the proxy (its staged N-step steps committed as a truncated episode end, its
        lane given back). A failure is a RuntimeWarning (the rows are lost; a writer left in
        the proxy is closed when its lease runs out), never an exception: a close always
        closes (call ``flush()`` first to get the error)."""
        if self._closed:   # also when an exit gave up on it (its lock may be held for ever)
            return
        with self._lock:
            if self._closed:
                return
            try:
                self._flush_locked(None)
                if self._writer_made:
                    for message in self._call("lane_close", self._client):
                        warnings.warn(message, RuntimeWarning, stacklevel=2)
            except Exception as error:  # noqa: BLE001
                warnings.warn(f"cpprb_ray: a remote handle of {self.location!r} could not send "
                              f"its queued rows or close its writer ({error})", RuntimeWarning,
                              stacklevel=2)
            finally:
                self._closed = True
                self._wake.notify_all()
                _live_stores.discard(self)


class RemoteLaneWriter:
    """The writer part (:mod:`cpprb_ray._parts`) of a remote handle of a laned buffer: its
    adds are queued in its store (checked here, by the rules a local add applies) and go, a
    batch at a time, to this handle's writer in the proxy (a lane writer, or an N-step writer
    over the lane: its lane, frame cache and N-step staging are there)."""

    def __init__(self, store: RemoteStore, columns: List[Any], size: int,
                 with_nstep: bool, episodes: bool = False) -> None:
        self._store = store
        self.add = store.add
        self.columns = columns      # the public columns (N-step's discounts included)
        self.size = size
        self._nstep = with_nstep
        # Whether the writer in the proxy keeps an episode that on_episode_end ends (N-step
        # staging, or a sequence buffer's stream and open sequences).
        self._episodes = with_nstep or episodes

    @property
    def staged(self) -> Optional[int]:
        """N-step steps this handle's writer in the proxy has staged (None without N-step)."""
        return self._store.lane_state()[1] if self._nstep else None

    def end_episode(self, timeout: Optional[float]) -> None:
        """on_episode_end: send the queue, then the writer in the proxy commits its staged
        steps (waiting as a local one does for a rate limiter)."""
        seconds = _rules.as_timeout(timeout)   # refused alike, with nothing to commit
        if not self._episodes or self._store.closed:
            return
        wait = None if seconds < 0 else seconds
        self._store.writer_call("lane_end", wait, waits=self._store.limited)

    def forget(self) -> None:
        self._store.forget_staged()

    def close(self) -> None:
        """Send the queue, commit what the writer in the proxy staged and give its lane back
        (the store's release, which the handle's close calls next)."""
        self._store.release()

    def next_slot(self) -> int:
        return self._store.lane_state()[0]

    def add_rows(self, transitions: Dict[str, np.ndarray], file: Any,
                 timeout: Optional[float]) -> None:
        """load_transitions: finished N-step rows into this handle's lane, in the proxy."""
        seconds = _rules.as_timeout(timeout)
        self._store.writer_call("lane_add_rows", transitions, repr(file),
                                None if seconds < 0 else seconds, waits=self._store.limited)


class RemoteLaneSampler:
    """The sampler part of a remote handle of a laned buffer: the proxy's sampler (the lanes',
    frames rebuilt there; cpprb's row numbers in a bounded lane)."""

    def __init__(self, store: RemoteStore) -> None:
        self.sample = store.sample
        self.update = store.update
        self._store = store

    def all_rows(self, room: int) -> Dict[str, np.ndarray]:
        return _own(self._store._flushed_call("all_rows", room))

    def rows_at(self, indexes: np.ndarray, room: int) -> Dict[str, np.ndarray]:
        return _own(self._store._flushed_call("rows_at", indexes, room))


def _own(rows: Dict[str, Any]) -> Dict[str, np.ndarray]:
    """Arrays from Ray's object store are read-only views of it: the caller's are copies."""
    return {name: np.array(column) for name, column in rows.items()}


def _flush_by_age(store_ref: weakref.ref[RemoteStore]) -> None:
    """The flusher thread: holds its store only weakly between steps, so that a handle nobody
    uses any more is collected (and its finalizer sends the queue)."""
    while True:
        store = store_ref()
        if store is None or not store._flush_if_old():
            return
        del store


def _gist(message: str) -> str:
    """A Ray error's first line, and its last (a failed creation task's own error) if other."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    if not lines:
        return ""
    return lines[0] if len(lines) == 1 else f"{lines[0]} ... {lines[-1]}"
