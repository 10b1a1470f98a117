"""Child processes for tests/test_endings.py: each makes or inherits a buffer and ends one way.

Top-level functions, importable by name, so that spawn and forkserver children can run them.
"""

from __future__ import annotations

import os
import signal
import traceback
from typing import Any, Optional

import cpprb_ray

ENV = {"obs": {"shape": 2}}

# Handles that outlive the function that made them (as a worker's state would): only what runs
# when the process ends can free them, not their collection when run() returns.
KEPT: list = []


def default_sigterm() -> None:
    """Start from SIGTERM's default action. A fork child inherits the parent's disposition: in
    a pytest process that ran Ray first, that is Ray's driver handler (sys.exit(15) on Ray
    2.7), which our handler then rightly chains to; these tests are about the default."""
    cpprb_ray.install_sigterm_handler(False)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    cpprb_ray.install_sigterm_handler(True)


def create_and_end(conn, backend: str, name: Optional[str], end: str) -> None:
    """Create a buffer (the child owns it), report its name, wait for the word, then end.

    end: "return" (the child's run() returns), "close_then_wait" (close it, report, wait for the
    word again, then return), or "block" (wait until terminated).
    """
    try:
        default_sigterm()
        rb = cpprb_ray.PrioritizedReplayBuffer(8, ENV, backend=backend, name=name)
        KEPT.append(rb)
        rb.add(obs=[1.0, 2.0])
        conn.send(("name", rb.name))
        if end == "close_then_wait":
            rb.close()
            conn.send(("closed", rb.name))
        if end == "block":
            conn.recv()   # never comes: the parent terminates us
        conn.recv()
    except BaseException:  # noqa: BLE001 - reported to the parent
        conn.send(("error", traceback.format_exc()))
        raise


def use_inherited(conn, rb: Any, end: str) -> None:
    """A fork child that holds the parent's owner handle (inherited, not unpickled)."""
    try:
        default_sigterm()
        rb.add(obs=[float(os.getpid()), 0.0])
        conn.send(("added", (rb.is_owner, rb.get_stored_size())))
        if end == "block":
            conn.recv()
    except BaseException:  # noqa: BLE001 - reported to the parent
        conn.send(("error", traceback.format_exc()))
        raise
