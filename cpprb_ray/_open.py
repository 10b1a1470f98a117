"""The one path by which an existing segment is opened: mapped, its layout read and checked, its
identity checked against a handle's token, and its store bound (refusing a lock that no live
thread holds). Handles (:mod:`cpprb_ray.buffer`) and the remote package's proxy actor
(:mod:`cpprb_ray.remote._proxy`) both open segments through it.

Examples
--------
>>> from cpprb_ray import ReplayBuffer, _open
>>> with ReplayBuffer(4, {"obs": {}}) as rb:
...     segment, layout = _open.open_segment(rb.backend, rb.name, rb._layout.token)
...     store = _open.open_store(segment, layout, prioritized=False, seed=0, view=True)
...     print(layout.capacity, store.stored_size)
...     store.release()
...     segment.close()
4 0
"""

from __future__ import annotations

import errno
import time
from typing import Any, Optional, Tuple

from cpprb_ray import _layout, _memory, _proc, _store


def open_segment(backend: str, location: str,
                 token: Optional[str] = None) -> Tuple[_memory.Segment, _layout.Layout]:
    """Map the segment at `location` and read its layout (ValueError for one that is not a valid
    cpprb_ray buffer). With `token` (unpickling), FileNotFoundError unless the segment there is
    that very buffer in this machine's memory: same identity token, made under this boot."""
    segment = _memory.attach(backend, location)
    try:
        _, layout = _layout.read(segment.memory, segment.size, location)
        if token is not None:
            check_identity(layout, token, location)
        return segment, layout
    except BaseException:
        segment.close()
        raise


def check_identity(layout: _layout.Layout, token: str, location: str) -> None:
    """FileNotFoundError unless `layout` is the buffer whose identity token is `token`, in
    memory this process shares with its owner."""
    if layout.token != token:
        raise FileNotFoundError(errno.ENOENT, "the segment at this name is another buffer than "
                                              "the handle's (its identity token differs: "
                                              "another host's /dev/shm, or a new buffer under "
                                              "the name)", location)
    boot = layout.meta.get("boot_id")
    if boot is not None and boot != _proc.boot_id():
        # The same file seen from another kernel (a shared disk): not shared memory.
        raise FileNotFoundError(errno.ENOENT, f"the segment at this name was made under another "
                                              f"kernel boot ({boot}): another host's file",
                                location)


def open_store(segment: _memory.Segment, layout: _layout.Layout, *, prioritized: bool,
               seed: Optional[int] = None, lock_timeout: float = 60.0,
               view: bool = True) -> Any:
    """The ReplayStore of a mapped segment, for a handle of the given kind (`prioritized`: its
    adds may carry priorities and its samples weigh rows). A `view` (not the creating process)
    refuses a segment whose lock names a thread that does not exist."""
    store = _store.ReplayStore(segment.memory, layout.columns, seed, lock_timeout,
                               prioritized=prioritized)
    if view:
        check_lock_holder(store, segment.location)
    return store


def check_lock_holder(store: Any, location: str) -> None:
    """Refuse a segment whose lock names a thread that does not exist (corrupt or foreign):
    waiting for it would hang forever. A live holder lets go within moments. The store is
    released when it is refused."""
    deadline = time.monotonic() + 0.5
    first = store.lock_owner()
    while True:
        holder = store.lock_owner()
        # Free, held by a live thread, or changing hands (a holder in another pid namespace
        # sharing /dev/shm is invisible in /proc but lets go): all fine.
        if holder == 0 or holder != first or _proc.thread_exists(holder):
            return
        if time.monotonic() > deadline:
            store.release()
            raise _layout.corrupt(location, f"its lock is held by thread {holder}, which does "
                                            f"not exist")
        time.sleep(0.01)
