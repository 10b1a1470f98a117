"""ReplayBuffer and PrioritizedReplayBuffer: thin handles on one shared segment.

A handle validates and casts user input, then makes ONE call into :mod:`cpprb_ray._store`, which
takes the segment's lock, does the work with the GIL released and lets go. Handles pickle to the
segment's name and re-attach in place wherever they are unpickled on the same host.
"""

from __future__ import annotations

import math
import os
import threading
import time
import weakref
from typing import Any, Dict, Mapping, Optional, Type, Union

import numpy as np

from cpprb_ray import _layout, _memory, _store, nstep

__all__ = ["PrioritizedReplayBuffer", "ReplayBuffer", "attach"]

PathLike = Union[str, "os.PathLike[str]"]

_INT64 = np.dtype(np.int64)
_FLOAT32 = np.dtype(np.float32)
_UINT64 = np.dtype(np.uint64)
_FLOAT_MAX = float(np.finfo(np.float64).max)


def _cleanup(segment: _memory.Segment, owner_pid: int) -> None:
    """Finalizer of an owner handle that was never closed: free the segment's name.

    A forked child inherits the owner's handle and finalizer; only the creating process frees.
    """
    if os.getpid() == owner_pid:
        _memory.unlink(segment.backend, segment.location)


def _as_count(value: Any, name: str) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int; got {type(value).__name__}")
    return int(value)


def _as_real(value: Any, name: str) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer,
                                                                      np.floating)):
        raise TypeError(f"{name} must be a real number; got {type(value).__name__}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite; got {value}")
    return value


def _as_priorities(store: _store.ReplayStore, priorities: Any, count: int,
                   name: str = "priorities") -> np.ndarray:
    array = priorities if type(priorities) is np.ndarray else np.asarray(priorities)
    if array.dtype.kind not in "iuf":
        raise TypeError(f"{name} must be real numbers; got dtype {array.dtype}")
    if array.ndim > 1:
        raise ValueError(f"{name} must be a scalar or 1-D; got shape {array.shape}")
    array = np.ascontiguousarray(array.reshape(-1), dtype=np.float64)
    if array.shape[0] != count:
        raise ValueError(f"{name} must have {count} entries (one per row); got {array.shape[0]}")
    store.check_priorities(array, name)
    return array


class ReplayBuffer:
    """A uniform replay buffer in one shared-memory segment, usable from many processes.

    The same storage and API as :class:`PrioritizedReplayBuffer`, with uniform sampling
    (cpprb's ``ReplayBuffer``).

    Parameters
    ----------
    size : int
        Capacity in rows (> 0). When full, the oldest rows are overwritten.
    env_dict : dict
        ``{key: {"shape": int or tuple (default 1), "dtype": numpy dtype (default float32)}}``.
    backend : {"auto", "shm", "mmap"}
        "auto" is "shm" where Python has it (>= 3.8), else "mmap".
    name : str, optional
        Segment name (default: ``cpprb_ray_`` and a random token). Must not exist yet.
    path : str, optional
        With backend="mmap", the file to create (may be on disk, even larger than RAM).
    seed : int, optional
        Seed of this handle's sampler. Unpickled handles draw a fresh seed.
    Nstep : dict, optional
        ``{"size": n, "gamma": g, "rew": key(s), "next": key(s)}``: store n-step transitions
        (needs a "done" column; samples gain "discounts", g**m per row). Each handle stages its
        own stream's last steps; see :mod:`cpprb_ray.nstep` and docs/nstep.md.

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

    def __init__(self, size: int, env_dict: Mapping[str, Any], *, backend: str = "auto",
                 name: Optional[str] = None, path: Optional[PathLike] = None,
                 seed: Optional[int] = None, Nstep: Optional[Mapping[str, Any]] = None) -> None:
        self._create(size, env_dict, backend, name, path, seed, alpha=0.0, eps=0.0, Nstep=Nstep)

    # -- construction helpers ---------------------------------------------------------------------

    def _create(self, size: Any, env_dict: Mapping[str, Any], backend: str, name: Optional[str],
                path: Optional[PathLike], seed: Optional[int], *, alpha: float,
                eps: float, Nstep: Optional[Mapping[str, Any]] = None) -> None:
        capacity = _as_count(size, "size")
        if capacity <= 0:
            raise ValueError(f"size must be > 0; got {capacity}")
        columns, nstep_config = nstep.plan_columns(_layout.parse_env_dict(env_dict), Nstep)
        backend = _memory.resolve_backend(backend)
        if path is not None and backend != "mmap":
            raise ValueError("path= needs backend='mmap'")
        if seed is not None and _as_count(seed, "seed") < 0:
            raise ValueError(f"seed must be >= 0; got {seed}")
        layout = _layout.plan(capacity, columns, self._prioritized, backend,
                              extra_meta=nstep.meta_of(nstep_config))
        segment = _memory.create(backend, layout.total_size, name=name,
                                 path=None if path is None else os.fspath(path))
        try:
            _store.initialize_segment(
                segment.memory, total_size=layout.total_size, capacity=capacity,
                prioritized=self._prioritized, alpha=alpha, eps=eps, owner_pid=os.getpid(),
                layout_json=layout.to_json(), data_offset=layout.data_offset,
                tree_offset=layout.tree_offset,
                row_stride=layout.row_stride, created_ns=time.time_ns())
            self._bind(segment, layout, owner=True, seed=seed)
        except BaseException:
            store = getattr(self, "_store", None)
            if store is not None:
                store.release()
            segment.close()
            _memory.unlink(segment.backend, segment.location)
            raise

    def _bind(self, segment: _memory.Segment, layout: _layout.Layout, *, owner: bool,
              seed: Optional[int]) -> None:
        # First, before anything that must be released: a broken N-step record refuses the
        # segment. The staging is this handle's own and starts empty.
        nstep_config = nstep.NstepConfig.from_meta(layout.meta, layout.columns,
                                                   segment.location)
        self._nstep = (None if nstep_config is None else
                       nstep.NstepStaging(nstep_config, layout.columns, self._prioritized))
        self._segment = segment
        self._layout = layout
        self._columns = layout.columns
        self._column_names = frozenset(c.name for c in layout.columns)
        self._store = _store.ReplayStore(segment.memory, [c.offset for c in layout.columns],
                                         [c.row_bytes for c in layout.columns], seed,
                                         [c.dtype for c in layout.columns],
                                         [c.shape for c in layout.columns])
        self._column_order = tuple(c.name for c in layout.columns)
        self._outputs = tuple((c.name, c.shape, c.dtype) for c in layout.columns)
        self._owner = owner
        self._owner_pid = os.getpid()
        self._close_lock = threading.Lock()
        if not owner:
            self._check_lock_holder(segment.location)
        self._finalizer = (weakref.finalize(self, _cleanup, segment, self._owner_pid)
                           if owner else None)

    def _check_lock_holder(self, location: str) -> None:
        """Refuse a segment whose lock names a thread that does not exist (corrupt or foreign):
        waiting for it would hang forever. A live holder lets go within moments."""
        deadline = time.monotonic() + 0.5
        first = self._store.lock_owner()
        while True:
            holder = self._store.lock_owner()
            # Free, held by a live thread, or changing hands (a holder in another pid namespace
            # sharing /dev/shm is invisible in /proc but lets go): all fine.
            if holder == 0 or holder != first or os.path.exists(f"/proc/{holder}"):
                return
            if time.monotonic() > deadline:
                self._store.release()
                raise _layout.corrupt(location, f"its lock is held by thread {holder}, which does "
                                                f"not exist")
            time.sleep(0.01)

    @classmethod
    def attach(cls, name_or_path: PathLike, *, seed: Optional[int] = None):
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
        return _open_view(cls, backend, location, seed)

    def __reduce__(self):
        # Only what re-attaching needs: a few hundred bytes whatever the buffer's size.
        return (_reattach, (type(self), self._segment.backend, self._segment.location))

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
        return self._layout.capacity

    def get_next_index(self) -> int:
        """Slot the next add writes first.

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
        return int(self._store.next_index)

    def __len__(self) -> int:
        return self.get_stored_size()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{self.get_stored_size()}/{self.get_buffer_size()}"
        role = "owner" if self.is_owner else "view"
        return f"<{type(self).__name__} {self.backend}:{self.name} {state} {role}>"

    # -- add ----------------------------------------------------------------------------------

    def _rows(self, columns: Dict[str, Any]) -> tuple:
        """Validate and cast one transition or a batch; returns (arrays, count)."""
        if len(columns) != len(self._columns) or not self._column_names.issuperset(columns):
            missing = sorted(self._column_names - set(columns))
            unknown = sorted(set(columns) - self._column_names)
            raise ValueError(f"add needs exactly the columns {sorted(self._column_names)}; "
                             f"missing {missing}, unknown {unknown}")
        arrays = []
        count = -1
        for column in self._columns:
            value = columns[column.name]
            array = value if type(value) is np.ndarray else np.asarray(value)
            if array.dtype != column.dtype:
                if array.dtype.kind not in "biuf" or not np.can_cast(
                        array.dtype, column.dtype, casting="same_kind"):
                    raise TypeError(f"column {column.name!r} has dtype {column.dtype}; cannot "
                                    f"cast {array.dtype} to it (same_kind casting)")
                array = array.astype(column.dtype)
            shape = array.shape
            if shape == column.shape or (column.shape == (1,) and shape == ()):
                rows = 1
            elif shape[1:] == column.shape or (column.shape == (1,) and array.ndim == 1):
                rows = shape[0]
            else:
                raise ValueError(f"column {column.name!r} must have shape {column.shape} or "
                                 f"(batch, *{column.shape}); got {shape}")
            if count < 0:
                count = rows
            elif rows != count:
                raise ValueError(f"ragged batch: column {column.name!r} has {rows} rows, "
                                 f"{self._columns[0].name!r} has {count}")
            if not array.flags.c_contiguous:
                array = np.ascontiguousarray(array)
            arrays.append(array)
        if count == 0:
            raise ValueError("add needs at least one row; got a batch of 0")
        return arrays, count

    def add(self, **columns: Any) -> int:
        """add(**columns) -> int: store one transition or a batch; returns the first slot written.

        Every env_dict key is required and no other is accepted. A single transition may omit
        the batch axis. Values are cast to the column dtype where numpy's same_kind casting
        allows, else TypeError. When full, the oldest rows are overwritten.

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
        if self._nstep is not None:
            return self._nstep.add(self, columns)  # type: ignore[return-value]
        first = self._try_add(columns)
        if first is not None:
            return first
        arrays, count = self._rows(columns)
        return int(self._store.add(arrays, count))

    def _commit_rows(self, rows: Dict[str, np.ndarray], priorities: Optional[np.ndarray]) -> int:
        """Store rows the N-step staging finished: every column (discounts included) already of
        its dtype, C-contiguous, of shape (count, *shape); ONE store add."""
        count = rows[nstep.DISCOUNTS].shape[0]
        return int(self._store.add([rows[name] for name in self._column_order], count,
                                   priorities))

    def _try_add(self, columns: Dict[str, Any]) -> Optional[int]:
        """The fast path for values that need no numpy conversion (see ReplayStore.try_add)."""
        if len(columns) != len(self._column_order):
            return None
        try:
            values = [columns[name] for name in self._column_order]
        except KeyError:
            return None
        return self._store.try_add(values)

    # -- sample -------------------------------------------------------------------------------

    def _check_batch(self, batch_size: Any) -> int:
        if type(batch_size) is not int:  # the common case skips the general checks
            batch_size = _as_count(batch_size, "batch_size")
        if batch_size <= 0:
            raise ValueError(f"batch_size must be > 0; got {batch_size}")
        return batch_size

    def _sample(self, batch: int, beta: float) -> Dict[str, np.ndarray]:
        # Fresh arrays every call (never views of the segment or of reused scratch memory).
        empty = np.empty
        result = {name: empty((batch,) + shape, dtype) for name, shape, dtype in self._outputs}
        indexes = empty(batch, _INT64)
        weights = empty(batch, _FLOAT32)
        generations = empty(batch, _UINT64)
        self._store.sample(batch, beta, list(result.values()), indexes, weights, generations)
        result["indexes"] = indexes
        result["weights"] = weights
        result["generations"] = generations
        return result

    def sample(self, batch_size: int) -> Dict[str, np.ndarray]:
        """sample(batch_size) -> dict: uniform sample with replacement.

        Every env_dict key as a fresh array of shape ``(batch_size, *shape)``, plus "indexes"
        (int64) and "generations" (uint64). Raises ValueError when the buffer is empty.

        Examples
        --------
        >>> from cpprb_ray import ReplayBuffer
        >>> with ReplayBuffer(4, {"obs": {"shape": 2}}, seed=0) as rb:
        ...     _ = rb.add(obs=[[0.0, 1.0], [2.0, 3.0]])
        ...     batch = rb.sample(5)
        ...     print(sorted(batch), batch["obs"].shape, batch["indexes"].dtype)
        ['generations', 'indexes', 'obs'] (5, 2) int64
        """
        result = self._sample(self._check_batch(batch_size), 0.0)
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

    def on_episode_end(self) -> None:
        """End the current episode (truncated): commit the steps staged for N-step returns.

        They bootstrap from the last step's next state (done stays 0). Without ``Nstep``, and
        after a step with done=1 (which commits at once), there is nothing to do.

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
            self._nstep.flush(self)

    def get_all_transitions(self) -> Dict[str, np.ndarray]:
        """Copies of every stored row, in slot order (rows torn by a crashed writer left out).

        Examples
        --------
        >>> from cpprb_ray import ReplayBuffer
        >>> with ReplayBuffer(4, {"obs": {}}) as rb:
        ...     _ = rb.add(obs=[1.0, 2.0, 3.0])
        ...     print(rb.get_all_transitions()["obs"].ravel())
        [1. 2. 3.]
        """
        room = self.get_stored_size()
        outputs = [np.empty((room,) + c.shape, dtype=c.dtype) for c in self._columns]
        indexes = np.empty(room, dtype=np.int64)
        leaves = np.empty(room, dtype=np.float64)
        copied = self._store.snapshot(outputs, indexes, leaves)
        return {c.name: out[:copied] for c, out in zip(self._columns, outputs)}

    # -- lifetime -----------------------------------------------------------------------------

    def close(self) -> None:
        """Unmap this handle; the owner also frees the memory (views elsewhere keep working).

        Idempotent. A view's close never frees the memory. With ``Nstep``, the steps this handle
        staged are committed first, as a truncated episode end (as :meth:`on_episode_end`).

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
                    self._nstep.flush(self)
            finally:  # a failed flush still closes
                self._store.release()
                self._segment.close()
                if self._finalizer is not None:
                    # Detach so a closed owner is not freed twice; free now in the owner only.
                    self._finalizer.detach()
                    if os.getpid() == self._owner_pid:
                        _memory.unlink(self._segment.backend, self._segment.location)

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
    size, env_dict, backend, name, path, seed, Nstep
        As for :class:`ReplayBuffer`. With ``Nstep``, the priorities given with a step go
        into the segment with that step's n-step transition.
    alpha : float
        Prioritization exponent, >= 0 (0 is uniform).
    eps : float
        Added to every priority, >= 0.

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

    def __init__(self, size: int, env_dict: Mapping[str, Any], *, alpha: float = 0.6,
                 eps: float = 1e-4, backend: str = "auto", name: Optional[str] = None,
                 path: Optional[PathLike] = None, seed: Optional[int] = None,
                 Nstep: Optional[Mapping[str, Any]] = None) -> None:
        alpha = _as_real(alpha, "alpha")
        eps = _as_real(eps, "eps")
        if alpha < 0:
            raise ValueError(f"alpha must be >= 0; got {alpha}")
        if eps < 0:
            raise ValueError(f"eps must be >= 0; got {eps}")
        self._create(size, env_dict, backend, name, path, seed, alpha=alpha, eps=eps,
                     Nstep=Nstep)

    def add(self, *, priorities: Any = None, **columns: Any) -> int:
        """add(*, priorities=None, **columns) -> int: store rows; returns the first slot written.

        Without `priorities`, new rows get the largest priority seen so far (1.0 at first).
        Priorities must be finite and >= 0, one per row.

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
        if self._nstep is not None:
            return self._nstep.add(self, columns, priorities)  # type: ignore[return-value]
        if priorities is None:
            first = self._try_add(columns)
            if first is not None:
                return first
        arrays, count = self._rows(columns)
        if priorities is not None:
            priorities = _as_priorities(self._store, priorities, count)
        return int(self._store.add(arrays, count, priorities))

    def _step_priorities(self, priorities: Any, count: int) -> np.ndarray:
        """The N-step staging's check of the priorities given with `count` steps."""
        return _as_priorities(self._store, priorities, count)

    def sample(self, batch_size: int, beta: float = 0.4) -> Dict[str, np.ndarray]:
        """sample(batch_size, beta=0.4) -> dict: stratified proportional sample with replacement.

        Every env_dict key as a fresh array of shape ``(batch_size, *shape)``, plus "indexes"
        (int64), "weights" (float32, ``(N P(i))**-beta / max_j (N P(j))**-beta``) and
        "generations" (uint64, for :meth:`update_priorities`). Raises ValueError when empty.

        Examples
        --------
        >>> from cpprb_ray import PrioritizedReplayBuffer
        >>> with PrioritizedReplayBuffer(8, {"obs": {}}, seed=0) as rb:
        ...     _ = rb.add(obs=[1.0, 2.0, 3.0])
        ...     batch = rb.sample(4, beta=0.5)
        ...     weights = batch["weights"]
        ...     print(batch["obs"].shape, weights.dtype, bool((weights <= 1).all()))
        (4, 1) float32 True
        """
        batch = self._check_batch(batch_size)
        if type(beta) is not float or not 0.0 <= beta <= _FLOAT_MAX:
            beta = _as_real(beta, "beta")
            if beta < 0:
                raise ValueError(f"beta must be >= 0; got {beta}")
        return self._sample(batch, beta)

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
        # Arrays as sample() returns them (float32 or float64 priorities) go straight in; -1
        # means they are of some other kind and are converted below.
        applied = self._store.update(indexes, priorities, generations)
        if applied >= 0:
            return int(applied)
        index_array = indexes if type(indexes) is np.ndarray else np.asarray(indexes)
        if index_array.dtype.kind not in "iu":
            if not (index_array.size == 0 and index_array.dtype.kind == "f"):
                raise TypeError(f"indexes must be integers; got dtype {index_array.dtype}")
        if index_array.ndim > 1:
            raise ValueError(f"indexes must be a scalar or 1-D; got shape {index_array.shape}")
        if index_array.dtype.kind == "u" and index_array.size and index_array.max() > 2**62:
            raise IndexError(f"indexes must be below the stored size; got {index_array.max()}")
        index_array = np.ascontiguousarray(index_array.reshape(-1), dtype=np.int64)
        count = index_array.shape[0]
        priority_array = priorities if type(priorities) is np.ndarray else np.asarray(priorities)
        if priority_array.dtype.kind not in "iuf":
            raise TypeError(f"priorities must be real numbers; got dtype {priority_array.dtype}")
        if priority_array.ndim > 1:
            raise ValueError(f"priorities must be a scalar or 1-D; got shape "
                             f"{priority_array.shape}")
        priority_array = np.ascontiguousarray(priority_array.reshape(-1), dtype=np.float64)
        if priority_array.shape[0] != count:
            raise ValueError(f"priorities must have {count} entries (one per index); got "
                             f"{priority_array.shape[0]}")
        generation_array = None
        if generations is not None:
            generation_array = np.asarray(generations)
            if generation_array.dtype.kind not in "iu" and generation_array.size:
                raise TypeError(f"generations must be unsigned integers; got dtype "
                                f"{generation_array.dtype}")
            if generation_array.ndim > 1 or generation_array.size != count:
                raise ValueError(f"generations must be 1-D with {count} entries (one per "
                                 f"index); got shape {generation_array.shape}")
            if generation_array.dtype.kind == "i" and generation_array.size and (
                    generation_array.min() < 0):
                raise ValueError("generations must be >= 0")
            generation_array = np.ascontiguousarray(generation_array.reshape(-1),
                                                    dtype=np.uint64)
        # Range and finiteness are checked by the store in one GIL-free pass each.
        return int(self._store.update(index_array, priority_array, generation_array))

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
               seed: Optional[int]) -> ReplayBuffer:
    """Map an existing segment and bind a view handle of the buffer's own kind to it."""
    segment = _memory.attach(backend, location)
    try:
        header, layout = _layout.read(segment.memory, segment.size, location)
        if layout.prioritized != cls._prioritized and cls is not ReplayBuffer:
            kind = "prioritized" if layout.prioritized else "uniform"
            raise ValueError(f"{location!r} is a {kind} buffer; attach it with "
                             f"cpprb_ray.attach()")
        target = PrioritizedReplayBuffer if layout.prioritized else ReplayBuffer
        if not issubclass(target, cls):
            target = cls
        handle = target.__new__(target)
        handle._bind(segment, layout, owner=False, seed=seed)
        return handle
    except BaseException:
        segment.close()
        raise


def _reattach(cls: Type[ReplayBuffer], backend: str, location: str) -> ReplayBuffer:
    """Unpickling: a view of the segment, with a fresh sampler seed."""
    return _open_view(cls, backend, location, None)


def attach(name_or_path: PathLike, *, seed: Optional[int] = None) -> ReplayBuffer:
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
    return ReplayBuffer.attach(name_or_path, seed=seed)
