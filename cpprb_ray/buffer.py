"""ReplayBuffer and PrioritizedReplayBuffer: cpprb's API on handles of one shared segment.

A handle validates and casts user input, then makes ONE call into :mod:`cpprb_ray._store`, which
takes the segment's lock, does the work with the GIL released and lets go. Handles pickle to the
segment's name and re-attach in place wherever they are unpickled on the same host; what makes a
handle (its segment, parts, lifetime, pickling, checkpoints) is :mod:`cpprb_ray._handle`'s.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional

import numpy as np

from cpprb_ray import _compat, _rules, checkpoint, frames, nstep, rate_limiters
from cpprb_ray._handle import KINDS, Handle, PathLike

__all__ = ["PrioritizedReplayBuffer", "ReplayBuffer", "attach"]

_FLOAT_MAX = float(np.finfo(np.float64).max)
# The most rows a count of the store can be (int64): a larger size or batch_size is refused
# with a ValueError naming it, not an OverflowError from the conversion.
_INT64_MAX = 2**63 - 1


_as_count = _rules.as_count
_as_real = _rules.as_real


class ReplayBuffer(Handle):
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
    sequence : dict, optional
        ``{"length": L, "period": P (L), "eta": 0.9}``: a sequence buffer for recurrent
        learners (R2D2). Steps are stored once, in lanes (one per writing handle: `lanes`);
        a sample returns sequences of `L` consecutive steps of one episode, starting at step 0,
        P, 2P, ... of it: every column as ``(batch, L, *shape)`` and "mask" ``(batch, L)``,
        False on the padding past an episode's end; "indexes", "weights" and "generations"
        are one per sequence, the unit of the stored size and of the rate limiter. A nonzero
        ``done`` or :meth:`on_episode_end` ends an episode. Not with Nstep, next_of or
        stack_compress. See :mod:`cpprb_ray.sequences` and docs/sequences.md.

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

    @_compat.cpprb_arguments
    def __init__(self, size: int, env_dict: Mapping[str, Any], *, backend: str = "auto",
                 name: Optional[str] = None, path: Optional[PathLike] = None,
                 seed: Optional[int] = None, lock_timeout: float = 60.0,
                 Nstep: Optional[Mapping[str, Any]] = None,
                 rate_limiter: Optional[rate_limiters.RateLimiter] = None,
                 default_dtype: Any = None,
                 next_of: frames.Names = None, stack_compress: frames.Names = None,
                 lanes: Optional[int] = None, mmap_prefix: Optional[str] = None,
                 sequence: Optional[Mapping[str, Any]] = None) -> None:
        size = _compat.whole_size(size)
        env_dict = _compat.with_default_dtype(env_dict, default_dtype)
        backend, path = _compat.mmap_path(mmap_prefix, backend, path)
        self._create(size, env_dict, backend, name, path, seed, alpha=0.0, eps=0.0,
                     lock_timeout=lock_timeout, Nstep=Nstep, rate_limiter=rate_limiter,
                     next_of=next_of, stack_compress=stack_compress, lanes=lanes,
                     sequence=sequence)

    # -- what it holds ----------------------------------------------------------------------

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
        return {c.name: {"shape": c.shape, "dtype": c.dtype} for c in self._writer.columns
                if c.name != nstep.DISCOUNTS or self._nstep_config is None}

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
        return None if self._nstep_config is None else self._nstep_config.as_dict()

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
        return int(self._writer.size)   # (a bounded frame lane's ring has more slots)

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
        return int(self._writer.next_slot())

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
        return self._add(columns, None, timeout)

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
        if type(batch_size) is int and 0 < batch_size <= _INT64_MAX:
            return self._sample(batch_size, 0.0, out, timeout)
        return self._sample(self._check_batch(batch_size), 0.0, out, timeout)

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
        self._writer.forget()
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
        self._writer.end_episode(timeout)
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
        # (In cpprb's row order in a bounded frame lane: its sampler's.)
        transitions = self._sampler.all_rows(self.get_stored_size())
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
        return self._sampler.rows_at(_rules.index_vector(indexes, "indexes", True),
                                     self.get_stored_size())

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
            _compat.save_transitions(transitions, target, nstep=self._nstep_config is not None)
            return
        # Opened here, checked on what was opened: np.savez's own open of a path would block
        # on a FIFO swapped in after any earlier check.
        with checkpoint.open_for_writing(target) as handle:
            _compat.save_transitions(transitions, handle, nstep=self._nstep_config is not None)

    def load_transitions(self, file: Any, *, timeout: Optional[float] = None) -> None:
        """Add the rows of a file that :meth:`save_transitions` or cpprb's wrote.

        Its columns must be this buffer's. Rows go in with :meth:`add` (a prioritized buffer
        gives them the largest priority seen, as cpprb does); N-step files hold finished
        transitions, committed as they are (cpprb's, without "discounts", are refused). Only
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
        nstep_buffer = self._nstep_config is not None
        if saved_nstep != nstep_buffer:
            raise ValueError(f"{file!r} holds {'N-step' if saved_nstep else 'plain'} "
                             f"transitions; this buffer {'has' if nstep_buffer else 'has no'} "
                             f"Nstep (cpprb refuses this mismatch too)")
        if not transitions or len(next(iter(transitions.values()))) == 0:
            return
        if nstep_buffer:
            # Finished transitions, committed as they are, with the columns the writer below
            # the staging takes (a laned buffer's: into this handle's lane, next_of's included).
            self._writer.add_rows(transitions, file, timeout)
            return
        names = frozenset(c.name for c in self._writer.columns)
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
        return self._nstep_config is not None

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

    @_compat.cpprb_arguments
    def __init__(self, size: int, env_dict: Mapping[str, Any], alpha: float = 0.6, *,
                 eps: float = 1e-4, backend: str = "auto", name: Optional[str] = None,
                 path: Optional[PathLike] = None, seed: Optional[int] = None,
                 lock_timeout: float = 60.0, Nstep: Optional[Mapping[str, Any]] = None,
                 rate_limiter: Optional[rate_limiters.RateLimiter] = None,
                 default_dtype: Any = None, check_for_update: bool = False,
                 next_of: frames.Names = None, stack_compress: frames.Names = None,
                 lanes: Optional[int] = None, mmap_prefix: Optional[str] = None,
                 sequence: Optional[Mapping[str, Any]] = None) -> None:
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
                     next_of=next_of, stack_compress=stack_compress, lanes=lanes,
                     sequence=sequence)
        if check_for_update:
            self._check_for_update = True
            self._choose_parts()

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
        return self._add(columns, priorities, timeout)

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
        if (type(batch_size) is int and 0 < batch_size <= _INT64_MAX
                and type(beta) is float and 0.0 <= beta <= _FLOAT_MAX):
            return self._sample(batch_size, beta, out, timeout)
        batch = self._check_batch(batch_size)
        if type(beta) is not float or not 0.0 <= beta <= _FLOAT_MAX:
            beta = _as_real(beta, "beta")
            if beta < 0:
                raise ValueError(f"beta must be >= 0; got {beta}")
        return self._sample(batch, beta, out, timeout)

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
        return self._update(indexes, priorities, generations)

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


KINDS[False] = ReplayBuffer
KINDS[True] = PrioritizedReplayBuffer
