"""What every buffer handle is, whatever it stores and samples: the segment it was made or
opened on, its parts (chosen once: :mod:`cpprb_ray._parts`), its lifetime (the owner frees the
segment; views never do), pickling by name, checkpoints and statistics. The public classes
(:mod:`cpprb_ray.buffer`) add the cpprb API on top.

Examples
--------
>>> from cpprb_ray import ReplayBuffer
>>> from cpprb_ray._handle import Handle
>>> issubclass(ReplayBuffer, Handle)
True
"""

from __future__ import annotations

import os
import sys
import threading
import time
import weakref
from typing import Any, Dict, List, Mapping, Optional, Type, Union

from cpprb_ray import (
    _layout,
    _memory,
    _open,
    _parts,
    _rules,
    _segment,
    checkpoint,
    frames,
    nstep,
    prefetch,
    rate_limiters,
    remote,
)
from cpprb_ray._ownership import Ownership

PathLike = Union[str, "os.PathLike[str]"]

# The public class of each kind of buffer (False: uniform, True: prioritized), which the public
# module registers: what attach, load and unpickling make of a segment of that kind.
KINDS: Dict[bool, Type[Handle]] = {}


class Handle:
    """A handle on one buffer's segment: made (the owner) or opened (a view, or a remote handle
    on a node that cannot see it). Subclassed by the public classes; not made directly."""

    _prioritized = False
    _check_for_update = False   # PrioritizedReplayBuffer(check_for_update=True) and the MP ones
    _writer: Any                # where add's rows go (_parts: ring, lane, N-step)
    _sampler: Any               # what sample draws (_parts: ring, lanes, check_for_update)

    # -- construction helpers ---------------------------------------------------------------------

    def _create(self, size: Any, env_dict: Mapping[str, Any], backend: str, name: Optional[str],
                path: Optional[PathLike], seed: Optional[int], *, alpha: float,
                eps: float, lock_timeout: float,
                Nstep: Optional[Mapping[str, Any]] = None,
                rate_limiter: Optional[rate_limiters.RateLimiter] = None,
                next_of: frames.Names = None, stack_compress: frames.Names = None,
                lanes: Optional[int] = None,
                sequence: Optional[Mapping[str, Any]] = None) -> None:
        capacity = _rules.as_count(size, "size")
        if capacity <= 0:
            raise ValueError(f"size must be > 0; got {capacity}")
        limiter = rate_limiters.check_rate_limiter(rate_limiter, capacity)
        # The columns and the parts' configs, checked before anything is made.
        backend = _memory.resolve_backend(backend)
        layout, lane_config, _ = _parts.plan_layout(capacity, env_dict, self._prioritized,
                                                    backend, Nstep, next_of, stack_compress,
                                                    lanes, sequence)
        if path is not None and backend != "mmap":
            raise ValueError("path= needs backend='mmap'")
        if seed is not None and _rules.as_count(seed, "seed") < 0:
            raise ValueError(f"seed must be >= 0; got {seed}")
        slots = layout.capacity
        claimed: List[Ownership] = []

        def claim(location: str, identity: _memory.Identity) -> None:
            # Claimed for freeing as soon as the file exists: filling it takes a while, and a
            # SIGTERM meanwhile must not leave it behind.
            claimed.append(Ownership(backend, location, layout.token, creating=identity))

        try:
            segment = _memory.create(backend, layout.total_size, name=name,
                                     path=None if path is None else os.fspath(path),
                                     on_open=claim, hot=layout.hot_regions())
        except BaseException:
            for ownership in claimed:
                ownership.forget()   # create removed the file already
            raise
        try:
            _segment.initialize_segment(
                segment.memory, total_size=layout.total_size, capacity=slots,
                # A laned buffer always samples through its tree (a uniform one weighs every
                # row 1: alpha 0), since its rows are not the slots below a stored size.
                prioritized=self._prioritized or lane_config is not None, alpha=alpha, eps=eps,
                owner_pid=os.getpid(),
                layout_json=layout.to_json(), data_offset=layout.data_offset,
                tree_offset=layout.tree_offset,
                row_stride=layout.row_stride, created_ns=time.time_ns(),
                limiter=None if limiter is None else limiter.record())
            claimed[0].created()
            self._bind(segment, layout, ownership=claimed[0], seed=seed,
                       lock_timeout=lock_timeout)
        except BaseException:
            store = getattr(self, "_store", None)
            if store is not None:
                store.release()
            segment.close()
            # By identity before the token is written, by token after: never a file that took
            # the name since (an unlink by name alone would remove it).
            claimed[0].free()
            raise

    def _bind(self, segment: _memory.Segment, layout: _layout.Layout, *,
              ownership: Optional[Ownership], seed: Optional[int], lock_timeout: float = 60.0,
              store: Any = None) -> None:
        # `ownership`: the owner's (claimed when the file was made), None for a view.
        # First, before anything that must be released: a broken lane or N-step record refuses
        # the segment.
        lane_config = frames.LaneConfig.from_meta(layout.meta, layout.columns, segment.location)
        # N-step works on the columns add takes: a laned layout's public ones.
        add_columns = layout.columns if lane_config is None else lane_config.columns()
        self._nstep_config = nstep.NstepConfig.from_meta(layout.meta, add_columns,
                                                         segment.location)
        self._segment = segment
        self._layout = layout
        self._columns = layout.columns
        # `store`: a stand-in with ReplayStore's methods (cpprb_ray.remote's client of the proxy
        # actor, for a handle on a node that cannot see the segment); else the segment itself.
        self._store = store if store is not None else _open.open_store(
            segment, layout, prioritized=self._prioritized, seed=seed, lock_timeout=lock_timeout,
            view=ownership is None)
        try:
            self._choose_parts()
        except BaseException:
            self._store.release()
            raise
        # get_current_episode_len counts the rows stored since this (cpprb's episode length).
        self._episode_start = int(self._store.rows_added)
        self._owner = ownership is not None
        self._owner_pid = os.getpid()
        self._close_lock = threading.Lock()
        self._pickled_for_ray = False   # an owner's close then ends the buffer's proxy actor
        # The ownership frees only in this process, and only the segment with this layout's
        # token (see _ownership for every way out of a process that frees it).
        self._ownership = ownership
        self._finalizer = weakref.finalize(self, ownership.free) if ownership is not None else None
        if store is None and ownership is None:
            # Every sample reads the tree's lower levels and the rows at random places: in
            # 2 MiB pages those reads stop missing the TLB (docs/design.md, "Huge pages"). A
            # new segment got them as it was made (_memory.create's `hot`); one attached may
            # hold units nobody has made huge yet (its maker's budget, or another kernel's
            # settings then), and these copies cost up to about 3 s for 1 GiB.
            _memory.prefer_huge_pages(segment, layout.hot_regions())

    def _choose_parts(self) -> None:
        """This handle's writer and sampler (_parts.choose, the one place they are chosen), and
        the methods its hot calls go straight to: a cold call pays for every attribute and
        Python frame it touches."""
        layout = self._layout
        self._writer, self._sampler = _parts.choose(
            self._store, layout, self._segment.location,
            frames.LaneConfig.from_meta(layout.meta, layout.columns, self._segment.location),
            self._nstep_config, self._prioritized, self._check_for_update)
        self._add = self._writer.add
        self._sample = self._sampler.sample
        self._update = self._sampler.update
        self._image = _parts.image_of(self._store, layout)

    @classmethod
    def attach(cls, name_or_path: PathLike, *, seed: Optional[int] = None,
               lock_timeout: float = 60.0):
        """Open a view of an existing buffer from its name (shm) or path (mmap) alone.

        Raises FileNotFoundError when there is no such segment, ValueError when it is not a
        valid cpprb_ray buffer (foreign, truncated or corrupt) or not of this class's kind.

        Examples
        --------
        >>> from cpprb_ray import PrioritizedReplayBuffer
        >>> with PrioritizedReplayBuffer(8, {"obs": {}}) as rb:
        ...     rb.add(obs=1.5)
        ...     with PrioritizedReplayBuffer.attach(rb.name) as view:
        ...         print(view.get_stored_size(), view.is_owner)
        0
        1 False
        """
        backend, location = _memory.locate(name_or_path)
        return _open_view(cls, backend, location, seed, lock_timeout)

    @classmethod
    def _target_class(cls, prioritized: bool) -> Optional[Type[Handle]]:
        """The class of a handle that `cls` opens (attach, load) on a buffer of this kind: the
        buffer's own kind, or None when `cls` cannot stand for it (a uniform buffer through
        PrioritizedReplayBuffer, or any other kind through a subclass)."""
        uniform = KINDS[False]
        if prioritized != cls._prioritized and cls is not uniform:
            return None
        target = KINDS[prioritized]
        return target if issubclass(target, cls) else cls

    # -- checkpoints --------------------------------------------------------------------------

    def save(self, file: PathLike) -> None:
        """Write the buffer's whole state to `file`, atomically (docs/checkpoints.md).

        Every column of every stored row, the priorities (leaf weights), generations, next
        index, stored size, max priority, alpha, eps, env_dict, the N-step config and the rate
        limiter with its counts, copied as one consistent snapshot under the lock (other
        processes may go on adding; the copy holds the lock for one memory copy of the rows).
        The file is written beside `file`,
        fsynced and renamed over it: a save killed at any moment leaves the previous file whole.
        Not saved: steps this handle staged for N-step returns (call :meth:`on_episode_end`
        first to commit them) and the sampler's state (seeds are per handle); a sequence
        buffer's open sequences are saved open and stay open (never sampled) in the loaded
        buffer, which has no writers to finish them (:meth:`on_episode_end` commits them).

        Examples
        --------
        >>> import os, tempfile
        >>> from cpprb_ray import ReplayBuffer
        >>> with tempfile.TemporaryDirectory() as directory, ReplayBuffer(8, {"obs": {}}) as rb:
        ...     _ = rb.add(obs=[1.0, 2.0, 3.0])
        ...     rb.save(os.path.join(directory, "replay.ckpt"))
        ...     with ReplayBuffer.load(os.path.join(directory, "replay.ckpt")) as copy:
        ...         print(copy.get_all_transitions()["obs"].ravel(), copy.is_owner)
        [1. 2. 3.] True
        """
        checkpoint.save(self, file)

    @classmethod
    def load(cls, file: PathLike, *, backend: str = "auto", name: Optional[str] = None,
             path: Optional[PathLike] = None, seed: Optional[int] = None,
             lock_timeout: float = 60.0):
        """A NEW buffer, owned by this process, holding the state :meth:`save` wrote to `file`.

        `backend`, `name`, `path`, `seed` and `lock_timeout` are those of the new buffer, as
        for the constructor (`path` is the new segment's file with backend="mmap", not the
        checkpoint). With the same seed, the loaded buffer samples what the saved one sampled.
        As with :meth:`attach`, ``ReplayBuffer.load`` loads either kind and returns the
        buffer's own class; ``PrioritizedReplayBuffer.load`` refuses a uniform buffer's file.

        Raises ValueError naming the file and the reason for a file that is truncated, corrupt
        (a checksum covers every byte), of another format version or of the other kind.

        Examples
        --------
        >>> import os, tempfile
        >>> from cpprb_ray import PrioritizedReplayBuffer
        >>> with tempfile.TemporaryDirectory() as directory:
        ...     file = os.path.join(directory, "replay.ckpt")
        ...     with PrioritizedReplayBuffer(8, {"obs": {}}, alpha=0.5, seed=3) as rb:
        ...         _ = rb.add(obs=[1.0, 2.0, 3.0], priorities=[1.0, 4.0, 9.0])
        ...         rb.save(file)
        ...         before = rb.sample(4)["indexes"]
        ...     with PrioritizedReplayBuffer.load(file, seed=3) as copy:
        ...         print(copy.get_stored_size(), copy.get_max_priority(),
        ...               (copy.sample(4)["indexes"] == before).all())
        3 9.0 True
        """
        return checkpoint.load(cls, file, backend=backend, name=name, path=path, seed=seed,
                               lock_timeout=lock_timeout)

    def __reduce__(self):
        # Only what re-attaching needs: a few hundred bytes whatever the buffer's size. The
        # token tells the segment we describe from another one under the same name; in a Ray
        # job, also what a node that cannot see the segment needs (cpprb_ray.remote).
        remote_state = None
        if "ray" in sys.modules:   # no Ray imported: no Ray job to move the handle to a node
            remote_state = remote.pickle_state(self)
            if remote_state is not None:
                self._pickled_for_ray = True
        return (_reattach, (type(self), self._segment.backend, self._segment.location,
                            self._layout.token, remote_state))

    # -- properties ---------------------------------------------------------------------------

    @property
    def name(self) -> str:
        """The shm name ("shm") or file path ("mmap"); what :meth:`attach` takes.

        Examples
        --------
        >>> from cpprb_ray import ReplayBuffer
        >>> with ReplayBuffer(4, {"obs": {}}) as rb, ReplayBuffer.attach(rb.name) as view:
        ...     print(view.name == rb.name)
        True
        """
        return self._segment.location

    @property
    def backend(self) -> str:
        """"shm" or "mmap".

        Examples
        --------
        >>> from cpprb_ray import ReplayBuffer
        >>> with ReplayBuffer(4, {"obs": {}}, backend="mmap") as rb:
        ...     print(rb.backend)
        mmap
        """
        return self._segment.backend

    @property
    def is_owner(self) -> bool:
        """True in the process that created the buffer (its close frees the memory).

        Examples
        --------
        >>> from cpprb_ray import ReplayBuffer
        >>> with ReplayBuffer(4, {"obs": {}}) as rb, ReplayBuffer.attach(rb.name) as view:
        ...     print(rb.is_owner, view.is_owner)
        True False
        """
        return self._owner and os.getpid() == self._owner_pid

    @property
    def is_remote(self) -> bool:
        """True for a handle that reaches its buffer through the buffer's proxy actor (it was
        unpickled on a Ray node that cannot see the segment; see :mod:`cpprb_ray.remote`).

        Examples
        --------
        >>> from cpprb_ray import ReplayBuffer
        >>> with ReplayBuffer(4, {"obs": {}}) as rb:
        ...     print(rb.is_remote)
        False
        """
        return bool(getattr(self._store, "is_remote", False))

    def flush(self, timeout: Optional[float] = None) -> int:
        """Send the rows a remote handle has queued; returns how many were sent.

        A remote handle (:attr:`is_remote`) batches its adds and sends them by rows, by age,
        and before every other call; ``flush`` sends them now, and raises what sending raises
        (``close`` only warns). A handle that sees the segment adds in place and has nothing
        queued: 0; so has a remote handle of a rate-limited buffer, whose adds are each sent
        at once (`timeout` is checked and otherwise unused). N-step steps staged for an open
        window are not rows yet (see :meth:`on_episode_end`).

        Examples
        --------
        >>> from cpprb_ray import ReplayBuffer
        >>> with ReplayBuffer(4, {"obs": {}}) as rb:
        ...     _ = rb.add(obs=1.0)
        ...     print(rb.flush(), rb.get_stored_size())
        0 1
        """
        _rules.as_timeout(timeout)
        flush = getattr(self._store, "flush", None)
        return 0 if flush is None else int(flush(timeout))

    @property
    def closed(self) -> bool:
        """True once :meth:`close` has been called on this handle.

        Examples
        --------
        >>> from cpprb_ray import ReplayBuffer
        >>> rb = ReplayBuffer(4, {"obs": {}})
        >>> rb.closed
        False
        >>> rb.close()
        >>> rb.closed
        True
        """
        return self._segment.closed

    @property
    def nbytes(self) -> int:
        """Bytes of the buffer's segment: rows, tree and everything else, all reserved at
        creation (what /dev/shm or the mmap file holds for it).

        Examples
        --------
        >>> from cpprb_ray import ReplayBuffer
        >>> with ReplayBuffer(1024, {"obs": {"shape": 4}}) as rb:
        ...     print(rb.nbytes >= 1024 * 24, rb.nbytes % 4096)  # 24-byte records, whole pages
        True 0
        """
        return self._layout.total_size

    # -- lifetime -----------------------------------------------------------------------------

    def close(self) -> None:
        """Unmap this handle; the owner also frees the memory (views elsewhere keep working).

        Idempotent. A view's close never frees the memory, and neither does the owner's when
        the name now holds another buffer (the segment's token differs: ours was removed and
        somebody made a new one under the name). With ``Nstep``, the steps this
        handle staged are committed first, as a truncated episode end (as :meth:`on_episode_end`)
        if the rate limiter (if any) lets them in at once; else they are dropped with a
        RuntimeWarning (call :meth:`on_episode_end` with a timeout first to wait for it).

        Examples
        --------
        >>> from cpprb_ray import ReplayBuffer
        >>> rb = ReplayBuffer(4, {"obs": {}})
        >>> view = ReplayBuffer.attach(rb.name)
        >>> rb.close()  # frees the name; the view keeps working
        >>> _ = view.add(obs=1.0)
        >>> view.get_stored_size()
        1
        >>> view.close()
        >>> view.close()  # idempotent
        >>> rb.closed, view.closed
        (True, True)
        """
        with self._close_lock:
            if self._segment.closed:
                return
            try:
                self._writer.close()   # staged N-step steps committed, a lane given back
            finally:  # a failed flush still closes
                self._store.release()
                self._segment.close()
                if self._finalizer is not None:
                    self._finalizer.detach()
                if self._ownership is not None:
                    if self._pickled_for_ray and self.is_owner:
                        remote.stop_proxy(self._segment.backend, self._segment.location,
                                          self._layout.token)
                    # Frees in the creating process only, and only our own segment.
                    self._ownership.free()

    # -- learners -----------------------------------------------------------------------------

    def prefetch(self, batch_size: int, *, beta: Any = 0.4, depth: int = 2,
                 timeout: Optional[float] = None,
                 out: Optional[List[Dict[str, Any]]] = None, copy: bool = False,
                 tensors: Optional[str] = None) -> prefetch.Prefetch:
        """prefetch(batch_size, *, beta=0.4, depth=2, timeout=None, out=None, copy=False,
        tensors=None) -> Prefetch: an iterator of batches sampled ahead on a background thread
        (also a context manager: leaving the ``with`` stops the thread).

        Each batch is what :meth:`sample` returns, drawn by the thread into a ring of `depth`
        preallocated output sets through ``sample(..., out=)``: no allocation per batch, and the
        learner finds its next batch ready while the sample kernel (which releases the GIL)
        runs beside its network step. See :mod:`cpprb_ray.prefetch` and docs/learner.md.

        Parameters
        ----------
        batch_size : int
            Rows per batch.
        beta : float or callable
            As for :meth:`PrioritizedReplayBuffer.sample`, or a callable of the batch number
            (0, 1, ...) returning it: annealing. A uniform buffer checks it and uses none.
        depth : int
            Output sets in the ring (>= 1): the thread keeps up to ``depth - 1`` batches
            ready beside the one the learner holds. A yielded batch stays valid until the next
            ``next()``; then its set is refilled, with batch ``k + depth``. The thread is woken
            once per ``depth - 1`` batches (it refills the ring once the learner took every
            batch ready): 4 suits samples of tens of microseconds (docs/learner.md).
        timeout : float, optional
            How long the thread's sample may wait for the rate limiter (as for
            :meth:`sample`); a TimeoutError reaches the learner at its ``next()``.
        out : list of dict, optional
            `depth` output sets to fill (each as :meth:`sample`'s `out`), instead of sets
            allocated like the first batch.
        copy : bool
            Yield owned copies (allocated per batch) instead of the ring's arrays.
        tensors : {None, "numpy", "torch", "jax"}
            "torch": torch tensors over the ring's arrays (``torch.from_numpy``; page-locked
            when CUDA is available, for ``.to("cuda", non_blocking=True)``); "jax": jax arrays
            through DLPack. Neither is a dependency of cpprb_ray.

        Examples
        --------
        >>> import numpy as np
        >>> from cpprb_ray import PrioritizedReplayBuffer
        >>> with PrioritizedReplayBuffer(1024, {"obs": {"shape": 3}}, seed=0) as rb:
        ...     _ = rb.add(obs=np.zeros((100, 3)))
        ...     with rb.prefetch(32, beta=0.5, depth=3) as batches:
        ...         for step, batch in zip(range(5), batches):
        ...             priorities = np.full(32, 1.0 + step)
        ...             _ = rb.update_priorities(batch["indexes"], priorities,
        ...                                      batch["generations"])
        ...     print(batch["obs"].shape, batch["weights"].dtype, batches.batches)
        (32, 3) float32 5
        """
        return prefetch.Prefetch(self, batch_size, beta=beta, depth=depth, timeout=timeout,
                                 out=out, copy=copy, tensors=tensors)

    # -- statistics ---------------------------------------------------------------------------

    @property
    def rate_limiter(self) -> Optional[rate_limiters.RateLimiter]:
        """The buffer's rate limiter (read from the segment, so views have it too), or None.

        Examples
        --------
        >>> from cpprb_ray import MinSize, ReplayBuffer
        >>> with ReplayBuffer(8, {"obs": {}}, rate_limiter=MinSize(2)) as rb:
        ...     with ReplayBuffer.attach(rb.name) as view:
        ...         print(view.rate_limiter)
        MinSize(2)
        """
        return rate_limiters.from_record(self._store.limiter_record())

    def stats(self) -> Dict[str, Any]:
        """stats() -> dict: what the buffer has done, as every process sees it.

        Cheap (one copy of the counters under the lock, a few hundred nanoseconds), so it can be
        polled every second from any process; the counts are of one moment. Should the lock not
        come within 50 ms (a holder stopped by SIGSTOP or a debugger), each count is read
        without it instead, exact on its own, two of them possibly a call apart:

        ``snapshot``
            True when the counts were copied under the lock (one moment), False when the lock
            did not come within 50 ms and they were read one by one.

        ``inserts``, ``samples``
            Rows ever added (those of an add that a repair rolled back do not count) and rows
            ever sampled (a sample(256) counts 256).
        ``updates``
            Priorities ever applied by update_priorities (entries skipped as stale do not count).
        ``repairs``
            Times a process died holding the lock and the next one repaired after it: > 0 means
            a writer or learner crashed mid-call.
        ``stored``, ``capacity``, ``fill``, ``next_index``
            Rows held, the buffer's size, their ratio, the slot the next add writes first.
        ``max_priority``
            The largest priority seen (prioritized buffers; None for a uniform one).
        ``lock_waits``
            Lock acquisitions that found the lock held (contention).
        ``lock_holder``
            The thread id holding the lock now (0: free); one that never changes over seconds
            is a process stopped (SIGSTOP, a debugger) inside a call.
        ``huge_page_bytes``
            Bytes of THIS process's mapping of the segment backed by 2 MiB pages (the tree
            and the rows, where the kernel can; 0 on a node that reaches the buffer through
            its proxy). See docs/design.md, "Huge pages".
        ``nstep_staged``
            With ``Nstep``: steps THIS handle has staged (not in the segment yet); else absent.
        ``rate_limiter``
            None, or a dict: ``kind``, ``samples_per_insert``, ``min_size_to_sample``,
            ``min_diff``, ``max_diff``; ``inserts`` and ``samples`` since creation or the last
            clear, and ``diff = inserts * samples_per_insert - samples``; ``can_insert`` and
            ``can_sample`` (whether a one-row add or sample would go now); ``insert_blocks``,
            ``sample_blocks`` (calls it held back at least once), ``insert_wait_s``,
            ``sample_wait_s`` (seconds they were held back, counted when they went through or
            gave up), ``insert_timeouts``, ``sample_timeouts`` (calls that gave up with
            TimeoutError, timeout=0 included); ``insert_waiting``, ``sample_waiting`` (a call
            of that side went to sleep on the limiter since the other side last made progress:
            held back now, or it gave up since).

        Examples
        --------
        >>> from cpprb_ray import PrioritizedReplayBuffer, SampleToInsertRatio
        >>> limiter = SampleToInsertRatio(samples_per_insert=1.0, min_size_to_sample=2,
        ...                               error_buffer=8)
        >>> with PrioritizedReplayBuffer(16, {"obs": {}}, rate_limiter=limiter) as rb:
        ...     _ = rb.add(obs=[1.0, 2.0, 3.0])
        ...     _ = rb.sample(4)
        ...     stats = rb.stats()
        >>> stats["inserts"], stats["samples"], stats["stored"], stats["fill"]
        (3, 4, 3, 0.1875)
        >>> limited = stats["rate_limiter"]
        >>> limited["kind"], limited["diff"], limited["can_insert"], limited["can_sample"]
        ('SampleToInsertRatio', -1.0, True, True)
        """
        counters = self._store.counters()
        counters["fill"] = counters["stored"] / counters["capacity"]
        counters["huge_page_bytes"] = getattr(self._segment.memory, "huge_bytes", 0)
        if not self._prioritized:
            counters["max_priority"] = None
        if self._nstep_config is not None:
            counters["nstep_staged"] = self._writer.staged
        return counters

    def __enter__(self):
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()


def _open_view(cls: Type[Handle], backend: str, location: str,
               seed: Optional[int], lock_timeout: float = 60.0,
               token: Optional[str] = None) -> Handle:
    """Open an existing segment (_open, the one open path) and bind a view handle of the
    buffer's own kind to it. With `token` (unpickling), FileNotFoundError unless the segment
    there is that very buffer in this machine's memory."""
    segment, layout = _open.open_segment(backend, location, token)
    try:
        target = cls._target_class(layout.prioritized)
        if target is None:
            kind = "prioritized" if layout.prioritized else "uniform"
            raise ValueError(f"{location!r} is a {kind} buffer; attach it with "
                             f"cpprb_ray.attach()")
        handle = target.__new__(target)
        handle._bind(segment, layout, ownership=None, seed=seed, lock_timeout=lock_timeout)
        return handle
    except BaseException:
        segment.close()
        raise


def _reattach(cls: Type[Handle], backend: str, location: str,
              token: Optional[str] = None,
              remote_state: Optional[Dict[str, Any]] = None) -> Handle:
    """Unpickling: a view of the segment, with a fresh sampler seed; on a Ray node that cannot
    see that segment, a client of the buffer's proxy actor (cpprb_ray.remote)."""
    try:
        return _open_view(cls, backend, location, None, token=token)
    except FileNotFoundError:
        if remote_state is None:
            raise
        handle = remote.client(cls, backend, location, token, remote_state)
        if handle is None:   # not in a Ray job, or on the owner's node: the segment is gone
            raise
        return handle
