"""Behaviour of PrioritizedReplayBuffer and ReplayBuffer against the public contract.

Every test that builds a buffer runs on each backend this Python has (the `backend` fixture);
the autouse leak check of conftest fails any test that leaves a segment behind.
"""

from __future__ import annotations

import copy
import math
import os
import pickle
import subprocess
import sys
import threading
import time
import warnings

import cloudpickle
import numpy as np
import pytest

import cpprb_ray
from cpprb_ray import PrioritizedReplayBuffer, ReplayBuffer, _rules

ENV = {
    "obs": {"shape": 3},
    "act": {"dtype": np.int64},
    "rew": {},
    "done": {"dtype": np.bool_},
}
OFFSETS = np.array([0.0, 0.25, 0.5])

# Upper 0.001 quantiles of the chi-square distribution, by degrees of freedom (no scipy on 3.7).
CHI2_999 = {5: 20.515, 7: 24.322, 9: 27.877}


def rows(start: int, count: int) -> dict:
    """`count` distinguishable transitions numbered from `start`, in plain float64/int64."""
    k = np.arange(start, start + count)
    return {"obs": k[:, None] + OFFSETS, "act": k, "rew": k * 1.0, "done": k % 2 == 0}


def one_row(k: int) -> dict:
    """Transition number `k` without a batch axis."""
    return {"obs": [k, k + 0.25, k + 0.5], "act": k, "rew": float(k), "done": k % 2 == 0}


def numbers(transitions: dict) -> np.ndarray:
    """The transition numbers of a dict of rows (checks that all columns agree)."""
    k = transitions["act"][:, 0]
    np.testing.assert_array_equal(transitions["obs"], (k[:, None] + OFFSETS).astype(np.float32))
    np.testing.assert_array_equal(transitions["rew"][:, 0], k.astype(np.float32))
    np.testing.assert_array_equal(transitions["done"][:, 0], k % 2 == 0)
    return k


def child_env() -> dict:
    """The environment of a child python that must import this checkout's cpprb_ray."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(cpprb_ray.__file__)))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return env


def make(backend: str, size: int = 8, cls=PrioritizedReplayBuffer, env=ENV, **kwargs):
    return cls(size, env, backend=backend, **kwargs)


def segment_file(rb) -> str:
    """The file behind a buffer: /dev/shm/NAME for shm, the path itself for mmap."""
    return os.path.join("/dev/shm", rb.name) if rb.backend == "shm" else rb.name


def chi_square(counts: np.ndarray, expected_weights: np.ndarray) -> float:
    expected = counts.sum() * expected_weights / expected_weights.sum()
    return float(((counts - expected) ** 2 / expected).sum())


# ---------------------------------------------------------------------------------------------
# add, ring, shapes, dtypes


@pytest.mark.parametrize("cls", [PrioritizedReplayBuffer, ReplayBuffer])
def test_add_single_and_batch(backend, cls):
    with make(backend, 8, cls) as rb:
        assert rb.backend == backend
        assert (rb.get_stored_size(), rb.get_next_index(), rb.get_buffer_size()) == (0, 0, 8)
        assert rb.add(**one_row(0)) == 0
        assert (rb.get_stored_size(), rb.get_next_index()) == (1, 1)
        assert rb.add(**rows(1, 3)) == 1
        assert (rb.get_stored_size(), rb.get_next_index()) == (4, 4)
        assert rb.add(**rows(4, 1)) == 4
        all_rows = rb.get_all_transitions()
        assert sorted(all_rows) == sorted(ENV)
        np.testing.assert_array_equal(numbers(all_rows), np.arange(5))
        assert all_rows["obs"].dtype == np.float32 and all_rows["act"].dtype == np.int64
        assert all_rows["done"].dtype == np.bool_


@pytest.mark.parametrize("cls", [PrioritizedReplayBuffer, ReplayBuffer])
def test_ring_overwrites_oldest(backend, cls):
    with make(backend, 5, cls) as rb:
        assert rb.add(**rows(0, 3)) == 0
        assert rb.add(**rows(3, 4)) == 3           # slots 3, 4, 0, 1
        assert (rb.get_stored_size(), rb.get_next_index()) == (5, 2)
        np.testing.assert_array_equal(numbers(rb.get_all_transitions()), [5, 6, 2, 3, 4])
        assert rb.add(**one_row(7)) == 2
        assert (rb.get_stored_size(), rb.get_next_index()) == (5, 3)
        np.testing.assert_array_equal(numbers(rb.get_all_transitions()), [5, 6, 7, 3, 4])
        # A batch larger than the buffer keeps its newest rows, oldest of them at the first slot
        # written: rows 10..19 from slot 3 -> rows 15..19 land in slots 3, 4, 0, 1, 2.
        assert rb.add(**rows(10, 10)) == 3
        assert (rb.get_stored_size(), rb.get_next_index()) == (5, 3)
        np.testing.assert_array_equal(numbers(rb.get_all_transitions()), [17, 18, 19, 15, 16])


def test_cpprb_default_shape_and_dtype(backend):
    with make(backend, 8, env={"a": {}, "b": {"shape": (2, 2)}}) as rb:
        rb.add(a=1.5, b=np.ones((2, 2)))                       # one row, no batch axis
        rb.add(a=[2.5, 3.5], b=np.zeros((2, 2, 2)))            # 1-D batch for a shape-1 column
        rb.add(a=[[4.5]], b=np.ones((1, 2, 2)))                # (batch, 1)
        assert rb.get_stored_size() == 4
        sample = rb.sample(5)
        assert sample["a"].shape == (5, 1) and sample["a"].dtype == np.float32
        assert sample["b"].shape == (5, 2, 2) and sample["b"].dtype == np.float32
        all_rows = rb.get_all_transitions()
        np.testing.assert_array_equal(all_rows["a"], [[1.5], [2.5], [3.5], [4.5]])
        assert all_rows["b"].shape == (4, 2, 2)


def test_dtype_casting(backend):
    env = {"f": {}, "i": {"dtype": np.int64}, "u": {"dtype": np.uint8, "shape": 2}}
    with make(backend, 8, env=env) as rb:
        # ints into a float32 column, int32 into int64, bools anywhere numeric: same_kind allows.
        rb.add(f=np.int64(3), i=np.int32(4), u=np.array([1, 2], dtype=np.uint8))
        rb.add(f=[1, 2], i=np.array([True, False]), u=np.array([[3, 4], [5, 6]], np.uint8))
        rb.add(f=np.float64(0.5), i=7, u=np.array([7, 8], dtype=np.uint8))
        all_rows = rb.get_all_transitions()
        np.testing.assert_array_equal(all_rows["f"][:, 0], [3.0, 1.0, 2.0, 0.5])
        np.testing.assert_array_equal(all_rows["i"][:, 0], [4, 1, 0, 7])
        np.testing.assert_array_equal(all_rows["u"], [[1, 2], [3, 4], [5, 6], [7, 8]])
        assert all_rows["f"].dtype == np.float32 and all_rows["i"].dtype == np.int64
        # Floats into an int64 column: whole numbers it holds go in (as cpprb takes them);
        # a fraction is refused by name and position, where cpprb would truncate it.
        with pytest.raises(ValueError, match="column 'i' has dtype int64; got 1.5, not a whole"):
            rb.add(f=1.0, i=1.5, u=np.array([1, 2], dtype=np.uint8))
        with pytest.raises(ValueError, match=r"'i'.* got 2.5 at index \(1,\)"):
            rb.add(f=[1.0, 1.0], i=np.array([1.0, 2.5]), u=np.ones((2, 2), np.uint8))
        assert rb.get_stored_size() == 4
        rb.add(f=[1.0, 1.0], i=np.array([1.0, 2.0]), u=np.ones((2, 2), np.uint8))
        assert rb.get_all_transitions()["i"][-2:, 0].tolist() == [1, 2]


@pytest.mark.parametrize("cls", [PrioritizedReplayBuffer, ReplayBuffer])
def test_sample_never_refills_arrays_somebody_holds(backend, cls):
    """sample() refills the arrays of an earlier result only once nothing else refers to them:
    a batch kept (whole, one array of it, a view, a buffer export) keeps its values through any
    number of later samples, and arrays changed in place (shape, dtype, read-only) while they
    were the user's come back as fresh ones of the right kind."""
    with make(backend, 64, cls, seed=5) as rb:
        rb.add(**rows(0, 64))
        kept = [rb.sample(16) for _ in range(3)]
        snapshots = [{key: value.copy() for key, value in batch.items()} for batch in kept]
        one_array = rb.sample(16)["obs"]
        view = rb.sample(16)["act"][:4]
        exported = memoryview(rb.sample(16)["rew"])
        frozen = (one_array.copy(), view.copy(), np.asarray(exported).copy())
        ids = set()
        for _ in range(50):
            batch = rb.sample(16)
            numbers(batch)        # every column of every row agrees with its transition number
            ids.update(id(value) for value in batch.values())
            del batch
        for batch, snapshot in zip(kept, snapshots):
            for key in snapshot:
                np.testing.assert_array_equal(batch[key], snapshot[key])
        np.testing.assert_array_equal(one_array, frozen[0])
        np.testing.assert_array_equal(view, frozen[1])
        np.testing.assert_array_equal(exported, frozen[2])
        # Dropped results are what gets refilled: far fewer distinct arrays than 50 fresh sets.
        assert len(ids) < 50 * len(kept[0])
        for change in ("shape", "dtype", "read-only"):
            for _ in range(3):                      # every kept set, whichever comes back
                batch = rb.sample(16)
                if change == "shape":
                    # In place (numpy 2.5 deprecates setting .shape; resize is not).
                    batch["obs"].resize((8, 6), refcheck=False)
                elif change == "dtype":
                    # Deprecated in numpy 2.5 but still possible (no other way changes an
                    # array's dtype in place): the store must still notice.
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore", DeprecationWarning)
                        batch["rew"].dtype = np.int32
                else:
                    batch["act"].flags.writeable = False
                del batch
            batch = rb.sample(16)
            assert batch["obs"].shape == (16, 3) and batch["rew"].dtype == np.float32
            assert batch["act"].flags.writeable
            numbers(batch)


def test_sample_threads_never_share_arrays(backend):
    """Threads sampling one handle at once each get arrays of their own."""
    with make(backend, 256, seed=6) as rb:
        rb.add(**rows(0, 256))
        failures = []

        def learner():
            try:
                held = []
                for _ in range(300):
                    batch = rb.sample(32)
                    k = numbers(batch)
                    held.append((batch, k.copy()))
                    if len(held) > 3:
                        old, old_k = held.pop(0)
                        np.testing.assert_array_equal(numbers(old), old_k)
            except Exception as error:      # pragma: no cover - reported below
                failures.append(error)

        threads = [threading.Thread(target=learner) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not failures, failures


LIST_DTYPES = [np.float32, np.float64, np.int64, np.int32, np.uint8, np.bool_]


@pytest.mark.parametrize("dtype", LIST_DTYPES, ids=lambda d: np.dtype(d).name)
def test_python_lists_follow_numpy(dtype):
    """A flat list of Python numbers (converted without numpy where it is a plain cast) stores
    what add's general rule makes of it (_rules.column_array: numpy's same_kind casting, with
    Python ints taken by their value), or fails with the same kind of error, for every mix of
    floats, ints and bools, as a batch of a scalar column and as one row of a 1-D column; a
    failed add leaves the buffer as it was."""
    rng = np.random.default_rng(7)
    pools = {"float": lambda: float(rng.normal() * 1e3),
             "int": lambda: int(rng.integers(-2**40, 2**40)),
             "small int": lambda: int(rng.integers(0, 2)), "bool": lambda: bool(rng.integers(2))}
    env = {"s": {"dtype": dtype}, "v": {"dtype": dtype, "shape": 3}}
    with ReplayBuffer(64, env) as ours, ReplayBuffer(64, env) as reference:
        for _ in range(60):
            kinds = rng.choice(sorted(pools), size=rng.integers(1, 3))
            batch = [pools[kinds[rng.integers(len(kinds))]]() for _ in range(3)]
            row = [pools[kinds[rng.integers(len(kinds))]]() for _ in range(3)]
            for value in ({"s": batch, "v": np.zeros((3, 3), dtype)},     # a batch of 3
                          {"s": batch[:1], "v": row}):                     # one row
                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        reference.add(**{k: _rules.column_array(v, np.dtype(dtype), k)
                                         for k, v in value.items()})
                except (TypeError, ValueError) as error:
                    before = ours.get_stored_size(), ours.get_next_index()
                    with pytest.raises(type(error)):
                        ours.add(**value)
                    assert (ours.get_stored_size(), ours.get_next_index()) == before
                    continue
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    ours.add(**value)
        mine, theirs = ours.get_all_transitions(), reference.get_all_transitions()
        assert len(mine["s"]) == len(theirs["s"]) > 0
        for name in env:
            assert mine[name].dtype == theirs[name].dtype
            np.testing.assert_array_equal(mine[name], theirs[name])


def test_add_accepts_non_contiguous_arrays(backend):
    """Strided or Fortran-ordered arrays of the right dtype are data like any other."""
    with make(backend, 8, env={"x": {"shape": 3}, "y": {"shape": (2, 2)}}) as rb:
        wide = np.arange(12, dtype=np.float32).reshape(2, 6)
        fortran = np.asfortranarray(np.arange(8, dtype=np.float32).reshape(2, 2, 2))
        rb.add(x=wide[:, ::2], y=fortran)
        rb.add(x=wide[0, ::2], y=fortran[0].T)
        all_rows = rb.get_all_transitions()
        np.testing.assert_array_equal(all_rows["x"], [[0, 2, 4], [6, 8, 10], [0, 2, 4]])
        np.testing.assert_array_equal(all_rows["y"][:2], fortran)
        np.testing.assert_array_equal(all_rows["y"][2], fortran[0].T)


def test_mixed_columns_round_trip(backend):
    """Odd sizes, several dtypes (one big-endian) and a row wider than a cache line."""
    env = {"a": {"dtype": ">f4", "shape": 3}, "b": {"dtype": np.uint16, "shape": 7},
           "c": {"dtype": np.float64, "shape": (2, 5)}, "d": {"dtype": np.int8},
           "e": {"dtype": np.bool_, "shape": 5}, "f": {"shape": 17}}
    rng = np.random.default_rng(0)
    data = {"a": rng.normal(size=(11, 3)).astype(">f4"),
            "b": rng.integers(0, 2 ** 16, (11, 7)).astype(np.uint16),
            "c": rng.normal(size=(11, 2, 5)), "d": rng.integers(-128, 128, (11, 1)).astype(np.int8),
            "e": rng.random((11, 5)) < 0.5, "f": rng.normal(size=(11, 17)).astype(np.float32)}
    for cls in (PrioritizedReplayBuffer, ReplayBuffer):
        with make(backend, 16, cls, env=env, seed=2) as rb:
            rb.add(**{key: value[:4] for key, value in data.items()})
            for k in range(4, 11):                                   # one row at a time
                rb.add(**{key: value[k] for key, value in data.items()})
            all_rows = rb.get_all_transitions()
            sample = rb.sample(32)
            for key, value in data.items():
                assert all_rows[key].dtype == np.dtype(env[key]["dtype"] if "dtype" in env[key]
                                                       else np.float32), key
                np.testing.assert_array_equal(all_rows[key], value, err_msg=key)
                np.testing.assert_array_equal(sample[key], value[sample["indexes"]], err_msg=key)


# ---------------------------------------------------------------------------------------------
# priorities and the sampling law


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64])
def test_priority_arrays_of_any_real_dtype(backend, dtype):
    """Priorities as float32 (a float32 network's |TD errors|), float64 or integer arrays give
    the leaves of the same values as Python floats; a bad one anywhere adds nothing."""
    raw = np.array([0.5, 2.0, 4.0, 1.0], dtype)
    with make(backend, 8, alpha=0.7, eps=0.01) as rb, make(backend, 8, alpha=0.7, eps=0.01) as ref:
        rb.add(**rows(0, 4), priorities=raw)
        ref.add(**rows(0, 4), priorities=[float(p) for p in raw])
        np.testing.assert_array_equal(rb._store.check_tree()[1], ref._store.check_tree()[1])
        assert rb.get_max_priority() == 4.0
        if dtype != np.int64:
            with pytest.raises(ValueError, match="position 1"):
                rb.add(**rows(4, 2), priorities=np.array([1.0, np.nan], dtype))
        with pytest.raises(ValueError, match="2 entries"):
            rb.add(**rows(4, 2), priorities=raw[:1])
        with pytest.raises(ValueError, match="position 0"):
            rb.add(**rows(4, 1), priorities=np.array([-1], dtype))
        assert rb.get_stored_size() == 4 and rb.get_max_priority() == 4.0


def test_priorities_default_to_max(backend):
    with make(backend, 8, alpha=0.5, eps=0.01) as rb:
        assert rb.get_max_priority() == 1.0
        rb.add(**rows(0, 2))
        assert rb.get_max_priority() == 1.0
        rb.add(**rows(2, 2), priorities=[3.0, 0.5])
        assert rb.get_max_priority() == 3.0
        rb.add(**one_row(4))                                   # gets 3.0
        rb.add(**one_row(5), priorities=0.25)                  # below the max: max unchanged
        assert rb.get_max_priority() == 3.0
        _, leaves, _, _ = rb._store.check_tree()
        raw = np.array([1.0, 1.0, 3.0, 0.5, 3.0, 0.25])
        np.testing.assert_allclose(leaves[:6], (raw + 0.01) ** 0.5, rtol=1e-12)
        assert rb.update_priorities([0], [7.0]) == 1
        assert rb.get_max_priority() == 7.0
        assert rb.update_priorities([0], [2.0]) == 1
        assert rb.get_max_priority() == 7.0                    # the largest ever seen
        rb.add(**one_row(6))
        _, leaves, _, _ = rb._store.check_tree()
        assert leaves[6] == pytest.approx((7.0 + 0.01) ** 0.5, rel=1e-12)


def test_sampling_follows_priority_law(backend):
    """P(i) = (p_i + eps)^alpha / sum_j (p_j + eps)^alpha, by a chi-square test that the laws
    without eps or without alpha fail."""
    raw = np.array([0.0, 0.5, 1.0, 2.0, 4.0, 8.0])
    alpha, eps = 0.7, 0.3
    with make(backend, 6, alpha=alpha, eps=eps, seed=12345) as rb:
        rb.add(**rows(0, 6), priorities=raw)
        counts = np.zeros(6)
        for _ in range(5000):                                  # single draws: no stratification
            counts[rb.sample(1)["indexes"][0]] += 1
        batch = rb.sample(6000)["indexes"]                     # stratified: tighter still
    df = 5
    assert chi_square(counts, (raw + eps) ** alpha) < CHI2_999[df]
    assert chi_square(counts, (raw + 1e-9) ** alpha) > CHI2_999[df]      # eps ignored
    assert chi_square(counts, raw + eps) > CHI2_999[df]                  # alpha ignored
    batch_counts = np.bincount(batch, minlength=6).astype(float)
    assert chi_square(batch_counts, (raw + eps) ** alpha) < CHI2_999[df]


@pytest.mark.parametrize("beta, spread", [(0.4, "narrow"), (1.0, "narrow"), (0.05, "narrow"),
                                          (0.4, "wide"), (1.0, "wide")])
def test_weights_are_exact(backend, beta, spread):
    rng = np.random.default_rng(3)
    if spread == "narrow":
        raw, alpha = rng.uniform(0.05, 5.0, size=40), 0.6
    else:                                      # leaf weights 12 orders of magnitude apart
        raw, alpha = 10.0 ** rng.uniform(-6, 6, size=40), 1.0
        raw[:2] = [1e-6, 1e6]
    eps = 1e-4 if spread == "narrow" else 0.0
    with make(backend, 64, alpha=alpha, eps=eps, seed=4) as rb:
        rb.add(**rows(0, 40), priorities=raw)
        sample = rb.sample(256, beta=beta)
    indexes, weights = sample["indexes"], sample["weights"]
    assert indexes.dtype == np.int64 and weights.dtype == np.float32
    assert sample["generations"].dtype == np.uint64
    assert indexes.min() >= 0 and indexes.max() < 40
    leaf = (raw + eps) ** alpha
    expected = (leaf[indexes] / leaf.min()) ** -beta
    np.testing.assert_allclose(weights, expected, rtol=1e-6)
    # The same, written as in the PER paper: (N P(i))^-beta / max_j (N P(j))^-beta.
    n, probability = 40, leaf / leaf.sum()
    paper = (n * probability[indexes]) ** -beta / ((n * probability) ** -beta).max()
    np.testing.assert_allclose(weights, paper, rtol=1e-6)
    assert weights.max() <= 1.0


def test_zero_priority_rows_are_never_sampled(backend):
    """With eps=0 a row of priority 0 weighs nothing: never drawn, and no part of the weights'
    normalisation (its P(i) = 0 would make max_j (N P(j))^-beta infinite)."""
    with make(backend, 8, alpha=1.0, eps=0.0, seed=3) as rb:
        rb.add(**rows(0, 4), priorities=[0.0, 1.0, 0.0, 4.0])
        sample = rb.sample(1000, beta=1.0)
        assert set(np.unique(sample["indexes"])) == {1, 3}
        np.testing.assert_allclose(sample["weights"], np.where(sample["indexes"] == 1, 1.0, 0.25),
                                   rtol=1e-6)
        assert abs(int((sample["indexes"] == 3).sum()) - 800) <= 1       # stratified: 4/5
        rb.update_priorities([1, 3], [0.0, 0.0])
        with pytest.raises(ValueError):                # nothing left with any weight
            rb.sample(1)


def test_beta_zero_and_alpha_zero_give_unit_weights(backend):
    raw = np.array([0.1, 1.0, 10.0, 100.0])
    with make(backend, 4, alpha=0.6, seed=1) as rb:
        rb.add(**rows(0, 4), priorities=raw)
        np.testing.assert_array_equal(rb.sample(64, beta=0.0)["weights"], np.ones(64))
    with make(backend, 4, alpha=0.0, seed=1) as rb:
        rb.add(**rows(0, 4), priorities=raw)
        sample = rb.sample(4000, beta=1.0)
        np.testing.assert_array_equal(sample["weights"], np.ones(4000))
        counts = np.bincount(sample["indexes"], minlength=4).astype(float)
        np.testing.assert_array_equal(counts, [1000, 1000, 1000, 1000])   # stratified, uniform
        counts = np.zeros(4)
        for _ in range(2000):
            counts[rb.sample(1)["indexes"][0]] += 1
        assert chi_square(counts, np.ones(4)) < 16.266                    # df 3, p 0.001


def test_update_priorities_with_and_without_generations(backend):
    with make(backend, 4, alpha=1.0, eps=0.0, seed=0) as rb:
        rb.add(**rows(0, 4))
        sample = rb.sample(16)                # equal priorities, 16 strata: each slot 4 times
        indexes, generations = sample["indexes"], sample["generations"]
        np.testing.assert_array_equal(np.bincount(indexes, minlength=4), [4, 4, 4, 4])
        rb.add(**one_row(4))                  # overwrites slot 0 after it was sampled
        priorities = np.arange(1.0, 17.0)
        applied = rb.update_priorities(indexes, priorities, generations)
        assert applied == int((indexes != 0).sum()) == 12
        _, leaves, _, _ = rb._store.check_tree()
        assert leaves[0] == 1.0               # the new row kept its (default) priority
        for slot in (1, 2, 3):                # duplicates: the last entry wins
            assert leaves[slot] == priorities[np.flatnonzero(indexes == slot)[-1]]
        # Without generations every entry applies, overwritten or not.
        assert rb.update_priorities(indexes, priorities) == 16
        _, leaves, _, _ = rb._store.check_tree()
        assert leaves[0] == priorities[np.flatnonzero(indexes == 0)[-1]]
        assert rb.get_max_priority() == 16.0
        # Lists, tuples and numpy scalars are accepted like arrays; uint64 indexes too.
        assert rb.update_priorities([1, 2], (0.5, 0.25)) == 2
        assert rb.update_priorities(np.array([3], dtype=np.uint64), np.float32(2.0)) == 1
        assert rb.update_priorities(np.int64(3), 3.0) == 1
        assert rb.update_priorities([], []) == 0
        _, leaves, _, _ = rb._store.check_tree()
        np.testing.assert_array_equal(leaves[1:4], [0.5, 0.25, 3.0])


def test_update_priorities_float32_and_converted_inputs_match_float64(backend):
    # float32 priorities (TD errors from a network) take the store's own path, widened there;
    # other kinds (lists, int32 indexes, big-endian, strided) are converted by the handle first.
    # All must leave exactly the leaves and the max priority that float64 arrays leave.
    rng = np.random.default_rng(5)
    indexes = rng.integers(0, 64, 40)
    priorities = rng.random(40).astype(np.float32) * 10
    expected_leaves = expected_max = None
    variants = [
        (indexes, priorities.astype(np.float64)),
        (indexes, priorities),
        (indexes.astype(np.int32), priorities),
        (indexes.astype(">i8"), priorities.astype(">f4")),
        (np.repeat(indexes, 2)[::2], np.repeat(priorities, 2)[::2]),
        (indexes.tolist(), priorities.tolist()),
    ]
    for index_input, priority_input in variants:
        with make(backend, 64, alpha=0.7, eps=1e-3, seed=0) as rb:
            rb.add(**rows(0, 64))
            assert rb.update_priorities(index_input, priority_input) == 40
            _, leaves, _, _ = rb._store.check_tree()
            if expected_leaves is None:
                expected_leaves, expected_max = leaves, rb.get_max_priority()
                last = {int(i): float(p) for i, p in zip(indexes, priorities)}
                for slot, priority in last.items():   # duplicates: the last entry wins
                    assert leaves[slot] == pytest.approx((priority + 1e-3) ** 0.7, rel=1e-12)
                assert expected_max == float(priorities.max())
            np.testing.assert_array_equal(leaves, expected_leaves)
            assert rb.get_max_priority() == expected_max


def test_clear(backend):
    with make(backend, 4, seed=0) as rb:
        rb.add(**rows(0, 4), priorities=[5.0, 1.0, 1.0, 1.0])
        sample = rb.sample(8)
        rb.clear()
        assert (rb.get_stored_size(), rb.get_next_index(), rb.get_max_priority()) == (0, 0, 1.0)
        with pytest.raises(ValueError, match="empty"):
            rb.sample(1)
        all_rows = rb.get_all_transitions()
        assert all_rows["obs"].shape == (0, 3) and all_rows["act"].shape == (0, 1)
        root_sum, leaves, root_min, _ = rb._store.check_tree()
        assert root_sum == 0.0 and not leaves.any() and root_min == math.inf
        rb.add(**rows(10, 4))
        # Stale generations from before clear() never touch the new rows.
        assert rb.update_priorities(sample["indexes"], np.full(8, 9.0), sample["generations"]) == 0
        assert rb.get_max_priority() == 1.0
        np.testing.assert_array_equal(numbers(rb.get_all_transitions()), [10, 11, 12, 13])
        rb.on_episode_end()                   # accepted, no effect
        assert rb.get_stored_size() == 4


def test_sample_empty_raises(backend):
    with make(backend, 4) as rb, make(backend, 4, ReplayBuffer) as uniform:
        with pytest.raises(ValueError):
            rb.sample(1)
        with pytest.raises(ValueError):
            uniform.sample(1)


def test_sample_returns_fresh_arrays(backend):
    with make(backend, 8, seed=1) as rb:
        rb.add(**rows(0, 8))
        before = rb.get_all_transitions()
        first, second = rb.sample(16), rb.sample(16)
        assert set(first) == set(ENV) | {"indexes", "weights", "generations"}
        for key in first:
            assert first[key].base is None, key            # owns its memory, no segment view
            assert first[key].flags.writeable
            assert not np.shares_memory(first[key], second[key]), key
            for other in before.values():
                assert not np.shares_memory(first[key], other)
        for key in ENV:
            first[key][...] = 0                            # scribbling on a sample ...
        for value in before.values():
            value[...] = 0                                 # ... or on get_all_transitions()
        after = rb.get_all_transitions()
        np.testing.assert_array_equal(numbers(after), np.arange(8))   # ... changes nothing
        third = rb.sample(16)
        np.testing.assert_array_equal(numbers(third), third["indexes"])


def test_get_all_transitions_of_uniform_buffer(backend):
    with make(backend, 4, ReplayBuffer) as rb:
        rb.add(**rows(0, 6))
        all_rows = rb.get_all_transitions()
        assert sorted(all_rows) == sorted(ENV)
        np.testing.assert_array_equal(numbers(all_rows), [4, 5, 2, 3])


# ---------------------------------------------------------------------------------------------
# names, attach, views, close


def test_names_and_file_mode(backend):
    with make(backend) as first, make(backend, cls=ReplayBuffer) as second:
        for rb in (first, second):
            base = os.path.basename(rb.name)
            assert base.startswith("cpprb_ray_") and len(base) > len("cpprb_ray_") + 8
            assert os.path.exists(segment_file(rb))
            assert os.stat(segment_file(rb)).st_mode & 0o777 == 0o600
            assert rb.is_owner
        assert first.name != second.name
        if backend == "mmap":
            assert os.path.isabs(first.name)


def test_custom_name(backend):
    name = "cpprb_ray_test_custom_" + os.urandom(6).hex()
    with make(backend, name=name) as rb:
        assert os.path.basename(rb.name) == name
        if backend == "shm":
            assert rb.name == name
        assert os.stat(segment_file(rb)).st_mode & 0o777 == 0o600
        with PrioritizedReplayBuffer.attach(rb.name) as view:
            assert view.get_buffer_size() == 8
    assert not os.path.exists(segment_file(rb))


def test_mmap_path(tmp_path):
    path = tmp_path / "buffer.bin"
    try:
        with PrioritizedReplayBuffer(16, ENV, backend="mmap", path=path) as rb:
            assert rb.backend == "mmap" and rb.name == str(path)
            assert os.stat(path).st_mode & 0o777 == 0o600
            rb.add(**rows(0, 3))
            with PrioritizedReplayBuffer.attach(path) as view:
                np.testing.assert_array_equal(numbers(view.get_all_transitions()), [0, 1, 2])
            with cpprb_ray.attach(str(path)) as view:
                assert view.get_stored_size() == 3
        assert not path.exists()
    finally:
        if path.exists():
            path.unlink()


@pytest.mark.parametrize("cls", [PrioritizedReplayBuffer, ReplayBuffer])
def test_owner_close_frees_and_views_keep_working(backend, cls):
    owner = make(backend, 8, cls, seed=0)
    owner.add(**rows(0, 3))
    view = cls.attach(owner.name)
    assert owner.is_owner and not view.is_owner
    assert view.name == owner.name and view.backend == backend and type(view) is cls
    path = segment_file(owner)
    owner.close()
    assert not os.path.exists(path)                         # the name is gone ...
    assert owner.closed
    np.testing.assert_array_equal(numbers(view.get_all_transitions()), [0, 1, 2])
    view.add(**rows(3, 2))                                  # ... the memory is not
    sample = view.sample(8)
    np.testing.assert_array_equal(numbers(sample), sample["indexes"])
    assert view.get_stored_size() == 5
    with pytest.raises(FileNotFoundError):
        cls.attach(owner.name)
    view.close()
    view.close()                                            # closing twice is fine
    owner.close()


def test_view_close_never_frees(backend):
    with make(backend, 8) as owner:
        owner.add(**rows(0, 2))
        view = PrioritizedReplayBuffer.attach(owner.name)
        view.add(**rows(2, 2))
        view.close()
        view.close()
        assert os.path.exists(segment_file(owner))
        np.testing.assert_array_equal(numbers(owner.get_all_transitions()), [0, 1, 2, 3])
        with PrioritizedReplayBuffer.attach(owner.name) as again:   # still attachable
            assert again.get_stored_size() == 4
        assert os.path.exists(segment_file(owner))


@pytest.mark.parametrize("role", ["owner", "view"])
def test_closed_handle_raises(backend, role):
    with make(backend, 8) as owner:
        owner.add(**rows(0, 4))
        rb = owner if role == "owner" else PrioritizedReplayBuffer.attach(owner.name)
        rb.close()
        calls = {
            "add": lambda: rb.add(**one_row(9)),
            "sample": lambda: rb.sample(2),
            "update_priorities": lambda: rb.update_priorities([0], [1.0]),
            "get_stored_size": rb.get_stored_size,
            "get_next_index": rb.get_next_index,
            "get_max_priority": rb.get_max_priority,
            "clear": rb.clear,
            "get_all_transitions": rb.get_all_transitions,
        }
        for what, call in calls.items():
            with pytest.raises(ValueError, match="closed"):
                call()
                pytest.fail(f"{what} worked on a closed handle")
        rb.close()


def test_closed_handle_get_buffer_size_raises(backend):
    rb = make(backend, 8)
    rb.close()
    with pytest.raises(ValueError, match="closed"):
        rb.get_buffer_size()


CLOSE_RACE_SCRIPT = """
import sys, threading, time
import numpy as np
from cpprb_ray import PrioritizedReplayBuffer
for trial in range(10):
    rb = PrioritizedReplayBuffer(1 << 14, {"obs": {"shape": 64}}, backend=sys.argv[1])
    print(rb.name, flush=True)
    rb.add(obs=np.ones((1 << 14, 64), np.float32))
    started = threading.Event()
    def work():
        try:
            while True:
                started.set()
                rb.sample(20000)
        except ValueError:       # "closed": the one acceptable outcome for the loser of the race
            pass
    thread = threading.Thread(target=work)
    thread.start()
    started.wait()
    time.sleep(0.005)
    rb.close()
    thread.join()
"""


def test_close_while_another_thread_samples(backend):
    """Closing a handle another thread is using may fail that thread's call, never crash."""
    child = subprocess.run([sys.executable, "-c", CLOSE_RACE_SCRIPT, backend],
                           capture_output=True, text=True, env=child_env(), timeout=120)
    for name in child.stdout.split():       # a crashed child cannot clean up after itself
        path = os.path.join("/dev/shm", name) if backend == "shm" else name
        if os.path.exists(path):
            os.unlink(path)
    assert child.returncode == 0, child.stderr[-2000:]


def test_context_manager(backend):
    with make(backend) as rb:
        rb.add(**one_row(0))
        path = segment_file(rb)
        assert os.path.exists(path)
    assert rb.closed and not os.path.exists(path)
    with pytest.raises(RuntimeError, match="boom"):
        with make(backend) as rb:
            path = segment_file(rb)
            raise RuntimeError("boom")
    assert rb.closed and not os.path.exists(path)


def test_attach_returns_the_right_class(backend):
    with make(backend, 4) as prioritized, make(backend, 4, ReplayBuffer) as uniform:
        with cpprb_ray.attach(prioritized.name) as view:
            assert type(view) is PrioritizedReplayBuffer
        with cpprb_ray.attach(uniform.name) as view:
            assert type(view) is ReplayBuffer
        with ReplayBuffer.attach(prioritized.name) as view:
            assert isinstance(view, PrioritizedReplayBuffer)
        with pytest.raises(ValueError, match="uniform"):
            PrioritizedReplayBuffer.attach(uniform.name)


def test_env_dict_round_trips_through_attach(backend):
    env = {"o": {"shape": (2, 3), "dtype": np.uint8}, "r": {}, "a": {"dtype": "int32"}}
    with make(backend, 4, env=env) as rb, cpprb_ray.attach(rb.name) as view:
        rb.add(o=np.full((2, 3), 7, np.uint8), r=1.0, a=np.int32(2))
        sample = view.sample(3)
        assert sample["o"].shape == (3, 2, 3) and sample["o"].dtype == np.uint8
        assert sample["r"].shape == (3, 1) and sample["r"].dtype == np.float32
        assert sample["a"].shape == (3, 1) and sample["a"].dtype == np.int32
        assert (sample["o"] == 7).all()


# ---------------------------------------------------------------------------------------------
# pickling


@pytest.mark.parametrize("dumps", [pickle.dumps, cloudpickle.dumps], ids=["pickle", "cloudpickle"])
@pytest.mark.parametrize("cls", [PrioritizedReplayBuffer, ReplayBuffer])
def test_pickle_is_small_and_reattaches(backend, dumps, cls):
    with make(backend, 2 ** 20, cls, env={"obs": {"shape": 4}}) as rb:
        rb.add(obs=np.arange(40.0).reshape(10, 4))
        payload = dumps(rb)
        assert len(payload) < 4096
        clone = pickle.loads(payload)
        try:
            assert type(clone) is cls
            assert not clone.is_owner and clone.name == rb.name and clone.backend == backend
            assert clone.get_buffer_size() == 2 ** 20 and clone.get_stored_size() == 10
            np.testing.assert_array_equal(clone.get_all_transitions()["obs"],
                                          rb.get_all_transitions()["obs"])
            clone.add(obs=np.full(4, -1.0))                       # writes are shared
            assert rb.get_stored_size() == 11
            np.testing.assert_array_equal(rb.get_all_transitions()["obs"][10], [-1] * 4)
            assert len(dumps(clone)) < 4096
        finally:
            clone.close()
        assert os.path.exists(segment_file(rb))                  # the clone's close kept it


CHILD_SCRIPT = """
import pickle, sys
import numpy as np
rb = pickle.loads(sys.stdin.buffer.read())
assert not rb.is_owner
rb.add(obs=np.full((3, 4), 7.0))
print(rb.get_stored_size(), rb.sample(2)["obs"].shape, flush=True)
"""


@pytest.mark.parametrize("cls", [PrioritizedReplayBuffer, ReplayBuffer])
def test_pickled_handle_in_another_process(backend, cls):
    """A child unpickles the handle, writes through it and exits: its writes are seen and its
    exit frees nothing (no resource tracker unlinking the owner's segment)."""
    with make(backend, 16, cls, env={"obs": {"shape": 4}}) as rb:
        rb.add(obs=np.zeros(4))
        child = subprocess.run([sys.executable, "-c", CHILD_SCRIPT], input=pickle.dumps(rb),
                               capture_output=True, env=child_env(), timeout=60)
        assert child.returncode == 0, child.stderr.decode()[-2000:]
        assert child.stdout.decode().split() == ["4", "(2,", "4)"]
        assert b"leaked" not in child.stderr and b"Warning" not in child.stderr
        assert os.path.exists(segment_file(rb))
        np.testing.assert_array_equal(rb.get_all_transitions()["obs"][1:], np.full((3, 4), 7.0))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_forked_child_does_not_free_the_owners_segment(backend):
    with make(backend, 8) as rb:
        rb.add(**rows(0, 2))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)   # 3.12+: fork with threads
            pid = os.fork()
        if pid == 0:                                              # the child
            code = 1
            try:
                code = 0 if (not rb.is_owner and rb.get_stored_size() == 2) else 2
                rb.add(**rows(2, 1))
                rb.close()                                        # not the owner: frees nothing
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
        assert os.path.exists(segment_file(rb))
        np.testing.assert_array_equal(numbers(rb.get_all_transitions()), [0, 1, 2])


# ---------------------------------------------------------------------------------------------
# uniform buffer, seeds, several handles, threads


def test_replay_buffer_samples_uniformly(backend):
    with make(backend, 16, ReplayBuffer, seed=99) as rb:
        rb.add(**rows(0, 10))                    # not full: only the 10 stored slots come out
        sample = rb.sample(4)
        assert set(sample) == set(ENV) | {"indexes", "generations"}
        assert sample["indexes"].dtype == np.int64 and sample["generations"].dtype == np.uint64
        np.testing.assert_array_equal(numbers(sample), sample["indexes"])
        counts = np.zeros(16)
        for _ in range(100):
            np.add.at(counts, rb.sample(100)["indexes"], 1)
    assert counts[10:].sum() == 0
    assert chi_square(counts[:10], np.ones(10)) < CHI2_999[9]
    # A clearly non-uniform law fails the same test.
    assert chi_square(counts[:10], np.arange(1.0, 11.0)) > CHI2_999[9]


@pytest.mark.parametrize("cls", [PrioritizedReplayBuffer, ReplayBuffer])
def test_seed_reproducibility(backend, cls):
    def draws(seed):
        with make(backend, 64, cls, seed=seed) as rb:
            rb.add(**rows(0, 50))
            if cls is PrioritizedReplayBuffer:
                rb.update_priorities(np.arange(50), np.linspace(0.1, 5.0, 50))
            return [rb.sample(32)["indexes"] for _ in range(3)]

    first, again, other = draws(7), draws(7), draws(8)
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)
    assert any((a != b).any() for a, b in zip(first, other))


def test_owner_and_view_in_one_process(backend):
    with make(backend, 16, seed=1) as owner, PrioritizedReplayBuffer.attach(owner.name,
                                                                            seed=2) as view:
        assert owner.add(**rows(0, 3)) == 0
        assert view.add(**rows(3, 3)) == 3
        assert owner.add(**one_row(6), priorities=4.0) == 6
        for rb in (owner, view):
            assert (rb.get_stored_size(), rb.get_next_index(), rb.get_max_priority()) == (7, 7, 4.0)
            np.testing.assert_array_equal(numbers(rb.get_all_transitions()), np.arange(7))
            sample = rb.sample(10)
            np.testing.assert_array_equal(numbers(sample), sample["indexes"])
        sample = owner.sample(4)
        assert view.update_priorities(sample["indexes"], np.full(4, 8.0),
                                      sample["generations"]) == 4
        assert owner.get_max_priority() == 8.0


def test_threads_share_one_handle(backend):
    capacity, alpha, eps = 300, 0.6, 1e-4
    rb = make(backend, capacity, alpha=alpha, eps=eps, seed=5)
    deadline = time.monotonic() + 0.8
    added = [0] * 4
    given_max = [0.0] * 4
    errors = []

    def worker(number):
        rng = np.random.default_rng(number)
        try:
            while time.monotonic() < deadline:
                count = int(rng.integers(1, 40))
                start = sum(added)
                if rng.random() < 0.5:
                    priorities = rng.uniform(0.0, 3.0, count)
                    given_max[number] = max(given_max[number], priorities.max())
                    rb.add(**rows(start, count), priorities=priorities)
                else:
                    rb.add(**rows(start, count))
                added[number] += count
                sample = rb.sample(16, beta=0.5)
                numbers(sample)                      # every column of a row agrees
                assert sample["indexes"].max() < capacity
                assert ((sample["weights"] > 0) & (sample["weights"] <= 1)).all()
                rb.update_priorities(sample["indexes"], rng.uniform(0.0, 3.0, 16),
                                     sample["generations"])
        except BaseException as error:  # noqa: B036 - reported by the main thread
            errors.append(error)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not errors, errors
        total = sum(added)
        assert total > capacity
        assert rb.get_stored_size() == capacity
        assert rb.get_next_index() == total % capacity
        root_sum, leaves, root_min, mins = rb._store.check_tree()
        assert root_sum == pytest.approx(math.fsum(leaves), rel=1e-9)
        assert root_min == mins.min() == leaves[leaves > 0].min()
        np.testing.assert_array_equal(mins[leaves > 0], leaves[leaves > 0])
        assert (leaves <= (3.0 + eps) ** alpha).all() and (leaves >= eps ** alpha).all()
        assert rb.get_max_priority() >= max(max(given_max), 1.0)
        assert rb.get_max_priority() <= 3.0
        all_rows = rb.get_all_transitions()
        assert len(numbers(all_rows)) == capacity              # every row intact, none torn
    finally:
        rb.close()


# ---------------------------------------------------------------------------------------------
# parity with cpprb


def test_api_parity_with_cpprb(backend):
    cpprb = pytest.importorskip("cpprb")
    env = {"obs": {"shape": (2, 3)}, "act": {"dtype": np.int64}, "rew": {},
           "done": {"dtype": np.bool_}, "img": {"shape": 4, "dtype": np.uint8}}

    def batch(start, count):
        k = np.arange(start, start + count)
        return {"obs": np.ones((count, 2, 3)) * k[:, None, None], "act": k, "rew": k * 0.5,
                "done": k % 3 == 0, "img": ((k[:, None] + np.arange(4)) % 256).astype(np.uint8)}

    theirs = cpprb.PrioritizedReplayBuffer(8, copy.deepcopy(env), alpha=0.5, eps=1e-3)
    ours = PrioritizedReplayBuffer(8, copy.deepcopy(env), alpha=0.5, eps=1e-3, backend=backend)
    try:
        steps = [
            ({"obs": np.ones((2, 3)), "act": 1, "rew": 0.5, "done": False,
              "img": np.arange(4, dtype=np.uint8)}, None),
            (batch(1, 3), None),
            (batch(4, 2), np.array([2.0, 3.0])),
            (batch(6, 9), np.linspace(0.5, 4.0, 9)),                 # wraps, overflows
        ]
        for transition, priorities in steps:
            for rb in (theirs, ours):
                if priorities is None:
                    rb.add(**copy.deepcopy(transition))
                else:
                    rb.add(**copy.deepcopy(transition), priorities=priorities.copy())
            assert ours.get_stored_size() == theirs.get_stored_size()
            assert ours.get_next_index() == theirs.get_next_index()
            assert ours.get_buffer_size() == theirs.get_buffer_size()
            assert ours.get_max_priority() == pytest.approx(theirs.get_max_priority())
        mine, cpprbs = ours.sample(5, beta=0.5), theirs.sample(5, beta=0.5)
        assert set(cpprbs) <= set(mine)
        for key in cpprbs:
            assert mine[key].shape == cpprbs[key].shape, key
            if key != "indexes":          # ours are int64 by contract, cpprb's uint64
                assert mine[key].dtype == cpprbs[key].dtype, key
        assert mine["indexes"].dtype.kind in "iu" and cpprbs["indexes"].dtype.kind in "iu"
        # update_priorities takes the same arguments in both.
        for indexes in (mine["indexes"], cpprbs["indexes"], [0, 1, 2]):
            count = len(indexes)
            theirs.update_priorities(indexes, np.full(count, 0.75))
            ours.update_priorities(indexes, np.full(count, 0.75))
        ours_all, theirs_all = ours.get_all_transitions(), theirs.get_all_transitions()
        assert set(ours_all) == set(theirs_all)
        for key in theirs_all:
            assert ours_all[key].shape == theirs_all[key].shape, key
            assert ours_all[key].dtype == theirs_all[key].dtype, key
            np.testing.assert_array_equal(ours_all[key], theirs_all[key], err_msg=key)
        ours.on_episode_end()
        theirs.on_episode_end()
        ours.clear()
        theirs.clear()
        assert (ours.get_stored_size(), ours.get_next_index(), ours.get_max_priority()) == (
            theirs.get_stored_size(), theirs.get_next_index(), theirs.get_max_priority())
    finally:
        ours.close()
