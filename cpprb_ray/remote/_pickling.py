"""The pickling glue of handles in a Ray job: what a handle carries for a node that cannot see
its segment, and the remote handle made of it there (called by buffer.py's pickling).

Examples
--------
>>> from cpprb_ray.remote import _pickling
>>> segment = _pickling.RemoteSegment("shm", "cpprb_ray_x")
>>> segment.closed, segment.location
(False, 'cpprb_ray_x')
"""

from __future__ import annotations

import json
import weakref
from typing import Any, Dict, Optional, Type

from cpprb_ray import _layout, _segment, frames
from cpprb_ray.remote import _client
from cpprb_ray.remote._client import NAMESPACE, proxy_name


def pickle_state(handle: Any) -> Optional[Dict[str, Any]]:
    """What a handle pickled in a Ray job carries for a node that cannot see its segment: the
    owner's node, the layout, alpha and eps; None outside a Ray job.

    Examples
    --------
    >>> import sys
    >>> from cpprb_ray import ReplayBuffer, remote
    >>> with ReplayBuffer(4, {"obs": {}}) as rb:
    ...     state = remote.pickle_state(rb)
    >>> in_ray_job = "ray" in sys.modules and sys.modules["ray"].is_initialized()
    >>> expected = ["alpha", "capacity", "eps", "layout", "limited", "node", "prioritized"]
    >>> (sorted(state) if state else None) == (expected if in_ray_job else None)
    True
    """
    store = handle._store
    if isinstance(store, _client.RemoteStore):
        return store.state        # a remote handle passes on the owner's node, not its own
    ray = _client._ray()
    if ray is None:
        return None
    header = _segment.read_header(handle._segment.memory)
    return {"node": ray.get_runtime_context().get_node_id(),
            "layout": handle._layout.to_json().decode(),
            "capacity": handle._layout.capacity, "prioritized": handle._layout.prioritized,
            "alpha": float(header["alpha"]), "eps": float(header["eps"]),
            "limited": store.limiter_record() is not None}


def _layout_of(state: Dict[str, Any], location: str) -> _layout.Layout:
    """The Layout a pickled state describes (columns with their offsets, meta)."""
    document = json.loads(state["layout"])
    entries = document["columns"]
    columns = _layout.parse_env_dict({str(entry["name"]): {"dtype": entry["dtype"],
                                                          "shape": tuple(entry["shape"])}
                                      for entry in entries})
    for column, entry in zip(columns, entries):
        column.offset = int(entry["offset"])
    return _layout.Layout(int(state["capacity"]), bool(state["prioritized"]), columns,
                          dict(document["meta"]), 0, int(document["row_stride"]), 0, 0)


class RemoteSegment:
    """Stands for the segment in a remote handle: its backend and name, and closed or not."""

    __slots__ = ("backend", "location", "memory", "_closed", "__weakref__")

    def __init__(self, backend: str, location: str) -> None:
        self.backend = backend
        self.location = location
        self.memory = None
        self._closed = False

    def close(self) -> None:
        self._closed = True

    @property
    def closed(self) -> bool:
        return self._closed


def client(cls: Type[Any], backend: str, location: str, token: Optional[str],
           state: Dict[str, Any]) -> Optional[Any]:
    """A remote handle of the buffer `state` describes, or None where none can be made: no Ray
    job in this process, or this IS the owner's node (whose segment, then, is gone).

    Examples
    --------
    >>> from cpprb_ray import ReplayBuffer, remote
    >>> state = {"node": "n0", "layout": "{}", "capacity": 4, "prioritized": False}
    >>> in_ray_job = remote._client._ray() is not None
    >>> in_ray_job or remote.client(ReplayBuffer, "shm", "cpprb_ray_x", "t", state) is None
    True
    """
    ray = _client._ray()
    if ray is None or ray.get_runtime_context().get_node_id() == state["node"]:
        return None
    layout = _layout_of(state, location)
    target = cls._target_class(layout.prioritized)
    if target is None:
        raise ValueError(f"{location!r} is a {'prioritized' if layout.prioritized else 'uniform'}"
                         f" buffer; it cannot be unpickled as {cls.__name__}")
    # What its samples return: a laned buffer's public columns (frames whole, next_of's).
    lanes = frames.LaneConfig.from_meta(layout.meta, layout.columns, location)
    columns = layout.columns if lanes is None else lanes.columns()
    store = _client.RemoteStore(backend, location, token, state, columns)
    handle = target.__new__(target)
    handle._bind(RemoteSegment(backend, location), layout, ownership=None, seed=None,
                 store=store)
    # Sends the queue when the handle is collected; close() detaches it after sending.
    handle._finalizer = weakref.finalize(handle, store.release)
    handle._finalizer.atexit = False   # the exit is _release_all_at_exit's, bounded
    return handle


def stop_proxy(backend: str, location: str, token: Optional[str]) -> None:
    """End the buffer's proxy actor, if it has one (the owner's close).

    Examples
    --------
    >>> from cpprb_ray import remote
    >>> remote.stop_proxy("shm", "cpprb_ray_no_such_buffer", "t")   # nothing to end
    """
    ray = _client._ray()
    if ray is None:
        return
    try:
        actor = ray.get_actor(proxy_name(backend, location, token), namespace=NAMESPACE)
    except ValueError:   # none was started
        return
    try:
        ray.kill(actor, no_restart=True)
    except Exception:   # already gone  # noqa: BLE001
        pass
