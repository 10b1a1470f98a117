"""The proxy actor of a buffer: a view of its segment on the owner's node, serving the remote
handles of other nodes (see :mod:`cpprb_ray.remote`, which starts it on demand).

One per buffer, named after it, pinned to the owner's node. A watchdog thread ends it once the
segment at the name is no longer this buffer (the owner closed it) or the owner process is
dead; a new proxy refuses a dead owner's segment.

A laned buffer's remote handles write through writers kept here, one per handle (its client
id): each chosen by :func:`cpprb_ray._parts.choose` on this proxy's store, as a local handle's
is (a lane writer, or an N-step writer over a lane sink), so each remote handle has its own
lane, frame cache and N-step staging. A writer whose handle made no call for its lease (the
handle's ``writer_lease`` setting) is closed by the watchdog: its staged N-step steps are
committed as a truncated episode end and its lane is given back.

Examples
--------
>>> from cpprb_ray.remote import _proxy
>>> _proxy.WATCH_SECONDS
0.5
"""

from __future__ import annotations

import os
import threading
import time
import warnings
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from cpprb_ray import _layout, _open, _orphans, _parts, frames, nstep

WATCH_SECONDS = 0.5            # how often a proxy checks its owner and segment


class Proxy:
    """The buffer's proxy: its segment opened on the owner's node (as a handle opens one,
    :mod:`cpprb_ray._open`), serving remote handles.

    Exits by itself (os._exit) once the segment at the name is no longer this buffer (the
    owner closed it) or the owner process is dead.
    """

    def __init__(self, backend: str, location: str, token: Optional[str]) -> None:
        self._segment, self._layout = _open.open_segment(backend, location, token)
        try:
            layout = self._layout
            self._store = _open.open_store(self._segment, layout,
                                           prioritized=layout.prioritized)
        except BaseException:
            self._segment.close()
            raise
        # Draws go through the buffer's own sampler. A plain ring's remote handle stages its
        # N-step steps itself and its batches go in as store adds; a laned buffer's handles
        # each have a writer here (_writers), N-step staging included.
        lanes = frames.LaneConfig.from_meta(layout.meta, layout.columns, location)
        self._lanes = lanes
        self._nstep = None if lanes is None else nstep.NstepConfig.from_meta(
            layout.meta, lanes.columns(), location)
        self._sampler = _parts.choose(self._store, layout, location, lanes, None,
                                      layout.prioritized)[1]
        self._writers: Dict[int, _ClientWriter] = {}
        self._writers_lock = threading.Lock()
        self._image = _parts.image_of(self._store, layout)
        self._backend, self._location, self._token = backend, location, token
        self._meta = dict(layout.meta)
        if self._owner_dead():
            self._close()
            raise FileNotFoundError(f"buffer {location!r}: its owner (pid "
                                    f"{self._meta.get('owner_pid')}) is dead; the segment is an "
                                    f"orphan (python -m cpprb_ray rm --orphans)")
        watchdog = threading.Thread(target=self._watch, name="cpprb_ray-proxy-watchdog",
                                    daemon=True)
        watchdog.start()

    def _close(self) -> None:
        self._store.release()
        self._segment.close()

    def _watch(self) -> None:
        while True:
            time.sleep(WATCH_SECONDS)
            if (_layout.token_at(self._backend, self._location) != self._token
                    or self._owner_dead()):
                break
            self._reap()
        # The buffer is gone: so is its proxy. Ray's own graceful exit (the actor is then
        # dead, its name free); should that not come within 2 s (Ray 2.7.2), the process ends
        # itself.
        try:
            import ray

            ray.get_runtime_context().current_actor.__ray_terminate__.remote()
        finally:
            time.sleep(2.0)
            os._exit(0)

    def _owner_dead(self) -> bool:
        return _orphans.owner_status(self._meta)[0] == _orphans.DEAD

    def ping(self) -> Dict[str, Any]:
        """Where this proxy runs: its pid and Ray node."""
        import ray

        return {"pid": os.getpid(), "node": ray.get_runtime_context().get_node_id()}

    def add(self, arrays: List[np.ndarray], priorities: Optional[np.ndarray],
            timeout: Optional[float]) -> Tuple[int, int]:
        """Store a remote handle's batch as ONE store add, so that it goes in whole or not at
        all: (first slot, rows). A NaN priority is a row that came without one (it gets the
        largest priority seen, under the lock, as every add's do)."""
        weights = None
        if priorities is not None:
            priorities = np.ascontiguousarray(priorities, dtype=np.float64)
            weights = self._store.weights_of(priorities, "priorities", missing=True)
        slot = self._store.add(list(arrays), priorities, timeout, weights)
        return int(slot), int(arrays[0].shape[0]) if arrays else 0

    def sample(self, batch: int, beta: float, timeout: Optional[float]) -> Dict[str, Any]:
        return self._sampler.sample(batch, beta, None, timeout)

    def update(self, indexes: Any, priorities: Any, generations: Any) -> int:
        return int(self._sampler.update(indexes, priorities, generations))

    def counters(self) -> Dict[str, Any]:
        return self._store.counters()

    def limiter_record(self) -> Any:
        return self._store.limiter_record()

    def position(self) -> Tuple[int, int, float]:
        return (int(self._store.stored_size), int(self._store.next_index),
                float(self._store.max_priority))

    def clear(self) -> None:
        self._store.clear()

    def all_rows(self, room: int) -> Dict[str, np.ndarray]:
        return self._sampler.all_rows(min(room, int(self._store.stored_size)))

    def snapshot(self, room: int) -> Tuple[List[np.ndarray], np.ndarray, np.ndarray]:
        """ReplayStore.snapshot of at most `room` rows: the columns, slots and leaf weights."""
        room = min(room, int(self._store.stored_size))
        outputs = [np.empty((room,) + c.shape, dtype=c.dtype) for c in self._layout.columns]
        indexes = np.empty(room, dtype=np.int64)
        leaves = np.empty(room, dtype=np.float64)
        copied = int(self._store.snapshot(outputs, indexes, leaves))
        return [output[:copied] for output in outputs], indexes[:copied], leaves[:copied]

    def rows_at(self, indexes: Any, room: int) -> Dict[str, np.ndarray]:
        return self._sampler.rows_at(indexes, min(room, int(self._store.stored_size)))

    def dump(self) -> Any:
        return self._image.dump()

    # -- the writers of a laned buffer's remote handles ---------------------------------------

    def _writer(self, client: int, lease: Optional[float]) -> _ClientWriter:
        """The writer of remote handle `client`, made now if it has none (lease None: only an
        existing one, else KeyError), marked busy until :meth:`_done` (the watchdog never closes
        a busy one)."""
        with self._writers_lock:
            record = self._writers.get(client)
            if record is None:
                if lease is None or self._lanes is None:
                    raise KeyError(client)
                writer = _parts.choose(self._store, self._layout, self._location, self._lanes,
                                       self._nstep, self._layout.prioritized)[0]
                record = self._writers[client] = _ClientWriter(writer)
            if lease is not None:
                record.lease = lease
            record.busy += 1
            return record

    def _done(self, record: _ClientWriter) -> None:
        with self._writers_lock:
            record.busy -= 1
            record.last = time.monotonic()

    def _reap(self) -> None:
        """Close the writers whose handles made no call for their lease (a dead client): each
        commits its staged N-step steps as a truncated episode end and gives its lane back."""
        now = time.monotonic()
        with self._writers_lock:
            idle = [client for client, record in self._writers.items()
                    if not record.busy and now - record.last > record.lease]
            records = [self._writers.pop(client) for client in idle]
        for record in records:
            try:
                record.writer.close()
            except Exception as error:  # noqa: BLE001 - the others are closed all the same
                warnings.warn(f"cpprb_ray proxy: closing a writer idle past its lease failed: "
                              f"{error}", RuntimeWarning, stacklevel=1)

    def lane_add(self, client: int, values: Dict[str, np.ndarray],
                 priorities: Optional[np.ndarray], timeout: Optional[float],
                 lease: float) -> Optional[int]:
        """A remote handle's batch of consecutive steps, into its writer as ONE add (a writer's
        add of consecutive steps is those adds one by one, for frames and N-step alike). A NaN
        priority is a row that came without one: a run of those goes in as an add without
        priorities (the largest seen, under the lock), so the batch is one add per run."""
        record = self._writer(client, lease)
        try:
            if priorities is None:
                return _first(record.writer.add(values, None, timeout))
            given = ~np.isnan(priorities)
            cuts = [0] + (np.flatnonzero(given[1:] != given[:-1]) + 1).tolist() + [len(given)]
            first = None
            for start, stop in zip(cuts[:-1], cuts[1:]):
                part = values if stop - start == len(given) else {
                    name: array[start:stop] for name, array in values.items()}
                slot = record.writer.add(part, priorities[start:stop] if given[start] else None,
                                         timeout)
                first = _first(slot) if first is None else first
            return first
        finally:
            self._done(record)

    def lane_end(self, client: int, timeout: Optional[float], lease: float) -> None:
        """on_episode_end of remote handle `client`: its writer commits its staged steps."""
        record = self._writer(client, lease)
        try:
            record.writer.end_episode(timeout)
        finally:
            self._done(record)

    def lane_add_rows(self, client: int, transitions: Dict[str, np.ndarray], file: str,
                      timeout: Optional[float], lease: float) -> None:
        """load_transitions of an N-step remote handle: finished rows into its lane."""
        record = self._writer(client, lease)
        try:
            record.writer.add_rows(transitions, file, timeout)
        finally:
            self._done(record)

    def lane_forget(self, client: int) -> None:
        """clear() of remote handle `client`: its writer drops its staged steps."""
        try:
            record = self._writer(client, None)
        except KeyError:
            return
        try:
            record.writer.forget()
        finally:
            self._done(record)

    def lane_state(self, client: int) -> Tuple[int, int]:
        """(next slot, staged steps) of remote handle `client`'s writer; of a new writer, one
        that holds nothing yet, when it has none."""
        try:
            record = self._writer(client, None)
        except KeyError:
            writer = _parts.choose(self._store, self._layout, self._location, self._lanes,
                                   self._nstep, self._layout.prioritized)[0]
            return int(writer.next_slot()), 0
        try:
            return int(record.writer.next_slot()), int(record.writer.staged or 0)
        finally:
            self._done(record)

    def lane_touch(self, client: int) -> bool:
        """A live remote handle's keepalive: its writer's lease starts again. False when it
        has none (never made, or closed after a lease ran out)."""
        with self._writers_lock:
            record = self._writers.get(client)
            if record is not None:
                record.last = time.monotonic()
            return record is not None

    def lane_close(self, client: int) -> List[str]:
        """close() of remote handle `client`: its writer commits its staged steps as a
        truncated episode end (unless a rate limiter holds them back: dropped, and the warning
        said so is returned for the handle to raise) and gives its lane back."""
        with self._writers_lock:
            record = self._writers.pop(client, None)
        if record is None:
            return []
        # (The warning is caught to be raised in the handle; catch_warnings is process-wide,
        # so another thread's warning meanwhile may go along: close calls are rare.)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            record.writer.close()
        return [str(warning.message) for warning in caught]


class _ClientWriter:
    """A remote handle's writer in the proxy: when its handle last called, its lease, and the
    calls in progress."""

    __slots__ = ("writer", "last", "lease", "busy")

    def __init__(self, writer: Any) -> None:
        self.writer = writer
        self.last = time.monotonic()
        self.lease = 60.0
        self.busy = 0


def _first(slot: Any) -> Optional[int]:
    return None if slot is None else int(slot)


_proxy_classes: Dict[int, Any] = {}


def proxy_class(ray: Any) -> Any:
    """Proxy as a Ray actor class (made once per process).

    Examples
    --------
    >>> from cpprb_ray.remote import _proxy
    >>> callable(_proxy.proxy_class)
    True
    """
    made = _proxy_classes.get(id(ray))
    if made is None:
        made = _proxy_classes[id(ray)] = ray.remote(Proxy)
    return made
