"""``rb.prefetch``: batches sampled ahead on a background thread (cpprb_ray.prefetch).

Every check runs on real buffers and a real thread: the batches are those that ``sample`` draws
(a twin buffer with the same seed and rows, sampled directly, gives the same ones), the ring's
sets cycle and a held batch is never refilled under the learner, nothing is allocated per batch
(tracemalloc, as tests/test_out_allocations.py), rate limiters keep their counts and waits
(TimeoutError, a wait interrupted by close()), and the thread's errors reach the learner.
"""

from __future__ import annotations

import gc
import importlib.util
import os
import subprocess
import sys
import threading
import time
import tracemalloc

import numpy as np
import pytest

from cpprb_ray import (
    MinSize,
    PrioritizedReplayBuffer,
    ReplayBuffer,
    SampleToInsertRatio,
    prefetch,
)
from cpprb_ray._sync import SpinCounter
from cpprb_ray.prefetch import Prefetch

ENV = {"obs": {"shape": 3}, "act": {"dtype": "int64"}, "rew": {}}
FRAMES_ENV = {"obs": {"shape": (4, 4, 2), "dtype": "uint8"}, "act": {"dtype": "int64"}}
NSTEP_ENV = {"obs": {}, "rew": {}, "next_obs": {}, "done": {}}
NSTEP = {"size": 3, "gamma": 0.9, "rew": "rew", "next": "next_obs"}

CASES = {
    "uniform": (ReplayBuffer, ENV, {}),
    "prioritized": (PrioritizedReplayBuffer, ENV, {}),
    "lanes": (PrioritizedReplayBuffer, ENV, {"lanes": 2}),
    "frames": (PrioritizedReplayBuffer, FRAMES_ENV, {"next_of": "obs", "stack_compress": "obs"}),
    "nstep": (PrioritizedReplayBuffer, NSTEP_ENV, {"Nstep": NSTEP}),
    "check_for_update": (PrioritizedReplayBuffer, ENV, {"check_for_update": True}),
}


def rows(env, count, seed):
    rng = np.random.default_rng(seed)
    made = {}
    for name, spec in env.items():
        shape = (count,) + tuple(np.atleast_1d(spec.get("shape", 1)))
        made[name] = rng.integers(0, 200, shape).astype(spec.get("dtype", "float32"))
    if "done" in made:
        made["done"][:] = 0
        made["done"][count // 2] = 1
    return made


def fill(rb, env, count=64, times=2):
    for seed in range(times):
        values = rows(env, count, seed)
        if "next_obs" in rb.env_dict and "next_obs" not in env:
            values["next_obs"] = values["obs"]
        rb.add(**values)


def sample_of(rb, batch_size, beta):
    if isinstance(rb, PrioritizedReplayBuffer):
        return rb.sample(batch_size, beta)
    return rb.sample(batch_size)


@pytest.mark.parametrize("case", sorted(CASES))
def test_batches_are_what_sample_draws(case):
    """The k-th batch equals the k-th sample of a twin buffer (same seed, same rows), with a
    beta annealed per batch; priorities updated between batches are applied."""
    cls, env, options = CASES[case]
    beta = (lambda step: 0.4 + 0.1 * step)   # noqa: E731
    with cls(256, env, seed=7, **options) as rb, cls(256, env, seed=7, **options) as twin:
        fill(rb, env)
        fill(twin, env)
        with rb.prefetch(16, beta=beta, depth=3) as batches:
            for step in range(6):
                batch = next(batches)
                expected = sample_of(twin, 16, beta(step))
                assert sorted(batch) == sorted(expected)
                for key in expected:
                    np.testing.assert_array_equal(batch[key], expected[key], err_msg=key)
        assert batches.batches == 6 and batches.closed
        if isinstance(rb, PrioritizedReplayBuffer):
            applied = rb.update_priorities(batch["indexes"], np.full(16, 5.0),
                                           batch["generations"])
            assert applied == 16 and rb.get_max_priority() == 5.0


SEQUENCE_ENV = {"obs": {"shape": 2}, "act": {"dtype": "int64"}, "rew": {}, "done": {},
                "core": {"shape": 8}}


@pytest.mark.parametrize("cls", [ReplayBuffer, PrioritizedReplayBuffer])
def test_sequence_batches_are_what_sample_draws(cls):
    """Sequence buffers (sequence=, issue 24) through the same sample(out=) path: batches of
    (batch, length, ...) with their mask, as a twin's sample draws them."""
    options = {"sequence": {"length": 12, "period": 4}, "lanes": 2, "seed": 3}
    try:
        rb = cls(1024, SEQUENCE_ENV, **options)
    except TypeError as error:
        if "sequence" not in str(error):
            raise
        pytest.skip("this build has no sequence buffers (sequence=)")
    with rb, cls(1024, SEQUENCE_ENV, **options) as twin:
        for handle in (rb, twin):
            for t in range(60):
                handle.add(obs=[t, t], act=t % 2, rew=1.0, done=float(t == 40),
                           core=np.zeros(8))
            handle.on_episode_end()
        with rb.prefetch(4, beta=0.6, depth=3) as batches:
            for _ in range(6):
                batch = next(batches)
                expected = sample_of(twin, 4, 0.6)
                assert batch["obs"].shape == (4, 12, 2) and batch["mask"].shape == (4, 12)
                assert sorted(batch) == sorted(expected)
                for key in expected:
                    np.testing.assert_array_equal(batch[key], expected[key], err_msg=key)
                if isinstance(rb, PrioritizedReplayBuffer):
                    for handle, drawn in ((rb, batch), (twin, expected)):
                        handle.update_priorities(drawn["indexes"], np.ones(4),
                                                 drawn["generations"])


def test_uniform_ignores_beta_but_checks_it():
    with ReplayBuffer(16, ENV) as rb:
        fill(rb, ENV, 8, 1)
        with pytest.raises(ValueError, match="beta must be >= 0"):
            rb.prefetch(4, beta=-1.0)
        with rb.prefetch(4, beta=0.9) as batches:
            assert "weights" not in next(batches)


def test_the_ring_cycles_and_a_held_batch_is_never_refilled():
    depth = 3
    with PrioritizedReplayBuffer(4096, ENV, seed=0) as rb:
        fill(rb, ENV, 1024, 4)
        with rb.prefetch(64, depth=depth) as batches:
            seen = [next(batches) for _ in range(1)]
            held = seen[0]
            copy = {key: value.copy() for key, value in held.items()}
            time.sleep(0.05)   # the thread fills every other set meanwhile
            for key in copy:
                np.testing.assert_array_equal(held[key], copy[key])
            ids = [id(held["obs"])]
            for _ in range(2 * depth):
                ids.append(id(next(batches)["obs"]))
            assert len(set(ids)) == depth
            assert ids[:depth] == ids[depth:2 * depth]
            # ahead of the learner: at most depth batches drawn beyond the ones it took
            time.sleep(0.05)
            drawn = rb.stats()["samples"] // 64
            assert batches.batches <= drawn <= batches.batches + depth - 1


def drawn_batches(rb, batch, count, seconds=2.0):
    """Batches sampled from `rb` once `count` are, or after `seconds` (then fewer)."""
    deadline = time.monotonic() + seconds
    while rb.stats()["samples"] // batch < count and time.monotonic() < deadline:
        time.sleep(0.002)
    return rb.stats()["samples"] // batch


def test_a_full_ring_is_refilled_once_the_learner_took_every_ready_batch(monkeypatch):
    """Without its spin and its poll (as when the learner's steps outlast both), the thread
    sleeps from a full ring until the learner has taken the last batch ready (one wake-up of it
    per depth - 1 batches), then refills every free set."""
    monkeypatch.setattr(prefetch, "SPIN_SECONDS", 0.0)
    monkeypatch.setattr(prefetch, "POLL_SECONDS", 0.0)
    with PrioritizedReplayBuffer(4096, ENV, seed=0) as rb:
        fill(rb, ENV, 1024, 4)
        with rb.prefetch(64, depth=4) as batches:
            next(batches)
            assert drawn_batches(rb, 64, 4) == 4   # the one held, three ready: full
            next(batches)
            next(batches)       # two sets free, one batch still ready: the thread sleeps on
            assert drawn_batches(rb, 64, 5, seconds=0.05) == 4
            next(batches)       # the last one ready taken: the thread refills three sets
            assert drawn_batches(rb, 64, 7) == 7
            for _ in range(20):
                next(batches)
            assert drawn_batches(rb, 64, 24) >= 24 and batches.batches == 24


def test_a_learner_within_the_spin_hands_sets_over_without_waking_the_thread(monkeypatch):
    """A learner that gives each set back within the thread's spin (here a spin of a second, so
    that a loaded machine cannot make it run out), or within its poll once the spin is gone,
    never makes the thread sleep: no wake-up in any next(). Without either the same learner
    makes it sleep (and wakes it) again and again."""
    sleeps = {}
    with PrioritizedReplayBuffer(4096, ENV, seed=0) as rb:
        fill(rb, ENV, 1024, 4)
        for spin, poll in ((1.0, 0.0), (0.0, 1.0), (0.0, 0.0)):
            monkeypatch.setattr(prefetch, "SPIN_SECONDS", spin)
            monkeypatch.setattr(prefetch, "POLL_SECONDS", poll)
            with rb.prefetch(16, depth=2) as batches:
                for _ in range(200):
                    next(batches)
                    time.sleep(0.0005)   # the learner's step: the thread finds the ring full
                sleeps[spin, poll] = batches.thread_sleeps
    assert sleeps[1.0, 0.0] == 0 and sleeps[0.0, 1.0] == 0 and sleeps[0.0, 0.0] >= 150, sleeps


def test_close_stops_a_spinning_thread_at_once():
    """close() while the thread spins for a set (the learner holds the only one): it ends
    within its spin, and close() returns long before JOIN_SECONDS."""
    with ReplayBuffer(64, {"obs": {}}, seed=0) as rb:
        rb.add(obs=np.arange(8.0))
        for _ in range(20):
            batches = rb.prefetch(4, depth=1)
            next(batches)            # the thread now waits for that set
            started = time.perf_counter()
            batches.close()
            assert time.perf_counter() - started < 0.5
            assert not batches._thread.is_alive()


def test_a_spin_counter_waits_without_the_gil_and_for_no_longer_than_asked():
    """wait_for spins with the GIL released (this thread raises the count while another
    spins), returns True once the count is reached and False when the time runs out."""
    counter = SpinCounter()
    results = []
    spinner = threading.Thread(target=lambda: results.append(counter.wait_for(5, 10.0)))
    started = time.perf_counter()
    spinner.start()
    for value in range(6):     # Python code of this thread, run while the other spins
        counter.set(value)
    spinner.join()
    assert results == [True] and time.perf_counter() - started < 2.0
    assert counter.value == 5
    started = time.perf_counter()
    assert counter.wait_for(6, 0.02) is False
    assert 0.02 <= time.perf_counter() - started < 1.0
    assert counter.wait_for(5, 0.0) is True and counter.wait_for(6, -1.0) is False
    assert counter.last_pass == 0
    started = time.perf_counter()
    assert counter.wait_for(6, 0.0, poll=0.02) is False   # polled, never reached
    assert 0.02 <= time.perf_counter() - started < 1.0 and counter.last_pass == 0
    raiser = threading.Timer(0.01, counter.set, (6,))
    raiser.start()
    assert counter.wait_for(6, 0.001, poll=10.0) is True and counter.last_pass == 2
    raiser.join()
    assert counter.wait_for(6, 1.0) is True and counter.last_pass == 1


def test_a_stopped_spin_counter_ends_every_wait_at_once():
    counter = SpinCounter()
    results = []
    spinner = threading.Thread(target=lambda: results.append(counter.wait_for(1, 30.0)))
    spinner.start()
    time.sleep(0.01)
    started = time.perf_counter()
    counter.stop()
    spinner.join(5.0)
    assert results == [False] and time.perf_counter() - started < 1.0 and counter.stopped
    counter.set(3)
    assert counter.wait_for(1, 1.0) is False   # stopped for good, even once reached


def held_sample(rb, counter, out, results):
    """In a thread of its own: the store holds this thread's calls on `counter`, and one
    sample into `out` is made (its result, or the exception, appended to `results`)."""
    store, ident = rb._store, threading.get_ident()
    store.hold_calls(ident, counter)
    try:
        results.append(rb.sample(8, out=out))
    except Exception as error:   # noqa: BLE001 (the test's to see)
        results.append(error)
    finally:
        store.release_calls(ident)


def test_a_held_call_starts_only_once_its_count_comes_and_does_nothing_otherwise():
    """hold_calls: a held thread's sample spins for the armed count before it takes the lock.
    Until the count comes nothing is sampled (the samples counted and `out` untouched); once it
    comes the sample goes through. A spin that runs out, or a counter stopped meanwhile, raises
    SpinExpired and leaves nothing done; once released, the thread's calls are not held."""
    with ReplayBuffer(64, {"obs": {}}, seed=0) as rb:
        rb.add(obs=np.arange(1.0, 17.0))
        out = rb.sample(8)
        counter = SpinCounter()
        for ending in ("count", "timeout", "stop"):
            out["obs"][:] = -1.0
            before = rb.stats()["samples"]
            counter.arm(counter.value + 1, 0.05 if ending == "timeout" else 30.0)
            results = []
            thread = threading.Thread(target=held_sample, args=(rb, counter, out, results))
            thread.start()
            time.sleep(0.1)
            if ending != "timeout":
                assert thread.is_alive() and not results   # still spinning: nothing done
                assert rb.stats()["samples"] == before and (out["obs"] == -1.0).all()
            if ending == "count":
                counter.set(counter.value + 1)
            elif ending == "stop":
                counter.stop()
            thread.join(5.0)
            assert not thread.is_alive() and len(results) == 1
            if ending == "count":
                assert results[0]["obs"] is out["obs"] and (out["obs"] >= 1.0).all()
                assert rb.stats()["samples"] == before + 8
            else:
                assert type(results[0]).__name__ == "SpinExpired", results
                assert rb.stats()["samples"] == before and (out["obs"] == -1.0).all()
            assert not counter.armed
        results = []
        counter.arm(10 ** 6, 30.0)   # armed, but the thread is no longer held: not waited for
        thread = threading.Thread(target=lambda: results.append(rb.sample(8)))
        thread.start()
        thread.join(5.0)
        assert len(results) == 1 and counter.armed


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork: POSIX only")
def test_a_forked_child_forgets_the_parents_held_thread(monkeypatch):
    """fork() while the prefetch thread waits for a set inside the store's call: the child's
    first call forgets that thread's hold (it does not exist there, and its ident may be given
    to a thread of the child), its thread's sample goes through, and the parent's prefetch goes
    on."""
    monkeypatch.setattr(prefetch, "SPIN_SECONDS", 30.0)
    with ReplayBuffer(4096, ENV, seed=0) as rb:
        fill(rb, ENV, 1024, 4)
        with rb.prefetch(64, depth=2) as batches:
            next(batches)
            time.sleep(0.05)           # batch 1 drawn; the thread waits for set 0 in its call
            assert rb._store.held_threads == (batches._thread.ident,)
            pid = os.fork()
            if pid == 0:               # the child: exit code 0 only if both samples went through
                code = 1
                try:
                    results = []
                    worker = threading.Thread(target=lambda: results.append(rb.sample(8)))
                    worker.start()
                    worker.join(10.0)
                    code = 0 if len(results) == 1 and rb._store.held_threads == () else 2
                finally:
                    os._exit(code)
            _, status = os.waitpid(pid, 0)
            assert os.WEXITSTATUS(status) == 0
            for _ in range(5):
                next(batches)
            assert batches.batches == 6


def test_the_thread_samples_while_the_learner_holds_the_gil(monkeypatch):
    """The thread spins for a given-back set inside the store's call, without the GIL, so its
    sample starts the moment next() gives the set back, even while the learner runs Python (and
    holds the GIL) from then on: here it never lets the GIL go (a switch interval of 100 s),
    and the given-back set is refilled meanwhile. A thread that needed the GIL between the set
    coming back and its sample would wait for the learner's next release of it."""
    monkeypatch.setattr(prefetch, "SPIN_SECONDS", 30.0)
    with ReplayBuffer(4096, ENV, seed=0) as rb:
        fill(rb, ENV, 1024, 4)
        with rb.prefetch(64, depth=2) as batches:
            first = next(batches)
            time.sleep(0.1)          # batch 1 drawn; the thread spins for set 0 in its call
            before = first["obs"].tobytes()
            interval = sys.getswitchinterval()
            sys.setswitchinterval(100.0)
            try:
                next(batches)        # batch 1 is ready: set 0 given back, no wait
                deadline = time.perf_counter() + 5.0
                while first["obs"].tobytes() == before and time.perf_counter() < deadline:
                    pass             # pure Python: the GIL is never let go here
                refilled = first["obs"].tobytes() != before
            finally:
                sys.setswitchinterval(interval)
            assert refilled


def test_copy_yields_owned_arrays():
    with ReplayBuffer(64, ENV, seed=1) as rb, ReplayBuffer(64, ENV, seed=1) as twin:
        fill(rb, ENV, 32, 1)
        fill(twin, ENV, 32, 1)
        with rb.prefetch(8, depth=2, copy=True) as batches:
            taken = [next(batches) for _ in range(5)]
        for batch in taken:
            np.testing.assert_array_equal(batch["indexes"], twin.sample(8)["indexes"])
        assert len({id(batch["obs"]) for batch in taken}) == 5


def test_given_out_sets_are_filled():
    with ReplayBuffer(64, ENV, seed=2) as rb:
        fill(rb, ENV, 32, 1)
        first = rb.sample(8)
        sets = [{key: np.empty_like(value) for key, value in first.items()} for _ in range(2)]
        with rb.prefetch(8, out=sets) as batches:
            assert next(batches)["obs"] is sets[0]["obs"]
            assert next(batches)["obs"] is sets[1]["obs"]
            assert next(batches)["obs"] is sets[0]["obs"]
        wrong = [{key: np.empty((9,) + value.shape[1:], value.dtype)
                  for key, value in first.items()} for _ in range(2)]
        with rb.prefetch(8, out=wrong) as batches:
            with pytest.raises(ValueError, match="out"):
                next(batches)
            assert next(batches, None) is None


def test_no_allocation_per_batch():
    """Peak traced memory over 1,000 batches (the thread's allocations included) stays below
    the smallest array of one batch."""
    batch = 4096
    with PrioritizedReplayBuffer(8192, ENV, seed=0) as rb:
        fill(rb, ENV, 1024, 4)
        with rb.prefetch(batch, depth=2) as batches:
            first = next(batches)
            smallest = min(value.nbytes for value in first.values())
            assert smallest >= 4 * batch
            for _ in range(10):
                next(batches)
            tracemalloc.start()
            try:
                start, _ = tracemalloc.get_traced_memory()
                for _ in range(1000):
                    next(batches)
                _, peak = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
        assert peak - start < smallest, (peak - start, smallest)


def test_rate_limiter_counts_and_timeouts():
    """The thread's sample waits with the prefetch's timeout; the learner gets the limiter's
    TimeoutError at next(), nothing was sampled, and the next next() tries again; every batch
    drawn counts as sampled, exactly."""
    limiter = SampleToInsertRatio(samples_per_insert=1.0, min_size_to_sample=8,
                                  error_buffer=16)
    with ReplayBuffer(256, ENV, rate_limiter=limiter, seed=0) as rb:
        with rb.prefetch(8, depth=2, timeout=0.05) as batches:
            with pytest.raises(TimeoutError, match="held back by the rate limiter"):
                next(batches)
            assert rb.stats()["samples"] == 0
            fill(rb, ENV, 16, 1)   # 16 inserts: 16 rows may be sampled (diff 16 - 8 >= -8)
            got = [next(batches) for _ in range(2)]
            assert [len(batch["indexes"]) for batch in got] == [8, 8]
            time.sleep(0.1)
            stats = rb.stats()
            limited = stats["rate_limiter"]
            # What was drawn: the learner's two, and at most one ahead (the one ahead may still
            # be held back: 3 * 8 = 24 needs diff 16 - 24 >= -8: it goes)
            assert stats["samples"] in (16, 24)
            assert limited["samples"] == stats["samples"]
            assert limited["sample_timeouts"] >= 1
        with pytest.raises(TimeoutError):
            with rb.prefetch(8, timeout=0.0) as batches:
                for _ in range(10):
                    next(batches)


def test_a_learner_the_limiter_holds_back_stops_spinning_and_spins_again_when_it_is_not():
    """A learner whose batches come late (the limiter holds the thread back until an actor adds)
    stops spinning in next() after LATE_AFTER late batches, leaving the core to the actors; once
    batches are ready within a spin again, it spins again."""
    limiter = SampleToInsertRatio(samples_per_insert=1.0, min_size_to_sample=8,
                                  error_buffer=16)
    with ReplayBuffer(4096, ENV, rate_limiter=limiter, seed=0) as rb:
        fill(rb, ENV, 16, 1)
        stop = threading.Event()

        def actor():
            seed = 1
            while not stop.is_set():
                time.sleep(0.005)      # an actor's episode steps: slower than the learner
                rb.add(**rows(ENV, 8, seed))
                seed += 1

        adder = threading.Thread(target=actor)
        adder.start()
        try:
            with rb.prefetch(8, depth=2) as batches:
                spins = []
                for _ in range(prefetch.LATE_AFTER + 4):
                    next(batches)
                    spins.append(batches._spin)
                assert spins[-1] == 0.0 and batches._late >= prefetch.LATE_AFTER, spins
                assert spins[0] == prefetch.SPIN_SECONDS
        finally:
            stop.set()
            adder.join()
        # a batch ready within a spin again: the full spin back at once
        assert prefetch._next_spin(prefetch.LATE_AFTER, 1e-5) == (prefetch.SPIN_SECONDS, 0)


def test_close_interrupts_a_limiter_wait_and_counts_nothing():
    with ReplayBuffer(64, ENV, rate_limiter=MinSize(32)) as rb:
        batches = rb.prefetch(4)   # timeout None: the limiter holds the thread back for ever
        time.sleep(0.1)
        started = time.monotonic()
        batches.close()
        assert time.monotonic() - started < 1.0
        assert not batches._thread.is_alive()
        limited = rb.stats()["rate_limiter"]
        assert (limited["sample_blocks"], limited["sample_timeouts"]) == (0, 0)
        assert next(batches, None) is None
        # The interrupt was for that thread only, and is undone: this thread still waits.
        with pytest.raises(TimeoutError):
            rb.sample(4, timeout=0.06)


def test_a_learner_blocked_in_next_is_released_by_close_from_another_thread():
    with ReplayBuffer(64, ENV, rate_limiter=MinSize(32)) as rb:
        batches = rb.prefetch(4)
        outcome = []

        def learner():
            outcome.append(next(batches, "stopped"))

        thread = threading.Thread(target=learner)
        thread.start()
        time.sleep(0.1)
        batches.close()
        thread.join(2.0)
        assert not thread.is_alive() and outcome == ["stopped"]


def test_errors_reach_the_learner():
    with PrioritizedReplayBuffer(16, ENV) as rb:
        batches = rb.prefetch(4)   # empty, no limiter: sample's ValueError
        with pytest.raises(ValueError, match="empty"):
            next(batches)
        assert batches.closed and next(batches, None) is None
        fill(rb, ENV, 8, 1)

        def bad_beta(step):
            if step == 2:
                raise ArithmeticError("annealing broke")
            return 0.4

        with rb.prefetch(4, beta=bad_beta) as batches:
            next(batches)
            next(batches)
            with pytest.raises(ArithmeticError, match="annealing broke"):
                next(batches)
            with pytest.raises(StopIteration):
                next(batches)


def test_a_closed_buffer_stops_the_thread():
    rb = PrioritizedReplayBuffer(64, ENV)
    fill(rb, ENV, 32, 1)
    batches = rb.prefetch(4)
    next(batches)
    rb.close()
    with pytest.raises(ValueError, match="closed"):
        for _ in range(5):
            next(batches)
    batches._thread.join(1.0)
    assert not batches._thread.is_alive()
    with pytest.raises(ValueError, match="closed"):
        rb.prefetch(4)


def test_a_dropped_iterator_stops_its_thread():
    with ReplayBuffer(64, ENV) as rb:
        fill(rb, ENV, 32, 1)
        batches = rb.prefetch(4)
        next(batches)
        thread = batches._thread
        del batches
        gc.collect()
        thread.join(1.0)
        assert not thread.is_alive()


@pytest.mark.parametrize("arguments, error, match", [
    ({"batch_size": 0}, ValueError, "batch_size must be > 0"),
    ({"batch_size": 2.5}, TypeError, "batch_size must be an int"),
    ({"depth": 0}, ValueError, "depth must be >= 1"),
    ({"beta": float("nan")}, ValueError, "beta must be finite"),
    ({"timeout": -1}, ValueError, "timeout"),
    ({"tensors": "tf"}, ValueError, "tensors must be one of"),
    ({"copy": "yes"}, TypeError, "copy must be a bool"),
    ({"out": {"obs": np.zeros(3)}}, TypeError, "out must be a list of 2 dicts"),
    ({"out": [{}]}, ValueError, "out must hold depth=2"),
    ({"out": [{"obs": [1]}, {}]}, TypeError, r"out\[0\] must be a dict of numpy arrays"),
])
def test_bad_arguments_are_refused_by_name(arguments, error, match):
    arguments = {"batch_size": 4, **arguments}
    with ReplayBuffer(16, ENV) as rb:
        fill(rb, ENV, 8, 1)
        threads = threading.active_count()
        with pytest.raises(error, match=match):
            rb.prefetch(arguments.pop("batch_size"), **arguments)
        assert threading.active_count() == threads   # no thread was started
        assert rb.stats()["samples"] == 0


def test_shared_arrays_between_sets_are_refused():
    with ReplayBuffer(16, ENV) as rb:
        fill(rb, ENV, 8, 1)
        shared = rb.sample(4)
        with pytest.raises(ValueError, match="must not share arrays"):
            rb.prefetch(4, out=[shared, shared])


def test_torch_tensors_over_the_ring():
    torch = pytest.importorskip("torch")
    with PrioritizedReplayBuffer(64, ENV, seed=3) as rb, \
            PrioritizedReplayBuffer(64, ENV, seed=3) as twin:
        fill(rb, ENV, 32, 1)
        fill(twin, ENV, 32, 1)
        with rb.prefetch(8, tensors="torch") as batches:
            ids = []
            for _ in range(4):
                batch = next(batches)
                expected = twin.sample(8)
                assert isinstance(batch["obs"], torch.Tensor)
                assert batch["obs"].dtype == torch.float32
                np.testing.assert_array_equal(batch["obs"].numpy(), expected["obs"])
                np.testing.assert_array_equal(batch["weights"].numpy(), expected["weights"])
                # what goes back to update_priorities stays numpy
                assert isinstance(batch["indexes"], np.ndarray)
                np.testing.assert_array_equal(batch["indexes"], expected["indexes"])
                ids.append(batch["obs"].data_ptr())
            assert len(set(ids)) == 2   # tensors over the two sets, not copies
            ring_arrays = {int(arrays["obs"].ctypes.data) for arrays in batches._ring.sets}
            assert set(ids) == ring_arrays
            assert batch["obs"].is_pinned() == torch.cuda.is_available()
            indexes, generations = batch["indexes"].copy(), batch["generations"].copy()
        # the twin draws what the thread had drawn ahead when it was closed (0 or 1)
        for _ in range((rb.stats()["samples"] - twin.stats()["samples"]) // 8):
            twin.sample(8)
        # a network's priorities come back as a tensor: update_priorities takes it
        priorities = torch.full((8,), 7.0)
        assert rb.update_priorities(indexes, priorities, generations) == 8
        assert rb.get_max_priority() == 7.0
        twin.update_priorities(indexes, priorities.numpy(), generations)
        with rb.prefetch(8, tensors="torch", copy=True) as batches:
            first = next(batches)
            np.testing.assert_array_equal(first["obs"].numpy(), twin.sample(8)["obs"])
            kept = first["obs"].clone()
            for _ in range(3):
                batch = next(batches)
                expected = twin.sample(8)
                np.testing.assert_array_equal(batch["obs"].numpy(), expected["obs"])
            # owned: the first batch's tensor was not refilled by the three after it
            assert torch.equal(first["obs"], kept)
            assert first["obs"].data_ptr() != batch["obs"].data_ptr()


JAX_CHECK = """
import jax, numpy as np
from cpprb_ray import ReplayBuffer
ENV = {"obs": {"shape": 3}, "act": {"dtype": "int64"}, "rew": {}}
rng = np.random.default_rng(0)
values = {"obs": rng.standard_normal((32, 3)), "act": np.arange(32), "rew": np.ones(32)}
with ReplayBuffer(64, ENV, seed=4) as rb, ReplayBuffer(64, ENV, seed=4) as twin:
    rb.add(**values)
    twin.add(**values)
    for copy in (False, True):
        with rb.prefetch(8, tensors="jax", copy=copy) as batches:
            for _ in range(4):
                batch = next(batches)
                expected = twin.sample(8)
                assert isinstance(batch["obs"], jax.Array)
                np.testing.assert_array_equal(np.asarray(batch["obs"]), expected["obs"])
                assert isinstance(batch["generations"], np.ndarray)
                assert batch["generations"].dtype == np.uint64
                np.testing.assert_array_equal(batch["indexes"], expected["indexes"])
        # the twin draws what the thread had drawn ahead when it was closed (0 or 1)
        for _ in range((rb.stats()["samples"] - twin.stats()["samples"]) // 8):
            twin.sample(8)
print("ok")
"""


def test_jax_arrays_through_dlpack():
    """In a process of its own: JAX, once imported, warns at every os.fork (which other tests
    of this session do)."""
    if importlib.util.find_spec("jax") is None:
        pytest.skip("jax is not installed")
    completed = subprocess.run([sys.executable, "-c", JAX_CHECK], capture_output=True,
                               text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert completed.returncode == 0 and completed.stdout.strip() == "ok", completed.stderr


def test_missing_tensor_library_is_a_clear_import_error():
    for module in ("torch", "jax"):
        if importlib.util.find_spec(module) is None:   # (not imported: see the jax test)
            with ReplayBuffer(16, ENV) as rb:
                with pytest.raises(ImportError, match=f"tensors='{module}' needs {module}"):
                    rb.prefetch(4, tensors=module)
            return
    pytest.skip("torch and jax are both installed")


def test_prefetch_class_is_what_the_method_returns():
    with ReplayBuffer(16, ENV) as rb:
        fill(rb, ENV, 8, 1)
        with rb.prefetch(2) as batches:
            assert isinstance(batches, Prefetch)
            assert iter(batches) is batches
