"""The proxy actor of a buffer: a view of its segment on the owner's node, serving the remote
handles of other nodes (see :mod:`cpprb_ray.remote`, which starts it on demand).

One per buffer, named after it, pinned to the owner's node. A watchdog thread ends it once the
segment at the name is no longer this buffer (the owner closed it) or the owner process is
dead; a new proxy refuses a dead owner's segment.

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
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from cpprb_ray import _layout, _open, _orphans, _parts, frames

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
        # The proxy stages nothing (a remote handle's N-step staging is its own): its parts
        # are the buffer's writer and sampler without N-step.
        lanes = frames.LaneConfig.from_meta(layout.meta, layout.columns, location)
        self._writer, self._sampler = _parts.choose(self._store, layout, location, lanes, None,
                                                    layout.prioritized)
        self._image = _parts.image_of(self._store)
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
        self._writer.close()
        self._store.release()
        self._segment.close()

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

    def dump(self) -> Any:
        return self._image.dump()


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
