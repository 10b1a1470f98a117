"""Who frees a segment, and on which ways out of a process.

The process that created a buffer owns its segment and frees (unlinks) it; views never do, and
neither does a forked child that inherited the owner's handle: an :class:`Ownership` frees only in
the pid that made it. Freeing is tied to the segment's identity, not just its name: before
unlinking, the owner reads the token at that name and unlinks only if it is the token it created
(with ``name=``, the name may by then belong to another job's buffer).

The ways a process ends, and what frees its segments:

- ``close()``, the handle being collected, a normal interpreter exit: the handle's finalizer.
- A ``multiprocessing`` child (fork, forkserver) ends with ``os._exit`` after running
  ``multiprocessing.util``'s finalizers, not ``atexit``: a ``Finalize`` registered with an exit
  priority frees there (after the child's own children were joined).
- SIGTERM (``docker stop``, Kubernetes, ``Process.terminate()``): a handler installed when the
  first owner handle is created, see :func:`install_sigterm_handler`. An owner's claim starts
  as soon as its file exists, before the file is filled (see :class:`Ownership`).
- SIGKILL, the OOM killer, a crash, ``os._exit`` in a plain process: nothing can run;
  ``python -m cpprb_ray rm --orphans`` removes what they leave.

The token check leaves one race: if, between our reading the token and our unlink, somebody
removes our segment and creates another of the same name, we remove theirs. Closing that window
would take a lock shared by every process that may create the name; the window is two system
calls wide and needs a third party that removes our segment in it.
"""

from __future__ import annotations

import multiprocessing.util
import os
import signal
import threading
from typing import Any, Callable, Dict, Optional, Union

from cpprb_ray import _layout, _memory

__all__ = ["Ownership", "install_sigterm_handler"]

# Runs after multiprocessing has joined the process's own children (priority >= 0 runs before),
# so a child still attaching by name finds the segment.
_EXIT_PRIORITY = -10

# Ownerships of this process (and, after a fork, of the parent: the pid check skips those) that
# are not freed yet, for the SIGTERM handler.
_live: Dict[int, Ownership] = {}

_Handler = Union[Callable[[int, Any], Any], int, None]
_sigterm_enabled = True
_sigterm_previous: Optional[_Handler] = None
_sigterm_installed = False


class Ownership:
    """The right to free one segment: its backend, location, token, and the creating pid.

    An ownership taken while the segment is still being filled (`creating`: the file's
    identity from :func:`_memory.create`'s ``on_open``) frees the file with that identity,
    since its token is not written yet; :meth:`created` switches it to the token, once the
    header holds it (an inode number can be reused by another file; a token cannot).
    """

    __slots__ = ("backend", "location", "token", "creating", "pid", "_exit_finalizer",
                 "__weakref__")

    def __init__(self, backend: str, location: str, token: Optional[str],
                 creating: Optional[_memory.Identity] = None) -> None:
        self.backend = backend
        self.location = location
        self.token = token
        self.creating = creating
        self.pid = os.getpid()
        _live[id(self)] = self
        # obj=None: a finalizer kept until it runs or is cancelled (free() cancels it).
        self._exit_finalizer = multiprocessing.util.Finalize(
            None, self.free, exitpriority=_EXIT_PRIORITY)
        _install_sigterm_handler_if_allowed()

    def free(self) -> bool:
        """Unlink the segment if this is the creating process and the name still holds our
        segment; True if it was unlinked. Idempotent; safe to call from any of the paths above.
        """
        return self.forget() and self._unlink_if_ours()

    def forget(self) -> bool:
        """Give the right up without unlinking (the file is gone already: a failed create
        removed it, and another file may take its name, even its inode number, at once); True
        if this process held it until now."""
        if os.getpid() != self.pid:
            return False
        if _live.pop(id(self), None) is None:
            return False
        self._exit_finalizer.cancel()
        return True

    def created(self) -> None:
        """The segment's header now holds the token: free by token from now on."""
        self.creating = None

    def _unlink_if_ours(self) -> bool:
        if self.creating is not None:
            if _memory.identity_at(self.backend, self.location) != self.creating:
                return False
        elif self.token is None or _layout.token_at(self.backend, self.location) != self.token:
            return False
        return _memory.unlink(self.backend, self.location)


def _on_sigterm(signum: int, frame: Any) -> None:
    """Free this process's segments, then do what SIGTERM did before we were installed."""
    me = os.getpid()
    for ownership in list(_live.values()):
        if ownership.pid == me:
            # Not free(): the main thread may be inside free() for this very ownership (a
            # handler interrupts it), and the process may be about to die.
            try:
                ownership._unlink_if_ours()
            except Exception:  # noqa: BLE001 - freeing the others matters more than a report
                pass
    previous = _sigterm_previous
    if callable(previous):
        previous(signum, frame)
        return
    # SIG_DFL: die of SIGTERM as we would have, so the exit status still says so.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(me, signal.SIGTERM)


def _install_sigterm_handler_if_allowed() -> bool:
    global _sigterm_installed, _sigterm_previous
    if _sigterm_installed:
        return True
    if not _sigterm_enabled or threading.current_thread() is not threading.main_thread():
        return False
    current = signal.getsignal(signal.SIGTERM)
    # SIG_IGN means the process chose to survive SIGTERM; None, a handler set outside Python.
    if current is not signal.SIG_DFL and not callable(current):
        return False
    _sigterm_previous = current   # before the handler can run
    signal.signal(signal.SIGTERM, _on_sigterm)
    _sigterm_installed = True
    return True


def install_sigterm_handler(enabled: bool = True) -> bool:
    """Turn the SIGTERM cleanup of this process's buffers on (the default) or off.

    When a process creates its first buffer, cpprb_ray installs a SIGTERM handler (from the
    main thread, and only over the default action or a Python handler, never over SIG_IGN). On
    SIGTERM -- what ``docker stop``, Kubernetes and ``multiprocessing.Process.terminate()`` send
    -- it unlinks the segments this process created and then does what SIGTERM did before: calls
    the previous Python handler, or dies of SIGTERM. Views in other processes keep working; new
    attaches by name fail from then on, even if the previous handler lets the process go on.

    ``install_sigterm_handler(False)`` removes the handler (if it is still the current one) and
    stops buffers from installing it; segments are then left to ``close()``, normal exit and
    ``python -m cpprb_ray rm --orphans``. ``install_sigterm_handler(True)`` installs it now, e.g.
    after the program set its own SIGTERM handler, which it then calls.

    Parameters
    ----------
    enabled : bool
        Whether buffers of this process are freed on SIGTERM.

    Returns
    -------
    bool
        Whether the handler is installed now (False when disabled, or when it cannot be: not
        the main thread, or SIGTERM is ignored or handled outside Python).

    Examples
    --------
    >>> import cpprb_ray
    >>> cpprb_ray.install_sigterm_handler(False)  # buffers made from now on leave SIGTERM alone
    False
    >>> cpprb_ray.install_sigterm_handler()  # back to the default
    True
    """
    global _sigterm_enabled, _sigterm_installed, _sigterm_previous
    if not isinstance(enabled, bool):
        raise TypeError(f"enabled must be a bool; got {type(enabled).__name__}")
    _sigterm_enabled = enabled
    if enabled:
        return _install_sigterm_handler_if_allowed()
    if _sigterm_installed and signal.getsignal(signal.SIGTERM) is _on_sigterm:
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("install_sigterm_handler(False) must be called from the main "
                               "thread to remove the handler")
        signal.signal(signal.SIGTERM, _sigterm_previous)
    _sigterm_installed = False
    _sigterm_previous = None
    return False
