"""Handles on other nodes of a Ray cluster: clients of one proxy actor on the owner's node.

A handle unpickled in a process that can see its segment attaches to it in place (buffer.py).
One unpickled on a Ray node that cannot (another host, or a node in its own mount namespace)
becomes a *remote handle* of the same class and API, whose store is a ``RemoteStore``
(:mod:`cpprb_ray.remote._client`): a client of the buffer's proxy actor
(:mod:`cpprb_ray.remote._proxy`), which opens the segment on the owner's node the way a handle
does (:mod:`cpprb_ray._open`). The pickling glue that turns an unpickled handle into one or
the other is :mod:`cpprb_ray.remote._pickling`. Nothing in this package imports the public
classes: the handle's class comes in as an argument.

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
  N-step staging of a plain buffer stays in the handle, as for any handle; it commits through
  the queue.
- **Laned buffers** (lanes, next_of, stack_compress, N-step in lanes): each remote handle's
  writer (its lane, frame cache and N-step staging) lives in the proxy, one per handle (a
  client id); its batches go there as writer adds, its first add at once (it claims the lane:
  LaneError as on one host). on_episode_end and close send the queue, then end or close that
  writer. A writer whose handle made no call for ``writer_lease`` seconds (a live handle's
  background thread calls every quarter of it) is closed by the proxy: its staged steps commit
  as a truncated episode end and its lane is given back.
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
(512, ['call_timeout', 'flush_bytes', 'flush_rows', 'flush_seconds', 'writer_lease'])
>>> _ = remote.configure(flush_rows=1024)
"""

from __future__ import annotations

from typing import Dict

from cpprb_ray import _rules
from cpprb_ray.remote import _client
from cpprb_ray.remote._client import NAMESPACE, RemoteBufferError, proxy_name
from cpprb_ray.remote._pickling import client, pickle_state, stop_proxy

__all__ = ["NAMESPACE", "RemoteBufferError", "client", "configure", "pickle_state", "proxy_name",
           "stop_proxy"]


def configure(**settings: float) -> Dict[str, float]:
    """Set how remote handles in this process batch and wait; returns every setting.

    ``flush_rows`` (1024) and ``flush_bytes`` (8 MiB): a queue that holds this many rows or
    bytes is sent at once. ``flush_seconds`` (0.05): the longest a queued row waits.
    ``call_timeout`` (60): seconds a call may go unanswered before :class:`RemoteBufferError`.
    ``writer_lease`` (60): seconds the proxy keeps a laned buffer's writer (its lane and
    staged N-step steps) for a remote handle of this process that makes no call (a live
    handle calls every quarter of it: only a dead or stopped one loses its writer).
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
