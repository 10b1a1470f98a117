"""The segment trees compare.py measures, behind the same small interface as _libraries.py.

A prioritized buffer's tree does two things per learner step: a proportional sample of a batch
of leaves, and a write of fresh priorities to those leaves. Each adapter holds a tree (or the
sum and min pair a library keeps) of `capacity` leaves, every leaf holding a random priority,
and hands out closures that make one call each:

- cpprb_ray: ``cpprb_ray._segtree.SegmentTree`` (sum and min in one 8-ary tree) in
  page-aligned anonymous memory, as in a segment: ``sample(batch, rng)`` (stratified) and
  ``set(indices, priorities)``.
- RLlib: ``SumSegmentTree`` and ``MinSegmentTree`` from ray/rllib/execution/segment_tree.py
  (loaded by benchmarks/_rllib_tree.py): `batch` stratified masses, ``find_prefixsum_idx``
  each, and ``tree[i] = p`` on both trees per item, as its PrioritizedReplayBuffer does
  (the same work as benchmarks/bench_segtree.py).
- TorchRL: ``torchrl._torchrl.SumSegmentTreeFp32`` and ``MinSegmentTreeFp32`` (C++): stratified
  masses as one float32 array into ``scan_lower_bound``, ``update(indices, priorities)`` on
  both trees with numpy inputs (its numpy overloads; TorchRL's sampler passes tensors).

There is no add(): a buffer's add writes its new rows' leaves, which is update's work.
"""

from __future__ import annotations

import mmap
import random
from typing import Any, Callable, List

import numpy as np

if __package__:
    from . import _rllib_tree, bench_segtree
    from ._libraries import _spread, cycling
else:  # imported by a script run from this folder
    import _rllib_tree
    import bench_segtree
    from _libraries import _spread, cycling

Call = Callable[[], Any]


def random_leaves(capacity: int, seed: int) -> np.ndarray:
    """`capacity` priorities in [0.1, 10), as bench_segtree.py fills its trees."""
    return np.random.default_rng(seed).uniform(0.1, 10.0, size=capacity)


class OursTree:
    """cpprb_ray's 8-ary sum-and-min tree."""

    label = "cpprb_ray tree"

    def __init__(self, segtree: Any, capacity: int, seed: int):
        self.memory = mmap.mmap(-1, segtree.SegmentTree.nbytes(capacity))
        self.tree = segtree.SegmentTree(self.memory, capacity)
        self.tree.set(np.arange(capacity), random_leaves(capacity, seed))
        self.generator = segtree.Random(seed)

    def close(self) -> None:
        """Release the tree's view of its memory, then the memory."""
        self.tree.release()
        self.memory.close()

    def sample(self, batch: int) -> Call:
        """One stratified sample of `batch` leaves."""
        sample, generator = self.tree.sample, self.generator
        return lambda: sample(batch, generator)

    def update(self, priorities: List[np.ndarray], samples: int, batch: int) -> Call:
        """One set(indices, priorities): indices of earlier samples, cycled."""
        indexes = [self.tree.sample(batch, self.generator) for _ in range(samples)]
        next_indexes, next_priorities = cycling(_spread(indexes)), cycling(priorities)
        write = self.tree.set
        return lambda: write(next_indexes(), next_priorities())

    def learner_step(self, priorities: List[np.ndarray], batch: int) -> Call:
        """One sample, then a set of its leaves to fresh priorities."""
        sample, write, generator = self.tree.sample, self.tree.set, self.generator
        next_priorities = cycling(priorities)
        return lambda: write(sample(batch, generator), next_priorities())


class RLlibTree:
    """RLlib's pure-Python sum tree and min tree."""

    label = "RLlib tree"

    def __init__(self, rllib: Any, capacity: int, seed: int):
        self.sum_tree, self.min_tree = bench_segtree.fill_rllib(
            rllib, random_leaves(capacity, seed))
        self.uniform = random.Random(seed).random

    def close(self) -> None:
        """Drop the trees (lists of 2 * capacity floats each)."""
        self.sum_tree = self.min_tree = None

    def _sampler(self, batch: int) -> Callable[[], List[int]]:
        find, total, uniform = self.sum_tree.find_prefixsum_idx, self.sum_tree.sum, self.uniform

        def sample() -> List[int]:
            stratum = total() / batch
            return [find((k + uniform()) * stratum) for k in range(batch)]
        return sample

    def _writer(self) -> Callable[[List[int], List[float]], None]:
        sum_tree, min_tree = self.sum_tree, self.min_tree

        def write(indices: List[int], priorities: List[float]) -> None:
            for index, priority in zip(indices, priorities):
                sum_tree[index] = priority
                min_tree[index] = priority
        return write

    def sample(self, batch: int) -> Call:
        """`batch` stratified masses, one find_prefixsum_idx each."""
        return self._sampler(batch)

    def update(self, priorities: List[List[float]], samples: int, batch: int) -> Call:
        """`batch` writes to both trees: indices of earlier samples, cycled."""
        sample = self._sampler(batch)
        indexes = [sample() for _ in range(samples)]
        next_indexes, next_priorities = cycling(_spread(indexes)), cycling(priorities)
        write = self._writer()
        return lambda: write(next_indexes(), next_priorities())

    def learner_step(self, priorities: List[List[float]], batch: int) -> Call:
        """One sample, then writes of its leaves to fresh priorities."""
        sample, write = self._sampler(batch), self._writer()
        next_priorities = cycling(priorities)
        return lambda: write(sample(), next_priorities())


class TorchRLTree:
    """TorchRL's C++ sum tree and min tree (float32, as its PrioritizedSampler keeps)."""

    label = "TorchRL tree"

    def __init__(self, torchrl_cpp: Any, capacity: int, seed: int):
        self.capacity = capacity
        self.sum_tree = torchrl_cpp.SumSegmentTreeFp32(capacity)
        self.min_tree = torchrl_cpp.MinSegmentTreeFp32(capacity)
        leaves = random_leaves(capacity, seed).astype(np.float32)
        everything = np.arange(capacity, dtype=np.int64)
        self.sum_tree.update(everything, leaves)
        self.min_tree.update(everything, leaves)
        self.rng = np.random.default_rng(seed)

    def close(self) -> None:
        """Drop the trees."""
        self.sum_tree = self.min_tree = None

    def _sampler(self, batch: int) -> Callable[[], np.ndarray]:
        scan, query, capacity = self.sum_tree.scan_lower_bound, self.sum_tree.query, self.capacity
        strata = np.arange(batch, dtype=np.float32)
        random_floats = self.rng.random

        def sample() -> np.ndarray:
            stratum = query(0, capacity) / batch
            masses = (strata + random_floats(batch, dtype=np.float32)) * np.float32(stratum)
            return scan(masses)
        return sample

    def _writer(self) -> Callable[[np.ndarray, np.ndarray], None]:
        sum_update, min_update = self.sum_tree.update, self.min_tree.update

        def write(indices: np.ndarray, priorities: np.ndarray) -> None:
            sum_update(indices, priorities)
            min_update(indices, priorities)
        return write

    def sample(self, batch: int) -> Call:
        """`batch` stratified masses in one scan_lower_bound."""
        return self._sampler(batch)

    def update(self, priorities: List[np.ndarray], samples: int, batch: int) -> Call:
        """One update of both trees: indices of earlier samples, cycled."""
        sample = self._sampler(batch)
        indexes = [sample() for _ in range(samples)]
        next_indexes, next_priorities = cycling(_spread(indexes)), cycling(priorities)
        write = self._writer()
        return lambda: write(next_indexes(), next_priorities())

    def learner_step(self, priorities: List[np.ndarray], batch: int) -> Call:
        """One sample, then an update of its leaves with fresh priorities."""
        sample, write = self._sampler(batch), self._writer()
        next_priorities = cycling(priorities)
        return lambda: write(sample(), next_priorities())


def load_rllib() -> Any:
    """RLlib's segment_tree module (RuntimeError when ray or its file is missing)."""
    return _rllib_tree.load_rllib_segment_tree()
