"""Children of tests/test_rate_limit.py: processes that add, sample, wait and report.

forkserver (and spawn) children import this module by name; the test module puts this
directory on ``sys.path`` first. Every child reports over a Pipe: ``(tag, payload)`` tuples, and
``("error", traceback)`` if it fails. Times are ``time.monotonic()``: CLOCK_MONOTONIC, the same
clock in every process of the host, so a parent can subtract a child's time from its own.
"""

from __future__ import annotations

import signal
import time
import traceback
from typing import Any, Dict

import numpy as np

ENV = {"obs": {"shape": 2}, "act": {"dtype": np.int64}, "rew": {}, "next_obs": {"shape": 2},
       "done": {}}


def batch_of(count: int, first: int = 0) -> Dict[str, np.ndarray]:
    serials = np.arange(first, first + count)
    obs = np.stack([serials, serials + 0.5], axis=1).astype(np.float32)
    return {"obs": obs, "act": serials, "rew": serials * 0.5, "next_obs": obs + 1.0,
            "done": np.zeros(count)}


def _reporting(function):
    """Run a child's body; a failure goes back to the parent as ("error", traceback)."""
    def child(conn, *args):
        try:
            function(conn, *args)
        except BaseException:
            conn.send(("error", traceback.format_exc()))
        finally:
            conn.close()
    child.__name__ = function.__name__
    child.__qualname__ = function.__qualname__
    return child


def _sample(rb, batch: int, timeout: Any):
    if hasattr(rb, "update_priorities"):
        return rb.sample(batch, 0.4, timeout=timeout)
    return rb.sample(batch, timeout=timeout)


@_reporting
def wake_sampler(conn, rb, rounds: int, batch: int, timeout: float) -> None:
    """Sample `rounds` times, each held back until the parent adds; report when each returned."""
    conn.send(("ready", time.monotonic()))
    for _ in range(rounds):
        _sample(rb, batch, timeout)
        conn.send(("woke", time.monotonic()))
    conn.send(("done", rb.stats()))
    rb.close()


@_reporting
def wake_adder(conn, rb, rounds: int, timeout: float) -> None:
    """Add one row `rounds` times, each held back until the parent samples; report each return."""
    conn.send(("ready", time.monotonic()))
    for k in range(rounds):
        rb.add(**batch_of(1, 1000 + k), timeout=timeout)
        conn.send(("woke", time.monotonic()))
    conn.send(("done", rb.stats()))
    rb.close()


@_reporting
def writer(conn, rb, start, seconds: float, rows: int, first: int, timeout: float,
           delay: float = 0.0) -> None:
    """Add batches of `rows` until `seconds` have passed (each add waits at most `timeout`),
    beginning `delay` seconds after `start`."""
    start.wait(30)
    time.sleep(delay)
    deadline = time.monotonic() + seconds - delay
    added = timeouts = 0
    while time.monotonic() < deadline:
        try:
            rb.add(**batch_of(rows, first + added), timeout=timeout)
            added += rows
        except TimeoutError:
            timeouts += 1
    conn.send(("done", {"added": added, "timeouts": timeouts}))
    rb.close()


@_reporting
def learner(conn, rb, start, seconds: float, batch: int, timeout: float) -> None:
    """Sample `batch` rows (and update their priorities) until `seconds` have passed."""
    start.wait(30)
    deadline = time.monotonic() + seconds
    sampled = timeouts = 0
    rng = np.random.default_rng(0)
    while time.monotonic() < deadline:
        try:
            result = _sample(rb, batch, timeout)
        except TimeoutError:
            timeouts += 1
            continue
        sampled += batch
        if hasattr(rb, "update_priorities"):
            rb.update_priorities(result["indexes"], rng.random(batch) + 0.1,
                                 result["generations"])
    conn.send(("done", {"sampled": sampled, "timeouts": timeouts}))
    rb.close()


@_reporting
def keep_going(conn, rb, side: str, rows: int, timeout: float, seconds: float) -> None:
    """Add (side "add") or sample (side "sample") `rows` at a time for `seconds`. Every 0.1 s
    (and after each timeout) it sends ("tick", totals): "ok" and "timeouts" so far, the time of
    the last success, the last TimeoutError's message. For kill tests: the parent kills it, or
    watches it go on or time out after its peers were killed."""
    deadline = time.monotonic() + seconds
    totals: Dict[str, Any] = {"ok": 0, "timeouts": 0, "last_ok": None, "message": None}
    conn.send(("ready", time.monotonic()))
    next_tick = 0.0
    k = 0
    while time.monotonic() < deadline:
        try:
            if side == "add":
                rb.add(**batch_of(rows, 10_000 + k), timeout=timeout)
            else:
                _sample(rb, rows, timeout)
            totals["ok"] += 1
            totals["last_ok"] = time.monotonic()
        except TimeoutError as error:
            totals["timeouts"] += 1
            totals["message"] = str(error)
            next_tick = 0.0
        k += rows
        now = time.monotonic()
        if now >= next_tick:
            conn.send(("tick", dict(totals, now=now)))
            next_tick = now + 0.1
    conn.send(("done", rb.stats()))
    rb.close()


@_reporting
def view_report(conn, name: str) -> None:
    """Attach by name; report the limiter and stats a view sees, and what it may do now."""
    import cpprb_ray

    with cpprb_ray.attach(name) as view:
        report: Dict[str, Any] = {"limiter": repr(view.rate_limiter),
                                  "stats": view.stats()}
        try:
            _sample(view, 1, 0)
            report["sample"] = "ok"
        except TimeoutError as error:
            report["sample"] = str(error)
        try:
            view.add(**batch_of(1, 500), timeout=0)
            report["add"] = "ok"
        except TimeoutError as error:
            report["add"] = str(error)
        report["after"] = view.stats()
    conn.send(("done", report))


@_reporting
def interrupted_sampler(conn, rb) -> None:
    """Wait in sample(timeout=None) until SIGINT; report how long after it the wait ended."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    conn.send(("ready", time.monotonic()))
    try:
        _sample(rb, 1, None)
        conn.send(("sampled", time.monotonic()))
    except KeyboardInterrupt:
        conn.send(("interrupted", time.monotonic()))
    rb.close()
