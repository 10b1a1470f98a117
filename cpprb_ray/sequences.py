"""Sequences for recurrent learners (R2D2): ``sequence={"length": L, "period": P}``.

A sequence buffer stores steps, each once, in lanes (one per writing handle, as frames do), and
samples sequences: `L` consecutive steps of one episode of one writer's stream, starting at
step 0, P, 2P, ... of the episode. Overlapping sequences share their steps. A sequence that
reaches past its episode's end is padded (zeros, ``mask`` False there); it becomes sampleable
once its `L` steps are written or its episode ends (``done`` nonzero, or ``on_episode_end()``).
Before the ring overwrites any step of a sequence, that sequence is gone: never sampled again,
and a late ``update_priorities`` of it is skipped by its generation. The kernels are in
:mod:`cpprb_ray._sequences`; docs/sequences.md has the contract and the figures.

Examples
--------
>>> import numpy as np
>>> from cpprb_ray import PrioritizedReplayBuffer, sequence_priority
>>> env = {"obs": {"shape": 2}, "done": {}}
>>> with PrioritizedReplayBuffer(64, env, sequence={"length": 4, "period": 2}, seed=0) as rb:
...     for t in range(5):                               # one episode of 5 steps
...         _ = rb.add(obs=[t, -t], done=float(t == 4))
...     batch = rb.sample(3)
...     print(rb.get_stored_size(), batch["obs"].shape, batch["mask"].shape)
...     print(sorted(set(batch["obs"][:, 0, 0].tolist())) <= [0.0, 2.0, 4.0])
...     prios = sequence_priority(np.ones((3, 4)), mask=batch["mask"])
...     print(rb.update_priorities(batch["indexes"], prios, batch["generations"]))
3 (3, 4, 2) (3, 4)
True
3
"""

from __future__ import annotations

import os
import warnings
from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np

from cpprb_ray import _rules, frames
from cpprb_ray._layout import Column
from cpprb_ray._seqstore import MAX_LENGTH, OPEN_LINK, SequenceStore

DONE = "done"      # the column whose nonzero value ends an episode
MASK = "mask"      # sample()'s output: True on a sequence's real steps
# A start's link (_sequences.pyx): OPEN_LINK while its sequence is open, its real steps (1 to
# length) once committed; a step that starts none: LINK_NONE (never written) or LINK_DEAD.
LINK_NONE = 0
LINK_DEAD = -2


class SequenceConfig:
    """A sequence buffer's configuration: `length` steps per sequence, a new one every `period`
    steps of an episode, and `eta`, the mix of a first priority from per-step priorities."""

    def __init__(self, length: int, period: int, eta: float):
        self.length = length
        self.period = period
        self.eta = eta

    @classmethod
    def plan(cls, sequence: Any, columns: List[Column], capacity: int, prioritized: bool,
             lanes: Any, refused: Mapping[str, Any]) -> Tuple[SequenceConfig, frames.LaneConfig]:
        """(config, lane config) of a new sequence buffer, or the ValueError naming what is
        wrong; `refused`: the arguments that do not go with ``sequence=`` (given when not None).

        Examples
        --------
        >>> from cpprb_ray._layout import parse_env_dict
        >>> config, lanes = SequenceConfig.plan({"length": 120, "period": 40},
        ...                                     parse_env_dict({"obs": {}}), 1024, True, 4, {})
        >>> config.length, config.period, config.eta, lanes.count
        (120, 40, 0.9, 4)
        >>> SequenceConfig.plan({"length": 8, "period": 9}, parse_env_dict({"obs": {}}), 64,
        ...                     True, None, {})
        Traceback (most recent call last):
        ...
        ValueError: sequence['period'] must be in [1, length 8]; got 9
        """
        for name, value in refused.items():
            if value is not None:
                why = (" (a recurrent learner computes its n-step targets inside the sequence)"
                       if name == "Nstep" else " (frames are not stored in sequence buffers)")
                raise ValueError(f"{name}= does not go with sequence={why}")
        if not isinstance(sequence, Mapping):
            raise TypeError(f"sequence must be a dict with 'length' and 'period'; got "
                            f"{type(sequence).__name__}")
        unknown = set(sequence) - {"length", "period", "eta"}
        if unknown or "length" not in sequence:
            raise ValueError(f"sequence must be a dict with 'length' (and 'period', 'eta'); got "
                             f"keys {sorted(map(str, sequence))}")
        length = _rules.as_count(sequence["length"], "sequence['length']")
        if not 1 <= length <= MAX_LENGTH:
            raise ValueError(f"sequence['length'] must be >= 1 (and at most {MAX_LENGTH}); "
                             f"got {length}")
        period = _rules.as_count(sequence.get("period", length), "sequence['period']")
        if not 1 <= period <= length:
            raise ValueError(f"sequence['period'] must be in [1, length {length}]; got {period}")
        eta = _rules.as_real(sequence.get("eta", 0.9), "sequence['eta']")
        if not 0.0 <= eta <= 1.0:
            raise ValueError(f"sequence['eta'] must be in [0, 1]; got {eta}")
        if MASK in [c.name for c in columns]:
            raise ValueError(f"env_dict key {MASK!r} is sample()'s output in a sequence buffer")
        count = 1 if lanes is None else _rules.as_count(lanes, "lanes")
        if count < 1:
            raise ValueError(f"lanes must be >= 1; got {lanes}")
        if capacity // count < length:
            raise ValueError(f"sequence['length'] {length} is longer than a lane: size "
                             f"{capacity} with lanes={count} leaves {capacity // count} steps "
                             f"per lane; use fewer lanes, a larger size or shorter sequences")
        public = [(c.name, c.shape, c.dtype) for c in columns]
        return cls(length, period, eta), frames.LaneConfig(count, [], not prioritized, public)

    def to_meta(self) -> Dict[str, Any]:
        return {"length": self.length, "period": self.period, "eta": self.eta}

    @classmethod
    def from_meta(cls, meta: Mapping[str, Any], location: str) -> Optional[SequenceConfig]:
        """The config a segment's layout records (None: not a sequence buffer); the store checks
        it against the lanes again before a kernel uses it."""
        record = meta.get("sequence")
        if record is None:
            return None
        try:
            config = cls(int(record["length"]), int(record["period"]), float(record["eta"]))
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(f"{location!r} is not a valid cpprb_ray buffer: unreadable "
                             f"sequence ({error})") from None
        if meta.get("lanes") is None:
            raise ValueError(f"{location!r} is not a valid cpprb_ray buffer: a sequence "
                             f"buffer without lanes")
        return config

    def as_dict(self) -> Dict[str, Any]:
        return {"length": self.length, "period": self.period, "eta": self.eta}


def check_image(generations: np.ndarray, links: np.ndarray, aheads: np.ndarray,
                lane_starts: np.ndarray, heads: np.ndarray, filled: np.ndarray,
                length: int) -> np.ndarray:
    """Which slots of a sequence buffer's image (a checkpoint's records and lane table, the lanes
    checked to fit already) start a committed sequence; ValueError saying what no write leaves:
    a link that is not a start's (open, or 1 to `length` real steps) nor a dead or unwritten
    step's, a second link (which the sequence part never sets), an open start on a slot that is
    torn or unwritten, a committed sequence that reaches past its lane's head (its steps are
    written in order before it) or over a torn step (a repair kills those). `lane_starts`: each
    lane's first slot and, last, the capacity; `heads`, `filled`: each lane's.

    Examples
    --------
    >>> import numpy as np
    >>> generations = np.array([2, 2, 2, 0], dtype=np.uint64)     # one lane of 4 slots
    >>> links = np.array([3, LINK_DEAD, OPEN_LINK, LINK_NONE], dtype=np.int32)
    >>> args = (np.zeros(4, np.int32), np.array([0, 4]), np.array([3]), np.array([3]))
    >>> check_image(generations, links, *args, 4).tolist()
    [True, False, False, False]
    >>> check_image(generations, np.array([4, -2, -3, 0], dtype=np.int32), *args, 4)
    Traceback (most recent call last):
    ...
    ValueError: slot 0's sequence of 4 steps reaches past its lane's head (its lane's slot 3, \
3 of its 4 slots written)
    """
    capacity = len(links)
    bad = np.flatnonzero(~(np.isin(links, (LINK_NONE, LINK_DEAD, OPEN_LINK))
                           | ((links >= 1) & (links <= length))))
    if bad.size:
        raise ValueError(f"slot {int(bad[0])}'s link is {int(links[bad[0]])}, which no write of "
                         f"sequences of {length} steps leaves")
    bad = np.flatnonzero(aheads != 0)
    if bad.size:
        raise ValueError(f"slot {int(bad[0])}'s second link is {int(aheads[bad[0]])}; a "
                         f"sequence buffer never sets it")
    torn = (generations & 1).astype(bool)
    sizes = np.diff(lane_starts)
    lane_of = np.repeat(np.arange(len(sizes)), sizes)
    size = sizes[lane_of]
    rel = np.arange(capacity) - lane_starts[lane_of]
    # How many slots from this one on, up to its lane's head, are written: a start's steps are.
    ahead = (heads.astype(np.int64)[lane_of] - rel) % size
    ahead = np.where(ahead == 0, size, ahead)
    written = ahead <= filled.astype(np.int64)[lane_of]
    bad = np.flatnonzero((links == OPEN_LINK) & (torn | ~written))
    if bad.size:
        raise ValueError(f"slot {int(bad[0])} opens a sequence, but it is "
                         + ("torn" if torn[bad[0]] else "not written"))
    live = (links >= 1) & ~torn
    bad = np.flatnonzero(live & ((links > ahead) | ~written))
    if bad.size:
        slot = int(bad[0])
        lane = int(lane_of[slot])
        raise ValueError(f"slot {slot}'s sequence of {int(links[slot])} steps reaches past its "
                         f"lane's head (its lane's slot {int(heads[lane])}, {int(filled[lane])} "
                         f"of its {int(sizes[lane])} slots written)")
    for lane in np.unique(lane_of[live]):
        first, count = int(lane_starts[lane]), int(sizes[lane])
        starts = np.flatnonzero(live[first:first + count])
        # Torn steps among each sequence's, around the lane's ring: sums over it twice.
        twice = np.concatenate((torn[first:first + count], torn[first:first + count]))
        before = np.concatenate(([0], np.cumsum(twice)))
        hit = np.flatnonzero(before[starts + links[first + starts]] > before[starts])
        if hit.size:
            raise ValueError(f"slot {first + int(starts[hit[0]])}'s sequence has a torn step")
    return live


def sequence_priority(abs_td: Any, mask: Any = None, eta: float = 0.9) -> np.ndarray:
    """R2D2's priority of each sequence: ``eta * max + (1 - eta) * mean`` of its steps' absolute
    TD errors, over the steps `mask` marks (all, without one); 0 for a sequence with none.

    Parameters
    ----------
    abs_td : array of shape (batch, length)
        Absolute TD errors (negative values are taken by their magnitude).
    mask : bool array of shape (batch, length), optional
        ``sample()``'s "mask": True on a sequence's real steps, False on its padding.
    eta : float
        In [0, 1] (0.9, R2D2's).

    Examples
    --------
    >>> import numpy as np
    >>> td = np.array([[1.0, 3.0, 9.0], [2.0, 2.0, 0.0]])
    >>> sequence_priority(td, mask=[[True, True, False], [True, True, True]], eta=0.5)
    array([2.5       , 1.66666667])
    """
    errors = np.abs(np.asarray(abs_td, dtype=np.float64))
    if errors.ndim != 2:
        raise ValueError(f"abs_td must have shape (batch, length); got shape {errors.shape}")
    if not np.isfinite(errors).all():
        raise ValueError("abs_td must be finite")
    eta = _rules.as_real(eta, "eta")
    if not 0.0 <= eta <= 1.0:
        raise ValueError(f"eta must be in [0, 1]; got {eta}")
    if mask is None:
        return eta * errors.max(axis=1) + (1.0 - eta) * errors.mean(axis=1)
    keep = np.asarray(mask)
    if keep.shape != errors.shape:
        raise ValueError(f"mask must have the shape of abs_td {errors.shape}; got {keep.shape}")
    keep = keep.astype(bool)
    counts = keep.sum(axis=1)
    kept = np.where(keep, errors, 0.0)
    means = kept.sum(axis=1) / np.maximum(counts, 1)
    return np.where(counts > 0, eta * kept.max(axis=1) + (1.0 - eta) * means, 0.0)


class SequenceWriter(frames.LaneWriter):
    """One handle's side of a sequence buffer: its lane (claimed on its first add, as the lane
    writer's), its stream (where its episode is, its open sequences), the staging of add's
    arrays; a writer part (see :mod:`cpprb_ray._parts`)."""

    def __init__(self, sequences: Any, lanes: Any, config: frames.LaneConfig,
                 stored: List[Column], capacity: int):
        super().__init__(lanes, config, stored, capacity)
        self._sequences = sequences
        self._stream = sequences.new_stream()
        self._stream_pid = os.getpid()
        self._lane_slots = capacity // config.count
        self._done = DONE if DONE in [c.name for c in stored] else None
        self._limited = self._store.limiter_record() is not None
        self._values = [c.name for c in stored]

    def _own_stream(self) -> Any:
        if self._stream_pid != os.getpid():     # a forked child: its own stream, from scratch
            self._stream = self._sequences.new_stream()
            self._stream_pid = os.getpid()
        return self._stream

    def add(self, columns: Dict[str, Any], priorities: Any, timeout: Optional[float],
            **_: Any) -> int:
        """Add steps of this handle's stream (returns the first step's slot); a step with a
        nonzero ``done`` ends its episode."""
        arrays, count = _rules.stage_rows(self.columns, columns)
        staged = dict(zip(self._values, arrays))
        if priorities is not None:
            _rules.check_priorities_allowed(self._store.prioritized)
            priorities = _rules.real_vector(priorities, count, "priorities", "step")
        ends = None
        if self._done is not None:
            ends = np.ascontiguousarray(staged[self._done].reshape(count, -1).any(axis=1),
                                        dtype=np.uint8)
        chunk = self._lane_slots
        if count > chunk and priorities is not None:
            # Checked whole before the first piece goes in: a bad one refuses the whole add.
            self._store.weights_of(priorities, "priorities")
        if count > chunk and self._limited:
            raise ValueError(f"an add of {count} steps goes into this sequence buffer in pieces "
                             f"of at most {chunk} (a lane's steps); with a rate_limiter an add "
                             f"must go in one piece: add at most {chunk} steps at a time")
        stream = self._own_stream()
        lane = self._claim()
        first = -1
        for start in range(0, count, chunk):
            stop = min(start + chunk, count)
            whole = stop - start == count
            slot = self._sequences.add(
                lane, self._token, stop - start,
                [staged[name] if whole else staged[name][start:stop] for name in self._values],
                None if priorities is None else priorities[start:stop],
                None if ends is None else ends[start:stop], False, stream, timeout)
            if first < 0:
                first = slot
        return first

    def end_episode(self, timeout: Optional[float]) -> None:
        """on_episode_end: the episode is over (truncated); its open sequences are committed,
        padded, and the next step starts a new one."""
        _rules.as_timeout(timeout)   # refused alike with nothing to commit
        stream = self._own_stream()
        if stream.position == 0:
            return
        self._sequences.add(self._claim(), self._token, 0, [None] * len(self._values), None,
                            None, True, stream, timeout)

    def forget(self) -> None:
        """clear(): the stream's open sequences are gone with the rows (the kernel sees the lane
        was cleared); its episode goes on, so later sequences keep their places in it."""

    def close(self) -> None:
        """Commit the open sequences as a truncated episode end (if a rate limiter lets them in
        at once; else they are dropped with a RuntimeWarning), then give the lane back."""
        try:
            if self._lane is not None and self._pid == os.getpid():
                try:
                    self.end_episode(0.0)
                except TimeoutError:
                    warnings.warn("close(): the rate limiter held back the sequences this "
                                  "handle had open; they were dropped (call on_episode_end("
                                  "timeout=...) before close to wait)", RuntimeWarning,
                                  stacklevel=3)
        finally:
            self.release()

    def next_slot(self) -> int:
        """The slot this handle's next step goes to (see LaneWriter.next_slot)."""
        return frames.LaneWriter.next_slot(self)


class SequenceSampler:
    """A sequence buffer's sampler: sequences drawn through the tree (a uniform buffer weighs
    each 1) and gathered with their padding and mask; indexes are their start slots."""

    def __init__(self, sequences: Any):
        self.sample = sequences.sample
        self.update = sequences.store.update
        self._sequences = sequences

    def all_rows(self, room: int) -> Dict[str, np.ndarray]:
        """Every committed sequence (at most `room`), by start slot."""
        return dict(self._sequences.all_rows(room))

    def rows_at(self, indexes: np.ndarray, room: int) -> Dict[str, np.ndarray]:
        """Copies of the sequences starting at `indexes` (IndexError naming the first that
        starts none)."""
        rows, slots = self._sequences.all_rows(room, True)
        where = {int(slot): k for k, slot in enumerate(slots)}
        found = np.array([where.get(int(index), -1) for index in indexes], dtype=np.int64)
        if (found < 0).any():
            at = int(np.flatnonzero(found < 0)[0])
            raise IndexError(f"indexes must name the start slot of a stored sequence; got "
                             f"{indexes[at]} at position {at}, which starts none")
        return {name: column[found] for name, column in rows.items()}


def parts(store: Any, layout: Any, lane_config: frames.LaneConfig, config: SequenceConfig,
          location: str) -> Tuple[SequenceWriter, SequenceSampler]:
    """(writer, sampler) of a handle on a sequence buffer's `store`."""
    if getattr(store, "is_remote", False):
        # A remote handle (cpprb_ray.remote): its writer, a SequenceWriter with its stream, lives
        # in the buffer's proxy (chosen there by _parts.choose), one per handle; its draws go
        # through the proxy's sampler.
        parts_pair = store.lane_parts(lane_config, None, episodes=True)
        store.sequence_outputs(config.length)
        return parts_pair
    lanes = frames.lane_store(store, layout, lane_config, location)
    sequences = SequenceStore(lanes, config.length, config.period, config.eta,
                              lane_config.public)
    writer = SequenceWriter(sequences, lanes, lane_config, layout.columns, layout.capacity)
    return writer, SequenceSampler(sequences)
