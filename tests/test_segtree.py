"""Tests for the 8-ary sum/min segment tree and its xoshiro generator (``cpprb_ray._segtree``).

The tree is checked against a plain numpy oracle (a Hypothesis state machine), for drift over a
million updates, for sampling frequencies (a chi-square bound that a wrong distribution fails),
for stratification, across processes (SharedMemory and an mmap'ed file), for every invalid call
and through the examples in its docstrings.
"""

from __future__ import annotations

import math
import mmap
import os
import queue
import runpy
import tempfile
import traceback
import uuid

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from cpprb_ray._segtree import Random, SegmentTree

try:  # Python >= 3.8
    from multiprocessing import shared_memory
except ImportError:  # pragma: no cover - Python 3.7
    shared_memory = None

# 8**k +- 1 are where a level gains or loses a node; the rest are odd sizes and tiny trees.
BOUNDARY_CAPACITIES = [1, 2, 3, 7, 8, 9, 63, 64, 65, 100, 511, 512, 513, 1000, 4095, 4096, 4097]

# Upper 0.001 quantile of the standard normal, for the Wilson-Hilferty chi-square quantile.
Z_999 = 3.090232306167813

# With this process's pid: the leak check of another test run on this host leaves a raw file
# (no buffer header) alone only when its name says whose it is (tests/conftest.py).
SEGMENT_PREFIX = f"cpprb_ray_test_{os.getpid()}_"

# A spawned child runs this file through runpy under this name (see the end of the file), so it
# needs neither the tests directory on sys.path nor pytest's module name for this file.
CHILD_RUN_NAME = "__cpprb_ray_segtree_child__"


# ---------------------------------------------------------------------------------------------
# Helpers


def make_tree(capacity: int) -> SegmentTree:
    """A fresh tree in its own bytearray."""
    return SegmentTree(bytearray(SegmentTree.nbytes(capacity)), capacity)


def snapshot(tree: SegmentTree) -> tuple:
    """Everything observable about a tree: (total, min, all leaves)."""
    return tree.total(), tree.min(), tree.get(np.arange(tree.capacity)).tolist()


def chi_square_critical(df: int, z: float = Z_999) -> float:
    """Wilson-Hilferty approximation of the chi-square quantile for `df` degrees of freedom.

    Accurate to well under 1% for df >= 10 at p = 0.001, which is all the tests need; scipy is
    not required (CI on Python 3.7 may not have it).
    """
    h = 2.0 / (9.0 * df)
    return df * (1.0 - h + z * math.sqrt(h)) ** 3


def chi_square(counts: np.ndarray, weights: np.ndarray) -> tuple[float, int]:
    """Pearson's statistic of `counts` against probabilities proportional to `weights`.

    Leaves of weight 0 are left out (they must have count 0, checked by the callers).
    """
    positive = weights > 0
    expected = counts.sum() * weights[positive] / weights[positive].sum()
    observed = counts[positive]
    return float(((observed - expected) ** 2 / expected).sum()), int(positive.sum()) - 1


def search_is_valid(values: np.ndarray, mass: float, found: int, tree_total: float) -> bool:
    """Whether leaf `found` is a correct answer of search(mass) for these leaf values.

    The oracle is np.searchsorted on the cumulative sum; a neighbouring leaf is accepted only
    where rounding puts the mass on (within a tiny tolerance of) the boundary between leaves.
    """
    positive = np.flatnonzero(values > 0)
    if not 0 <= found < values.size or values[found] <= 0:
        return False  # a zero leaf is never a valid answer
    if mass >= tree_total:
        return found == positive[-1]
    cumsum = np.cumsum(values)
    expected = int(np.searchsorted(cumsum, mass, side="right"))
    if found == expected:
        return True
    tolerance = 1e-12 * tree_total
    before = cumsum[found] - values[found]
    return before - tolerance <= mass <= cumsum[found] + tolerance


# ---------------------------------------------------------------------------------------------
# The tree against a numpy oracle

leaf_values = st.one_of(
    st.just(0.0),
    st.floats(min_value=1e-3, max_value=1e3),
    st.integers(min_value=1, max_value=8).map(float),
)


class TreeAgainstOracle(RuleBasedStateMachine):
    """Random set/clear/rebuild sequences; every observable compared with a numpy oracle."""

    @initialize(
        capacity=st.one_of(
            st.sampled_from(BOUNDARY_CAPACITIES), st.integers(min_value=1, max_value=700)
        )
    )
    def create(self, capacity):
        self.tree = make_tree(capacity)
        self.values = np.zeros(capacity)
        self.is_set = np.zeros(capacity, dtype=bool)

    def indices(self, data, max_size=40):
        capacity = self.tree.capacity
        # Half the time draw from a handful of leaves so that batches repeat indices.
        pool = st.one_of(
            st.integers(0, capacity - 1),
            st.sampled_from(sorted({0, capacity - 1, capacity // 2})),
        )
        return data.draw(st.lists(pool, max_size=max_size), label="indices")

    @rule(data=st.data())
    def set_leaves(self, data):
        indices = self.indices(data)
        values = data.draw(st.lists(leaf_values, min_size=len(indices), max_size=len(indices)))
        self.tree.set(np.array(indices, dtype=np.int64), np.array(values, dtype=np.float64))
        for index, value in zip(indices, values):  # in order: duplicates resolve last-wins
            self.values[index] = value
            self.is_set[index] = True

    @rule(data=st.data())
    def set_one_scalar(self, data):
        index = data.draw(st.integers(0, self.tree.capacity - 1))
        value = data.draw(leaf_values)
        self.tree.set(index, value)
        self.values[index] = value
        self.is_set[index] = True

    @rule(data=st.data())
    def clear_some(self, data):
        indices = self.indices(data, max_size=10)
        self.tree.clear(indices)
        self.values[indices] = 0.0
        self.is_set[indices] = False

    @rule()
    def clear_all(self):
        self.tree.clear()
        self.values[:] = 0.0
        self.is_set[:] = False

    @rule()
    def rebuild(self):
        before = self.tree.total(), self.tree.min()
        self.tree.rebuild()
        # Parents are always recomputed from children, so a rebuild changes no bit.
        assert (self.tree.total(), self.tree.min()) == before

    @precondition(lambda self: self.values.sum() > 0)
    @rule(data=st.data())
    def search(self, data):
        total = self.tree.total()
        masses = data.draw(
            st.lists(
                st.one_of(
                    st.just(0.0),
                    st.just(total),
                    st.floats(min_value=0.0, max_value=1.0).map(lambda u: u * total),
                    st.floats(min_value=total, max_value=2 * total + 1.0),
                    # Exactly on a leaf boundary, where ties are decided by rounding.
                    st.integers(0, self.tree.capacity - 1).map(
                        lambda i: float(np.cumsum(self.values)[i])
                    ),
                ),
                min_size=1,
                max_size=20,
            )
        )
        found = self.tree.search(masses)
        assert found.dtype == np.int64 and found.shape == (len(masses),)
        for mass, leaf in zip(masses, found.tolist()):
            assert search_is_valid(self.values, mass, leaf, total), (mass, leaf, total)

    @precondition(lambda self: self.values.sum() == 0)
    @rule()
    def search_empty(self):
        with pytest.raises(ValueError, match="total is 0"):
            self.tree.search([0.0])
        with pytest.raises(ValueError, match="total is 0"):
            self.tree.sample(1, Random(0))

    @precondition(lambda self: self.values.sum() > 0)
    @rule(batch_size=st.integers(1, 64), seed=st.integers(0, 2**64 - 1))
    def sample(self, batch_size, seed):
        found = self.tree.sample(batch_size, Random(seed))
        assert found.shape == (batch_size,)
        assert (self.values[found] > 0).all()
        # Strata are increasing masses, and the search is monotonic in the mass.
        assert (np.diff(found) >= 0).all()

    @invariant()
    def leaves_match(self):
        assert self.tree.get(np.arange(self.tree.capacity)).tolist() == self.values.tolist()

    @invariant()
    def total_matches(self):
        assert self.tree.total() == pytest.approx(math.fsum(self.values), rel=1e-12, abs=0.0)

    @invariant()
    def min_matches(self):
        expected = self.values[self.is_set].min() if self.is_set.any() else math.inf
        assert self.tree.min() == expected


TreeAgainstOracle.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestTreeAgainstOracle = TreeAgainstOracle.TestCase


@settings(max_examples=150, deadline=None)
@given(
    capacity=st.sampled_from(BOUNDARY_CAPACITIES),
    seed=st.integers(0, 2**32 - 1),
    zero_fraction=st.sampled_from([0.0, 0.5, 0.9, 0.99, 1.0]),
    masses=st.lists(st.floats(min_value=0.0, max_value=1.5), min_size=1, max_size=30),
)
def test_search_matches_searchsorted_exactly_on_dyadic_values(
    capacity, seed, zero_fraction, masses
):
    """With multiples of 1/8 every sum is exact, so search must equal np.searchsorted exactly."""
    # Hypothesis picks the shape; numpy fills thousands of leaves cheaply.
    rng = np.random.default_rng(seed)
    values = rng.integers(1, 65, size=capacity) / 8.0
    values[rng.random(capacity) < zero_fraction] = 0.0
    values[rng.integers(capacity)] = 0.125  # at least one positive leaf
    tree = make_tree(capacity)
    tree.set(np.arange(capacity), values)
    cumsum = np.cumsum(values)
    total = cumsum[-1]
    assert tree.total() == total
    # Hypothesis' fractions of the total, plus every leaf boundary and the float just below it.
    boundaries = np.unique(cumsum)
    probes = np.concatenate(
        [np.array(masses) * total, boundaries, np.nextafter(boundaries, 0.0), [0.0]]
    )
    found = tree.search(probes)
    last_positive = int(np.flatnonzero(values > 0)[-1])
    expected = np.searchsorted(cumsum, probes, side="right")
    expected[probes >= total] = last_positive
    assert found.tolist() == expected.tolist()
    assert (values[found] > 0).all()


@settings(max_examples=200, deadline=None)
@given(
    values=st.lists(
        # <= 1e297 so that 80 of them cannot overflow the total to inf.
        st.one_of(st.just(0.0), st.floats(min_value=0.0, max_value=1e297)),
        min_size=1,
        max_size=80,
    ).filter(lambda v: any(x > 0 for x in v)),
    data=st.data(),
)
def test_search_never_returns_a_zero_leaf_whatever_the_magnitudes(values, data):
    """Leaves from subnormal to 1e300 side by side: rounding must never land on a zero leaf."""
    capacity = len(values)
    tree = make_tree(capacity)
    tree.set(np.arange(capacity), values)
    total = tree.total()
    masses = data.draw(
        st.lists(
            st.one_of(st.floats(0.0, 1.0).map(lambda u: u * total), st.just(total)),
            min_size=1,
            max_size=20,
        )
    )
    found = tree.search(masses)
    assert (np.asarray(values)[found] > 0).all()
    # A mass >= total goes to the last positive leaf however small it is next to the others.
    last_positive = max(i for i, value in enumerate(values) if value > 0)
    assert tree.search([total, total * 2]).tolist() == [last_positive, last_positive]
    assert (np.asarray(values)[tree.sample(16, Random(data.draw(st.integers(0, 99))))] > 0).all()


def test_search_mass_at_total_goes_to_last_positive_leaf_when_rounding_hides_it():
    """A mass >= total maps to the last positive leaf, even when small leaves are absorbed.

    Regression test, found by random search: when parents were summed pairwise but search()
    scanned sequential prefix sums, the last prefix of the root's children could exceed the
    root. A mass equal to the total then took the "mass inside a child" branch and stopped at
    leaf 5 (value 1.0) instead of the last positive leaf 7 (value 0.3, below the float spacing
    at 1e16); the second case shows the same with ordinary magnitudes (leaf 7 holds 3e-17).
    """
    cases = [
        [0.7, 2.0 / 3.0, 0.1, 0.3, 1e16, 1.0, 0.1, 0.3],
        [1.0, 0.1, 0.3, 2.0 / 3.0, 3e-17, 0.3, 1.0, 3e-17],
    ]
    for values in cases:
        tree = make_tree(len(values))
        tree.set(np.arange(len(values)), values)
        total = tree.total()
        assert tree.search([total, total * 2]).tolist() == [7, 7], values


@pytest.mark.parametrize("capacity", [1, 8, 9, 64, 65, 4097])
def test_duplicate_indices_last_wins_for_sum_and_min(capacity):
    tree = make_tree(capacity)
    last = capacity - 1
    tree.set([last, 0, last, last], [9.0, 4.0, 7.0, 0.5])
    expected = {0: 4.0, last: 0.5} if capacity > 1 else {0: 0.5}
    assert tree.get(list(expected)).tolist() == list(expected.values())
    assert tree.total() == sum(expected.values())
    assert tree.min() == min(expected.values())


def test_capacity_one():
    tree = make_tree(1)
    assert tree.capacity == 1 and tree.total() == 0.0 and tree.min() == math.inf
    tree.set(0, 2.5)
    assert tree.total() == 2.5 and tree.min() == 2.5
    assert tree.search([0.0, 1.0, 2.5, 100.0]).tolist() == [0, 0, 0, 0]
    assert tree.sample(5, Random(1)).tolist() == [0] * 5
    tree.set([0], [0.0])
    assert tree.total() == 0.0 and tree.min() == 0.0  # a leaf set to 0 counts for min
    tree.clear()
    assert tree.min() == math.inf


def test_min_counts_zero_leaves_but_not_unset_ones():
    tree = make_tree(20)
    assert tree.min() == math.inf
    tree.set([3, 11], [2.0, 5.0])
    assert tree.min() == 2.0
    tree.set([17], [0.0])
    assert tree.min() == 0.0
    tree.clear([17])
    assert tree.min() == 2.0
    tree.clear([3, 11])
    assert tree.min() == math.inf and tree.total() == 0.0
    assert tree.get([3, 11, 17]).tolist() == [0.0, 0.0, 0.0]
    # Inside, an unset leaf is -0.0; a -0.0 the caller passes is still a value of zero.
    tree.set([5], [-0.0])
    assert tree.min() == 0.0 and tree.total() == 0.0
    assert math.copysign(1.0, tree.total()) == 1.0
    assert math.copysign(1.0, tree.get([5, 6])[1]) == 1.0


@pytest.mark.parametrize("capacity", BOUNDARY_CAPACITIES)
def test_nbytes_is_cache_line_multiple_and_tree_fits(capacity):
    nbytes = SegmentTree.nbytes(capacity)
    assert nbytes % 64 == 0
    # The leaves (float64, shared by the sum and min trees) plus two sets of inner levels:
    # for a fanout of 8 those are about capacity / 7 nodes each.
    assert 8 * capacity <= nbytes <= 8 * (capacity + 2 * (capacity // 7 + 8 * 24)) + 64
    # Exactly nbytes is enough: a full tree at an offset, with a guard byte on each side.
    memory = bytearray(nbytes + 128)
    memory[63] = memory[64 + nbytes] = 0xAB
    tree = SegmentTree(memory, capacity, offset=64)
    tree.set(np.arange(capacity), np.full(capacity, 2.0))
    tree.rebuild()
    tree.clear()
    assert memory[63] == memory[64 + nbytes] == 0xAB
    assert tree.total() == 0.0


def test_numpy_array_memory_and_integer_types():
    memory = np.zeros(SegmentTree.nbytes(100) // 8, dtype=np.float64)
    tree = SegmentTree(memory, np.int32(100))
    tree.set(np.array([5, 6], dtype=np.uint16), np.array([3, 4], dtype=np.int8))
    assert tree.get(np.array([5, 6], dtype=np.int32)).tolist() == [3.0, 4.0]
    assert tree.total() == 7.0
    # initialize=False binds to what is already there instead of clearing it.
    again = SegmentTree(memory, 100, initialize=False)
    assert snapshot(again) == snapshot(tree)


# ---------------------------------------------------------------------------------------------
# Drift


def test_no_drift_after_a_million_updates():
    capacity, batches, batch = 2**16, 4000, 256
    rng = np.random.default_rng(20240607)
    indices = rng.integers(0, capacity, size=(batches, batch))
    # Values over 7 orders of magnitude, 5% exact zeros: the worst case for a delta-updated tree.
    values = rng.exponential(size=(batches, batch)) * 10.0 ** rng.integers(-3, 4, (batches, batch))
    values[rng.random((batches, batch)) < 0.05] = 0.0
    tree = make_tree(capacity)
    for k in range(batches):
        tree.set(indices[k], values[k])

    leaves = tree.get(np.arange(capacity))
    touched = np.zeros(capacity, dtype=bool)
    touched[indices.ravel()] = True
    exact = math.fsum(leaves.tolist())
    assert tree.total() == pytest.approx(exact, rel=1e-9, abs=0.0)
    assert tree.min() == leaves[touched].min()

    # The internal nodes are a pure function of the leaves: rebuilding, or building a fresh
    # tree from the final leaves in one call, gives the very same bits.
    total = tree.total()
    tree.rebuild()
    assert tree.total() == total
    assert tree.total() == pytest.approx(exact, rel=1e-9, abs=0.0)
    fresh = make_tree(capacity)
    fresh.set(np.flatnonzero(touched), leaves[touched])
    assert fresh.total() == total and fresh.min() == tree.min()


@pytest.mark.parametrize("capacity", [2**20, 2**17 + 5, 8 * 4096, 8 * 4096 + 1])
def test_every_node_is_what_a_rebuild_makes_after_random_batches(capacity):
    """The refresh walks the batch on the wide levels and a bitmap of nodes on the narrow ones.
    Whatever the batch (sorted, as a sample gives them; shuffled; runs of one index; 1 to 3000
    indexes), every node, on the wide levels too (2**20 has two), must be bit for bit what a
    rebuild from the leaves makes. 8 * 4096 leaves: level 1 is the widest level marked in a
    bitmap (4096 nodes); one more leaf makes it a wide one."""
    memory = bytearray(SegmentTree.nbytes(capacity))
    tree = SegmentTree(memory, capacity)
    # A cleared tree's inner sums are +0.0 where a rebuild writes the -0.0 sum of unset leaves
    # (the same value): start from the rebuild's bits, so that only a stale node differs.
    tree.rebuild()
    rng = np.random.default_rng(20261201)
    for step in range(80):
        size = int(rng.choice([1, 7, 256, 3000]))
        indices = rng.integers(0, capacity, size)
        if step % 4 == 0:
            indices.sort()
        elif step % 4 == 1:   # few distinct leaves, so batches repeat and merge early
            indices = np.repeat(rng.integers(0, capacity, size // 16 + 1), 16)[:size]
        if step % 9 == 5:
            tree.clear(indices[: size // 4 + 1])
            continue
        # Seven orders of magnitude and 5% zeros, so that mins change at every level.
        values = rng.exponential(size=size) * 10.0 ** rng.integers(-6, 2, size)
        values[rng.random(size) < 0.05] = 0.0
        tree.set(indices, values)
        if step % 20 == 19:
            rebuilt = bytearray(memory)
            SegmentTree(rebuilt, capacity, initialize=False).rebuild()
            assert rebuilt == memory, f"a node differs from its rebuild after step {step}"


# ---------------------------------------------------------------------------------------------
# Sampling


# scipy.stats.chi2.ppf(0.999, df), rounded to 3 decimals (tabulated so no scipy is needed).
CHI_SQUARE_999 = {10: 29.588, 39: 72.055, 49: 85.351, 200: 267.541}


def test_wilson_hilferty_matches_the_chi_square_quantile():
    for df, quantile in CHI_SQUARE_999.items():
        assert chi_square_critical(df) == pytest.approx(quantile, rel=0.01)


def sampling_weights() -> np.ndarray:
    rng = np.random.default_rng(5)
    weights = rng.uniform(0.1, 5.0, size=45)
    weights[[0, 7, 8, 44]] = 0.0  # zero leaves, including the first and the last
    return weights


@pytest.mark.parametrize("batch_size, batches", [(1, 20000), (64, 400), (45, 400)])
def test_sampling_frequencies_match_value_over_total(batch_size, batches):
    weights = sampling_weights()
    tree = make_tree(weights.size)
    tree.set(np.arange(weights.size), weights)
    rng = Random(12345)
    drawn = np.concatenate([tree.sample(batch_size, rng) for _ in range(batches)])
    counts = np.bincount(drawn, minlength=weights.size)
    assert counts[weights == 0].sum() == 0

    statistic, df = chi_square(counts, weights)
    critical = chi_square_critical(df)
    assert statistic < critical, (statistic, critical)

    # The same check must reject a wrong distribution: the true weights with their largest and
    # smallest positive entries swapped.
    wrong = weights.copy()
    positive = np.flatnonzero(weights > 0)
    low, high = positive[np.argmin(weights[positive])], positive[np.argmax(weights[positive])]
    wrong[[low, high]] = wrong[[high, low]]
    assert chi_square(counts, wrong)[0] > critical
    # ... and the uniform distribution.
    assert chi_square(counts, (weights > 0).astype(float))[0] > critical


@pytest.mark.parametrize("capacity", [1, 7, 8, 9, 64, 65, 777, 4096, 4097])
@pytest.mark.parametrize("weight", [1.0, 0.25, 3.0])
def test_stratification_equal_weights_one_sample_per_leaf(capacity, weight):
    """batch_size = n with equal weights: stratum k is exactly leaf k's mass range."""
    tree = make_tree(capacity)
    tree.set(np.arange(capacity), np.full(capacity, weight))
    for seed in range(3):
        assert tree.sample(capacity, Random(seed)).tolist() == list(range(capacity))


@pytest.mark.parametrize("capacity, batch_size", [(100, 32), (513, 256), (4097, 7)])
def test_stratification_each_sample_lies_in_its_own_stratum(capacity, batch_size):
    rng = np.random.default_rng(capacity)
    values = rng.uniform(0.0, 10.0, size=capacity)
    values[rng.random(capacity) < 0.2] = 0.0
    tree = make_tree(capacity)
    tree.set(np.arange(capacity), values)
    total = tree.total()
    cumsum = np.cumsum(values)
    tolerance = 1e-12 * total
    for seed in range(5):
        found = tree.sample(batch_size, Random(seed))
        assert (values[found] > 0).all()
        for k, leaf in enumerate(found.tolist()):
            low, high = k * total / batch_size, (k + 1) * total / batch_size
            # The leaf's mass interval overlaps stratum k's.
            assert cumsum[leaf] - values[leaf] <= high + tolerance
            assert cumsum[leaf] >= low - tolerance


def test_sample_is_deterministic_for_a_seed_and_skips_zero_leaves():
    tree = make_tree(300)
    tree.set(np.arange(0, 300, 3), np.linspace(1.0, 2.0, 100))
    first = tree.sample(256, Random(99))
    assert tree.sample(256, Random(99)).tolist() == first.tolist()
    assert (first % 3 == 0).all()
    assert tree.sample(256, Random(100)).tolist() != first.tolist()


# ---------------------------------------------------------------------------------------------
# Random


def test_random_is_reproducible_and_uniform():
    draws = Random(42).random(200000)
    assert draws.dtype == np.float64 and draws.shape == (200000,)
    assert draws.min() >= 0.0 and draws.max() < 1.0
    assert Random(42).random(10).tolist() == draws[:10].tolist()
    assert Random(43).random(10).tolist() != draws[:10].tolist()
    counts = np.histogram(draws, bins=50, range=(0.0, 1.0))[0]
    statistic, df = chi_square(counts, np.ones(50))
    assert statistic < chi_square_critical(df)
    assert Random(0).random(0).shape == (0,)
    # A seed beyond 64 bits is reduced, not rejected.
    assert Random(2**64 + 5).random(3).tolist() == Random(5).random(3).tolist()
    assert Random(None).random(3).shape == (3,)


@pytest.mark.parametrize(
    "seed, error, name",
    [(-1, ValueError, "seed"), (1.5, TypeError, "seed"), (True, TypeError, "seed"),
     ("7", TypeError, "seed")],
)
def test_random_rejects_bad_seeds(seed, error, name):
    with pytest.raises(error, match=name):
        Random(seed)


def test_random_rejects_negative_size():
    with pytest.raises(ValueError, match="size"):
        Random(0).random(-1)


# ---------------------------------------------------------------------------------------------
# Invalid calls: a clear error naming the argument, and the tree left as it was


def populated_tree(capacity: int = 50) -> SegmentTree:
    tree = make_tree(capacity)
    tree.set(np.arange(0, capacity, 2), np.arange(0, capacity, 2) / 7.0 + 0.5)
    return tree


INVALID_CALLS = [
    # (id, call on a populated tree of capacity 50, error, message pattern)
    ("index-out-of-range", lambda t: t.set([0, 50], [1.0, 1.0]), IndexError, "indices"),
    ("index-negative", lambda t: t.set([3, -1], [1.0, 1.0]), IndexError, "indices"),
    ("index-float", lambda t: t.set(np.array([1.0, 2.0]), [1.0, 1.0]), TypeError, "indices"),
    ("index-bool", lambda t: t.set(np.array([True]), [1.0]), TypeError, "indices"),
    ("index-2d", lambda t: t.set(np.zeros((2, 2), np.int64), [1.0] * 4), ValueError, "indices"),
    ("index-str", lambda t: t.set(["1"], [1.0]), TypeError, "indices"),
    ("value-nan", lambda t: t.set([1, 3], [1.0, math.nan]), ValueError, "values"),
    ("value-inf", lambda t: t.set([1, 3], [math.inf, 1.0]), ValueError, "values"),
    ("value-negative", lambda t: t.set([1, 3], [1.0, -0.5]), ValueError, "values"),
    # Finite, but 50 leaves of it would overflow the total to inf.
    ("value-too-large", lambda t: t.set([1], [1e307]), ValueError, "values"),
    ("value-too-few", lambda t: t.set([1, 3, 5], [1.0, 2.0]), ValueError, "values"),
    ("value-too-many", lambda t: t.set([1], [1.0, 2.0]), ValueError, "values"),
    ("value-str", lambda t: t.set([1, 3], ["1", "2"]), TypeError, "values"),
    ("value-bool", lambda t: t.set([1], np.array([True])), TypeError, "values"),
    ("value-2d", lambda t: t.set([1, 3], np.ones((2, 1))), ValueError, "values"),
    ("get-out-of-range", lambda t: t.get([50]), IndexError, "indices"),
    ("get-negative", lambda t: t.get([-1]), IndexError, "indices"),
    ("get-float", lambda t: t.get([0.0, 1.0]), TypeError, "indices"),
    ("clear-out-of-range", lambda t: t.clear([0, 2, 51]), IndexError, "indices"),
    ("clear-float", lambda t: t.clear([0.5]), TypeError, "indices"),
    ("clear-2d", lambda t: t.clear([[0, 2]]), ValueError, "indices"),
    ("mass-nan", lambda t: t.search([1.0, math.nan]), ValueError, "masses"),
    ("mass-negative", lambda t: t.search([1.0, -1e-9]), ValueError, "masses"),
    ("mass-inf", lambda t: t.search([math.inf]), ValueError, "masses"),
    ("mass-str", lambda t: t.search(["1.0"]), TypeError, "masses"),
    ("batch-zero", lambda t: t.sample(0, Random(0)), ValueError, "batch_size"),
    ("batch-negative", lambda t: t.sample(-3, Random(0)), ValueError, "batch_size"),
    ("rng-numpy", lambda t: t.sample(4, np.random.default_rng(0)), TypeError, "rng"),
    ("rng-none", lambda t: t.sample(4, None), TypeError, "rng"),
    ("rng-int", lambda t: t.sample(4, 7), TypeError, "rng"),
]


@pytest.mark.parametrize(
    "call, error, pattern", [c[1:] for c in INVALID_CALLS], ids=[c[0] for c in INVALID_CALLS]
)
def test_invalid_call_raises_and_changes_nothing(call, error, pattern):
    tree = populated_tree()
    before = snapshot(tree)
    with pytest.raises(error, match=pattern):
        call(tree)
    assert snapshot(tree) == before


@pytest.mark.parametrize(
    "call",
    [lambda t: t.search([0.0]), lambda t: t.sample(1, Random(0))],
    ids=["search", "sample"],
)
@pytest.mark.parametrize("state", ["never-set", "set-to-zero", "cleared"])
def test_search_and_sample_on_an_all_zero_tree(call, state):
    tree = make_tree(30)
    if state == "set-to-zero":
        tree.set([1, 2], [0.0, 0.0])
    elif state == "cleared":
        tree.set([1, 2], [1.0, 2.0])
        tree.clear([1, 2])
    before = snapshot(tree)
    with pytest.raises(ValueError, match="total is 0"):
        call(tree)
    assert snapshot(tree) == before


@pytest.mark.parametrize(
    "capacity, error",
    [(0, ValueError), (-1, ValueError), (2.0, TypeError), (8.5, TypeError), (True, TypeError),
     (np.bool_(True), TypeError), ("8", TypeError), (None, TypeError), (2**48 + 1, ValueError)],
)
def test_invalid_capacity(capacity, error):
    memory = bytearray(4096)
    with pytest.raises(error, match="capacity"):
        SegmentTree(memory, capacity)
    with pytest.raises(error, match="capacity"):
        SegmentTree.nbytes(capacity)
    memory.append(0)  # the buffer was not left exported


def existing_tree_memory() -> tuple[bytearray, tuple]:
    """A bytearray with a populated tree of capacity 50 at offset 0, and that tree's snapshot."""
    memory = bytearray(SegmentTree.nbytes(50) + 64)
    tree = SegmentTree(memory, 50)
    tree.set([1, 2, 49], [1.0, 2.0, 3.0])
    state = snapshot(tree)
    tree.release()
    return memory, state


@pytest.mark.parametrize(
    "make_call, error, pattern",
    [
        # Too small by one byte, at offset 0 and once the offset is counted.
        (lambda m: SegmentTree(m[: SegmentTree.nbytes(50) - 1], 50), ValueError, "memory"),
        (lambda m: SegmentTree(m, 50, offset=72), ValueError, "memory"),
        (lambda m: SegmentTree(m, 50, offset=3), ValueError, "offset"),
        (lambda m: SegmentTree(m, 50, offset=4), ValueError, "offset"),
        (lambda m: SegmentTree(m, 50, offset=-8), ValueError, "offset"),
        (lambda m: SegmentTree(bytes(m), 50), TypeError, "memory"),
        (lambda m: SegmentTree(memoryview(bytes(m)), 50), TypeError, "memory"),
        # numpy refuses these exports with ValueError, not BufferError: either type will do,
        # as long as the message names `memory`.
        (lambda m: SegmentTree(np.frombuffer(m, np.float64)[::2], 5), (TypeError, ValueError),
         "memory"),
        (lambda m: SegmentTree(np.frombuffer(bytes(m), np.float64), 5), (TypeError, ValueError),
         "memory"),
        (lambda m: SegmentTree([0.0] * 1000, 5), TypeError, "memory"),
        (lambda m: SegmentTree(m, 2**20), ValueError, "memory"),
    ],
    ids=["short", "short-at-offset", "misaligned-3", "misaligned-4", "negative-offset", "bytes",
         "readonly-view", "strided-numpy", "readonly-numpy", "list", "capacity-too-big-for-memory"],
)
def test_invalid_memory_raises_and_leaves_the_memory_alone(make_call, error, pattern):
    memory, state = existing_tree_memory()
    original = bytes(memory)
    with pytest.raises(error, match=pattern):
        make_call(memory)
    assert bytes(memory) == original
    assert snapshot(SegmentTree(memory, 50, initialize=False)) == state


def test_too_small_fortran_ordered_memory_raises_value_error_naming_memory():
    """A Fortran-ordered array is a contiguous buffer the tree accepts when big enough.

    Regression test: the too-small message was built with ``memoryview(memory).cast('B')``,
    which only works on C-contiguous views, so a TypeError from memoryview escaped instead of
    the ValueError naming `memory`.
    """
    big = np.zeros((8, SegmentTree.nbytes(5) // 64), order="F")
    assert not big.flags.c_contiguous
    SegmentTree(big, 5).release()  # accepted when large enough
    small = np.zeros((2, 3), order="F")
    with pytest.raises(ValueError, match="memory"):
        SegmentTree(small, 5)


def test_use_after_release_raises_and_memory_is_free():
    memory = bytearray(SegmentTree.nbytes(10))
    tree = SegmentTree(memory, 10)
    tree.set([1], [2.0])
    tree.release()
    tree.release()  # idempotent
    memory.append(0)  # no exported buffer any more: the bytearray can be resized
    calls = [
        lambda: tree.set([1], [1.0]),
        lambda: tree.get([1]),
        lambda: tree.clear(),
        lambda: tree.clear([1]),
        lambda: tree.total(),
        lambda: tree.min(),
        lambda: tree.rebuild(),
        lambda: tree.search([0.5]),
        lambda: tree.sample(1, Random(0)),
    ]
    for call in calls:
        with pytest.raises(ValueError, match="released"):
            call()


def test_release_lets_an_mmap_close():
    with mmap.mmap(-1, SegmentTree.nbytes(16)) as memory:
        tree = SegmentTree(memory, 16)
        tree.set([3], [1.0])
        with pytest.raises(BufferError):
            memory.close()  # the tree still holds the buffer
        tree.release()
    assert memory.closed


def test_init_twice_is_refused():
    memory = bytearray(SegmentTree.nbytes(10))
    tree = SegmentTree(memory, 10)
    tree.set([1], [2.0])
    with pytest.raises(RuntimeError, match="already"):
        tree.__init__(bytearray(SegmentTree.nbytes(10)), 10)
    assert snapshot(tree)[0] == 2.0


# ---------------------------------------------------------------------------------------------
# Across processes

CROSS_CAPACITY = 8**4 + 1
CROSS_OFFSET = 64  # where a mutex would sit in front of the tree
PARENT_INDICES = list(range(0, CROSS_CAPACITY, 5))
PARENT_VALUES = [1.0 + (i % 11) / 4.0 for i in PARENT_INDICES]
CHILD_INDICES = [1, 2, CROSS_CAPACITY - 1, 4093, 4094]
CHILD_VALUES = [0.5, 0.0, 9.0, 0.125, 3.0]
CHILD_CLEARS = [0, 4095]


def expected_leaves_after_child() -> np.ndarray:
    values = np.zeros(CROSS_CAPACITY)
    values[PARENT_INDICES] = PARENT_VALUES
    values[CHILD_INDICES] = CHILD_VALUES
    values[CHILD_CLEARS] = 0.0
    return values


def child_main(params: dict) -> None:
    """In a spawned process: attach to the parent's tree, check its writes, make our own."""
    if params["kind"] == "shm":
        segment = shared_memory.SharedMemory(name=params["name"])
        memory = segment.buf
    else:
        with open(params["path"], "r+b") as handle:  # mmap keeps its own descriptor
            segment = mmap.mmap(handle.fileno(), 0)
        memory = segment
    tree = SegmentTree(memory, CROSS_CAPACITY, offset=CROSS_OFFSET, initialize=False)
    try:
        # The parent's leaves, total and min, bit for bit.
        assert tree.get(PARENT_INDICES).tolist() == PARENT_VALUES
        assert tree.total() == params["total"], (tree.total(), params["total"])
        assert tree.min() == min(PARENT_VALUES)
        assert tree.get([1, 2, 3]).tolist() == [0.0, 0.0, 0.0]
        tree.set(CHILD_INDICES, CHILD_VALUES)
        tree.clear(CHILD_CLEARS)
    finally:
        tree.release()
        segment.close()


def run_child(params: dict) -> None:
    """Run child_main(params) in a spawned process; fail with the child's traceback."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    errors = context.Queue()
    init = {"CHILD_PARAMS": params, "CHILD_ERRORS": errors}
    process = context.Process(
        target=runpy.run_path, args=(os.path.abspath(__file__), init, CHILD_RUN_NAME)
    )
    process.start()
    process.join(120)
    if process.is_alive():  # pragma: no cover - only when the child hangs
        process.kill()
        process.join()
        pytest.fail("the child process did not finish in 120 s")
    try:
        message = errors.get(timeout=1.0)
    except queue.Empty:
        message = ""
    errors.close()
    errors.join_thread()
    assert process.exitcode == 0 and not message, message or f"exit code {process.exitcode}"


def check_after_child(tree: SegmentTree) -> None:
    values = expected_leaves_after_child()
    assert tree.get(np.arange(CROSS_CAPACITY)).tolist() == values.tolist()
    assert tree.total() == pytest.approx(math.fsum(values), rel=1e-12)
    # Set leaves: the parent's, minus the cleared ones, plus the child's (one of them 0.0).
    assert tree.min() == 0.0
    tree.clear([2])  # the child's zero leaf; then the smallest set leaf is the child's 0.125
    assert tree.min() == 0.125
    found = tree.sample(512, Random(3))
    assert (values[found] > 0).all()
    assert tree.search([tree.total()]).tolist() == [CROSS_CAPACITY - 1]


@pytest.mark.skipif(shared_memory is None, reason="multiprocessing.shared_memory needs 3.8+")
def test_tree_in_shared_memory_across_a_spawned_process():
    name = SEGMENT_PREFIX + uuid.uuid4().hex[:12]
    size = CROSS_OFFSET + SegmentTree.nbytes(CROSS_CAPACITY)
    segment = shared_memory.SharedMemory(name=name, create=True, size=size)
    try:
        tree = SegmentTree(segment.buf, CROSS_CAPACITY, offset=CROSS_OFFSET)
        try:
            tree.set(PARENT_INDICES, PARENT_VALUES)
            run_child({"kind": "shm", "name": name, "total": tree.total()})
            check_after_child(tree)
        finally:
            tree.release()
    finally:
        segment.close()
        segment.unlink()


def test_tree_in_mmap_file_across_a_spawned_process():
    size = CROSS_OFFSET + SegmentTree.nbytes(CROSS_CAPACITY)
    descriptor, path = tempfile.mkstemp(prefix=SEGMENT_PREFIX, dir=tempfile.gettempdir())
    try:
        os.ftruncate(descriptor, size)
        with mmap.mmap(descriptor, size) as memory:
            tree = SegmentTree(memory, CROSS_CAPACITY, offset=CROSS_OFFSET)
            try:
                tree.set(PARENT_INDICES, PARENT_VALUES)
                run_child({"kind": "mmap", "path": path, "total": tree.total()})
                check_after_child(tree)
            finally:
                tree.release()
    finally:
        os.close(descriptor)
        os.unlink(path)


# ---------------------------------------------------------------------------------------------
# Entry point of the spawned child (run through runpy.run_path with CHILD_RUN_NAME).

if __name__ == CHILD_RUN_NAME:
    try:
        child_main(globals()["CHILD_PARAMS"])
    except BaseException:
        globals()["CHILD_ERRORS"].put(traceback.format_exc())
        raise
    finally:
        globals()["CHILD_ERRORS"].close()
        globals()["CHILD_ERRORS"].join_thread()
