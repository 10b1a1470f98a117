"""A buffer's parts: a writer (where an add's rows go) and a sampler (what a draw returns),
chosen once when a handle is made or attached. ``buffer.py`` holds the two objects and calls
them; it tests no flags.

Every writer has the same small interface::

    add(values, priorities, timeout) -> first slot or None   one user add (values by name)
    end_episode(timeout)                                     on_episode_end: commit staged steps
    forget()                                                 clear(): drop this handle's staging
    close()                                                  commit what is staged, give back
                                                             what this handle holds (a lane)
    next_slot() -> int                                       get_next_index()
    size                                                     rows the buffer keeps
    columns                                                  the Column objects add takes
    staged                                                   steps staged here (None: none kept)

and every sampler::

    sample(batch, beta, out, timeout) -> dict                one draw (out=: refilled in place)
    update(indexes, priorities, generations) -> int          new priorities of drawn rows
    all_rows(room) -> dict                                   every committed row, in order
    rows_at(indexes, room) -> dict                           the rows at given indexes

The writers: the ring's (:class:`RingWriter`, an add is one store add), the lane writer
(:class:`cpprb_ray.frames.LaneWriter`, one handle's lane: frames, many writers), and the N-step
writer (:class:`cpprb_ray.nstep.NstepWriter`), which stages a stream's steps and commits its
transitions through the ring's or the lane's sink. The samplers: the ring's
(:class:`RingSampler`), the lanes' (:class:`LaneSampler`), and cpprb's check_for_update over
either (:class:`CheckingSampler`); a sequence buffer's pair, :mod:`cpprb_ray.sequences`' writer and
sampler. Their kernels are in the store's
extension modules (the ring's in ``_core``/``_store``, the lanes' in ``_lanes``/``_lanestore``);
a new way of writing or sampling is a new pair here and there, chosen in :func:`choose`.

Examples
--------
>>> from cpprb_ray import ReplayBuffer
>>> with ReplayBuffer(8, {"obs": {}}) as rb, ReplayBuffer(8, {"obs": {}}, lanes=2) as laned:
...     print(type(rb._writer).__name__, type(rb._sampler).__name__)
...     print(type(laned._writer).__name__, type(laned._sampler).__name__)
RingWriter RingSampler
LaneWriter LaneSampler
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np

from cpprb_ray import _compat, _layout, _rules, frames, nstep, sequences
from cpprb_ray._image import LaneImage, StoreImage
from cpprb_ray._layout import Column, Layout


class RingWriter:
    """The plain ring's writer: an add is one store add, made by the store's own method (a
    cold call pays for every Python frame it passes through).

    Examples
    --------
    >>> from cpprb_ray import ReplayBuffer
    >>> with ReplayBuffer(4, {"obs": {}}) as rb:
    ...     print(rb._writer.add({"obs": [1.0, 2.0]}, None, None), rb._writer.next_slot())
    0 2
    """

    staged = None

    def __init__(self, store: Any, columns: List[Column], size: int) -> None:
        self.add = store.add
        self.columns = columns
        self.size = size            # rows the buffer keeps
        self._store = store

    def end_episode(self, timeout: Optional[float]) -> None:
        _rules.as_timeout(timeout)   # refused alike, with nothing to commit

    def forget(self) -> None:
        """Nothing is staged in the ring's writer."""

    def close(self) -> None:
        """Nothing is held by the ring's writer."""

    def next_slot(self) -> int:
        return int(self._store.next_index)


class RingSampler:
    """The plain ring's sampler: the store's own sample and update (prioritized over the tree,
    or uniform over the committed rows below the stored size).

    Examples
    --------
    >>> from cpprb_ray import ReplayBuffer
    >>> with ReplayBuffer(4, {"obs": {}}) as rb:
    ...     _ = rb.add(obs=[1.0, 2.0])
    ...     print(rb._sampler.all_rows(2)["obs"].ravel())
    [1. 2.]
    """

    def __init__(self, store: Any, columns: List[Column]) -> None:
        self.sample = store.sample
        self.update = store.update
        self._store = store
        self._columns = columns

    def all_rows(self, room: int) -> Dict[str, np.ndarray]:
        """Every committed row (at most `room`), in slot order; torn rows are left out."""
        return self._numbered_rows(room)[0]

    def _numbered_rows(self, room: int) -> Tuple[Dict[str, np.ndarray], np.ndarray]:
        outputs = [np.empty((room,) + c.shape, dtype=c.dtype) for c in self._columns]
        indexes = np.empty(room, dtype=np.int64)
        leaves = np.empty(room, dtype=np.float64)
        copied = self._store.snapshot(outputs, indexes, leaves)
        return {c.name: out[:copied] for c, out in zip(self._columns, outputs)}, indexes[:copied]

    def rows_at(self, indexes: np.ndarray, room: int) -> Dict[str, np.ndarray]:
        """Copies of the rows at `indexes` (slots below the stored size `room`)."""
        rows, slots = self._numbered_rows(room)
        return pick_rows(rows, slots, indexes, room)


class LaneSampler:
    """The lanes' sampler: rows drawn through the tree (a uniform laned buffer weighs each row
    1), their frame stacks rebuilt from the planes of the slots before them in their lane. A
    bounded lane (cpprb's next_of / stack_compress) numbers its rows as cpprb does (rows added
    since the last clear, modulo its size: its ring index), in the order of get_all_transitions
    and for rows_at; sample's indexes stay slots (what update takes)."""

    def __init__(self, lanes: Any, config: frames.LaneConfig, slots: int) -> None:
        self.sample = lanes.sample
        self.update = lanes.store.update
        self._lanes = lanes
        self._rows = config.rows
        self._slots = slots

    def _numbered_rows(self, room: int) -> Tuple[Dict[str, np.ndarray], np.ndarray]:
        """The live rows (at most `room`) and each one's number: its slot, or in a bounded lane
        its number as cpprb counts (the lane keeps its newest rows in ring order, oldest at its
        head; read in three steps: exact while no add runs meanwhile)."""
        rows, slots = self._lanes.all_rows(room, True)
        if not self._rows:
            return rows, slots
        since_clear = int(self._lanes.store.rows_since_clear)
        head = int(self._lanes.lane_next_slots()[0])
        age = np.argsort((slots - head) % self._slots, kind="stable")
        count = len(slots)
        numbers = np.empty(count, dtype=np.int64)
        # The first number in Python's integers: a counter near 2**64 (it only grows; a
        # hostile header may put it there) must not overflow numpy's int64.
        numbers[age] = ((since_clear - count) % self._rows + np.arange(count)) % self._rows
        return rows, numbers

    def all_rows(self, room: int) -> Dict[str, np.ndarray]:
        """Every live row (at most `room`): in slot order, or in a bounded lane by number."""
        rows, numbers = self._numbered_rows(room)
        if not self._rows:
            return rows
        order = np.argsort(numbers, kind="stable")
        return {name: column[order] for name, column in rows.items()}

    def rows_at(self, indexes: np.ndarray, room: int) -> Dict[str, np.ndarray]:
        """Copies of the rows at `indexes`: numbers in a bounded lane, else live rows' slots."""
        rows, numbers = self._numbered_rows(room)
        return pick_rows(rows, numbers, indexes, self._rows or self._slots)


def pick_rows(rows: Dict[str, np.ndarray], numbers: np.ndarray, wanted: np.ndarray,
              bound: int) -> Dict[str, np.ndarray]:
    """The rows (a dict of columns, one entry per number in `numbers`) at the numbers `wanted`,
    in its order, repeats allowed; IndexError naming the first that holds no row."""
    position = np.full(max(bound, 1), -1, dtype=np.int64)
    position[numbers] = np.arange(len(numbers))
    inside = (wanted >= 0) & (wanted < bound)
    found = np.where(inside, position[np.where(inside, wanted, 0)], -1)
    if (found < 0).any():
        at = int(np.flatnonzero(found < 0)[0])
        raise IndexError(f"indexes must name stored rows (slots in [0, {bound})); got "
                         f"{wanted[at]} at position {at}, which holds none")
    return {name: column[found] for name, column in rows.items()}


class CheckingSampler:
    """cpprb's ``check_for_update``, over another sampler: each sample's generations are kept,
    and an update given no generations skips every slot written since this handle sampled it
    (and any slot it never sampled), as if given them.

    Examples
    --------
    >>> from cpprb_ray import PrioritizedReplayBuffer
    >>> with PrioritizedReplayBuffer(2, {"obs": {}}, check_for_update=True, seed=0) as rb:
    ...     _ = rb.add(obs=[1.0, 2.0])
    ...     batch = rb.sample(2)
    ...     _ = rb.add(obs=[3.0, 4.0])   # overwrites both sampled slots
    ...     print(type(rb._sampler).__name__, rb.update_priorities(batch["indexes"], [5.0, 5.0]))
    CheckingSampler 0
    """

    def __init__(self, inner: Any, capacity: int) -> None:
        self._inner = inner
        self._sampled = _compat.SampledGenerations(capacity)
        self.all_rows = inner.all_rows
        self.rows_at = inner.rows_at

    def sample(self, batch: int, beta: float, out: Optional[Dict[str, np.ndarray]],
               timeout: Optional[float]) -> Dict[str, np.ndarray]:
        result = self._inner.sample(batch, beta, out, timeout)
        self._sampled.remember(result["indexes"], result["generations"])
        return result

    def update(self, indexes: Any, priorities: Any, generations: Any = None) -> int:
        if generations is None:
            generations = self._sampled.generations_of(indexes)
        return int(self._inner.update(indexes, priorities, generations))


def image_of(store: Any, layout: Layout) -> Any:
    """The checkpoint image part (dump, restore) of a handle on `store` (after :func:`choose`,
    which binds a laned buffer's lane part): the store's own where it stands in for a segment
    this process cannot see (a remote handle's), else :class:`cpprb_ray._image.LaneImage` for
    a laned layout and :class:`cpprb_ray._image.StoreImage` for the ring."""
    if getattr(store, "is_remote", False):
        return store
    return LaneImage(store) if "lanes" in layout.meta else StoreImage(store)


def plan_layout(capacity: int, env_dict: Mapping[str, Any], prioritized: bool, backend: str,
                Nstep: Optional[Mapping[str, Any]] = None, next_of: frames.Names = None,
                stack_compress: frames.Names = None, lanes: Optional[int] = None,
                sequence: Optional[Mapping[str, Any]] = None,
                ) -> Tuple[Layout, Optional[frames.LaneConfig], Optional[nstep.NstepConfig]]:
    """(layout, lane config, N-step config) of a new buffer of `capacity` rows, as its
    constructor lays it out (nothing is allocated): N-step first, on the columns add takes
    (next_obs included when next_of derives it); then the lanes, which store frame columns a
    plane per slot and derive next_of's. A bounded frame lane (cpprb's next_of /
    stack_compress) keeps `capacity` rows in more slots (frames.bounded_slots). A sequence
    buffer (`sequence`, :mod:`cpprb_ray.sequences`) stores its steps in lanes, without frames
    or N-step.

    Examples
    --------
    >>> from cpprb_ray._parts import plan_layout
    >>> layout, lanes, steps = plan_layout(8, {"obs": {}}, False, "shm", lanes=2)
    >>> layout.capacity, lanes.count, steps
    (8, 2, None)
    """
    if sequence is not None:
        columns = _layout.parse_env_dict(env_dict)
        sequence_config, lanes_of_steps = sequences.SequenceConfig.plan(
            sequence, columns, capacity, prioritized, lanes,
            {"Nstep": Nstep, "next_of": next_of, "stack_compress": stack_compress})
        layout = _layout.plan(capacity, columns, prioritized, backend,
                              extra_meta={"sequence": sequence_config.to_meta()},
                              lanes=lanes_of_steps.to_meta())
        return layout, lanes_of_steps, None
    columns = frames.with_next_columns(_layout.parse_env_dict(env_dict), next_of)
    columns, nstep_config = nstep.plan_columns(columns, Nstep)
    columns, lane_config = frames.LaneConfig.plan(columns, capacity, prioritized, next_of,
                                                  stack_compress, lanes)
    slots = capacity if lane_config is None else lane_config.slots(capacity)
    layout = _layout.plan(slots, columns, prioritized, backend,
                          extra_meta=nstep.meta_of(nstep_config),
                          lanes=None if lane_config is None else lane_config.to_meta())
    return layout, lane_config, nstep_config


def choose(store: Any, layout: Layout, location: str,
           lane_config: Optional[frames.LaneConfig], nstep_config: Optional[nstep.NstepConfig],
           prioritized: bool, check_for_update: bool = False) -> Tuple[Any, Any]:
    """(writer, sampler) for a handle on `store` (a ReplayStore, or a remote handle's stand-in
    for one) of a buffer with this layout: the one place where a buffer's parts are chosen.

    Examples
    --------
    >>> from cpprb_ray import ReplayBuffer
    >>> env = {"obs": {}, "rew": {}, "next_obs": {}, "done": {}}
    >>> spec = {"size": 3, "gamma": 0.9, "rew": "rew", "next": "next_obs"}
    >>> with ReplayBuffer(8, env, Nstep=spec) as rb:
    ...     print(type(rb._writer).__name__, type(rb._writer._sink).__name__)
    NstepWriter RingSink
    """
    writer: Any
    sampler: Any
    sequence_config = sequences.SequenceConfig.from_meta(layout.meta, location)
    if sequence_config is not None and lane_config is not None:
        # A sequence buffer (cpprb_ray.sequences): steps in lanes, sequences drawn.
        writer, sampler = sequences.parts(store, layout, lane_config, sequence_config, location)
        if check_for_update:
            sampler = CheckingSampler(sampler, layout.capacity)
        return writer, sampler
    if lane_config is None:
        writer = RingWriter(store, layout.columns, layout.capacity)
        sampler = RingSampler(store, layout.columns)
    elif getattr(store, "is_remote", False):
        # A remote handle of a laned buffer (cpprb_ray.remote): its writer, N-step staging
        # included, lives in the buffer's proxy (chosen there by this function), one per
        # handle; its draws go through the proxy's sampler.
        writer, sampler = store.lane_parts(lane_config, nstep_config)
        nstep_config = None
    else:
        lanes = frames.lane_store(store, layout, lane_config, location)
        writer = frames.LaneWriter(lanes, lane_config, layout.columns, layout.capacity)
        sampler = LaneSampler(lanes, lane_config, layout.capacity)
    if nstep_config is not None:
        sink = (nstep.RingSink(store, writer.columns) if lane_config is None
                else nstep.LaneSink(store, writer))
        writer = nstep.NstepWriter(nstep_config, writer, sink, prioritized)
    if check_for_update:
        sampler = CheckingSampler(sampler, layout.capacity)
    return writer, sampler
