"""N-step returns: per-handle staging of the last steps of one environment stream.

A buffer made with ``Nstep={"size": n, "gamma": g, "rew": "rew", "next": "next_obs"}`` stores,
for each step t it is given, the n-step transition of t::

    rew       = sum over k < m of g**k * rew(t + k)
    next_obs  = next_obs(t + m - 1)
    done      = done(t + m - 1)          (1 when the episode terminated inside the window)
    discounts = g**m                     (float32; the factor of the bootstrap value)

with m = min(n, steps left in t's episode), every other column as given with step t. A learner's
target is then ``rew + discounts * (1 - done) * Q(next_obs)`` for every row, the shortened
windows at an episode's end included.

Step t can only be written once step t + n - 1 was added or its episode ended, so each handle
keeps the steps it added whose window is still open (at most n - 1) in local staging, in its own
process; they are not in the shared segment until they are committed. An episode ends with a step
whose ``done`` is non-zero (terminated: everything staged is committed at once) or with
``on_episode_end()`` / ``close()`` (truncated: the staged steps are committed, bootstrapping from
the last step's ``next_obs``).

The staging is a run of contiguous per-column arrays: new steps are appended after the staged
ones, and the finished transitions are always a prefix of the run, so their plain columns go to
the store as slices without a copy. Only the n-step columns (rewards, next observations, done,
discounts) are computed, vectorized over the committed rows.

Examples
--------
>>> from cpprb_ray import ReplayBuffer
>>> env = {"obs": {}, "rew": {}, "next_obs": {}, "done": {}}
>>> nstep = {"size": 3, "gamma": 0.5, "rew": "rew", "next": "next_obs"}
>>> with ReplayBuffer(16, env, Nstep=nstep) as rb:
...     for t in range(4):  # an episode of 4 steps, terminated by its last one
...         _ = rb.add(obs=t, rew=1.0, next_obs=t + 1, done=float(t == 3))
...     rows = rb.get_all_transitions()
>>> rows["rew"].ravel().tolist(), rows["next_obs"].ravel().tolist()
([1.75, 1.75, 1.5, 1.0], [3.0, 4.0, 4.0, 4.0])
>>> rows["done"].ravel().tolist(), rows["discounts"].ravel().tolist()
([0.0, 1.0, 1.0, 1.0], [0.125, 0.125, 0.25, 0.5])
"""

from __future__ import annotations

import math
import os
import threading
import time
import warnings
import weakref
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from cpprb_ray import _compat, _layout, _rules
from cpprb_ray._store import NeverAdmitted

__all__ = ["DISCOUNTS", "DONE", "LaneSink", "NstepConfig", "NstepStaging", "NstepWriter",
           "RingSink", "meta_of", "plan_columns"]

DISCOUNTS = "discounts"   # the column this module adds: g**m per row
DONE = "done"             # the terminated flag, as in cpprb
DEFAULT_GAMMA = 0.99      # cpprb's default discount (its Nstep["gamma"] is optional)
META_KEY = "nstep"        # where the config lives in the layout JSON's "meta"

_FLOAT32 = np.dtype(np.float32)
_FLOAT64 = np.dtype(np.float64)

# Bumped in every forked child: a staging made before the fork sees it changed and forgets the
# steps it inherited (cheaper than comparing os.getpid(), a system call, on every add).
_FORKS = [0]
_FLOAT_MAX = 1.7976931348623157e308   # a size past it is past any memory: shown as this
_LARGE = 4096   # staging capacity (steps) above which a commit shrinks it back to the base
_SLOT = " slot"           # (laned) staging arrays: each staged step's row, as written; the
_GENERATION = " generation"   # space keeps them apart from any env_dict key


# Every staging, so that a forked child can give each a new lock: a thread of the parent that
# held one at the fork (an add the rate limiter held back) does not exist in the child, and its
# lock would stay held for good.
_STAGINGS: weakref.WeakSet[NstepStaging] = weakref.WeakSet()


def _count_fork() -> None:
    _FORKS[0] += 1
    for staging in list(_STAGINGS):
        staging._lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_count_fork)

def _keys(spec: Mapping[str, Any], field: str) -> Tuple[str, ...]:
    if field not in spec:
        return ()   # cpprb's N-step without rewards (or without next columns): none summed
    value = spec[field]
    if isinstance(value, str):
        return (value,)
    if isinstance(value, (list, tuple)) and value and all(isinstance(k, str) for k in value):
        if len(set(value)) != len(value):
            raise ValueError(f"Nstep[{field!r}] names a column twice: {list(value)}")
        return tuple(value)
    raise TypeError(f"Nstep[{field!r}] must be a column name or a non-empty list of them; got "
                    f"{value!r}")


class NstepConfig:
    """A validated N-step spec: window `size`, discount `gamma`, reward and next-state columns.

    Parameters
    ----------
    size : int
        The window n (>= 1).
    gamma : float
        The discount, in [0, 1].
    rew : tuple of str
        Columns summed with discounts over the window (may be empty).
    next : tuple of str
        Columns taken from the window's last step (may be empty).

    Examples
    --------
    >>> from cpprb_ray.nstep import NstepConfig
    >>> config = NstepConfig(3, 0.99, ("rew",), ("next_obs",))
    >>> config.as_dict()
    {'size': 3, 'gamma': 0.99, 'rew': ['rew'], 'next': ['next_obs']}
    """

    __slots__ = ("size", "gamma", "rew", "next")

    def __init__(self, size: int, gamma: float, rew: Tuple[str, ...],
                 next: Tuple[str, ...]) -> None:  # noqa: A002 (cpprb's key)
        self.size = size
        self.gamma = gamma
        self.rew = rew
        self.next = next

    @classmethod
    def parse(cls, spec: Any, columns: Sequence[Any]) -> NstepConfig:
        """Validate cpprb's ``Nstep`` dict against the buffer's columns.

        As in cpprb, ``"size"`` is required, ``"gamma"`` defaults to 0.99 and ``"rew"`` and
        ``"next"`` may be left out (N-step on observations alone: the done flags and
        discounts). Raises TypeError or ValueError naming the offending key; unlike cpprb, a
        key must name an existing column of a fitting kind, and no other key is taken.

        Examples
        --------
        >>> import numpy as np
        >>> from cpprb_ray._layout import parse_env_dict
        >>> from cpprb_ray.nstep import NstepConfig
        >>> columns = parse_env_dict({"obs": {}, "rew": {}, "next_obs": {}, "done": {}})
        >>> NstepConfig.parse({"size": 2, "gamma": 0.9, "rew": "rew", "next": "next_obs"},
        ...                   columns).size
        2
        >>> NstepConfig.parse({"size": 2, "gamma": 0.9, "rew": "reward", "next": "next_obs"},
        ...                   columns)
        Traceback (most recent call last):
        ...
        ValueError: Nstep['rew'] names 'reward', which is not a column of env_dict ...
        >>> NstepConfig.parse({"size": 4}, columns).as_dict()
        {'size': 4, 'gamma': 0.99}
        """
        if not isinstance(spec, Mapping):
            raise TypeError(f"Nstep must be a dict like {{'size': 3, 'gamma': 0.99, 'rew': "
                            f"'rew', 'next': 'next_obs'}}; got {type(spec).__name__}")
        expected = ("size", "gamma", "rew", "next")
        unknown = sorted(str(key) for key in spec if key not in expected)
        if "size" not in spec or unknown:
            raise ValueError(f"Nstep takes the keys {list(expected)} ('size' required); "
                             f"unknown {unknown}")
        size = spec["size"]
        if isinstance(size, _rules.NOT_NUMBERS) or not isinstance(size, (int, np.integer)):
            raise TypeError(f"Nstep['size'] must be an int; got {type(size).__name__}")
        if size < 1:
            raise ValueError(f"Nstep['size'] must be >= 1; got {size}")
        gamma = spec.get("gamma", DEFAULT_GAMMA)
        if isinstance(gamma, _rules.NOT_NUMBERS) or not isinstance(
                gamma, (int, float, np.integer, np.floating)):
            raise TypeError(f"Nstep['gamma'] must be a real number; got {type(gamma).__name__}")
        try:
            discount = float(gamma)
        except OverflowError:   # an int beyond any float
            discount = math.inf
        if not 0.0 <= discount <= 1.0:
            raise ValueError(f"Nstep['gamma'] must be in [0, 1]; got {_rules.shown(gamma)}")
        config = cls(int(size), discount, _keys(spec, "rew"), _keys(spec, "next"))
        config.check(columns)
        # Each handle stages up to 4 windows of steps in its own memory (NstepStaging): a size
        # that could never fit is refused here, naming it, not by numpy's allocation error.
        staging_bytes = 4 * config.size * (sum(c.row_bytes for c in columns) + 8)
        _rules.check_memory(float(min(staging_bytes, _FLOAT_MAX)), "Nstep['size']", size,
                            "staging in each handle's process")
        return config

    def check(self, columns: Sequence[Any]) -> None:
        """ValueError/TypeError unless the columns can carry this config's N-step transitions.

        Examples
        --------
        >>> from cpprb_ray._layout import parse_env_dict
        >>> from cpprb_ray.nstep import NstepConfig
        >>> NstepConfig(3, 0.9, ("rew",), ("next_obs",)).check(parse_env_dict({"rew": {}}))
        Traceback (most recent call last):
        ...
        ValueError: Nstep['next'] names 'next_obs', which is not a column of env_dict ...
        """
        by_name = {c.name: c for c in columns}
        for field, names in (("rew", self.rew), ("next", self.next)):
            for name in names:
                if name not in by_name:
                    raise ValueError(f"Nstep[{field!r}] names {name!r}, which is not a column of "
                                     f"env_dict {sorted(by_name)}")
                if name == DONE:
                    raise ValueError(f"Nstep[{field!r}] must not name the {DONE!r} column")
        both = sorted(set(self.rew) & set(self.next))
        if both:
            raise ValueError(f"Nstep['rew'] and Nstep['next'] must not share columns; both name "
                             f"{both}")
        for name in self.rew:
            if by_name[name].dtype.kind != "f":
                raise TypeError(f"Nstep['rew'] column {name!r} must have a floating dtype (it "
                                f"holds discounted sums); got {by_name[name].dtype}")
        done = by_name.get(DONE)
        if done is None:
            raise ValueError(f"Nstep needs a {DONE!r} column in env_dict (non-zero when a step "
                             f"terminated its episode), as cpprb does")
        if done.shape != (1,) or done.dtype.kind not in "biuf":
            raise TypeError(f"the {DONE!r} column must be one number per step; got shape "
                            f"{done.shape}, dtype {done.dtype}")

    def as_dict(self) -> Dict[str, Any]:
        """The config as cpprb's ``Nstep`` dict (lists of column names; ``rew`` and ``next``
        only where they name columns).

        Examples
        --------
        >>> from cpprb_ray.nstep import NstepConfig
        >>> NstepConfig(2, 0.5, ("rew",), ("next_obs", "next_act")).as_dict()["next"]
        ['next_obs', 'next_act']
        """
        spec: Dict[str, Any] = {"size": self.size, "gamma": self.gamma}
        for field, names in (("rew", self.rew), ("next", self.next)):
            if names:
                spec[field] = list(names)
        return spec

    @classmethod
    def from_meta(cls, meta: Mapping[str, Any], columns: Sequence[Any],
                  location: str = "") -> Optional[NstepConfig]:
        """The config recorded in a segment's layout metadata, or None; ValueError (the
        segment at `location` is not a valid buffer) when the record is broken.

        Examples
        --------
        >>> from cpprb_ray._layout import parse_env_dict
        >>> from cpprb_ray.nstep import NstepConfig, plan_columns
        >>> spec = {"size": 2, "gamma": 0.5, "rew": "rew", "next": "next_obs"}
        >>> columns, config = plan_columns(
        ...     parse_env_dict({"rew": {}, "next_obs": {}, "done": {}}), spec)
        >>> NstepConfig.from_meta({"nstep": config.as_dict()}, columns).as_dict()
        {'size': 2, 'gamma': 0.5, 'rew': ['rew'], 'next': ['next_obs']}
        >>> NstepConfig.from_meta({}, columns) is None
        True
        """
        spec = meta.get(META_KEY)
        if spec is None:
            return None
        discounts = [c for c in columns if c.name == DISCOUNTS]
        if len(discounts) != 1 or discounts[0].dtype != _FLOAT32 or discounts[0].shape != (1,):
            raise _layout.corrupt(location, f"its N-step layout has no float32 {DISCOUNTS!r} "
                                            f"column")
        try:
            return cls.parse(spec, [c for c in columns if c.name != DISCOUNTS])
        except (TypeError, ValueError) as error:
            raise _layout.corrupt(location, f"its N-step record is broken: {error}") from None


def plan_columns(columns: List[Any], spec: Any) -> Tuple[List[Any], Optional[NstepConfig]]:
    """The columns of a new buffer and its N-step config (None without `spec`).

    With a spec, a float32 "discounts" column is appended. "discounts" is reserved in env_dict
    either way, so that a sample's "discounts" always means g**m.

    Examples
    --------
    >>> from cpprb_ray._layout import parse_env_dict
    >>> from cpprb_ray.nstep import plan_columns
    >>> columns, config = plan_columns(parse_env_dict({"rew": {}, "next_obs": {}, "done": {}}),
    ...                                {"size": 3, "gamma": 0.9, "rew": "rew", "next": "next_obs"})
    >>> [c.name for c in columns], config.size
    (['rew', 'next_obs', 'done', 'discounts'], 3)
    """
    if any(c.name == DISCOUNTS for c in columns):
        raise ValueError(f"env_dict key {DISCOUNTS!r} is reserved for the N-step discount "
                         f"(g**m) that sample() returns")
    if spec is None:
        return columns, None
    config = NstepConfig.parse(spec, columns)
    return columns + [_layout.Column(DISCOUNTS, _FLOAT32, (1,))], config


def meta_of(config: Optional[NstepConfig]) -> Dict[str, Any]:
    """What a buffer records in its layout's "meta" for `config` (nothing without one).

    Examples
    --------
    >>> from cpprb_ray.nstep import NstepConfig, meta_of
    >>> meta_of(NstepConfig(3, 0.5, ("rew",), ("next_obs",)))
    {'nstep': {'size': 3, 'gamma': 0.5, 'rew': ['rew'], 'next': ['next_obs']}}
    >>> meta_of(None)
    {}
    """
    return {} if config is None else {META_KEY: config.as_dict()}


def _never_admitted(error: NeverAdmitted, call: str, staged: int) -> NeverAdmitted:
    """The rate limiter's refusal of an N-step commit, saying which rows it counted: a row for
    each step whose window of n steps is complete, steps staged by earlier adds included (so a
    batch of k steps can complete more than k rows). Nothing was staged or committed."""
    return NeverAdmitted(f"{error} (N-step: {call} completes a row for each step whose window "
                         f"of n steps it completes, and the {staged} step"
                         f"{'' if staged == 1 else 's'} staged before it count among them; "
                         f"they stay staged)")


class NstepStaging:
    """One handle's staged steps and the commit of its finished N-step transitions.

    Not shared: each handle (and each process a handle is inherited into by fork) has its own,
    empty at first. Thread-safe, though interleaving two streams on one handle mixes them.

    Every call that commits gets the writer part it commits through as `sink`: a RingSink or
    a LaneSink (below), the two implementations of the interface it declares::

        sink.closed -> bool                 adds to a closed buffer are refused
        sink.laned -> bool                  which of the two ways below it commits
        sink.weights_of(priorities, count)  (float64 priorities, their leaf weights): the
                                            one check and weighing of a step's priorities
        sink.commit(rows, priorities, weights, timeout) -> first slot      (ring)
        sink.write_steps(steps, count, slots, generations, timeout, admit) (lane)
        sink.rows_lost(slots, generations) -> bool                         (lane)
        sink.complete(rows, priorities, weights, slots, generations, last_slots,
                      last_generations, timeout) -> first slot or None     (lane)

    A commit is ONE store call; `timeout` is how long a rate limiter may hold it back, and a
    TimeoutError there leaves the staging as it was before the call. Priorities and weights
    are None when no committed step came with one, else NaN for each step that did not: the
    store gives those the largest priority seen, read under its lock.

    Parameters
    ----------
    config : NstepConfig
        Window, discount and columns.
    columns : sequence of Column
        The buffer's columns, "discounts" included, in layout order.
    prioritized : bool
        Whether steps may carry priorities.

    Examples
    --------
    >>> from cpprb_ray._layout import parse_env_dict
    >>> from cpprb_ray.nstep import NstepStaging, plan_columns
    >>> columns, config = plan_columns(parse_env_dict({"rew": {}, "next_obs": {}, "done": {}}),
    ...                                {"size": 2, "gamma": 0.5, "rew": "rew", "next": "next_obs"})
    >>> class Sink:
    ...     closed = False
    ...     laned = False
    ...     committed = []
    ...     def commit(self, rows, priorities, weights, timeout=None):
    ...         self.committed.append(rows)
    ...         return 0
    >>> staging = NstepStaging(config, columns, prioritized=False)
    >>> staging.add(Sink(), {"rew": 1.0, "next_obs": 1.0, "done": 0.0}) is None, staging.staged
    (True, 1)
    >>> staging.add(Sink(), {"rew": 2.0, "next_obs": 2.0, "done": 0.0}), staging.staged
    (0, 1)
    >>> Sink.committed[0]["rew"].ravel().tolist(), Sink.committed[0]["discounts"].ravel().tolist()
    ([2.0], [0.25])
    """

    def __init__(self, config: NstepConfig, columns: Sequence[Any], prioritized: bool,
                 laned: bool = False) -> None:
        self.config = config
        # Through a lane (frames): each step goes into the lane when it is staged, as a row that
        # waits for its window (its frames must be in the lane in stream order); a commit then
        # completes those rows. Each staged step keeps its row's slot and generation.
        self._laned = laned
        self._user_columns = [c for c in columns if c.name != DISCOUNTS]
        self._names = [c.name for c in self._user_columns]
        self._done_index = self._names.index(DONE)
        self._rew = [name for name in self._names if name in config.rew]
        self._next = [name for name in self._names if name in config.next]
        # Taken from a row's own step: everything but the n-step columns.
        self._plain = [name for name in self._names
                       if name not in config.rew and name not in config.next and name != DONE]
        # Where the single-step commit takes each copied column from: the row's own step, or
        # (next and done) the window's last one, n - 1 later.
        self._row_sources = ([(name, 0) for name in self._plain]
                             + [(name, config.size - 1) for name in self._next + [DONE]])
        self._prioritized = prioritized
        size = config.size
        self._size = size
        # g**k for k = 0..n, computed once; a row's rewards weigh g**k and its discount is g**m.
        self._powers = np.power(config.gamma, np.arange(size + 1, dtype=_FLOAT64))
        self._weights = self._powers[:size].tolist()
        self._weights_row = self._powers[:size].reshape(1, size)
        self._offsets = np.arange(size, dtype=np.int64)
        self._discounts_by_span = self._powers[1:].astype(_FLOAT32)   # g**(span + 1)
        self._full_discount = np.full((1, 1), self._powers[size], dtype=_FLOAT32)
        self._reward_scratch = {c.name: np.empty((1, 1), dtype=c.dtype)
                                for c in self._user_columns if c.name in config.rew}
        # The single-step path sums one-number reward columns in Python floats, the same
        # float64 operations in the same order as _discounted_sums, so both give equal rows.
        self._scalar_rewards = all(c.shape == (1,) for c in self._user_columns
                                   if c.name in config.rew)
        self._castable: Dict[Tuple[str, np.dtype], bool] = {}
        self._lock = threading.Lock()
        # clear() asks (_clears moves) and the next holder of the lock drops the staged steps
        # (_cleared catches up): a clear never waits for an add that the rate limiter holds
        # back in another thread (close() clears after such an add kept the lock from it).
        self._clears = self._cleared = 0
        _STAGINGS.add(self)
        # Room for single steps: compaction (moving the < n staged steps to the front) comes
        # once every `base - n` steps. Batches grow it; past _LARGE steps the next commit
        # shrinks it back, so that one huge batch does not keep a huge staging.
        self._base_capacity = max(4 * size, 64)
        self._allocate(self._base_capacity)

    def _allocate(self, capacity: int) -> None:
        self._set_storage(capacity, self._new_storage(capacity), self._no_priorities(capacity))
        self._head = 0    # first staged step
        self._tail = 0    # one past the last staged step
        self._fork_epoch = _FORKS[0]

    def _new_storage(self, capacity: int) -> Dict[str, np.ndarray]:
        storage = {c.name: np.empty((capacity,) + c.shape, dtype=c.dtype)
                   for c in self._user_columns}
        if self._laned:
            storage[_SLOT] = np.empty(capacity, dtype=np.int64)
            storage[_GENERATION] = np.empty(capacity, dtype=np.uint64)
        return storage

    @staticmethod
    def _no_priorities(capacity: int) -> np.ndarray:
        """(2, capacity) float64 of NaN: each staged step's priority and its leaf weight."""
        return np.full((2, capacity), np.nan, dtype=_FLOAT64)

    def _set_storage(self, capacity: int, storage: Dict[str, np.ndarray],
                     priorities: np.ndarray) -> None:
        self._capacity = capacity
        self._storage = storage
        # Each staged step's priority and leaf weight, checked and weighed when it was added
        # (sink.weights_of); NaN: the step came without one.
        self._priority_table = priorities
        self._priorities = priorities[0]
        self._leaf_weights = priorities[1]
        # 1-D views of the one-number columns, for the single-step path's item reads and writes
        self._scalars = {name: array[:, 0] for name, array in storage.items()
                         if array.shape[1:] == (1,)}
        # What _stage_one writes each column through: (name, 1-D view of a one-number column
        # or None, the column's storage, row shape, whether a Python float / int may go in).
        self._writers = []
        for column in self._user_columns:
            kind = column.dtype.kind
            self._writers.append((column.name, self._scalars.get(column.name),
                                  storage[column.name], column.shape, kind == "f",
                                  kind == "f" or (kind == "i" and column.dtype.itemsize == 8)))
        # Row views by position for the single-step commit (a lookup costs less than slicing),
        # made on first use.
        self._row_views: Dict[str, List[Optional[np.ndarray]]] = {
            name: [None] * capacity for name in storage}

    @property
    def full_discount(self) -> float:
        """gamma**n: the discount of a row whose window has all n steps."""
        return float(self._powers[self._size])

    @property
    def staged(self) -> int:
        """Steps added but not yet committed (at most size - 1 between calls).

        Examples
        --------
        >>> from cpprb_ray import ReplayBuffer
        >>> env = {"rew": {}, "next_obs": {}, "done": {}}
        >>> with ReplayBuffer(8, env, Nstep={"size": 3, "gamma": 1.0, "rew": "rew",
        ...                                  "next": "next_obs"}) as rb:
        ...     _ = rb.add(rew=[1.0, 1.0], next_obs=[1.0, 2.0], done=[0.0, 0.0])
        ...     print(rb._writer.staged, rb.get_stored_size())
        2 0
        """
        if self._fork_epoch != _FORKS[0] or self._cleared != self._clears:
            return 0
        return self._tail - self._head

    def _sync(self) -> None:
        """Under the lock: forget inherited steps and apply the clears asked for since."""
        # A forked child inherits a copy of the parent's staged steps; they belong to the
        # parent's stream, which commits them itself, so the child starts empty.
        if self._fork_epoch != _FORKS[0]:
            self._allocate(self._base_capacity)
        if self._cleared != self._clears:
            self._cleared = self._clears
            self._head = self._tail = 0

    def _acquire(self, timeout: Optional[float], what: str) -> None:
        """Take the staging's lock, waiting at most `timeout` (None: as long as it takes) for
        another thread's call on this handle (an add the rate limiter holds back keeps it);
        TimeoutError, with nothing changed, when it is not free by then."""
        if self._lock.acquire(False):
            return
        seconds = _rules.as_timeout(timeout)   # -1.0: no limit
        if seconds > threading.TIMEOUT_MAX:
            seconds = -1.0
        if self._lock.acquire(True, seconds):
            return
        raise TimeoutError(f"{what}: another thread's call on this handle held its N-step "
                           f"staging for {seconds:g} s (timeout={timeout!r}), e.g. an add the "
                           f"rate limiter holds back; nothing was staged or committed")

    def _reserve(self, count: int) -> None:
        """Make room for `count` more steps after the staged ones (moving those to the front)."""
        if self._tail + count <= self._capacity:
            return
        staged = self._tail - self._head
        if staged + count > self._capacity:
            capacity = max(2 * self._capacity, staged + count + self._size)
            storage = self._new_storage(capacity)
            priorities = self._no_priorities(capacity)
        else:
            capacity, storage, priorities = self._capacity, self._storage, self._priority_table
        for name, old in self._storage.items():
            storage[name][:staged] = old[self._head:self._tail]
        priorities[:, :staged] = self._priority_table[:, self._head:self._tail]
        if storage is not self._storage:   # compacting in place keeps every view valid
            self._set_storage(capacity, storage, priorities)
        self._head, self._tail = 0, staged

    def add(self, sink: Any, values: Mapping[str, Any], priorities: Any = None,
            timeout: Optional[float] = None) -> Optional[int]:
        """Stage one step or a batch of consecutive steps; commit the transitions they finish.

        Returns the first slot written, or None when no row was committed. `timeout` goes to
        the commit (a rate limiter's wait); when it expires, the steps given are not staged
        and nothing is committed.

        Examples
        --------
        >>> from cpprb_ray import ReplayBuffer
        >>> env = {"rew": {}, "next_obs": {}, "done": {}}
        >>> with ReplayBuffer(8, env, Nstep={"size": 2, "gamma": 0.5, "rew": "rew",
        ...                                  "next": "next_obs"}) as rb:
        ...     print(rb.add(rew=[1.0, 2.0, 4.0], next_obs=[1, 2, 3], done=[0, 0, 0]))
        ...     print(rb.get_all_transitions()["rew"].ravel())
        0
        [2. 4.]
        """
        if sink.closed:
            raise ValueError("operation on a closed buffer")
        if timeout is not None:
            _rules.as_timeout(timeout)   # refused even when nothing is committed
        self._acquire(timeout, "add")
        try:
            if self._fork_epoch != _FORKS[0] or self._cleared != self._clears:
                self._sync()
            staged = self._tail - self._head
            if self._tail == self._capacity:
                self._reserve(1)
            tail = self._tail
            if self._stage_one(values, tail):
                # Checked before the lane write: a bad priority must leave the lane unchanged.
                priority = weight = np.nan
                if priorities is not None:
                    given, weights = sink.weights_of(priorities, 1)
                    priority, weight = given[0], weights[0]
                if self._laned:
                    done = bool(self._scalars[DONE][tail])
                    timeout = self._write_steps(
                        sink, tail, tail + 1, timeout,
                        self._ready(tail if done else -1, tail + 1) - self._head)
                self._priorities[tail] = priority
                self._leaf_weights[tail] = weight
                if not self._scalars[DONE][tail]:
                    if tail + 1 - self._head < self._size:
                        self._tail = tail + 1
                        return None
                    if self._scalar_rewards:
                        first = self._commit_full_window(sink, timeout)
                        self._tail = tail + 1
                        return first
                    return self._commit_ready(sink, np.empty(0, dtype=np.int64), tail + 1,
                                              timeout)
                return self._commit_ready(sink, np.array([tail], dtype=np.int64), tail + 1,
                                          timeout)
            arrays, count = _rules.stage_rows(self._user_columns, values)
            weights = None
            if priorities is not None:
                priorities, weights = sink.weights_of(priorities, count)
            self._reserve(count)
            tail = self._tail
            new_tail = tail + count
            for name, array in zip(self._names, arrays):
                self._storage[name][tail:new_tail] = array
            ends = tail + np.flatnonzero(arrays[self._done_index].reshape(-1))
            if self._laned:
                timeout = self._write_steps(
                    sink, tail, new_tail, timeout,
                    self._ready(int(ends[-1]) if ends.shape[0] else -1, new_tail) - self._head)
            self._priorities[tail:new_tail] = np.nan if priorities is None else priorities
            self._leaf_weights[tail:new_tail] = np.nan if weights is None else weights
            return self._commit_ready(sink, ends, new_tail, timeout)
        except NeverAdmitted as error:
            raise _never_admitted(error, "the add", staged) from None
        finally:
            self._lock.release()

    def _ready(self, last_end: int, new_tail: int) -> int:
        """Where the steps whose windows are complete end once the staging reaches
        `new_tail`: past the last episode end (`last_end`, -1 for none) and every step with n
        steps after it. The one rule for what an add commits (see _commit_ready)."""
        return max(self._head, last_end + 1, new_tail - self._size + 1)

    def _rewrite_lost_steps(self, sink: Any, stop: int) -> None:
        """(Laned) A clear() (from any handle) since staged steps head..stop-1 went into the
        lane wiped their rows, and their windows would complete nothing (their slots'
        generations moved on). Written again, before anything newer and in stream order (so
        their frames are exact and compress as before), they commit after the clear, as a
        plain ring's staged steps do. No limiter wait: they complete no row by themselves."""
        head = self._head
        storage = self._storage
        if stop > head and sink.rows_lost(storage[_SLOT][head:stop],
                                          storage[_GENERATION][head:stop]):
            self._lane_write(sink, head, stop, None, 0)

    def _lane_write(self, sink: Any, start: int, stop: int, timeout: Optional[float],
                    rows: int) -> None:
        """Staged steps start..stop-1 into the lane; each one's slot and generation, as
        written, beside it in the staging (`rows`: what the limiter must admit first)."""
        storage = self._storage
        sink.write_steps({name: storage[name][start:stop] for name in self._names},
                         stop - start, storage[_SLOT][start:stop],
                         storage[_GENERATION][start:stop], timeout, rows)

    def _write_steps(self, sink: Any, start: int, stop: int, timeout: Optional[float],
                     rows: int) -> Optional[float]:
        """(Laned) Put staged steps start..stop-1 into the lane as rows that wait for their
        windows; their slots and generations go beside them in the staging. A rate limiter
        holds the write back until it would admit the `rows` rows the add completes (so a
        held-back add writes nothing); the completion is then admitted and counted as one add
        (another writer may have taken the room meanwhile). Returns what is left of
        `timeout` for that completion."""
        self._rewrite_lost_steps(sink, start)
        started = time.monotonic()
        self._lane_write(sink, start, stop, timeout, rows)
        seconds = _rules.as_timeout(timeout)
        if seconds < 0.0:
            return None
        return max(0.0, seconds - (time.monotonic() - started))

    def _commit(self, sink: Any, rows: Dict[str, np.ndarray], timeout: Optional[float],
                head: int, ready: int, lasts: np.ndarray) -> Any:
        """Hand rows head..ready-1 to the sink, with their steps' priorities and weights: as
        new rows, or (laned) completing the rows their steps were written as, whose next stacks
        end at the rows of steps `lasts`."""
        priorities = weights = None
        if self._prioritized and not np.isnan(self._priorities[head:ready]).all():
            priorities = self._priorities[head:ready]
            weights = self._leaf_weights[head:ready]
        if not self._laned:
            return sink.commit(rows, priorities, weights, timeout)
        storage = self._storage
        self._rewrite_lost_steps(sink, int(lasts.max()) + 1)   # on_episode_end after a clear
        return sink.complete(rows, priorities, weights, storage[_SLOT][head:ready],
                             storage[_GENERATION][head:ready], storage[_SLOT].take(lasts),
                             storage[_GENERATION].take(lasts), timeout)

    def _stage_one(self, values: Mapping[str, Any], tail: int) -> bool:
        """Write one step at `tail` when every value is a Python or numpy scalar (one-number
        columns) or an array of the row's shape, of a dtype that same_kind casting allows; else
        False, and the caller applies _rules.stage_rows (which raises what add must raise)."""
        if len(values) != len(self._writers):
            return False
        castable = self._castable
        try:
            for name, scalars, storage, shape, float_ok, int_ok in self._writers:
                value = values[name]
                value_type = type(value)
                if value_type is float or value_type is int or value_type is bool:
                    # An int into a narrower int column follows numpy's cast in stage_rows.
                    if scalars is None or not (float_ok or value_type is bool
                                               or (int_ok and value_type is int)):
                        return False
                    scalars[tail] = value
                    continue
                if value_type is np.ndarray:
                    if value.shape != shape and not (scalars is not None and value.shape == ()):
                        return False
                elif scalars is None or not isinstance(value, np.generic):
                    return False
                if value.dtype is not storage.dtype:
                    key = (name, value.dtype)
                    allowed = castable.get(key)
                    if allowed is None:
                        allowed = castable[key] = value.dtype.kind in "biuf" and bool(
                            np.can_cast(value.dtype, storage.dtype, casting="same_kind"))
                    if not allowed:
                        return False
                storage[tail] = value
        except (KeyError, OverflowError, ValueError):
            return False
        return True

    def flush(self, sink: Any, timeout: Optional[float] = None) -> Optional[int]:
        """End the episode: commit every staged step, bootstrapping from the last next state.

        Returns the first slot written, or None when nothing was staged. `timeout` as for
        :meth:`add` (on expiry the steps stay staged).

        Examples
        --------
        >>> from cpprb_ray import ReplayBuffer
        >>> env = {"rew": {}, "next_obs": {}, "done": {}}
        >>> with ReplayBuffer(8, env, Nstep={"size": 3, "gamma": 0.5, "rew": "rew",
        ...                                  "next": "next_obs"}) as rb:
        ...     _ = rb.add(rew=[1.0, 2.0], next_obs=[1, 2], done=[0, 0])
        ...     staging, sink = rb._writer._staging, rb._writer._sink
        ...     print(staging.flush(sink), staging.flush(sink))
        ...     rows = rb.get_all_transitions()
        ...     print(rows["rew"].ravel(), rows["next_obs"].ravel(), rows["discounts"].ravel())
        0 None
        [2. 2.] [2. 2.] [0.25 0.5 ]
        """
        if timeout is not None:
            _rules.as_timeout(timeout)   # refused even when nothing is staged
        self._acquire(timeout, "on_episode_end")
        try:
            self._sync()
            if self._tail == self._head:
                return None
            staged = self._tail - self._head
            return self._commit_ready(sink, np.array([self._tail - 1], dtype=np.int64),
                                      self._tail, timeout)
        except NeverAdmitted as error:
            raise _never_admitted(error, "on_episode_end", staged) from None
        finally:
            self._lock.release()

    def clear(self) -> None:
        """Drop the staged steps without committing them.

        Examples
        --------
        >>> from cpprb_ray import ReplayBuffer
        >>> env = {"rew": {}, "next_obs": {}, "done": {}}
        >>> with ReplayBuffer(8, env, Nstep={"size": 3, "gamma": 0.5, "rew": "rew",
        ...                                  "next": "next_obs"}) as rb:
        ...     _ = rb.add(rew=1.0, next_obs=1.0, done=0.0)
        ...     staging, sink = rb._writer._staging, rb._writer._sink
        ...     staging.clear()
        ...     print(staging.staged, staging.flush(sink))
        0 None
        """
        # Never waits: an add that the rate limiter holds back in another thread keeps the lock
        # (close() clears then, and must not hang); it drops the steps when it lets go.
        self._clears += 1
        if self._lock.acquire(False):
            try:
                self._sync()
            finally:
                self._lock.release()

    def _commit_full_window(self, sink: Any, timeout: Optional[float]) -> int:
        """The common single-step case: the oldest staged step's window just filled (n steps,
        no episode end), so every column is one row and each reward a sum of n Python floats.
        The arrays given to the commit are views and scratch, consumed before it returns (the
        store copies them into the segment)."""
        head = self._head
        last = head + self._size - 1
        rows = {}
        views, storage = self._row_views, self._storage
        for name, offset in self._row_sources:
            position = head + offset
            view = views[name][position]
            if view is None:
                view = views[name][position] = storage[name][position:position + 1]
            rows[name] = view
        for name in self._rew:
            total = 0.0
            for weight, reward in zip(self._weights,
                                      self._scalars[name][head:last + 1].tolist()):
                total += weight * reward
            scratch = self._reward_scratch[name]
            scratch[0, 0] = total
            rows[name] = scratch
        rows[DISCOUNTS] = self._full_discount
        first = self._commit(sink, rows, timeout, head, head + 1,
                             np.array([last], dtype=np.int64))
        self._head = head + 1
        return first

    def _commit_ready(self, sink: Any, ends: np.ndarray, new_tail: int,
                      timeout: Optional[float]) -> Optional[int]:
        """Commit every step whose window is complete: those up to the last episode end in
        `ends` (ascending positions of terminal or truncating steps) and those with n steps
        after them; keep the rest (at most n - 1) staged. Rolls nothing forward on failure."""
        head = self._head
        size = self._size
        ready = self._ready(int(ends[-1]) if ends.shape[0] else -1, new_tail)
        if ready == head:
            self._tail = new_tail
            if self._capacity > _LARGE:
                self._shrink()
            return None
        storage = self._storage
        rows = {}
        for name in self._plain:
            rows[name] = storage[name][head:ready]
        if ends.shape[0]:
            rows.update(self._windows_to_ends(ends, head, ready, new_tail))
            lasts = self._lasts
        else:
            lasts = np.arange(head + size - 1, ready + size - 1, dtype=np.int64)
            # No episode end among them: every window has n steps, and every column is a slice.
            for name in self._next:
                rows[name] = storage[name][head + size - 1:ready + size - 1]
            rows[DONE] = storage[DONE][head + size - 1:ready + size - 1]
            for name in self._rew:
                total = np.zeros(storage[name][head:ready].shape, dtype=_FLOAT64)
                for k, weight in enumerate(self._weights):
                    total += weight * storage[name][head + k:ready + k].astype(_FLOAT64)
                rows[name] = total.astype(storage[name].dtype)
            rows[DISCOUNTS] = np.full((ready - head, 1), self._powers[size], dtype=_FLOAT32)
        first = self._commit(sink, rows, timeout, head, ready, lasts)
        self._head = ready
        self._tail = new_tail
        if ready == new_tail:
            self._head = self._tail = 0   # nothing staged: start again at the front
        if self._capacity > _LARGE:
            self._shrink()
        return first

    def _windows_to_ends(self, ends: np.ndarray, head: int, ready: int,
                         new_tail: int) -> Dict[str, np.ndarray]:
        """The n-step columns of rows head..ready-1 when episodes end among them: each row's
        window runs to its episode's end or n steps, whichever comes first."""
        size = self._size
        storage = self._storage
        positions = np.arange(head, ready, dtype=np.int64)
        # span = steps - 1: to the episode's end (new_tail past the last one), at most n - 1.
        span = np.append(ends, new_tail).take(ends.searchsorted(positions))
        span -= positions
        np.minimum(span, size - 1, out=span)
        last = positions + span
        self._lasts = last
        rows = {}
        for name in self._next:
            rows[name] = storage[name].take(last, axis=0)
        rows[DONE] = storage[DONE].take(last, axis=0)
        if self._rew:
            outside = self._offsets > span[:, None]
            window = positions[:, None] + self._offsets
            np.minimum(window, new_tail - 1, out=window)
            for name in self._rew:
                scalars = self._scalars.get(name)
                if scalars is not None:   # (rows, n), not (rows, n, 1): fewer broadcasts
                    weighted = scalars.take(window).astype(_FLOAT64)
                    weighted *= self._weights_row
                    # Steps past a window's end (another episode, or not added yet) are set to
                    # 0 after weighting, not weighted by 0, so an inf there cannot leak in.
                    weighted[outside] = 0.0
                else:
                    weighted = storage[name].take(window, axis=0).astype(_FLOAT64)
                    weighted *= self._powers[:size].reshape(
                        (size,) + (1,) * (storage[name].ndim - 1))
                    weighted[outside] = 0.0
                # k by k, in float64, as the single-step path adds: equal rows either way.
                total = np.zeros(weighted.shape[:1] + weighted.shape[2:], dtype=_FLOAT64)
                for k in range(size):
                    total += weighted[:, k]
                rows[name] = total.astype(storage[name].dtype).reshape(
                    (-1,) + storage[name].shape[1:])
        rows[DISCOUNTS] = self._discounts_by_span.take(span).reshape(-1, 1)
        return rows

    def _shrink(self) -> None:
        """Back to the base capacity after a large batch (at most n - 1 steps are staged)."""
        staged = self._tail - self._head
        storage = self._new_storage(self._base_capacity)
        priorities = self._no_priorities(self._base_capacity)
        for name, old in self._storage.items():
            storage[name][:staged] = old[self._head:self._tail]
        priorities[:, :staged] = self._priority_table[:, self._head:self._tail]
        self._set_storage(self._base_capacity, storage, priorities)
        self._head, self._tail = 0, staged


# -- the N-step writer and its two sinks --------------------------------------------------------

class RingSink:
    """N-step's sink into the plain ring: finished transitions go in as ONE store add."""

    laned = False

    def __init__(self, store: Any, columns: Sequence[Any]) -> None:
        self._store = store
        self._names = [c.name for c in columns]

    @property
    def closed(self) -> bool:
        return bool(self._store.closed)

    def weights_of(self, priorities: Any, count: int) -> Tuple[np.ndarray, np.ndarray]:
        """`count` steps' priorities as float64, checked, with their leaf weights."""
        array = _rules.real_vector(priorities, count, "priorities")
        return array, self._store.weights_of(array, "priorities")

    def commit(self, rows: Mapping[str, np.ndarray], priorities: Optional[np.ndarray],
               weights: Optional[np.ndarray], timeout: Optional[float]) -> Optional[int]:
        first = self._store.add([rows[name] for name in self._names], priorities, timeout,
                                weights)
        return None if first is None else int(first)   # None: a remote handle queued them


class LaneSink(RingSink):
    """N-step's sink into a handle's lane: each step is written when it is staged, as a row
    that waits for its window; a commit completes those rows (frames in stream order)."""

    laned = True

    def __init__(self, store: Any, writer: Any) -> None:
        super().__init__(store, writer.columns)
        self._writer = writer

    def write_steps(self, steps: Dict[str, np.ndarray], count: int, slots: np.ndarray,
                    generations: np.ndarray, timeout: Optional[float], admit: int) -> None:
        """Staged steps as rows that wait for their windows (never sampled before complete);
        each row's slot and generation go to `slots` and `generations`. A rate limiter holds
        the write back (up to `timeout`) until it would admit the `admit` rows the add then
        completes, so that an add it holds back writes nothing."""
        self._writer.add(steps, None, timeout, incomplete=True, out=(slots, generations),
                         count=count, admit=admit)

    def rows_lost(self, slots: np.ndarray, generations: np.ndarray) -> bool:
        """Whether the lane rows of staged steps are gone (a clear since they were written)."""
        return bool(self._writer.rows_lost(slots, generations))

    def complete(self, rows: Dict[str, np.ndarray], priorities: Optional[np.ndarray],
                 weights: Optional[np.ndarray], slots: np.ndarray, generations: np.ndarray,
                 last_slots: np.ndarray, last_generations: np.ndarray,
                 timeout: Optional[float] = None) -> Optional[int]:
        """The rows of `slots` get their n-step columns and their next stacks (those ending at
        `last_slots`), admitted by a rate limiter as one add; the first row's slot, None when
        no row could be completed."""
        # A bounded lane (cpprb's next_of / stack_compress) answers with cpprb's row number.
        before = self._writer.next_slot() if self._writer.rows else int(slots[0])
        done = self._writer.complete(rows, priorities, weights, slots, generations, last_slots,
                                     last_generations, timeout)
        return before if done else None


class NstepWriter:
    """The N-step writer (a writer part, :mod:`cpprb_ray._parts`): this handle's staging of
    its stream's steps over another writer (the ring's or the lane writer), committing finished
    transitions through the sink into it (a RingSink or a LaneSink).

    Examples
    --------
    >>> from cpprb_ray import ReplayBuffer
    >>> env = {"obs": {}, "rew": {}, "next_obs": {}, "done": {}}
    >>> spec = {"size": 2, "gamma": 0.5, "rew": "rew", "next": "next_obs"}
    >>> with ReplayBuffer(8, env, Nstep=spec) as rb:
    ...     _ = rb.add(obs=0.0, rew=1.0, next_obs=1.0, done=0.0)
    ...     print(rb._writer.staged, rb.get_stored_size())
    ...     rb._writer.end_episode(None)
    ...     print(rb._writer.staged, rb.get_stored_size())
    1 0
    0 1
    """

    def __init__(self, config: NstepConfig, base: Any, sink: RingSink, prioritized: bool) -> None:
        self.config = config
        self.columns = base.columns
        self._base = base
        self._sink = sink
        self._staging = NstepStaging(config, base.columns, prioritized, laned=sink.laned)

    @property
    def staged(self) -> int:
        return self._staging.staged

    def add(self, values: Mapping[str, Any], priorities: Any,
            timeout: Optional[float]) -> Optional[int]:
        return self._staging.add(self._sink, values, priorities, timeout)

    @property
    def size(self) -> int:
        return int(self._base.size)

    def add_rows(self, transitions: Dict[str, np.ndarray], file: Any,
                 timeout: Optional[float]) -> None:
        """Finished transitions (the transitions `file`'s), committed as they are, with the
        columns the writer below takes (a laned buffer's: into this handle's lane)."""
        self._base.add(_compat.nstep_rows(transitions, self.columns, file,
                                          self._staging.full_discount), None, timeout)

    def end_episode(self, timeout: Optional[float]) -> None:
        self._staging.flush(self._sink, timeout)

    def forget(self) -> None:
        self._staging.clear()

    def next_slot(self) -> int:
        return int(self._base.next_slot())

    def close(self) -> None:
        """Commit the staged steps as a truncated episode end if the rate limiter (if any) lets
        them in at once, else drop them with a RuntimeWarning; then close the writer below."""
        staged = self._staging.staged
        try:
            # No wait: a close must not hang on a learner that stopped sampling.
            self._staging.flush(self._sink, 0)
        except TimeoutError:
            self._staging.clear()
            warnings.warn(f"close(): the rate limiter held back the {staged} N-step step(s) "
                          f"this handle had staged; they were dropped (call "
                          f"on_episode_end(timeout=...) before close() to wait for it)",
                          RuntimeWarning, stacklevel=4)
        finally:
            self._base.close()
