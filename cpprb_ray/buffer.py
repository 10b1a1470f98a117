"""ReplayBuffer and PrioritizedReplayBuffer: thin handles on one shared segment.

A handle validates and casts user input, then makes ONE call into :mod:`cpprb_ray._store`, which
takes the segment's lock, does the work with the GIL released and lets go. Handles pickle to the
segment's name and re-attach in place wherever they are unpickled on the same host.
"""

from __future__ import annotations

import errno
import os
import sys
import threading
import time
import warnings
import weakref
from typing import Any, Dict, List, Mapping, Optional, Type, Union

import numpy as np

from cpprb_ray import (
    _compat,
    _layout,
    _memory,
    _proc,
    _rules,
    _store,
    checkpoint,
    frames,
    nstep,
    rate_limiters,
)
from cpprb_ray._ownership import Ownership

__all__ = ["PrioritizedReplayBuffer", "ReplayBuffer", "attach"]

PathLike = Union[str, "os.PathLike[str]"]

_FLOAT_MAX = float(np.finfo(np.float64).max)
# The most rows a count of the store can be (int64): a larger size or batch_size is refused
# with a ValueError naming it, not an OverflowError from the conversion.
_INT64_MAX = 2**63 - 1


_as_count = _rules.as_count
_as_real = _rules.as_real


class ReplayBuffer:
    """A uniform replay buffer in one shared-memory segment, usable from many processes.

    The same storage and API as :class:`PrioritizedReplayBuffer`, with uniform sampling
    (cpprb's ``ReplayBuffer``).

    Parameters
    ----------
    size : int
        Capacity in rows (> 0). When full, the oldest rows are overwritten. A float with a
        whole value (cpprb's ``1e6``) is taken as that int.
    env_dict : dict
        ``{key: {"shape": int or tuple (default 1), "dtype": numpy dtype (default float32)}}``.
    default_dtype : numpy dtype, optional
        The dtype of every column whose spec names none (cpprb's argument; default float32).
    backend : {"auto", "shm", "mmap"}
        "auto" is "shm" where Python has it (>= 3.8), else "mmap".
    name : str, optional
        Segment name (default: ``cpprb_ray_`` and a random token). Must not exist yet.
    path : str, optional
        With backend="mmap", the file to create (may be on disk, even larger than RAM).
    seed : int, optional
        Seed of this handle's sampler. Unpickled handles draw a fresh seed.
    lock_timeout : float
        Seconds any call waits for the segment's lock before TimeoutError (60). A holder that
        was killed hands the lock on at once; one that is stopped (SIGSTOP, ``docker pause``,
        a debugger) or a corrupt lock word would otherwise block every process. Ctrl-C
        interrupts a wait.
    Nstep : dict, optional
        ``{"size": n, "gamma": g, "rew": key(s), "next": key(s)}``: store n-step transitions
        (needs a "done" column; samples gain "discounts", g**m per row). Each handle stages its
        own stream's last steps; see :mod:`cpprb_ray.nstep` and docs/nstep.md.
    rate_limiter : cpprb_ray.MinSize or cpprb_ray.SampleToInsertRatio, optional
        Reverb's limiters, kept in the segment: every process's adds and samples are held to
        it, and ``add(..., timeout=)`` / ``sample(..., timeout=)`` wait while it holds them
        back (see :mod:`cpprb_ray.rate_limiters` and docs/rate_limiting.md). None (the
        default): no limiter, no cost.
    next_of : str or list of str, optional
        cpprb's argument: ``next_<name>`` is not stored but read from the next slot of the
        writer's lane; add still takes it (env_dict may list it or not), sample returns it.
    stack_compress : str or list of str, optional
        cpprb's argument: the column's last axis is a frame stack; a slot keeps its newest
        frame only. Every row still comes back exactly as added (docs/frames.md).
    lanes : int, optional
        Split the ring into this many lanes, one per concurrent writing handle (claimed on
        its first add, given back on close or when its process dies); more writers than lanes
        raise :class:`cpprb_ray.LaneError`. 1 with next_of / stack_compress, else no lanes.
    mmap_prefix : str, optional
        cpprb's argument: the buffer in the file ``{mmap_prefix}.cpprb_ray`` (backend "mmap";
        it may be larger than RAM). Freed like any buffer when its owner closes it.

    Raises
    ------
    OSError
        ENOSPC when the filesystem (/dev/shm, or that of `path`) has no room for the whole
        segment, which is reserved here rather than faulting (SIGBUS) at a later write.

    Notes
    -----
    This process owns the segment and frees it on close, exit, or SIGTERM (see
    :func:`cpprb_ray.install_sigterm_handler`); views in other processes never free it.

    Examples
    --------
    >>> from cpprb_ray import ReplayBuffer
    >>> with ReplayBuffer(4, {"obs": {"shape": 2}, "act": {"dtype": "int64"}}, seed=0) as rb:
    ...     rb.add(obs=[[0.0, 1.0], [2.0, 3.0]], act=[5, 6])
    ...     batch = rb.sample(3)
    ...     print(rb.get_stored_size(), batch["obs"].shape, batch["act"].dtype)
    0
    2 (3, 2) int64
    """

    _prioritized = False
    _check_for_update = False   # PrioritizedReplayBuffer(check_for_update=True) and the MP ones

    @_compat.cpprb_arguments
    def __init__(self, size: int, env_dict: Mapping[str, Any], *, backend: str = "auto",
                 name: Optional[str] = None, path: Optional[PathLike] = None,
                 seed: Optional[int] = None, lock_timeout: float = 60.0,
                 Nstep: Optional[Mapping[str, Any]] = None,
                 rate_limiter: Optional[rate_limiters.RateLimiter] = None,
                 default_dtype: Any = None,
                 next_of: frames.Names = None, stack_compress: frames.Names = None,
                 lanes: Optional[int] = None, mmap_prefix: Optional[str] = None) -> None:
        size = _compat.whole_size(size)
        env_dict = _compat.with_default_dtype(env_dict, default_dtype)
        backend, path = _compat.mmap_path(mmap_prefix, backend, path)
        self._create(size, env_dict, backend, name, path, seed, alpha=0.0, eps=0.0,
                     lock_timeout=lock_timeout, Nstep=Nstep, rate_limiter=rate_limiter,
                     next_of=next_of, stack_compress=stack_compress, lanes=lanes)

    # -- construction helpers ---------------------------------------------------------------------

    def _create(self, size: Any, env_dict: Mapping[str, Any], backend: str, name: Optional[str],
                path: Optional[PathLike], seed: Optional[int], *, alpha: float,
                eps: float, lock_timeout: float,
                Nstep: Optional[Mapping[str, Any]] = None,
                rate_limiter: Optional[rate_limiters.RateLimiter] = None,
                next_of: frames.Names = None, stack_compress: frames.Names = None,
                lanes: Optional[int] = None) -> None:
        capacity = _as_count(size, "size")
        if capacity <= 0:
            raise ValueError(f"size must be > 0; got {capacity}")
        limiter = rate_limiters.check_rate_limiter(rate_limiter, capacity)
        # N-step first, on the columns add takes (next_obs included when next_of derives it);
        # then the lanes, which store frame columns a plane per slot and derive next_of's.
        columns = frames.with_next_columns(_layout.parse_env_dict(env_dict), next_of)
        columns, nstep_config = nstep.plan_columns(columns, Nstep)
        columns, lane_config = frames.LaneConfig.plan(columns, capacity, self._prioritized,
                                                      next_of, stack_compress, lanes)
        backend = _memory.resolve_backend(backend)
        if path is not None and backend != "mmap":
            raise ValueError("path= needs backend='mmap'")
        if seed is not None and _as_count(seed, "seed") < 0:
            raise ValueError(f"seed must be >= 0; got {seed}")
        # A bounded frame lane (cpprb's next_of / stack_compress) keeps `capacity` rows in more
        # slots, so that filler slots do not take the rows' room (frames.bounded_slots).
        slots = capacity if lane_config is None else lane_config.slots(capacity)
        layout = _layout.plan(slots, columns, self._prioritized, backend,
                              extra_meta=nstep.meta_of(nstep_config),
                              lanes=None if lane_config is None else lane_config.to_meta())
        claimed: List[Ownership] = []

        def claim(location: str, identity: _memory.Identity) -> None:
            # Claimed for freeing as soon as the file exists: filling it takes a while, and a
            # SIGTERM meanwhile must not leave it behind.
            claimed.append(Ownership(backend, location, layout.token, creating=identity))

        try:
            segment = _memory.create(backend, layout.total_size, name=name,
                                     path=None if path is None else os.fspath(path),
                                     on_open=claim)
        except BaseException:
            for ownership in claimed:
                ownership.forget()   # create removed the file already
            raise
        try:
            _store.initialize_segment(
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
        # First, before anything that must be released: a broken N-step record refuses the
        # segment. The staging is this handle's own and starts empty.
        lane_config = frames.LaneConfig.from_meta(layout.meta, layout.columns, segment.location)
        # N-step works on the columns add takes: a laned layout's public ones.
        add_columns = layout.columns if lane_config is None else lane_config.columns()
        nstep_config = nstep.NstepConfig.from_meta(layout.meta, add_columns, segment.location)
        self._nstep = (None if nstep_config is None else
                       nstep.NstepStaging(nstep_config, add_columns, self._prioritized,
                                          laned=lane_config is not None))
        self._segment = segment
        self._layout = layout
        self._columns = layout.columns
        self._column_names = frozenset(c.name for c in layout.columns)
        # `store`: a stand-in with ReplayStore's methods (cpprb_ray.remote's client of the proxy
        # actor, for a handle on a node that cannot see the segment); else the segment itself.
        self._store = (_store.ReplayStore(segment.memory, layout.columns, seed, lock_timeout)
                       if store is None else store)
        self._column_order = tuple(c.name for c in layout.columns)
        self._lanes: Optional[frames.LaneWriter] = None
        if lane_config is not None:
            if store is not None:
                raise ValueError(f"{segment.location!r} is a laned buffer (lanes, next_of, "
                                 f"stack_compress): it cannot be used from a node that does not "
                                 f"see its segment yet (docs/frames.md)")
            lane_config.check_lane_size(layout.capacity, segment.location)
            self._store.bind_lanes(layout.meta["lanes"]["offset"], lane_config.count,
                                   lane_config.store_specs(layout.columns), lane_config.rows)
            self._lanes = frames.LaneWriter(self._store, lane_config, layout.columns,
                                           layout.capacity)
        self._plain_flags()
        # get_current_episode_len counts the rows stored since this (cpprb's episode length).
        self._episode_start = int(self._store.rows_added)
        self._owner = ownership is not None
        self._owner_pid = os.getpid()
        self._close_lock = threading.Lock()
        self._pickled_for_ray = False   # an owner's close then ends the buffer's proxy actor
        if ownership is None and store is None:
            self._check_lock_holder(segment.location)
        # The ownership frees only in this process, and only the segment with this layout's
        # token (see _ownership for every way out of a process that frees it).
        self._ownership = ownership
        self._finalizer = weakref.finalize(self, ownership.free) if ownership is not None else None
        if store is None:
            # Every sample reads the tree's lower levels and the rows at random places: in
            # 2 MiB pages those reads stop missing the TLB (docs/design.md, "Huge pages").
            # Last, once the segment is owned: a SIGTERM during the copy (up to about 3 s for
            # 1 GiB) then frees it like any other.
            _memory.prefer_huge_pages(segment, self._store.hot_regions())

    def _plain_flags(self) -> None:
        # A cold call pays for every attribute and Python frame it touches (about 8 us of a
        # cold sample went to the checks that a plain buffer never needs), so the hot methods
        # test one flag each and go straight to the store.
        self._plain_add = self._nstep is None and self._lanes is None
        self._plain_sample = self._lanes is None and not self._check_for_update

    def _check_lock_holder(self, location: str) -> None:
        """Refuse a segment whose lock names a thread that does not exist (corrupt or foreign):
        waiting for it would hang forever. A live holder lets go within moments."""
        deadline = time.monotonic() + 0.5
        first = self._store.lock_owner()
        while True:
            holder = self._store.lock_owner()
            # Free, held by a live thread, or changing hands (a holder in another pid namespace
            # sharing /dev/shm is invisible in /proc but lets go): all fine.
            if holder == 0 or holder != first or _proc.thread_exists(holder):
                return
            if time.monotonic() > deadline:
                self._store.release()
                raise _layout.corrupt(location, f"its lock is held by thread {holder}, which does "
                                                f"not exist")
            time.sleep(0.01)

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
    def _target_class(cls, prioritized: bool) -> Optional[Type[ReplayBuffer]]:
        """The class of a handle that `cls` opens (attach, load) on a buffer of this kind: the
        buffer's own kind, or None when `cls` cannot stand for it (a uniform buffer through
        PrioritizedReplayBuffer, or any other kind through a subclass)."""
        if prioritized != cls._prioritized and cls is not ReplayBuffer:
            return None
        target = PrioritizedReplayBuffer if prioritized else ReplayBuffer
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
        first to commit them) and the sampler's state (seeds are per handle).

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
        if self._lanes is not None:
            raise ValueError("save() does not support laned buffers (lanes, next_of, "
                             "stack_compress) yet (docs/frames.md)")
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
            from cpprb_ray import remote

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
    def env_dict(self) -> Dict[str, Dict[str, Any]]:
        """The columns, normalized: ``{key: {"shape": tuple, "dtype": numpy dtype}}``.

        Examples
        --------
        >>> from cpprb_ray import ReplayBuffer
        >>> with ReplayBuffer(4, {"obs": {"shape": 2}, "act": {"dtype": "int64"}}) as rb:
        ...     print(rb.env_dict["obs"]["shape"], rb.env_dict["act"]["dtype"])
        (2,) int64
        """
        if self._lanes is not None:
            return {name: {"shape": shape, "dtype": dtype}
                    for name, shape, dtype in self._lanes.public
                    if name != nstep.DISCOUNTS or self._nstep is None}
        return {c.name: {"shape": c.shape, "dtype": c.dtype} for c in self._columns
                if c.name != nstep.DISCOUNTS or self._nstep is None}

    @property
    def nstep(self) -> Optional[Dict[str, Any]]:
        """The N-step config as cpprb's ``Nstep`` dict (lists of keys), or None.

        Views (attached or unpickled) have the same config, with their own empty staging.

        Examples
        --------
        >>> from cpprb_ray import ReplayBuffer
        >>> env = {"obs": {}, "rew": {}, "next_obs": {}, "done": {}}
        >>> spec = {"size": 3, "gamma": 0.99, "rew": "rew", "next": "next_obs"}
        >>> with ReplayBuffer(8, env, Nstep=spec) as rb, ReplayBuffer.attach(rb.name) as view:
        ...     print(view.nstep)
        ...     print(sorted(view.env_dict))
        {'size': 3, 'gamma': 0.99, 'rew': ['rew'], 'next': ['next_obs']}
        ['done', 'next_obs', 'obs', 'rew']
        """
        return None if self._nstep is None else self._nstep.config.as_dict()

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

    def get_stored_size(self) -> int:
        """Rows stored (at most the buffer size).

        Examples
        --------
        >>> from cpprb_ray import ReplayBuffer
        >>> with ReplayBuffer(2, {"obs": {}}) as rb:
        ...     _ = rb.add(obs=[1.0, 2.0, 3.0])
        ...     print(rb.get_stored_size())
        2
        """
        return int(self._store.stored_size)

    def get_buffer_size(self) -> int:
        """Capacity in rows.

        Examples
        --------
        >>> from cpprb_ray import ReplayBuffer
        >>> with ReplayBuffer(4, {"obs": {}}) as rb:
        ...     print(rb.get_buffer_size())
        4
        """
        if self._segment.closed:
            raise ValueError("operation on a closed buffer")
        if self._lanes is not None and self._lanes.rows:
            return self._lanes.rows    # (its ring has more slots, for its filler slots)
        return self._layout.capacity

    def get_next_index(self) -> int:
        """Slot the next add writes first (a laned buffer: the next slot of this handle's lane,
        or before its first add of the lane it would claim now).

        Examples
        --------
        >>> from cpprb_ray import ReplayBuffer
        >>> with ReplayBuffer(4, {"obs": {}}) as rb:
        ...     _ = rb.add(obs=[1.0, 2.0, 3.0])
        ...     print(rb.get_next_index())
        ...     _ = rb.add(obs=[4.0, 5.0])  # wraps around
        ...     print(rb.get_next_index())
        3
        1
        """
        if self._lanes is not None:
            if self._lanes.rows:   # one lane with frames: counted as cpprb counts rows
                return int(self._store.rows_since_clear) % self._lanes.rows
            return self._lanes.next_slot()
        return int(self._store.next_index)

    def __len__(self) -> int:
        return self.get_stored_size()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{self.get_stored_size()}/{self.get_buffer_size()}"
        role = "owner" if self.is_owner else "remote" if self.is_remote else "view"
        return f"<{type(self).__name__} {self.backend}:{self.name} {state} {role}>"

    # -- add ----------------------------------------------------------------------------------

    def add(self, *, timeout: Optional[float] = None, **columns: Any) -> int:
        """add(*, timeout=None, **columns) -> int: store one transition or a batch; returns the
        first slot written.

        Every env_dict key is required and no other is accepted. A single transition may omit
        the batch axis. Values are cast to the column dtype where numpy's same_kind casting
        allows, else TypeError. When full, the oldest rows are overwritten.

        With a ``rate_limiter``, the add (all its rows, as one step) waits while the limiter
        holds it back: at most `timeout` seconds (None: as long as it takes; 0: not at all),
        then TimeoutError, with nothing added. Without one, `timeout` is checked and unused.

        Examples
        --------
        >>> from cpprb_ray import ReplayBuffer
        >>> with ReplayBuffer(4, {"obs": {"shape": 2}, "done": {}}) as rb:
        ...     print(rb.add(obs=[0.0, 1.0], done=0.0))  # one transition
        ...     print(rb.add(obs=[[2, 3], [4, 5]], done=[0, 1]))  # a batch of two
        0
        1

        With ``Nstep``, the steps are staged and the call returns the first slot of the n-step
        transitions it completed, or None when it completed none.
        """
        if self._plain_add:
            return self._store.add(columns, None, timeout)
        if self._nstep is not None:
            return self._nstep.add(self, columns, None, timeout)  # type: ignore[return-value]
        return self._lane_add(columns, None, timeout)

    def _lane_add(self, columns: Dict[str, Any], priorities: Any,
                  timeout: Optional[float]) -> int:
        """A laned add; returns its first row's slot, or in a bounded lane (cpprb's next_of /
        stack_compress) its first row's number as cpprb counts (what get_next_index said)."""
        lanes = self._lanes
        assert lanes is not None
        if not lanes.rows:
            return lanes.add(columns, priorities, timeout)
        before = self.get_next_index()
        lanes.add(columns, priorities, timeout)
        return before

    def _commit_rows(self, rows: Dict[str, np.ndarray], priorities: Optional[np.ndarray],
                     timeout: Optional[float] = None) -> Optional[int]:
        """Store rows the N-step staging finished: every column (discounts included) already of
        its dtype, C-contiguous, of shape (count, *shape); ONE store add. None: a remote
        handle queued them (its slots are chosen when the batch is sent)."""
        first = self._store.add([rows[name] for name in self._column_order], priorities, timeout)
        return None if first is None else int(first)

    def _lane_steps(self, steps: Dict[str, np.ndarray], count: int, slots: np.ndarray,
                    generations: np.ndarray, timeout: Optional[float] = None,
                    admit: int = 0) -> None:
        """N-step in a laned buffer: write staged steps as rows that wait for their windows
        (never sampled before _complete_rows), so that their frames are in the lane in order;
        each row's slot and generation go to `slots` and `generations`. A rate limiter holds
        the write back (up to `timeout`) until it would admit the `admit` rows the add then
        completes, so that an add it holds back writes nothing."""
        self._lanes.add(steps, None, timeout, incomplete=True,  # type: ignore[union-attr]
                        out=(slots, generations), count=count, admit=admit)

    def _lane_rows_lost(self, slots: np.ndarray, generations: np.ndarray) -> bool:
        """N-step in a laned buffer: whether the lane rows of staged steps are gone (a clear
        since they were written), so that they must be written again."""
        return self._lanes.rows_lost(slots, generations)  # type: ignore[union-attr]

    def _complete_rows(self, rows: Dict[str, np.ndarray], priorities: Optional[np.ndarray],
                       slots: np.ndarray, generations: np.ndarray, last_slots: np.ndarray,
                       last_generations: np.ndarray,
                       timeout: Optional[float] = None) -> Optional[int]:
        """N-step in a laned buffer: the rows of `slots` get their n-step columns and their
        next stacks (those ending at `last_slots`), admitted by a rate limiter as one add (up
        to `timeout`); returns the first row's slot, None when no row could be completed."""
        lanes = self._lanes
        assert lanes is not None
        before = self.get_next_index() if lanes.rows else 0
        done = lanes.complete(rows, priorities, slots, generations, last_slots,
                              last_generations, timeout)
        if not done:
            return None
        # A bounded lane (cpprb's next_of / stack_compress) answers with cpprb's row number.
        return before if lanes.rows else int(slots[0])

    # -- sample -------------------------------------------------------------------------------

    def _check_batch(self, batch_size: Any) -> int:
        if type(batch_size) is not int:  # the common case skips the general checks
            batch_size = _as_count(batch_size, "batch_size")
        if not 0 < batch_size <= _INT64_MAX:
            raise ValueError(f"batch_size must be > 0 and <= 2**63 - 1; got "
                             f"{_rules.shown(batch_size)}")
        return batch_size

    def sample(self, batch_size: int, *, out: Optional[Dict[str, np.ndarray]] = None,
               timeout: Optional[float] = None) -> Dict[str, np.ndarray]:
        """sample(batch_size, *, out=None, timeout=None) -> dict: uniform sample with replacement.

        Every env_dict key as a fresh array of shape ``(batch_size, *shape)`` (the arrays of an
        earlier result that nothing refers to any more may be refilled), plus "indexes"
        (int64) and "generations" (uint64). Raises ValueError when the buffer is empty (with a
        rate limiter, an empty buffer is one the limiter holds samples back from instead).
        With `out` (a dict of arrays with those keys, shapes and dtypes, C-contiguous and
        writable: e.g. an earlier result), they are filled in place instead, numpy's
        convention for a loop that should not allocate.

        With a ``rate_limiter``, the sample (all `batch_size` rows, as one step) waits while
        the limiter holds it back: at most `timeout` seconds (None: as long as it takes; 0: not
        at all), then TimeoutError, with nothing sampled.

        Examples
        --------
        >>> from cpprb_ray import ReplayBuffer
        >>> with ReplayBuffer(4, {"obs": {"shape": 2}}, seed=0) as rb:
        ...     _ = rb.add(obs=[[0.0, 1.0], [2.0, 3.0]])
        ...     batch = rb.sample(5)
        ...     print(sorted(batch), batch["obs"].shape, batch["indexes"].dtype)
        ['generations', 'indexes', 'obs'] (5, 2) int64
        """
        if (self._plain_sample and out is None and type(batch_size) is int
                and 0 < batch_size <= _INT64_MAX):
            result = self._store.sample(batch_size, 0.0, None, timeout)
            del result["weights"]
            return result
        batch = self._check_batch(batch_size)
        if self._lanes is not None:
            if out is not None and isinstance(out, dict):
                out = dict(out, weights=np.empty(batch, dtype=np.float32))
            result = self._lanes.sample(batch, 0.0, out, timeout)
            del result["weights"]
            return result
        if out is not None:
            # The store fills weights too; a uniform sample has none to give back.
            out = dict(out) if isinstance(out, dict) else out
            if isinstance(out, dict):
                out["weights"] = np.empty(batch, dtype=np.float32)
        result = self._store.sample(batch, 0.0, out, timeout)
        del result["weights"]
        return result

    # -- whole buffer -------------------------------------------------------------------------

    def clear(self) -> None:
        """Forget every row (and the steps this handle staged for N-step returns).

        Examples
        --------
        >>> from cpprb_ray import ReplayBuffer
        >>> with ReplayBuffer(4, {"obs": {}}) as rb:
        ...     _ = rb.add(obs=[1.0, 2.0])
        ...     rb.clear()
        ...     print(rb.get_stored_size())
        0
        """
        self._store.clear()
        if self._nstep is not None:
            self._nstep.clear()
        self._episode_start = int(self._store.rows_added)

    def on_episode_end(self, *, timeout: Optional[float] = None) -> None:
        """End the current episode (truncated): commit the steps staged for N-step returns.

        They bootstrap from the last step's next state (done stays 0). Without ``Nstep``, and
        after a step with done=1 (which commits at once), there is nothing to do. With a
        ``rate_limiter``, the commit waits as :meth:`add` does (`timeout` alike); on
        TimeoutError the steps stay staged.

        Examples
        --------
        >>> from cpprb_ray import ReplayBuffer
        >>> with ReplayBuffer(4, {"obs": {}}) as rb:
        ...     _ = rb.add(obs=1.0)
        ...     rb.on_episode_end()
        ...     print(rb.get_stored_size())
        1
        """
        if self._nstep is not None:
            self._nstep.flush(self, timeout)
        else:
            _rules.as_timeout(timeout)   # refused alike, with nothing to commit
        if not self._segment.closed:
            self._episode_start = int(self._store.rows_added)

    def get_all_transitions(self, shuffle: bool = False) -> Dict[str, np.ndarray]:
        """Copies of every stored row, in slot order (rows torn by a crashed writer left out).

        ``shuffle=True`` (cpprb's argument): in one random order, drawn from numpy's global
        random state as cpprb does.

        Examples
        --------
        >>> from cpprb_ray import ReplayBuffer
        >>> with ReplayBuffer(4, {"obs": {}}) as rb:
        ...     _ = rb.add(obs=[1.0, 2.0, 3.0])
        ...     print(rb.get_all_transitions()["obs"].ravel())
        [1. 2. 3.]
        """
        room = self.get_stored_size()
        if self._lanes is not None and self._lanes.rows:
            # In cpprb's order: by row number (ring index), as cpprb's buffer lies.
            rows, numbers = self._lanes.numbered_rows(room, int(self._store.rows_since_clear))
            order = np.argsort(numbers, kind="stable")
            transitions = {name: column[order] for name, column in rows.items()}
        elif self._lanes is not None:
            # (shuffle and its check below apply to a laned buffer's rows too)
            transitions = self._lanes.all_rows(room)
        else:
            outputs = [np.empty((room,) + c.shape, dtype=c.dtype) for c in self._columns]
            indexes = np.empty(room, dtype=np.int64)
            leaves = np.empty(room, dtype=np.float64)
            copied = self._store.snapshot(outputs, indexes, leaves)
            transitions = {c.name: out[:copied] for c, out in zip(self._columns, outputs)}
        if not isinstance(shuffle, (bool, np.bool_)):
            raise TypeError(f"shuffle must be a bool; got {type(shuffle).__name__}")
        return _compat.shuffled(transitions) if shuffle else transitions

    def _encode_sample(self, indexes: Any) -> Dict[str, np.ndarray]:
        """cpprb's method: copies of the rows at `indexes` (an int or a 1-D array of them, in
        any order, repeats allowed), every column as :meth:`get_all_transitions` gives them.

        An index is a row's place in the ring as cpprb counts it: below the stored size, the
        slot ``sample`` returns in ``"indexes"``. With next_of / stack_compress in one lane
        (the default), it is the row's number as cpprb counts (rows added since the last
        clear, modulo the size), while ``sample``'s indexes are slots of the larger ring
        (what ``update_priorities`` takes); with several lanes, a live row's slot. IndexError
        naming the first that holds no row. Reads every row and picks: for tools and tests;
        ``sample`` is the training path.

        Examples
        --------
        >>> from cpprb_ray import ReplayBuffer
        >>> with ReplayBuffer(8, {"obs": {}}) as rb:
        ...     _ = rb.add(obs=[10.0, 11.0, 12.0])
        ...     print(rb._encode_sample([2, 0, 2])["obs"].ravel())
        [12. 10. 12.]
        """
        wanted = _rules.index_vector(indexes, "indexes", True)
        room = self.get_stored_size()
        if self._lanes is not None and self._lanes.rows:
            transitions, slots = self._lanes.numbered_rows(room,
                                                           int(self._store.rows_since_clear))
            bound = self._lanes.rows
        elif self._lanes is not None:
            transitions, slots = self._lanes.all_rows(room, with_slots=True)
            bound = self._layout.capacity
        else:
            outputs = [np.empty((room,) + c.shape, dtype=c.dtype) for c in self._columns]
            slots = np.empty(room, dtype=np.int64)
            copied = self._store.snapshot(outputs, slots, np.empty(room, dtype=np.float64))
            transitions = {c.name: out[:copied] for c, out in zip(self._columns, outputs)}
            slots = slots[:copied]
            bound = room
        position = np.full(max(bound, 1), -1, dtype=np.int64)
        position[slots] = np.arange(len(slots))
        inside = (wanted >= 0) & (wanted < bound)
        found = np.where(inside, position[np.where(inside, wanted, 0)], -1)
        if (found < 0).any():
            at = int(np.flatnonzero(found < 0)[0])
            raise IndexError(f"indexes must name stored rows (slots in [0, {bound})); got "
                             f"{wanted[at]} at position {at}, which holds none")
        return {name: column[found] for name, column in transitions.items()}

    # -- cpprb's transitions files and queries ---------------------------------------------

    def save_transitions(self, file: Any, *, safe: bool = True) -> None:
        """Write every stored row to `file` (a path or a binary file) in cpprb's format.

        The file is what cpprb's ``save_transitions`` writes (an .npz of get_all_transitions,
        format version 1), so cpprb loads it and :meth:`load_transitions` loads cpprb's.
        Priorities are not saved (cpprb saves none; :meth:`save` keeps everything). `safe`:
        cpprb's switch for its raw next_of / stack_compress storage; cpprb_ray always writes
        the safe form.

        Examples
        --------
        >>> import io
        >>> from cpprb_ray import ReplayBuffer
        >>> file = io.BytesIO()
        >>> with ReplayBuffer(8, {"obs": {}}) as rb:
        ...     _ = rb.add(obs=[1.0, 2.0])
        ...     rb.save_transitions(file)
        >>> _ = file.seek(0)
        >>> with ReplayBuffer(8, {"obs": {}}) as copy:
        ...     copy.load_transitions(file)
        ...     print(copy.get_all_transitions()["obs"].ravel())
        [1. 2.]
        """
        if not isinstance(safe, (bool, np.bool_)):
            raise TypeError(f"safe must be a bool; got {type(safe).__name__}")
        target = checkpoint.transitions_target(file)
        transitions = self.get_all_transitions()
        if not isinstance(target, str):
            _compat.save_transitions(transitions, target, nstep=self._nstep is not None)
            return
        # Opened here, checked on what was opened: np.savez's own open of a path would block
        # on a FIFO swapped in after any earlier check.
        with checkpoint.open_for_writing(target) as handle:
            _compat.save_transitions(transitions, handle, nstep=self._nstep is not None)

    def load_transitions(self, file: Any, *, timeout: Optional[float] = None) -> None:
        """Add the rows of a file that :meth:`save_transitions` or cpprb's wrote.

        Its columns must be this buffer's. Rows go in with :meth:`add` (a prioritized buffer
        gives them the largest priority seen, as cpprb does); N-step files hold finished
        transitions, committed as they are (cpprb's have no "discounts": their rows get
        gamma**n, with a RuntimeWarning). cpprb's ``safe=False`` files (its raw ring and its
        cache) load as cpprb's own loader reads them. Only
        numpy arrays are unpickled from the file: a crafted file cannot run code. `timeout`:
        as for :meth:`add`. ValueError naming the file and the reason for a file it cannot load.

        Examples
        --------
        >>> import os, tempfile
        >>> from cpprb_ray import PrioritizedReplayBuffer
        >>> with tempfile.TemporaryDirectory() as directory:
        ...     file = os.path.join(directory, "transitions.npz")
        ...     with PrioritizedReplayBuffer(8, {"obs": {}, "act": {"dtype": "int64"}}) as rb:
        ...         _ = rb.add(obs=[0.5, 1.5], act=[1, 2])
        ...         rb.save_transitions(file)
        ...         rb.load_transitions(file)          # appends: 4 rows now
        ...         print(rb.get_stored_size(), rb.get_all_transitions()["act"].ravel())
        4 [1 2 1 2]
        """
        transitions, saved_nstep = checkpoint.read_transitions(file)
        if saved_nstep != (self._nstep is not None):
            raise ValueError(f"{file!r} holds {'N-step' if saved_nstep else 'plain'} "
                             f"transitions; this buffer {'has' if self._nstep else 'has no'} "
                             f"Nstep (cpprb refuses this mismatch too)")
        if not transitions or len(next(iter(transitions.values()))) == 0:
            return
        if self._nstep is not None:
            if self._lanes is not None:
                # Laned: the finished rows go into this handle's lane (never the plain ring),
                # with the columns add takes (next_of's included).
                rows = _compat.nstep_rows(transitions, self._lanes.columns(), file,
                                          self._nstep.full_discount)
                self._lanes.add(rows, None, timeout)
                return
            rows = _compat.nstep_rows(transitions, self._columns, file,
                                      self._nstep.full_discount)
            self._commit_rows(rows, None, timeout)
            return
        names = (self._column_names if self._lanes is None
                 else frozenset(name for name, _, _ in self._lanes.public))
        if set(transitions) != names:
            raise ValueError(f"{file!r} holds the columns {sorted(transitions)}; this buffer's "
                             f"are {sorted(names)}")
        self.add(timeout=timeout, **transitions)

    def is_Nstep(self) -> bool:
        """Whether the buffer stores N-step transitions (cpprb's name for ``nstep is not None``).

        Examples
        --------
        >>> from cpprb_ray import ReplayBuffer
        >>> env = {"obs": {}, "rew": {}, "next_obs": {}, "done": {}}
        >>> spec = {"size": 3, "gamma": 0.99, "rew": "rew", "next": "next_obs"}
        >>> with ReplayBuffer(8, env, Nstep=spec) as rb, ReplayBuffer(8, env) as plain:
        ...     print(rb.is_Nstep(), plain.is_Nstep())
        True False
        """
        return self._nstep is not None

    def get_current_episode_len(self) -> int:
        """Rows stored since this handle's last :meth:`on_episode_end` or :meth:`clear` (or
        since it was made or attached): cpprb's count.

        As cpprb counts: rows that went into the buffer (with ``Nstep``, the transitions
        committed, which lag the steps added by up to n - 1). The count is the buffer's, read
        from the segment: rows other writers added meanwhile count too, so it is this
        episode's length where this handle is the buffer's only writer, as a cpprb buffer
        always is.

        Examples
        --------
        >>> from cpprb_ray import ReplayBuffer
        >>> with ReplayBuffer(8, {"obs": {}}) as rb:
        ...     _ = rb.add(obs=[1.0, 2.0, 3.0])
        ...     print(rb.get_current_episode_len())
        ...     rb.on_episode_end()
        ...     print(rb.get_current_episode_len())
        3
        0
        """
        return int(self._store.rows_added) - self._episode_start

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
                if self._nstep is not None:
                    self._flush_on_close()
                if self._lanes is not None:
                    self._lanes.release()
            finally:  # a failed flush still closes
                self._store.release()
                self._segment.close()
                if self._finalizer is not None:
                    self._finalizer.detach()
                if self._ownership is not None:
                    if self._pickled_for_ray and self.is_owner:
                        from cpprb_ray import remote

                        remote.stop_proxy(self._segment.backend, self._segment.location,
                                          self._layout.token)
                    # Frees in the creating process only, and only our own segment.
                    self._ownership.free()

    def _flush_on_close(self) -> None:
        # No wait: a close must not hang on a learner that stopped sampling.
        staged = self._nstep.staged if self._nstep is not None else 0
        try:
            self._nstep.flush(self, 0)  # type: ignore[union-attr]
        except TimeoutError:
            self._nstep.clear()  # type: ignore[union-attr]
            warnings.warn(f"close(): the rate limiter held back the {staged} N-step step(s) "
                          f"this handle had staged; they were dropped (call "
                          f"on_episode_end(timeout=...) before close() to wait for it)",
                          RuntimeWarning, stacklevel=3)

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
        ``snapshot``
            True when the counts were copied under the lock (one moment), False when the lock
            did not come within 50 ms and they were read one by one.
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
            TimeoutError, timeout=0 included).

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
        if self._nstep is not None:
            counters["nstep_staged"] = self._nstep.staged
        return counters

    def __enter__(self):
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()


class PrioritizedReplayBuffer(ReplayBuffer):
    """A prioritized replay buffer in one shared-memory segment, usable from many processes.

    cpprb's ``PrioritizedReplayBuffer`` API: a cpprb user changes only the import. A row with
    priority ``p`` weighs ``(p + eps) ** alpha``; new rows get the largest priority seen so far.

    Parameters
    ----------
    size, env_dict, backend, name, path, seed, Nstep, rate_limiter, default_dtype
        As for :class:`ReplayBuffer`. With ``Nstep``, the priorities given with a step go
        into the segment with that step's n-step transition.
    next_of, stack_compress, lanes
        As for :class:`ReplayBuffer` (docs/frames.md).
    mmap_prefix : str, optional
        As for :class:`ReplayBuffer`.
    alpha : float
        Prioritization exponent, >= 0 (0 is uniform).
    eps : float
        Added to every priority, >= 0.
    check_for_update : bool
        cpprb's argument: :meth:`update_priorities` called without `generations` skips every
        slot written since this handle last sampled it (and any slot it never sampled), as if
        given the generations that sample returned. A property of this handle: views made by
        attach or pickling do not check (``MPPrioritizedReplayBuffer`` handles always do).

    Examples
    --------
    >>> import numpy as np
    >>> from cpprb_ray import PrioritizedReplayBuffer
    >>> env = {"obs": {"shape": 4}, "act": {"dtype": np.int64}, "rew": {}, "done": {}}
    >>> with PrioritizedReplayBuffer(1024, env, alpha=0.6, seed=1) as rb:
    ...     first = rb.add(obs=np.zeros((8, 4)), act=np.arange(8), rew=np.ones(8), done=np.zeros(8))
    ...     batch = rb.sample(4, beta=0.4)
    ...     applied = rb.update_priorities(batch["indexes"], np.full(4, 2.0), batch["generations"])
    ...     print(first, batch["obs"].shape, batch["weights"].dtype, applied, rb.get_max_priority())
    0 (4, 4) float32 4 2.0
    """

    _prioritized = True
    _sampled_generations: Optional[_compat.SampledGenerations] = None

    @_compat.cpprb_arguments
    def __init__(self, size: int, env_dict: Mapping[str, Any], alpha: float = 0.6, *,
                 eps: float = 1e-4, backend: str = "auto", name: Optional[str] = None,
                 path: Optional[PathLike] = None, seed: Optional[int] = None,
                 lock_timeout: float = 60.0, Nstep: Optional[Mapping[str, Any]] = None,
                 rate_limiter: Optional[rate_limiters.RateLimiter] = None,
                 default_dtype: Any = None, check_for_update: bool = False,
                 next_of: frames.Names = None, stack_compress: frames.Names = None,
                 lanes: Optional[int] = None, mmap_prefix: Optional[str] = None) -> None:
        size = _compat.whole_size(size)
        env_dict = _compat.with_default_dtype(env_dict, default_dtype)
        backend, path = _compat.mmap_path(mmap_prefix, backend, path)
        if not isinstance(check_for_update, (bool, np.bool_)):
            raise TypeError(f"check_for_update must be a bool; got "
                            f"{type(check_for_update).__name__}")
        alpha = _as_real(alpha, "alpha")
        eps = _as_real(eps, "eps")
        if alpha < 0:
            raise ValueError(f"alpha must be >= 0; got {alpha}")
        if eps < 0:
            raise ValueError(f"eps must be >= 0; got {eps}")
        if (isinstance(size, (int, np.integer)) and not isinstance(size, _rules.NOT_NUMBERS)
                and 0 < size <= _INT64_MAX):   # any other size: refused by _create, by name
            _rules.check_alpha_eps(alpha, eps, int(size))
        self._create(size, env_dict, backend, name, path, seed, alpha=alpha, eps=eps,
                     lock_timeout=lock_timeout, Nstep=Nstep, rate_limiter=rate_limiter,
                     next_of=next_of, stack_compress=stack_compress, lanes=lanes)
        if check_for_update:
            self._check_for_update = True
            self._plain_flags()

    def add(self, *, priorities: Any = None, timeout: Optional[float] = None,
            **columns: Any) -> int:
        """add(*, priorities=None, timeout=None, **columns) -> int: store rows; returns the first
        slot written.

        Without `priorities`, new rows get the largest priority seen so far (1.0 at first).
        Priorities must be finite and >= 0, one per row. `timeout`: as for
        :meth:`ReplayBuffer.add` (how long a rate limiter may hold the add back).

        Examples
        --------
        >>> from cpprb_ray import PrioritizedReplayBuffer
        >>> with PrioritizedReplayBuffer(8, {"obs": {}}) as rb:
        ...     print(rb.add(obs=[1.0, 2.0], priorities=[0.5, 3.0]))
        ...     print(rb.add(obs=4.0), rb.get_max_priority())
        0
        2 3.0

        With ``Nstep``, each priority belongs to the step it came with and is stored with that
        step's n-step transition; the call returns the first slot of the transitions it
        completed, or None.
        """
        if self._plain_add:
            return self._store.add(columns, priorities, timeout)
        if self._nstep is not None:
            return self._nstep.add(self, columns, priorities,  # type: ignore[return-value]
                                   timeout)
        return self._lane_add(columns, priorities, timeout)

    def _step_priorities(self, priorities: Any, count: int) -> np.ndarray:
        """The N-step staging's check of the priorities given with `count` steps."""
        array = _rules.real_vector(priorities, count, "priorities")
        self._store.check_priorities(array, "priorities")
        return array

    def sample(self, batch_size: int, beta: float = 0.4, *,
               out: Optional[Dict[str, np.ndarray]] = None,
               timeout: Optional[float] = None) -> Dict[str, np.ndarray]:
        """sample(batch_size, beta=0.4, *, out=None, timeout=None) -> dict: stratified
        proportional sample with replacement.

        Every env_dict key as a fresh array of shape ``(batch_size, *shape)`` (the arrays of an
        earlier result that nothing refers to any more may be refilled), plus "indexes"
        (int64), "weights" (float32, ``(N P(i))**-beta / max_j (N P(j))**-beta``) and
        "generations" (uint64, for :meth:`update_priorities`). Raises ValueError when empty
        (without a rate limiter). With `out` (a dict of arrays with those keys, shapes and
        dtypes, C-contiguous and writable: e.g. an earlier result), they are filled in place
        and returned in a new dict, numpy's convention for a learner loop that should not
        allocate. `timeout`: as for :meth:`ReplayBuffer.sample` (how long a rate limiter may
        hold the sample back).

        Examples
        --------
        >>> from cpprb_ray import PrioritizedReplayBuffer
        >>> with PrioritizedReplayBuffer(8, {"obs": {}}, seed=0) as rb:
        ...     _ = rb.add(obs=[1.0, 2.0, 3.0])
        ...     batch = rb.sample(4, beta=0.5)
        ...     weights = batch["weights"]
        ...     print(batch["obs"].shape, weights.dtype, bool((weights <= 1).all()))
        ...     again = rb.sample(4, beta=0.5, out=batch)     # the same arrays, refilled
        ...     print(again["obs"] is batch["obs"])
        (4, 1) float32 True
        True
        """
        if (self._plain_sample and type(batch_size) is int and 0 < batch_size <= _INT64_MAX
                and type(beta) is float and 0.0 <= beta <= _FLOAT_MAX):
            return self._store.sample(batch_size, beta, out, timeout)
        batch = self._check_batch(batch_size)
        if type(beta) is not float or not 0.0 <= beta <= _FLOAT_MAX:
            beta = _as_real(beta, "beta")
            if beta < 0:
                raise ValueError(f"beta must be >= 0; got {beta}")
        if self._lanes is not None:
            result = self._lanes.sample(batch, beta, out, timeout)
            return self._remember_sample(result) if self._check_for_update else result
        if self._check_for_update:
            return self._remember_sample(self._store.sample(batch, beta, out, timeout))
        return self._store.sample(batch, beta, out, timeout)

    def _remember_sample(self, batch: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
        # check_for_update: keep each sampled slot's generation for update_priorities.
        if self._sampled_generations is None:
            self._sampled_generations = _compat.SampledGenerations(self._layout.capacity)
        self._sampled_generations.remember(batch["indexes"], batch["generations"])
        return batch

    def update_priorities(self, indexes: Any, priorities: Any,
                          generations: Any = None) -> int:
        """update_priorities(indexes, priorities, generations=None) -> int: rows updated.

        Every index must be below the stored size. With `generations` (from :meth:`sample`),
        entries whose slot was overwritten since it was sampled are skipped.

        Examples
        --------
        >>> from cpprb_ray import PrioritizedReplayBuffer
        >>> with PrioritizedReplayBuffer(2, {"obs": {}}, seed=0) as rb:
        ...     _ = rb.add(obs=[1.0, 2.0])
        ...     print(rb.update_priorities([0, 1], [0.1, 5.0]), rb.get_max_priority())
        ...     batch = rb.sample(2)
        ...     _ = rb.add(obs=[3.0, 4.0])  # overwrites both sampled rows
        ...     print(rb.update_priorities(batch["indexes"], [9.0, 9.0], batch["generations"]))
        2 5.0
        0
        """
        if generations is None and self._check_for_update:
            generations = (np.zeros(len(_rules.index_vector(indexes, "indexes", True)),
                                    np.uint64)
                           if self._sampled_generations is None
                           else self._sampled_generations.generations_of(indexes))
        return self._store.update(indexes, priorities, generations)

    def get_max_priority(self) -> float:
        """The largest raw priority seen (1.0 before any was given).

        Examples
        --------
        >>> from cpprb_ray import PrioritizedReplayBuffer
        >>> with PrioritizedReplayBuffer(4, {"obs": {}}) as rb:
        ...     print(rb.get_max_priority())
        ...     _ = rb.add(obs=1.0, priorities=2.5)
        ...     print(rb.get_max_priority())
        1.0
        2.5
        """
        return float(self._store.max_priority)


def _open_view(cls: Type[ReplayBuffer], backend: str, location: str,
               seed: Optional[int], lock_timeout: float = 60.0,
               token: Optional[str] = None) -> ReplayBuffer:
    """Map an existing segment and bind a view handle of the buffer's own kind to it.

    With `token` (unpickling), FileNotFoundError unless the segment there is that very buffer
    in this machine's memory: same identity token, made under this kernel boot."""
    segment = _memory.attach(backend, location)
    try:
        header, layout = _layout.read(segment.memory, segment.size, location)
        if token is not None:
            _check_identity(layout, token, location)
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


def _check_identity(layout: _layout.Layout, token: str, location: str) -> None:
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


def _reattach(cls: Type[ReplayBuffer], backend: str, location: str,
              token: Optional[str] = None,
              remote_state: Optional[Dict[str, Any]] = None) -> ReplayBuffer:
    """Unpickling: a view of the segment, with a fresh sampler seed; on a Ray node that cannot
    see that segment, a client of the buffer's proxy actor (cpprb_ray.remote)."""
    try:
        return _open_view(cls, backend, location, None, token=token)
    except FileNotFoundError:
        if remote_state is None:
            raise
        from cpprb_ray import remote

        handle = remote.client(cls, backend, location, token, remote_state)
        if handle is None:   # not in a Ray job, or on the owner's node: the segment is gone
            raise
        return handle


def attach(name_or_path: PathLike, *, seed: Optional[int] = None,
           lock_timeout: float = 60.0) -> ReplayBuffer:
    """Open a view of an existing buffer of either kind from its name or path.

    Examples
    --------
    >>> import cpprb_ray
    >>> with cpprb_ray.ReplayBuffer(8, {"obs": {}}) as rb:
    ...     view = cpprb_ray.attach(rb.name)
    ...     print(type(view).__name__)
    ...     view.close()
    ReplayBuffer
    """
    return ReplayBuffer.attach(name_or_path, seed=seed, lock_timeout=lock_timeout)
