"""Batches sampled ahead of a learner on a background thread: ``rb.prefetch(batch_size)``.

A learner alternates a sample, a network step and an update of priorities. The sample kernel
releases the GIL, so a thread can draw the next batch while the learner's step runs: the
learner then finds its batch ready. :class:`Prefetch` is that thread and its ring of `depth`
output sets, each filled in place through the handle's own ``sample(..., out=)`` (so it works
for every kind of buffer whose ``sample`` takes ``out=``: plain, prioritized, laned, frames,
N-step, remote handles).

The contract (docs/learner.md):

- Batch ``k`` goes into set ``k % depth``. The thread refills a set only once the learner has
  asked for the batch after the one it holds: a yielded batch stays valid until the learner's
  next ``next()``, which is also when its set may be refilled with batch ``k + depth``. So the
  thread keeps up to ``depth - 1`` batches ready ahead of the one in use. ``copy=True``
  yields owned copies (and frees the set at once).
- Once the ring is full the thread waits for the learner to give back a set, without the GIL
  (``_sync.SpinCounter``) and, on a buffer of this host, inside the store's own call
  (``ReplayStore.hold_calls``), so that its sample starts the moment the set comes back,
  whoever holds the GIL then. It spins at most ``SPIN_SECONDS``: a learner whose step is
  short hands the set over with no system call and no wake-up. Where the steps outlast the
  spin the thread spins less and less and looks for the set every few tens of microseconds
  instead, sleeping in between (``POLL_SECONDS`` at most), so the learner still wakes nobody;
  a learner slower than that (or stopped) finds the thread asleep until it has taken every
  batch ready: one wake-up (a system call of its ``next()``) per ``depth - 1`` batches. Either
  side stops spinning after LATE_AFTER waits in a row that outlasted the spin (a learner that
  the rate limiter holds back leaves the core to the actors it waits for), and a spin yields
  the core to any process waiting for it. A ``next()`` whose batch is ready takes no lock and
  runs no Python (``_sync.HandIterator``); one whose batch is not spins, then sleeps.
- No allocation per batch: the sets are allocated once, from the first batch's arrays.
- ``beta`` may be a callable of the batch number ``k`` (0, 1, ...): annealing.
- Rate limiters keep their exact semantics: a batch counts as sampled when the thread draws
  it; the thread's sample waits with `timeout`, and a TimeoutError reaches the learner at its
  ``next()`` (nothing was sampled; the next ``next()`` tries again).
- Any other error of the thread reaches the learner at its next ``next()``, and ends the
  iterator. ``close()`` (or leaving the ``with``) stops the thread within a bounded time, also
  while the limiter holds it back (its wait is interrupted; a remote handle's wait runs in the
  buffer's proxy, and ends there: the thread is then left to finish on its own, and its batch
  is dropped).
- Priorities updated while batches wait in the ring are applied as usual; a batch sampled
  before such an update carries the weights of before it (its ``generations`` keep a late
  update of an overwritten slot safe).

Examples
--------
>>> import numpy as np
>>> from cpprb_ray import PrioritizedReplayBuffer
>>> with PrioritizedReplayBuffer(64, {"obs": {}}, seed=0) as rb:
...     _ = rb.add(obs=np.arange(10.0))
...     with rb.prefetch(4, beta=lambda step: min(1.0, 0.4 + 0.1 * step)) as batches:
...         for _ in range(3):
...             batch = next(batches)
...             _ = rb.update_priorities(batch["indexes"], np.ones(4), batch["generations"])
...     print(batch["obs"].shape, sorted(batch))
(4, 1) ['generations', 'indexes', 'obs', 'weights']
"""

from __future__ import annotations

import collections
import importlib
import inspect
import threading
import time
import weakref
from typing import Any, Callable, Deque, Dict, List, Optional, Sequence, Union

import numpy as np

from cpprb_ray import _rules
from cpprb_ray._store import ReplayStore
from cpprb_ray._sync import HandIterator, Handover, SpinCounter, SpinExpired, wake_one

__all__ = ["Prefetch"]

TENSORS = (None, "numpy", "torch", "jax")
# How long close() waits for the thread. A local wait (for the lock or the limiter) ends within
# one slice (50 ms) once interrupted, and a kernel runs for micro- to milliseconds; only a
# remote handle's call, which waits in the proxy actor, may take longer (then it is left).
JOIN_SECONDS = 5.0

Beta = Union[float, Callable[[int], float]]
NEVER = 1 << 62
# The longest spin of either side before it sleeps: a few Ape-X samples, 1/30 of a pixel
# learner's step. Where its spin runs out, the thread goes on looking for the set it waits for
# every few tens of microseconds, sleeping in between, for POLL_SECONDS more (so the learner
# never has to wake it), and only then sleeps until the learner wakes it. It stops spinning
# once LATE_AFTER sets in a row came later than a spin lasts (a learner whose steps are longer
# gets its core back), and spins again as soon as one comes sooner (the steps became shorter):
# one late set (the learner descheduled once) costs nothing.
SPIN_SECONDS = 200e-6
POLL_SECONDS = 0.02
LATE_AFTER = 8


class _Ring:
    """What the learner's iterator and the thread share (the thread holds this, never the
    iterator, so that an iterator dropped without close() is collected and stops it).

    The hand-over is lock-free on its common path: the thread appends to `ready` (None for a
    batch, in order, or the exception that replaces one) and the learner pops from it (a
    deque's append and popleft are atomic); the learner counts the sets it gave back in
    `hand.released`, which only it writes (`hand`: the learner's side, in C:
    ``_sync.Handover``). Each side sleeps on a lock of its own (`thread_wake`,
    `learner_wake`: held while no wake-up is pending) only when it has to wait, and the other
    side releases that lock after changing what the sleeper waits for: a learner whose batch
    is ready takes it without a lock, a wait or waking anyone but the thread that waits for
    the set it gives back. (A threading.Condition is Python code on both sides of every
    batch, run while the other side waits for the GIL.)"""

    def __init__(self, depth: int, sets: Optional[List[Dict[str, np.ndarray]]]) -> None:
        self.depth = depth
        self.sets: List[Optional[Dict[str, np.ndarray]]] = (
            list(sets) if sets is not None else [None] * depth)
        # Per batch in batch order: None (the batch is in set k % depth) or the exception.
        self.ready: Deque[Optional[BaseException]] = collections.deque()
        # The same counts, for the other side's spin: the sets the learner gave back (its
        # hand's `released`) and the entries of `ready` ever appended (set by the thread, after
        # each append).
        self.given_back = SpinCounter()
        self.appended = SpinCounter()
        self.pending_timeout = False   # a TimeoutError waits for the learner to see it
        self.sleeps = 0                # times the thread slept for a set (Prefetch.thread_sleeps)
        self.stop = False
        self.exited = False
        self.thread_wake = threading.Lock()
        self.learner_wake = threading.Lock()
        self.thread_wake.acquire()
        self.learner_wake.acquire()
        # The learner's side. It wakes the thread once `hand.released` reaches `hand.wake_at`
        # (the thread sets it before it sleeps; NEVER while it runs).
        self.hand = Handover(depth, self.ready, self.thread_wake, self.given_back)
        # Orders an interrupt of the thread's waits against their undoing at its exit (an
        # interrupt after that would stay on a thread id the system may reuse).
        self.guard = threading.Lock()
        self.ident: Optional[int] = None
        self.interrupt: Optional[Callable[[int], None]] = None
        self.resume: Optional[Callable[[int], None]] = None

    def request_stop(self) -> None:
        """Stop the thread: at once where it waits for a set, within one slice where it waits
        on the buffer (the store interrupts that thread's waits)."""
        self.stop = True
        self.given_back.stop()   # a spin for a set ends at once
        with self.guard:
            if not self.exited and self.ident is not None and self.interrupt is not None:
                self.interrupt(self.ident)
        wake_one(self.thread_wake)


def _allocator(tensors: Optional[str]) -> Callable[[np.ndarray], np.ndarray]:
    """How a set's arrays are allocated, like a first batch's array: plain numpy, or (torch
    with CUDA) page-locked memory, so that ``.to("cuda", non_blocking=True)`` overlaps."""
    if tensors == "torch":
        torch = importlib.import_module("torch")
        if torch.cuda.is_available():
            def pinned(like: np.ndarray) -> np.ndarray:
                tensor = torch.empty(like.shape, dtype=torch.from_numpy(like[:0]).dtype,
                                     pin_memory=True)
                return tensor.numpy()
            return pinned
    return np.empty_like


# What goes back to update_priorities, not to a network: numpy arrays whatever `tensors` says
# (JAX's default 32-bit mode would truncate a uint64 generation).
BOOKKEEPING = ("indexes", "generations")


def _views(arrays: Dict[str, np.ndarray], tensors: Optional[str]) -> Dict[str, Any]:
    """The objects yielded for one set: the arrays, or tensors over them (torch: made once per
    set, views of its memory; jax: made per batch, since JAX copies where it cannot share)."""
    # Imported by name: neither is a dependency (nor has stubs here).
    if tensors == "torch":
        convert = importlib.import_module("torch").from_numpy
    elif tensors == "jax":
        convert = importlib.import_module("jax.dlpack").from_dlpack
    else:
        return dict(arrays)
    return {key: value if key in BOOKKEEPING else convert(value)
            for key, value in arrays.items()}


def _sleep_for_set(ring: _Ring, k: int, wake_after: int) -> None:
    """Sleep until the learner has taken every batch ready (it then holds the last): once
    it gave back set k - depth + wake_after - 1 (after a TimeoutError: once it saw that)."""
    hand = ring.hand
    wake_at = NEVER if ring.pending_timeout else k - ring.depth + wake_after
    hand.wake_at = wake_at
    if hand.released < wake_at or ring.pending_timeout:
        ring.sleeps += 1
        ring.thread_wake.acquire()   # released by the learner (or close())
    hand.wake_at = NEVER


def _next_spin(late: int, waited: float) -> tuple:
    """The thread's next (spin, late) after a wait for a set that took `waited` seconds (or
    did not end: infinity), `late` waits in a row having taken longer than a spin before it."""
    if waited <= SPIN_SECONDS:
        return SPIN_SECONDS, 0
    late += 1
    return (0.0 if late >= LATE_AFTER else SPIN_SECONDS), late


def _run(ring: _Ring, sample: Callable[..., Dict[str, np.ndarray]], batch_size: int,
         beta: Beta, takes_beta: bool, timeout: Optional[float],
         allocate: Callable[[np.ndarray], np.ndarray], store: Any) -> None:
    """The thread: draw batch k into set k % depth once the learner gave that set back. Its
    Python per batch is this loop and the sample call: the learner waits for the GIL while
    the thread holds it, so nothing else is done here (no dict, no lock but a wait's)."""
    k = 0
    depth = ring.depth
    ready = ring.ready
    sets = ring.sets
    learner_wake = ring.learner_wake
    # Once the ring is full, the thread spins for the next set (`spin` seconds at most: while
    # the learner's steps are short, a set comes back within it and is refilled at once, with
    # no system call on either side), then polls for it (POLL_SECONDS at most, nanosleeps in
    # between). On a local store the wait is armed on `given_back` and waited by the store's
    # call itself (hold_calls), in the same stretch without the GIL as its kernel: the sample
    # starts the moment the set comes back. A thread that waited here first needed the GIL to
    # call the store, which the learner holds from its next() until its step lets it go, and
    # the sample that started that late still held the buffer's lock when the learner came to
    # update its priorities. Where the poll runs out too, the thread sleeps until the learner
    # has taken every batch ready: one wake-up per depth - 1 batches, not one per batch.
    # Waking a sleeping thread costs the waker a system call and, where the other core idles,
    # an interrupt of it: 8 to 16 us of the learner's next() on a 2-core virtual machine, a
    # lock release without a sleeper 0.2 us; and the thread starts its sample only once the
    # scheduler runs it again.
    wake_after = max(1, depth - 1)
    hand = ring.hand
    given_back = ring.given_back
    appended = ring.appended
    entries = 0       # appended to `ready`
    spin = SPIN_SECONDS
    late = 0          # waits in a row for a set that took longer than a spin
    ident = threading.get_ident()
    held = store is not None
    if held:
        store.hold_calls(ident, given_back)
    try:
        while True:
            waited = False
            while k >= hand.released + depth or ring.pending_timeout:
                if ring.stop:
                    return
                if not ring.pending_timeout:
                    waited = True
                    if held:   # spun, then polled, by the sample's call
                        given_back.arm(k - depth + 1, spin, POLL_SECONDS)
                        break
                    if given_back.wait_for(k - depth + 1, spin, POLL_SECONDS):
                        break   # set k % depth is back: no sleep, no wake-up
                    spin, late = _next_spin(late, float("inf"))
                    waited = False
                    if ring.stop:
                        return
                _sleep_for_set(ring, k, wake_after)
            if ring.stop:
                return
            out = sets[k % depth]
            try:
                if takes_beta:
                    result = sample(batch_size, beta(k) if callable(beta) else beta, out=out,
                                    timeout=timeout)
                else:
                    result = sample(batch_size, out=out, timeout=timeout)
                if out is None:
                    # The first batch, in fresh arrays: the ring's sets are made like them,
                    # once (the first of them gets this batch).
                    made = [{key: allocate(value) for key, value in result.items()}
                            for _ in range(depth)]
                    for key, value in result.items():
                        np.copyto(made[0][key], value)
                    sets[:] = made
            except SpinExpired:   # the set did not come back within the wait (or close())
                if ring.stop:
                    return
                spin, late = _next_spin(late, float("inf"))
                _sleep_for_set(ring, k, wake_after)
                continue
            except TimeoutError as error:
                ring.pending_timeout = True   # tried again once the learner saw it
                ready.append(error)
                entries += 1
                appended.set(entries)
                wake_one(learner_wake)
                continue
            except BaseException as error:  # noqa: BLE001 (the learner's to see)
                if not ring.stop:
                    ready.append(error)
                return
            if waited:
                spin, late = _next_spin(late, given_back.last_wait)
            ready.append(None)
            entries += 1
            appended.set(entries)
            wake_one(learner_wake)
            k += 1
    finally:
        if held:
            store.release_calls(ident)
        with ring.guard:
            ring.exited = True
            if ring.ident is not None and ring.resume is not None:
                ring.resume(ring.ident)   # an interrupt_waits of this thread, undone
        wake_one(learner_wake)


class Prefetch(HandIterator):
    """An iterator of batches sampled ahead on a background thread; also a context manager.

    Made by ``rb.prefetch(batch_size, *, beta=0.4, depth=2, timeout=None, out=None,
    copy=False, tensors=None)`` (see :meth:`cpprb_ray.ReplayBuffer.prefetch`), which documents
    the arguments. ``next()`` returns the next batch (a dict, as ``sample`` returns), raises
    the thread's error, or StopIteration once closed.

    Attributes
    ----------
    batches : int
        Batches the learner has taken.
    wait_seconds : float
        Seconds the learner spent waiting in ``next()`` for a batch not yet ready: what
        prefetching did not hide.
    thread_sleeps : int
        Times the thread slept until the learner gave a set back (each one a wake-up in a
        ``next()``), where its spin and its poll ran out: about one per ``depth - 1`` batches
        when the learner's steps outlast ``POLL_SECONDS``, none when they are shorter.

    Examples
    --------
    >>> from cpprb_ray import ReplayBuffer
    >>> with ReplayBuffer(16, {"obs": {}}, seed=0) as rb:
    ...     _ = rb.add(obs=[1.0, 2.0, 3.0])
    ...     batches = rb.prefetch(2, depth=3)
    ...     first = next(batches)
    ...     print(sorted(first), first["obs"].shape, batches.batches)
    ...     batches.close()
    ...     print(next(batches, "done"))
    ['generations', 'indexes', 'obs'] (2, 1) 1
    done
    """

    def __init__(self, rb: Any, batch_size: int, *, beta: Beta = 0.4, depth: int = 2,
                 timeout: Optional[float] = None,
                 out: Optional[Sequence[Dict[str, np.ndarray]]] = None, copy: bool = False,
                 tensors: Optional[str] = None) -> None:
        batch_size = _rules.as_count(batch_size, "batch_size")
        if batch_size <= 0:
            raise ValueError(f"batch_size must be > 0; got {batch_size}")
        if not callable(beta):
            beta = _rules.as_real(beta, "beta")
            if beta < 0:
                raise ValueError(f"beta must be >= 0 or a callable of the batch number; got "
                                 f"{beta}")
        depth = _rules.as_count(depth, "depth")
        if depth < 1:
            raise ValueError(f"depth must be >= 1; got {depth}")
        _rules.as_timeout(timeout)
        if not isinstance(copy, (bool, np.bool_)):
            raise TypeError(f"copy must be a bool; got {type(copy).__name__}")
        if tensors not in TENSORS:
            raise ValueError(f"tensors must be one of None, 'numpy', 'torch', 'jax'; got "
                             f"{_rules.shown(repr(tensors))}")
        if tensors == "numpy":
            tensors = None
        if tensors == "torch":
            _require("torch", "tensors='torch'")
        elif tensors == "jax":
            _require("jax", "tensors='jax'")
        if out is not None:
            out = _check_out(out, depth)
        if rb.closed:
            raise ValueError("operation on a closed buffer")
        sample = rb.sample
        self._tensors = tensors
        self._copy = bool(copy)
        self._ring = ring = _Ring(depth, out)
        self._hand = self.hand = ring.hand   # next() on a ready batch: HandIterator's, in C
        self._ready = ring.ready
        self._depth = depth
        self.wait_seconds = 0.0
        # The learner's own spin for a batch not ready, adapted as the thread's: a learner that
        # the rate limiter holds back (the thread waits on the limiter) stops spinning after
        # LATE_AFTER late batches, and leaves the core to the actors that it waits for.
        self._spin, self._late = SPIN_SECONDS, 0
        store = getattr(rb, "_store", None)
        ring.interrupt = getattr(store, "interrupt_waits", None)
        ring.resume = getattr(store, "resume_waits", None)
        # A store in this process spins for the set in its own call (hold_calls); a remote
        # handle's runs in its proxy, so its thread spins here before it calls.
        local = isinstance(store, ReplayStore)
        takes_beta = "beta" in inspect.signature(sample).parameters
        self._thread = threading.Thread(
            target=_run, name=f"cpprb_ray prefetch {rb.name}", daemon=True,
            args=(ring, sample, batch_size, beta, takes_beta, timeout, _allocator(tensors),
                  store if local else None))
        with ring.guard:
            self._thread.start()
            ring.ident = self._thread.ident
        self._finalizer = weakref.finalize(self, ring.request_stop)

    # -- the iterator ---------------------------------------------------------------------------

    def _next_waited(self) -> Dict[str, Any]:
        """next() where the hand's common path did not take a batch: wait for one, raise the
        thread's error, make a set's views, or copy (`copy=True`)."""
        ring, hand = self._ring, self._hand
        ready = self._ready
        if not ready:
            self._wait(ring)
        try:
            failed = ready.popleft()
        except IndexError:   # the thread ended without a word: it was stopped
            self.done = True
            raise StopIteration from None
        hand.taken += 1
        if failed is not None:
            if isinstance(failed, TimeoutError):
                ring.pending_timeout = False
                wake_one(ring.thread_wake)
            else:
                self.done = True
            raise failed
        k = hand.batches
        hand.batches = k + 1
        if self._copy:
            # The set's arrays copied by numpy, then made tensors: a tensor library's own copy
            # of a tensor over the set may share it (JAX takes its arrays for immutable, and
            # its copy of one over memory it does not own came back refilled by the thread).
            arrays = ring.sets[k % self._depth]
            assert arrays is not None   # filled before its batch was queued
            batch = _views({key: value.copy() for key, value in arrays.items()}, self._tensors)
            hand.give_back()
            return batch
        views = hand.views[k % self._depth]
        if views is None:
            views = self._views_of(k % self._depth)
        hand.held = True
        return dict(views)

    @property
    def batches(self) -> int:
        return int(self._hand.batches)

    def _wait(self, ring: _Ring) -> None:
        """Spin, then sleep, until the thread has a batch (or an error) ready, or has ended."""
        started = time.perf_counter()
        ready = ring.ready
        ring.appended.wait_for(self._hand.taken + 1, self._spin)
        while not ready and not ring.exited:
            ring.learner_wake.acquire()   # the thread releases it after each batch
        waited = time.perf_counter() - started
        self.wait_seconds += waited
        self._spin, self._late = _next_spin(self._late, waited)

    def _views_of(self, slot: int) -> Dict[str, Any]:
        """What the learner gets of set `slot`: made once per set (jax: per batch)."""
        arrays = self._ring.sets[slot]
        assert arrays is not None   # filled before its batch was queued
        views = _views(arrays, self._tensors)
        if self._tensors != "jax":
            self._hand.views[slot] = views
        return views

    @property
    def thread_sleeps(self) -> int:
        return self._ring.sleeps

    # -- lifetime -------------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called (or the thread ended on an error the learner saw).

        Examples
        --------
        >>> from cpprb_ray import ReplayBuffer
        >>> with ReplayBuffer(8, {"obs": {}}) as rb:
        ...     _ = rb.add(obs=1.0)
        ...     with rb.prefetch(1) as batches:
        ...         _ = next(batches)
        ...     print(batches.closed)
        True
        """
        return self.done

    def close(self) -> None:
        """Stop the thread and wait for it (bounded: see the module's notes). Idempotent; the
        batches sampled ahead are dropped (the rate limiter counted them as sampled).

        Examples
        --------
        >>> from cpprb_ray import MinSize, ReplayBuffer
        >>> with ReplayBuffer(8, {"obs": {}}, rate_limiter=MinSize(4)) as rb:
        ...     batches = rb.prefetch(2)      # the limiter holds its thread back: 0 rows
        ...     batches.close()               # interrupted within one 50 ms slice
        ...     print(batches.closed, rb.stats()["rate_limiter"]["sample_timeouts"])
        True 0
        """
        self.done = True
        self._ring.request_stop()
        if self._thread.ident != threading.get_ident():
            self._thread.join(JOIN_SECONDS)

    def __enter__(self) -> Prefetch:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()


def _require(module: str, what: str) -> None:
    try:
        importlib.import_module(module)
    except ImportError as error:
        raise ImportError(f"{what} needs {module}, which is not installed here "
                          f"({error})") from None


def _check_out(out: Any, depth: int) -> List[Dict[str, np.ndarray]]:
    """`out`: `depth` output sets (dicts of arrays, as ``sample(out=)`` takes each; their
    shapes and dtypes are checked by the first sample into each)."""
    if isinstance(out, dict) or not isinstance(out, (list, tuple)):
        raise TypeError(f"out must be a list of {depth} dicts of arrays (one per set of the "
                        f"ring, depth={depth}); got {type(out).__name__}")
    if len(out) != depth:
        raise ValueError(f"out must hold depth={depth} output sets; got {len(out)}")
    for position, arrays in enumerate(out):
        if not isinstance(arrays, dict) or not all(
                isinstance(value, np.ndarray) for value in arrays.values()):
            raise TypeError(f"out[{position}] must be a dict of numpy arrays; got "
                            f"{type(arrays).__name__}")
    ids = [id(value) for arrays in out for value in arrays.values()]
    if len(set(ids)) != len(ids):
        raise ValueError("out's sets must not share arrays: each set holds its own batch")
    return list(out)
