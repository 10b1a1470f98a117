"""Handles on other nodes of a Ray cluster: clients of one proxy actor on the owner's node.

A handle unpickled in a process that can see its segment attaches to it in place (buffer.py).
One unpickled on a Ray node that cannot (another host, or a node in its own mount namespace)
becomes a *remote handle* of the same class and API, whose store is a ``RemoteStore``
(:mod:`cpprb_ray._client`): a client of the buffer's proxy actor (:mod:`cpprb_ray._proxy`),
which holds a view of the segment on the owner's node.

- **The proxy actor.** One per buffer, named after it (:func:`proxy_name`: backend, name and
  identity token) in the ``"cpprb_ray"`` namespace; started on demand by the first remote
  handle that needs it (``get_if_exists``), pinned to the owner's node (hard node affinity),
  ``num_cpus=0``, threaded (a rate-limited call that waits does not hold up the others),
  detached, and gone when the owner closes (the owner's close kills it) or dies, or the segment
  is removed (a watchdog in the actor checks twice a second and exits).
- **Adds are batched.** Without a rate limiter, a remote handle validates each add at once (the
  same rules and messages as ``add``) and copies its rows into a local queue, sent as ONE Ray
  call when it holds ``flush_rows`` rows or ``flush_bytes`` bytes, when its oldest row is
  ``flush_seconds`` old (a background thread), before every other call (sample, update,
  stats, ...), on :meth:`~cpprb_ray.ReplayBuffer.flush`, on close, when the handle is collected
  and at process exit. With a rate limiter, every add is sent at once and waits in the actor, so
  the limiter admits each call's rows whole, as it does locally. Such a handle's ``add``
  returns None (the slots are chosen when the batch arrives).
- **Sample, update, stats, clear, get_all_transitions, save** are Ray calls (after a flush).
  N-step staging stays in the handle, as for any handle; it commits through the queue.
- **Failures.** Every call is bounded: a call that gets no answer within ``call_timeout``
  seconds (calls that a rate limiter holds back: their own timeout, while the actor answers a
  ping every second), or whose actor or node is gone, raises :class:`RemoteBufferError`. The
  next call starts a new proxy when the owner is still there. A client killed while it had
  rows queued loses those rows (at most one batch: ``flush_rows`` rows or ``flush_seconds``
  of adds); rows of a flush that was in flight are in the buffer or not, whole.

Nothing here imports Ray until a remote handle or a proxy is made: the core works without it.

Examples
--------
>>> from cpprb_ray import remote
>>> settings = remote.configure(flush_rows=512)
>>> settings["flush_rows"], sorted(settings)
(512, ['call_timeout', 'flush_bytes', 'flush_rows', 'flush_seconds'])
>>> _ = remote.configure(flush_rows=1024)
"""

from __future__ import annotations

import json
import weakref
from typing import Any, Dict, Optional, Type

from cpprb_ray import _client, _layout, _rules, _store
from cpprb_ray._client import NAMESPACE, RemoteBufferError, proxy_name

__all__ = ["NAMESPACE", "RemoteBufferError", "configure", "proxy_name"]


def configure(**settings: float) -> Dict[str, float]:
    """Set how remote handles in this process batch and wait; returns every setting.

    ``flush_rows`` (1024) and ``flush_bytes`` (8 MiB): a queue that holds this many rows or
    bytes is sent at once. ``flush_seconds`` (0.05): the longest a queued row waits.
    ``call_timeout`` (60): seconds a call may go unanswered before :class:`RemoteBufferError`.
    They apply from the next call of every remote handle here.

    Examples
    --------
    >>> from cpprb_ray import remote
    >>> remote.configure(call_timeout=30.0)["call_timeout"]
    30.0
    >>> remote.configure(call_timeout=0)
    Traceback (most recent call last):
    ...
    ValueError: call_timeout must be > 0; got 0
    >>> _ = remote.configure(call_timeout=60.0)
    """
    known = _client._settings
    for key, value in settings.items():
        if key not in known:
            raise ValueError(f"unknown setting {key!r}; expected one of {sorted(known)}")
        number = _rules.as_count(value, key) if key in ("flush_rows", "flush_bytes") else \
            _rules.as_real(value, key)
        if not number > 0:
            raise ValueError(f"{key} must be > 0; got {value}")
        _client._settings[key] = number
    return dict(_client._settings)


# ---------------------------------------------------------------------------------------------
# Pickling and unpickling (called by buffer.py)


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
    header = _store.read_header(handle._segment.memory)
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
    store = _client.RemoteStore(backend, location, token, state, layout.columns)
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


# ---------------------------------------------------------------------------------------------
