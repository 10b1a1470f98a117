"""The proxy actor of a buffer: a view of its segment on the owner's node, serving the remote
handles of other nodes (see :mod:`cpprb_ray.remote`, which starts it on demand).

One per buffer, named after it, pinned to the owner's node. A watchdog thread ends it once the
segment at the name is no longer this buffer (the owner closed it) or the owner process is
dead; a new proxy refuses a dead owner's segment.

Examples
--------
>>> from cpprb_ray import _proxy
>>> _proxy.WATCH_SECONDS
0.5
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from cpprb_ray import _layout, _orphans, _rules, buffer

WATCH_SECONDS = 0.5            # how often a proxy checks its owner and segment


class Proxy:
    """The buffer's proxy: a view of the segment on the owner's node, serving remote handles.

    Exits by itself (os._exit) once the segment at the name is no longer this buffer (the
    owner closed it) or the owner process is dead.
    """

    def __init__(self, backend: str, location: str, token: Optional[str]) -> None:
        self._view = buffer._open_view(buffer.ReplayBuffer, backend, location, None,
                                       token=token)
        self._store = self._view._store
        self._backend, self._location, self._token = backend, location, token
        self._meta = dict(self._view._layout.meta)
        if self._owner_dead():
            self._view.close()
            raise FileNotFoundError(f"buffer {location!r}: its owner (pid "
                                    f"{self._meta.get('owner_pid')}) is dead; the segment is an "
                                    f"orphan (python -m cpprb_ray rm --orphans)")
        watchdog = threading.Thread(target=self._watch, name="cpprb_ray-proxy-watchdog",
                                    daemon=True)
        watchdog.start()

    def _watch(self) -> None:
        while True:
            time.sleep(WATCH_SECONDS)
            if (_layout.token_at(self._backend, self._location) != self._token
                    or self._owner_dead()):
                break
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
            runs: List[Tuple[int, int, bool]], timeout: Optional[float]) -> Tuple[int, int]:
        """Store a client's batch as ONE store add, whole or not at all: (first slot, rows).

        `runs` ((start, stop, given) in order, covering every row once) say which rows came
        with a priority. Everything is checked before anything is written. A row that came
        without one gets what a local add in that order would give it: the largest priority
        seen, as this proxy reads it just before the add, or given to a row before it in the
        batch."""
        rows = _batch_rows(arrays, priorities, runs)
        given = np.zeros(rows, dtype=bool)
        for start, stop, with_priority in runs:
            given[start:stop] = with_priority
        if not given.any():
            chosen = None
        elif not self._store.prioritized:
            raise TypeError("priorities are only for a PrioritizedReplayBuffer")
        else:
            chosen = _rules.real_vector(priorities, rows, "priorities").copy()
            self._store.check_priorities(np.ascontiguousarray(chosen[given]))
            if not given.all():
                seen = np.where(given, chosen, float(self._store.max_priority))
                chosen[~given] = np.maximum.accumulate(seen)[~given]
        slot = self._store.add(list(arrays), chosen, timeout)
        return int(slot), rows

    def sample(self, batch: int, beta: float, timeout: Optional[float]) -> Dict[str, Any]:
        return self._store.sample(batch, beta, None, timeout)

    def update(self, indexes: Any, priorities: Any, generations: Any) -> int:
        return int(self._store.update(indexes, priorities, generations))

    def counters(self) -> Dict[str, Any]:
        return self._store.counters()

    def limiter_record(self) -> Any:
        return self._store.limiter_record()

    def position(self) -> Tuple[int, int, float]:
        return (int(self._store.stored_size), int(self._store.next_index),
                float(self._store.max_priority))

    def clear(self) -> None:
        self._store.clear()

    def snapshot(self, room: int) -> Tuple[int, List[np.ndarray], np.ndarray, np.ndarray]:
        room = min(room, int(self._store.stored_size))
        columns = self._view._layout.columns
        outputs = [np.empty((room,) + c.shape, dtype=c.dtype) for c in columns]
        indexes = np.empty(room, dtype=np.int64)
        leaves = np.empty(room, dtype=np.float64)
        copied = self._store.snapshot(outputs, indexes, leaves)
        return int(copied), outputs, indexes, leaves

    def dump(self) -> Any:
        return self._store.dump()


def _batch_rows(arrays: Any, priorities: Any, runs: Any) -> int:
    """The rows of a batch sent to Proxy.add, or ValueError/TypeError saying what is wrong with
    it: one array per column, each of the same rows; runs that cover them in order, each once;
    priorities for them where a run says so."""
    if not isinstance(arrays, (list, tuple)) or not arrays:
        raise TypeError("arrays must be a non-empty list of arrays, one per column")
    lengths = {len(array) for array in arrays}
    if len(lengths) != 1:
        raise ValueError(f"the columns of a batch have different numbers of rows: "
                         f"{sorted(lengths)}")
    rows = lengths.pop()
    if not isinstance(runs, (list, tuple)) or not runs:
        raise ValueError("runs must cover the batch's rows")
    end = 0
    for run in runs:
        if (not isinstance(run, (list, tuple)) or len(run) != 3
                or not all(isinstance(x, int) and not isinstance(x, bool) for x in run[:2])):
            raise TypeError(f"each run must be (start, stop, given); got {_rules.shown(run)}")
        start, stop, given = run
        if start != end or not start < stop <= rows:
            raise ValueError(f"the runs must cover the batch's {rows} rows in order, each once; "
                             f"got {_rules.shown(list(runs), 80)}")
        if given and priorities is None:
            raise ValueError(f"run {_rules.shown(run)} says its rows came with priorities; "
                             f"none were sent")
        end = stop
    if end != rows:
        raise ValueError(f"the runs must cover the batch's {rows} rows in order, each once; "
                         f"got {_rules.shown(list(runs), 80)}")
    return rows


_proxy_classes: Dict[int, Any] = {}


def proxy_class(ray: Any) -> Any:
    """Proxy as a Ray actor class (made once per process).

    Examples
    --------
    >>> from cpprb_ray import _proxy
    >>> callable(_proxy.proxy_class)
    True
    """
    made = _proxy_classes.get(id(ray))
    if made is None:
        made = _proxy_classes[id(ray)] = ray.remote(Proxy)
    return made
