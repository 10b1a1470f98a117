"""Rate limiting across processes: Reverb's MinSize and SampleToInsertRatio kept in the segment.

* Semantics: each admission decision equals a plain-Python model of Reverb's CanInsert /
  CanSample (rows as the unit, batches admitted whole), clear starts the counts again, and
  batches that no state admits are refused at once.
* Real processes: 2 writers and a learner keep samples/inserts inside the limiter's window
  (exact snapshots, taken by the parent while they run); a process blocked in add or sample is
  woken by another process's progress within milliseconds (a futex, not a poll period);
  timeouts, timeout=0, Ctrl-C, close while waiting; SIGKILL of the learner and of writers while
  the other side waits; a view in another process sees and obeys the same limiter.
* N-step: a held-back add leaves the staging as it was; close drops what the limiter refuses.

Every wait here is bounded; a hang is a failure.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
import warnings

import numpy as np
import pytest

from cpprb_ray import MinSize, PrioritizedReplayBuffer, ReplayBuffer, SampleToInsertRatio

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
if TESTS_DIR not in sys.path:  # forkserver children import _rate_workers from the parent's path
    sys.path.insert(0, TESTS_DIR)

import _rate_workers as workers  # noqa: E402
from _rate_workers import ENV, batch_of  # noqa: E402
from _workers import Children  # noqa: E402
from conftest import available_backends  # noqa: E402

TIMEOUT = 60.0
# At collection, before any test can have started the forkserver.
multiprocessing.get_context("forkserver").set_forkserver_preload(["numpy", "cpprb_ray"])

CLASSES = [ReplayBuffer, PrioritizedReplayBuffer]
# The long multi-process runs take each class once, the backends in turn: the limiter's record
# lives in the header, the same on both backends (CI runs the suite on two Pythons, in 25 min).
CLASS_BACKEND_PAIRS = [(kind, available_backends()[i % len(available_backends())])
                       for i, kind in enumerate(CLASSES)]


def context():
    return multiprocessing.get_context("forkserver")


def sample(rb, batch, timeout=None):
    if isinstance(rb, PrioritizedReplayBuffer):
        return rb.sample(batch, 0.4, timeout=timeout)
    return rb.sample(batch, timeout=timeout)


def receive(conn, what: str, timeout: float = TIMEOUT):
    assert conn.poll(timeout), f"no {what} report within {timeout} s (a child hung?)"
    tag, payload = conn.recv()
    assert tag != "error", f"{what} failed:\n{payload}"
    return tag, payload


def snapshot(rb):
    """(inserts, samples) of the limiter at one instant, or None: without the lock, but both
    counts only grow here, so two equal reads in a row bracket a moment at which both held."""
    for _ in range(1000):
        first = rb.stats()["rate_limiter"]
        second = rb.stats()["rate_limiter"]
        if (first["inserts"], first["samples"]) == (second["inserts"], second["samples"]):
            return first["inserts"], first["samples"]
    return None


# -- parameters -----------------------------------------------------------------------------------

def test_reverb_parameters():
    limiter = SampleToInsertRatio(4.0, 100, 50.0)
    assert (limiter.min_diff, limiter.max_diff) == (350.0, 450.0)
    assert SampleToInsertRatio(4.0, 100, (-10, 500)).error_buffer == (-10.0, 500.0)
    minimum = MinSize(7)
    assert (minimum.samples_per_insert, minimum.min_size_to_sample) == (1.0, 7)
    assert minimum.min_diff == -sys.float_info.max and minimum.max_diff == sys.float_info.max
    assert MinSize(7) == MinSize(7) != MinSize(8)


@pytest.mark.parametrize("make, error, words", [
    (lambda: MinSize(0), ValueError, "min_size_to_sample"),
    (lambda: MinSize(2.0), TypeError, "min_size_to_sample must be an int"),
    (lambda: MinSize(True), TypeError, "min_size_to_sample"),
    (lambda: SampleToInsertRatio(0.0, 10, 5), ValueError, "samples_per_insert"),
    (lambda: SampleToInsertRatio(-1.0, 10, 5), ValueError, "samples_per_insert"),
    (lambda: SampleToInsertRatio(float("nan"), 10, 5), ValueError, "samples_per_insert"),
    (lambda: SampleToInsertRatio(float("inf"), 10, 5), ValueError, "samples_per_insert"),
    (lambda: SampleToInsertRatio("2", 10, 5), TypeError, "samples_per_insert"),
    (lambda: SampleToInsertRatio(1.0, 0, 5), ValueError, "min_size_to_sample"),
    (lambda: SampleToInsertRatio(4.0, 10, 3.0), ValueError, ">= 2 * max(1.0"),
    (lambda: SampleToInsertRatio(1.0, 10, (5.0, 5.5)), ValueError, ">= 2 * max(1.0"),
    (lambda: SampleToInsertRatio(1.0, 10, (11.0, 20.0)), ValueError, "min_diff (11) is above"),
    (lambda: SampleToInsertRatio(1.0, 10, (0.0, 5.0, 9.0)), ValueError, "pair; got 3"),
    (lambda: SampleToInsertRatio(1.0, 10, (float("nan"), 5.0)), ValueError, "NaN"),
    (lambda: SampleToInsertRatio(1.0, 10, "wide"), TypeError, "error_buffer"),
    # Numbers beyond a float or the segment's 64 bits: a ValueError naming the argument, not
    # an OverflowError from float().
    (lambda: SampleToInsertRatio(10**400, 10, 5), ValueError,
     "samples_per_insert must be a real number within the float range"),
    (lambda: SampleToInsertRatio(1.0, 10, 10**400), ValueError,
     "error_buffer must be a real number within the float range"),
    (lambda: SampleToInsertRatio(1.0, 10, (0, 10**400)), ValueError,
     "error_buffer[1] (max_diff) must be a real number within the float range"),
    (lambda: SampleToInsertRatio(1.0, 10**400, 5), ValueError,
     "min_size_to_sample must be a positive integer <= 2**63 - 1"),
    (lambda: MinSize(2**64), ValueError, "min_size_to_sample must be a positive integer <= 2**63"),
    (lambda: SampleToInsertRatio(1.0, 10, np.array([0.0, 20.0])), TypeError,
     "error_buffer must be a number or a (min_diff, max_diff) pair; got ndarray"),
])
def test_bad_parameters_raise_clear_errors(make, error, words):
    with pytest.raises(error, match=re.escape(words)):
        make()


def test_a_window_below_the_first_diff_warns_as_reverb_does():
    with pytest.warns(RuntimeWarning, match="blocks itself"):
        SampleToInsertRatio(1.0, 100, (-50.0, 50.0))


@pytest.mark.parametrize("kind", CLASSES)
def test_bad_rate_limiter_arguments(kind):
    with pytest.raises(TypeError, match="rate_limiter must be None"):
        kind(16, ENV, rate_limiter="MinSize(3)")
    with pytest.raises(ValueError, match=r"min_size_to_sample \(17\) is larger than the buffer"):
        kind(16, ENV, rate_limiter=MinSize(17))
    with kind(16, ENV, rate_limiter=MinSize(16)) as rb:   # as large as the buffer: fine
        assert rb.rate_limiter == MinSize(16)


@pytest.mark.parametrize("kind", CLASSES)
@pytest.mark.parametrize("timeout, error, words", [
    (-1, ValueError, "timeout must be None or a number of seconds >= 0; got -1"),
    (float("nan"), ValueError, "timeout must be None or a number of seconds >= 0; got nan"),
    ("1", TypeError, "timeout must be None or a number of seconds; got str"),
    (True, TypeError, "timeout must be None or a number of seconds; got bool"),
    (-10**400, ValueError, "timeout must be None or a number of seconds >= 0; got -1000"),
])
def test_bad_timeouts_raise_and_change_nothing(kind, timeout, error, words):
    with kind(16, ENV, rate_limiter=MinSize(1)) as rb:
        rb.add(**batch_of(2))
        before = rb.stats()
        with pytest.raises(error, match=words):
            rb.add(**batch_of(1), timeout=timeout)
        with pytest.raises(error, match=words):
            sample(rb, 1, timeout)
        with pytest.raises(error, match=words):   # nothing to commit without Nstep: refused
            rb.on_episode_end(timeout=timeout)
        assert rb.stats() == before


@pytest.mark.parametrize("kind", CLASSES)
def test_a_timeout_past_any_float_means_no_limit(kind):
    # It was float()'s OverflowError, naming nothing; 10**400 seconds is as long as it takes.
    with kind(16, ENV, rate_limiter=MinSize(1)) as rb:
        rb.add(**batch_of(2), timeout=10**400)
        assert sample(rb, 2, 10**400)["obs"].shape == (2, 2)
        rb.on_episode_end(timeout=10**400)
        assert rb.get_stored_size() == 2


@pytest.mark.parametrize("kind", CLASSES)
def test_batches_no_state_admits_are_refused_at_once(kind):
    # Window [10 * 2 - 8, 10 * 2 + 8] = [12, 28]: the diff never exceeds 28, so a sample of more
    # than 28 - 12 = 16 rows could never go, and an add of more than 10 rows past the minimum
    # size needs k * 2 <= 28.
    with kind(64, ENV, rate_limiter=SampleToInsertRatio(2.0, 10, 8.0)) as rb:
        before = rb.stats()
        with pytest.raises(ValueError, match="batch_size 17 can never be sampled at once"):
            sample(rb, 17, 0)
        with pytest.raises(ValueError, match="an add of 15 rows can never be admitted"):
            rb.add(**batch_of(15), timeout=0)
        assert rb.stats() == before
        rb.add(**batch_of(10))                # free while filling up to the minimum size
        assert sample(rb, 8, 0)["obs"].shape == (8, 2)   # 20 - 8 = 12 >= min_diff
        with pytest.raises(TimeoutError):
            sample(rb, 1, 0)


# -- semantics in one process ---------------------------------------------------------------------

class ReverbModel:
    """Reverb's RateLimiter (rate_limiter.cc) in plain Python, with rows for items: CanInsert
    and CanSample of k rows, the table's size being the ring's stored size."""

    def __init__(self, limiter, capacity: int) -> None:
        self.limiter = limiter
        self.capacity = capacity
        self.inserts = self.samples = self.stored = 0

    def can_insert(self, rows: int) -> bool:
        limiter = self.limiter
        if min(self.stored + rows, self.capacity) <= limiter.min_size_to_sample:
            return True
        return ((self.inserts + rows) * limiter.samples_per_insert - self.samples
                <= limiter.max_diff)

    def can_sample(self, rows: int) -> bool:
        limiter = self.limiter
        if self.stored < limiter.min_size_to_sample:
            return False
        return self.inserts * limiter.samples_per_insert - self.samples - rows >= limiter.min_diff

    def insert(self, rows: int) -> None:
        self.inserts += rows
        self.stored = min(self.stored + rows, self.capacity)

    def reset(self) -> None:
        self.inserts = self.samples = self.stored = 0


@pytest.mark.parametrize("kind", CLASSES)
@pytest.mark.parametrize("limiter", [
    MinSize(20),
    SampleToInsertRatio(3.0, 20, 25.0),
    SampleToInsertRatio(0.5, 5, (-10.0, 30.0)),
    SampleToInsertRatio(2.0, 64, 40.0),         # the minimum size is the capacity: inserts free
], ids=repr)
def test_every_decision_matches_reverb(kind, limiter):
    capacity = 64
    rng = np.random.default_rng(5)
    model = ReverbModel(limiter, capacity)
    decisions = {"insert": [0, 0], "sample": [0, 0]}
    with kind(capacity, ENV, rate_limiter=limiter, seed=1) as rb:
        adds = 0.5         # how often an add comes; after the clear, mostly adds
        for step in range(3000):
            if step == 1500:
                rb.clear()
                model.reset()
                adds = 0.8
            if rng.random() < adds:
                rows = int(rng.integers(1, 6))
                expected = model.can_insert(rows)
                try:
                    rb.add(**batch_of(rows, step), timeout=0)
                    admitted = True
                except TimeoutError as error:
                    admitted = False
                    assert "nothing was added" in str(error)
                assert admitted == expected, (step, rows, vars(model))
                if admitted:
                    model.insert(rows)
                decisions["insert"][admitted] += 1
            else:
                rows = int(rng.integers(1, 9))
                expected = model.can_sample(rows)
                try:
                    sample(rb, rows, 0)
                    admitted = True
                except TimeoutError as error:
                    admitted = False
                    assert "nothing was sampled" in str(error)
                assert admitted == expected, (step, rows, vars(model))
                if admitted:
                    model.samples += rows
                decisions["sample"][admitted] += 1
            state = rb.stats()["rate_limiter"]
            assert (state["inserts"], state["samples"]) == (model.inserts, model.samples)
            assert rb.get_stored_size() == model.stored
        # Both answers were seen on the side the limiter can hold back.
        assert decisions["sample"][0] > 0 and decisions["sample"][1] > 0, decisions
        if not isinstance(limiter, MinSize) and limiter.min_size_to_sample < capacity:
            assert decisions["insert"][0] > 0 and decisions["insert"][1] > 0, decisions
        stats = rb.stats()
        assert stats["inserts"] >= model.inserts and stats["samples"] >= model.samples


@pytest.mark.parametrize("kind", CLASSES)
def test_timeout_waits_then_raises_with_the_state_and_changes_nothing(kind):
    with kind(64, ENV, rate_limiter=SampleToInsertRatio(1.0, 4, 4.0)) as rb:
        rb.add(**batch_of(8))                        # diff 8 = max_diff
        before = rb.stats()
        began = time.monotonic()
        with pytest.raises(TimeoutError) as caught:
            rb.add(**batch_of(1), timeout=0.3)
        waited = time.monotonic() - began
        assert 0.3 <= waited < 1.5
        message = str(caught.value)
        for words in ("add of 1 row held back by the rate limiter", "timeout=0.3",
                      "SampleToInsertRatio(samples_per_insert=1, min_size_to_sample=4",
                      "inserts=8, samples=0, diff=8", "nothing was added"):
            assert words in message, message
        after = rb.stats()
        assert after["rate_limiter"]["insert_timeouts"] == 1
        assert after["rate_limiter"]["insert_blocks"] == 1
        assert 0.3 <= after["rate_limiter"]["insert_wait_s"] < 1.5
        for key in ("inserts", "samples", "stored", "next_index"):
            assert after[key] == before[key]
        sample(rb, 8)                                 # 8 - 8 = 0 >= min_diff 0
        began = time.monotonic()
        with pytest.raises(TimeoutError, match="sample of 1 row held back .* nothing was sampled"):
            sample(rb, 1, 0.2)
        assert 0.2 <= time.monotonic() - began < 1.5
        assert rb.stats()["samples"] == 8


@pytest.mark.parametrize("kind", CLASSES)
def test_timeout_zero_never_blocks(kind):
    with kind(64, ENV, rate_limiter=MinSize(10)) as rb:
        rb.add(**batch_of(3))
        durations = []
        for _ in range(50):
            began = time.perf_counter()
            with pytest.raises(TimeoutError):
                sample(rb, 1, 0)
            durations.append(time.perf_counter() - began)
        assert statistics.median(durations) < 0.005, durations
        assert rb.stats()["rate_limiter"]["sample_timeouts"] == 50


@pytest.mark.parametrize("kind", CLASSES)
def test_no_limiter_no_change(kind):
    with kind(8, ENV) as rb:
        assert rb.rate_limiter is None
        rb.add(**batch_of(2), timeout=0)
        sample(rb, 5, 0)
        stats = rb.stats()
        assert stats["rate_limiter"] is None
        assert (stats["inserts"], stats["samples"], stats["stored"]) == (2, 5, 2)
        with pytest.raises(ValueError, match="empty"):
            rb.clear()
            sample(rb, 1, 0)


def test_stats_keys():
    with PrioritizedReplayBuffer(32, ENV, rate_limiter=MinSize(2)) as rb:
        rb.add(**batch_of(4))
        batch = rb.sample(6)
        rb.update_priorities(batch["indexes"], np.ones(6))
        stats = rb.stats()
    assert {"inserts", "samples", "updates", "repairs", "stored", "capacity", "fill",
            "next_index", "max_priority", "lock_waits", "lock_holder",
            "rate_limiter"} <= set(stats)
    assert (stats["inserts"], stats["samples"], stats["updates"], stats["stored"]) == (4, 6, 6, 4)
    assert stats["repairs"] == 0 and stats["lock_holder"] == 0
    assert stats["rate_limiter"]["kind"] == "MinSize"
    with ReplayBuffer(4, ENV) as uniform:
        assert uniform.stats()["max_priority"] is None


def test_clear_starts_the_counts_again():
    limiter = SampleToInsertRatio(1.0, 4, 4.0)
    with PrioritizedReplayBuffer(64, ENV, rate_limiter=limiter) as rb:
        rb.add(**batch_of(8))
        with pytest.raises(TimeoutError):
            rb.add(**batch_of(1), timeout=0)
        rb.clear()
        state = rb.stats()["rate_limiter"]
        assert (state["inserts"], state["samples"], state["diff"]) == (0, 0, 0.0)
        assert state["can_insert"] and not state["can_sample"]
        rb.add(**batch_of(4), timeout=0)
        assert rb.stats()["inserts"] == 12      # the buffer's own count goes on


# -- across processes -----------------------------------------------------------------------------

def wake_latencies(rb, parent_side: str, rounds: int = 20):
    """Seconds from the parent's add (or sample) to the child's held-back sample (or add)
    returning, one per round; the child is asleep on its gate when the parent acts."""
    latencies = []
    with Children(context()) as children:
        if parent_side == "add":
            process, pipe = children.launch(workers.wake_sampler, rb, rounds, 1, 30.0)
        else:
            process, pipe = children.launch(workers.wake_adder, rb, rounds, 30.0)
        receive(pipe, "child start")
        rng = np.random.default_rng(3)
        for k in range(rounds):
            # Long enough for the child to be asleep; not a multiple of its 50 ms slice.
            time.sleep(0.03 + 0.04 * rng.random())
            assert not pipe.poll(), "the child went through before the parent's progress"
            acted = time.monotonic()
            if parent_side == "add":
                rb.add(**batch_of(1, 100 + k))
            else:
                sample(rb, 1)
            tag, woke = receive(pipe, "wake-up")
            assert tag == "woke"
            latencies.append(woke - acted)
        tag, stats = receive(pipe, "child end")
        process.join(TIMEOUT)
    return latencies, stats


@pytest.mark.parametrize("kind", CLASSES)
def test_a_sampler_in_another_process_wakes_on_an_add(kind, backend):
    # (0, 2) window, 1 sample per insert: each sample of 1 row needs one more insert.
    limiter = SampleToInsertRatio(1.0, 1, (0.0, 2.0))
    with kind(64, ENV, rate_limiter=limiter, backend=backend) as rb:
        latencies, stats = wake_latencies(rb, "add")
        state = rb.stats()["rate_limiter"]
    print(f"\nsampler woken by an add ({kind.__name__}, {backend}): median "
          f"{statistics.median(latencies) * 1e3:.2f} ms, max {max(latencies) * 1e3:.2f} ms")
    # A poll of the 50 ms slice would give a median near 25 ms.
    assert statistics.median(latencies) < 0.010, latencies
    assert state["sample_blocks"] >= 15 and state["inserts"] == state["samples"] == 20


@pytest.mark.parametrize("kind", CLASSES)
def test_an_adder_in_another_process_wakes_on_a_sample(kind):
    # Inserts wait while (inserts + 1) - samples > 1: each add needs one more sample.
    limiter = SampleToInsertRatio(1.0, 1, (-1.0, 1.0))
    with kind(64, ENV, rate_limiter=limiter) as rb:
        rb.add(**batch_of(1))
        latencies, stats = wake_latencies(rb, "sample")
        state = rb.stats()["rate_limiter"]
    print(f"\nadder woken by a sample ({kind.__name__}): median "
          f"{statistics.median(latencies) * 1e3:.2f} ms, max {max(latencies) * 1e3:.2f} ms")
    assert statistics.median(latencies) < 0.010, latencies
    assert state["insert_blocks"] >= 15 and state["inserts"] == 21


@pytest.mark.parametrize("kind, backend", CLASS_BACKEND_PAIRS)
def test_two_writers_and_a_learner_stay_inside_the_window(kind, backend):
    spi, least, slack = 4.0, 200, 150.0
    limiter = SampleToInsertRatio(spi, least, slack)       # window [650, 950]
    seconds = 3.0
    rows, batch = 8, 32                                    # a batch of either side fits: 64 < 300
    diffs = []
    with kind(4096, ENV, rate_limiter=limiter, backend=backend) as rb, \
            Children(context()) as children:
        start = context().Event()
        # The learner first: it waits for the minimum size (a sample held back).
        runs = [children.launch(workers.learner, rb, start, seconds, batch, 5.0)]
        runs += [children.launch(workers.writer, rb, start, seconds, rows, 10_000 * w, 5.0, 0.3)
                 for w in range(2)]
        start.set()
        ended = time.monotonic() + seconds + 30
        while any(process.is_alive() for process, _ in runs) and time.monotonic() < ended:
            if all(pipe.poll() for _, pipe in runs):
                break
            counts = snapshot(rb)
            if counts is not None:
                diffs.append((counts[0], counts[1], counts[0] * spi - counts[1]))
            time.sleep(0.002)
        reports = [receive(pipe, "run")[1] for _, pipe in runs]
        for process, _ in runs:
            process.join(TIMEOUT)
        state = rb.stats()["rate_limiter"]
    learner_report, writer_reports = reports[0], reports[1:]
    inserts, samples = state["inserts"], state["samples"]
    assert inserts == sum(r["added"] for r in writer_reports)
    assert samples == learner_report["sampled"]
    assert samples > 10 * batch and inserts > least
    sampling = [d for i, s, d in diffs if s > 0]
    assert len(sampling) > 50
    low, high = min(sampling), max(d for _, _, d in diffs)
    print(f"\n{kind.__name__} ({backend}): {inserts} inserts, {samples} samples, ratio "
          f"{samples / inserts:.3f} (limit {spi}); diff seen in [{low:g}, {high:g}] "
          f"over {len(diffs)} snapshots, window [{limiter.min_diff:g}, {limiter.max_diff:g}]; "
          f"writers held back {state['insert_wait_s']:.2f} s, learner "
          f"{state['sample_wait_s']:.2f} s")
    assert limiter.min_diff <= low and high <= limiter.max_diff
    # The final ratio is the limit up to the window over the inserts.
    assert abs(samples - spi * inserts) <= max(abs(limiter.min_diff), limiter.max_diff)
    assert state["insert_blocks"] > 0 and state["sample_blocks"] > 0


def test_a_view_in_another_process_sees_and_obeys_the_same_limiter(backend):
    limiter = SampleToInsertRatio(1.0, 4, 4.0)             # window [0, 8]
    with PrioritizedReplayBuffer(64, ENV, rate_limiter=limiter, backend=backend) as rb, \
            Children(context()) as children:
        rb.add(**batch_of(8))                               # diff 8: adds held back
        process, pipe = children.launch(workers.view_report, rb.name)
        report = receive(pipe, "view")[1]
        process.join(TIMEOUT)
        own = rb.stats()["rate_limiter"]
    assert report["limiter"] == repr(limiter)
    seen = report["stats"]["rate_limiter"]
    assert (seen["inserts"], seen["samples"], seen["diff"]) == (8, 0, 8.0)
    assert seen["can_sample"] and not seen["can_insert"]
    assert report["sample"] == "ok"
    assert report["add"] == "ok"       # after its sample: (8 + 1) - 1 = 8 <= max_diff
    assert (own["inserts"], own["samples"]) == (9, 1)


def test_ctrl_c_ends_a_wait_promptly():
    with ReplayBuffer(16, ENV, rate_limiter=MinSize(4)) as rb, Children(context()) as children:
        process, pipe = children.launch(workers.interrupted_sampler, rb)
        receive(pipe, "start")
        time.sleep(0.2)
        sent = time.monotonic()
        os.kill(process.pid, signal.SIGINT)
        tag, when = receive(pipe, "interrupt")
        process.join(TIMEOUT)
    assert tag == "interrupted"
    assert when - sent < 0.5


def test_closing_the_handle_ends_a_wait_in_another_thread():
    rb = PrioritizedReplayBuffer(16, ENV, rate_limiter=MinSize(4))
    outcome = {}

    def wait():
        try:
            rb.sample(1, timeout=30)
            outcome["result"] = "sampled"
        except ValueError as error:
            outcome["result"] = str(error)

    thread = threading.Thread(target=wait)
    thread.start()
    time.sleep(0.2)
    began = time.monotonic()
    rb.close()
    thread.join(5)
    assert not thread.is_alive()
    assert time.monotonic() - began < 1.0
    assert "closed while this call waited for its rate limiter" in outcome["result"]


def latest(pipe, seconds: float):
    """The last totals a keep_going child sent within the next `seconds`."""
    until = time.monotonic() + seconds
    last = None
    while True:
        left = until - time.monotonic()
        if left <= 0 or not pipe.poll(left):
            break
        tag, payload = pipe.recv()
        assert tag != "error", payload
        if tag == "tick":
            last = payload
    assert last is not None, f"no report within {seconds} s"
    return last


def test_killing_the_learner_lets_waiting_writers_time_out_then_go_on():
    """Writers held back at max_diff: the learner is SIGKILLed (in or out of a call), the
    writers' waits end in clean TimeoutErrors, and a new learner lets them go on. One writer is
    SIGKILLed while it sleeps on its gate: nobody is wedged by it."""
    limiter = SampleToInsertRatio(2.0, 16, 40.0)          # window [-8, 72]
    with PrioritizedReplayBuffer(1024, ENV, rate_limiter=limiter) as rb, \
            Children(context()) as children:
        learner, learner_pipe = children.launch(workers.keep_going, rb, "sample", 8, 0.5, 60.0)
        writers = [children.launch(workers.keep_going, rb, "add", 4, 0.4, 60.0)
                   for _ in range(3)]
        for _, pipe in writers + [(learner, learner_pipe)]:
            receive(pipe, "start")
        running = [latest(pipe, 1.0) for _, pipe in writers]
        assert all(totals["ok"] > 0 for totals in running), running
        assert rb.stats()["rate_limiter"]["insert_blocks"] > 0   # the writers do wait
        os.kill(learner.pid, signal.SIGKILL)
        learner.join(10)
        # Let the writers fall asleep on their gate; kill one there.
        time.sleep(0.2)
        os.kill(writers[0][0].pid, signal.SIGKILL)
        writers[0][0].join(10)
        survivors = writers[1:]
        # With no learner, every survivor's adds time out, cleanly; none goes through.
        settled = [latest(pipe, 0.5) for _, pipe in survivors]
        later = [latest(pipe, 1.5) for _, pipe in survivors]
        for before, after in zip(settled, later):
            assert after["ok"] == before["ok"], "an add went through with no learner sampling"
            assert after["timeouts"] > before["timeouts"]
            assert "add of 4 rows held back by the rate limiter" in after["message"]
        stuck = rb.stats()
        assert not stuck["rate_limiter"]["can_insert"]
        # A new learner: the survivors go on.
        _, new_learner = children.launch(workers.keep_going, rb, "sample", 8, 0.5, 3.0)
        receive(new_learner, "start")
        resumed = [latest(pipe, 1.5) for _, pipe in survivors]
        for before, after in zip(later, resumed):
            assert after["ok"] > before["ok"], (before, after)
        assert rb.stats()["inserts"] > stuck["inserts"]
        # A kill inside a call is repaired by the next locker; the tree is whole either way.
        root_sum, sums, _, _ = rb._store.check_tree()
        assert root_sum == pytest.approx(sums.sum())


def test_killing_writers_while_the_learner_waits():
    """The learner is held back at min_diff and woken by writers; one writer is SIGKILLed and
    the learner goes on with the other's progress; then the other is killed and the learner's
    waits end in clean TimeoutErrors."""
    limiter = SampleToInsertRatio(1.0, 8, 20.0)           # window [-12, 28]
    with ReplayBuffer(1024, ENV, rate_limiter=limiter) as rb, Children(context()) as children:
        learner, learner_pipe = children.launch(workers.keep_going, rb, "sample", 4, 0.4, 60.0)
        writers = [children.launch(workers.keep_going, rb, "add", 1, 5.0, 60.0)
                   for _ in range(2)]
        for _, pipe in writers + [(learner, learner_pipe)]:
            receive(pipe, "start")
        first = latest(learner_pipe, 0.5)
        assert rb.stats()["rate_limiter"]["sample_blocks"] > 0   # the learner does wait
        os.kill(writers[0][0].pid, signal.SIGKILL)
        writers[0][0].join(10)
        second = latest(learner_pipe, 1.0)
        assert second["ok"] > first["ok"] + 5, (first, second)
        os.kill(writers[1][0].pid, signal.SIGKILL)
        writers[1][0].join(10)
        settled = latest(learner_pipe, 0.5)
        later = latest(learner_pipe, 1.5)
        assert later["ok"] == settled["ok"], "a sample went through with no writer adding"
        assert later["timeouts"] > settled["timeouts"]
        assert "sample of 4 rows held back by the rate limiter" in later["message"]


# -- N-step ---------------------------------------------------------------------------------------

NSTEP = {"size": 3, "gamma": 0.5, "rew": "rew", "next": "next_obs"}


# A laned buffer stages N-step steps in its lane before their rows complete: the same rules.
LANED = [{}, {"lanes": 1}]


@pytest.mark.parametrize("lanes", LANED, ids=["plain", "laned"])
def test_nstep_add_held_back_leaves_the_staging_as_it_was(lanes):
    limiter = SampleToInsertRatio(1.0, 1, (-2.0, 2.0))    # at most 2 inserts ahead of samples
    with PrioritizedReplayBuffer(32, ENV, Nstep=NSTEP, rate_limiter=limiter, **lanes) as rb:
        steps = [batch_of(1, k) for k in range(6)]
        for step in steps[:4]:     # commits rows for steps 0 and 1 (their windows filled)
            rb.add(**{key: value[0] for key, value in step.items()}, timeout=0)
        assert rb.get_stored_size() == 2 and rb.stats()["nstep_staged"] == 2
        with pytest.raises(TimeoutError, match="add of 1 row held back"):
            rb.add(**{key: value[0] for key, value in steps[4].items()}, timeout=0)
        assert rb.get_stored_size() == 2 and rb.stats()["nstep_staged"] == 2
        with pytest.raises(TimeoutError):
            rb.on_episode_end(timeout=0.05)
        assert rb.stats()["nstep_staged"] == 2
        rb.sample(2)
        # The same step again: now admitted, and the rows are those of an uninterrupted stream.
        rb.add(**{key: value[0] for key, value in steps[4].items()}, timeout=0)
        rows = rb.get_all_transitions()
        assert rows["act"].ravel().tolist() == [0, 1, 2]
        assert rows["rew"].ravel().tolist() == [0 + 0.25 + 0.25, 0.5 + 0.5 + 0.375,
                                                1 + 0.75 + 0.5]
        # The episode's last two steps: held back until the learner samples again.
        with pytest.raises(TimeoutError):
            rb.on_episode_end(timeout=0)
        rb.sample(2)
        rb.on_episode_end(timeout=0)
        assert rb.get_stored_size() == 5 and rb.stats()["nstep_staged"] == 0


@pytest.mark.parametrize("lanes", LANED, ids=["plain", "laned"])
def test_an_nstep_batch_is_admitted_whole_by_the_rows_it_completes(lanes):
    # 20 more steps complete 20 rows (2 were staged); with 12 inserts and max_diff 30 they do
    # not fit.
    # A laned buffer writes its steps to the lane in pieces (8 here) and completes the rows
    # after: each piece used to be admitted on its own against inserts that did not count
    # the others, and all 20 rows went in (32 inserts, past max_diff). Now the write waits
    # for room for the 20 rows the batch completes, and their completion is admitted and
    # counted as one add.
    limiter = SampleToInsertRatio(1.0, 1, (-1.0, 30.0))
    with ReplayBuffer(64, ENV, Nstep=NSTEP, rate_limiter=limiter, **lanes) as rb:
        rb.add(**batch_of(14), timeout=0)
        assert rb.get_stored_size() == 12 and rb.stats()["inserts"] == 12
        with pytest.raises(TimeoutError, match="add of 20 rows held back"):
            rb.add(**batch_of(20, 14), timeout=0)
        assert rb.get_stored_size() == 12 and rb.stats()["inserts"] == 12
        assert rb.stats()["nstep_staged"] == 2
        sample(rb, 3)                 # diff 9: room for 21 more rows
        rb.add(**batch_of(20, 14), timeout=0)
        assert rb.get_stored_size() == 32 and rb.stats()["inserts"] == 32
        rows = rb.get_all_transitions()
        assert rows["act"].ravel().tolist() == list(range(32))
        assert rows["rew"].ravel()[-1] == pytest.approx(15.5 + 0.5 * 16 + 0.25 * 16.5)
        # The episode's end completes the 2 staged rows: diff 29, past max_diff until a sample.
        with pytest.raises(TimeoutError, match="add of 2 rows held back"):
            rb.on_episode_end(timeout=0)
        assert rb.get_stored_size() == 32 and rb.stats()["nstep_staged"] == 2
        sample(rb, 1)                 # diff 28: room for 2
        rb.on_episode_end(timeout=0)
        assert rb.get_stored_size() == 34 and rb.stats()["inserts"] == 34


@pytest.mark.parametrize("lanes", LANED, ids=["plain", "laned"])
def test_an_nstep_batch_no_state_admits_says_the_staged_steps_count(lanes):
    # As in test_batches_no_state_admits_are_refused_at_once, no add of more than 14 rows is
    # ever admitted. 13 steps that end the episode complete 15 rows with the 2 staged before:
    # refused at once, and the message says where the other 2 rows come from.
    limiter = SampleToInsertRatio(2.0, 10, 8.0)
    with ReplayBuffer(64, ENV, Nstep=NSTEP, rate_limiter=limiter, **lanes) as rb:
        rb.add(**batch_of(2), timeout=0)          # no window complete: both stay staged
        before = rb.stats()
        steps = batch_of(13, 2)
        steps["done"][-1] = 1.0
        with pytest.raises(ValueError, match=r"an add of 15 rows can never be admitted at once"
                                             r".*the 2 steps staged before it count among them"):
            rb.add(**steps, timeout=0)
        assert rb.stats() == before and rb.stats()["nstep_staged"] == 2
        steps["done"][-1] = 0.0                   # 13 steps, no end: 13 rows, admitted
        rb.add(**steps, timeout=0)
        assert rb.get_stored_size() == 13 and rb.stats()["nstep_staged"] == 2
        assert rb.get_all_transitions()["act"].ravel().tolist() == list(range(13))
        sample(rb, 10)                            # diff 16: room for the 2 staged rows
        rb.on_episode_end(timeout=0)
        assert rb.get_stored_size() == 15


def test_an_nstep_completion_that_loses_its_room_to_another_writer_keeps_the_staging():
    # Between an N-step add's lane write (admitted: room for its 2 rows) and their completion,
    # another writer takes the room. The completion is held back: TimeoutError, the staging as
    # before the call, and the steps written stay in the lane as rows that never complete;
    # the same steps given again go in exact, and no row of either writer is lost. The other
    # writer's add runs at that point through the N-step sink's completion (the one place the
    # interleaving can be made deterministic); everything else is the real buffer.
    limiter = SampleToInsertRatio(1.0, 1, (-1.0, 10.0))
    with ReplayBuffer(64, ENV, Nstep=NSTEP, rate_limiter=limiter, lanes=2) as rb, \
            ReplayBuffer.attach(rb.name) as other:
        rb.add(**batch_of(6), timeout=0)                    # rows 0..3, steps 4 and 5 staged
        other.add(**batch_of(6, 100), timeout=0)           # rows 100..103: 8 inserts
        sink = rb._writer._sink      # the N-step writer's sink into its lane
        complete = sink.complete

        def racing(*args, **kwargs):
            other.add(**batch_of(1, 106), timeout=0)       # row 104: 9 inserts, 2 too many
            return complete(*args, **kwargs)

        sink.complete = racing
        with pytest.raises(TimeoutError, match="add of 2 rows held back"):
            rb.add(**batch_of(2, 6), timeout=0)
        del sink.complete
        assert rb.stats()["inserts"] == 9 and rb.stats()["nstep_staged"] == 2
        assert sorted(rb.get_all_transitions()["act"].ravel().tolist()) == [
            0, 1, 2, 3, 100, 101, 102, 103, 104]
        sample(rb, 4)
        rb.add(**batch_of(2, 6), timeout=0)                 # the same steps again
        sample(rb, 4)
        rb.on_episode_end(timeout=0)
        other.on_episode_end(timeout=0)
        rows = rb.get_all_transitions()
        assert sorted(rows["act"].ravel().tolist()) == list(range(8)) + list(range(100, 107))
        by_act = {int(a): k for k, a in enumerate(rows["act"].ravel())}
        assert rows["rew"][by_act[5], 0] == pytest.approx(2.5 + 0.5 * 3.0 + 0.25 * 3.5)
        assert (rows["next_obs"][by_act[5]] == batch_of(1, 7)["next_obs"][0]).all()


def held_back_nstep_add(rb, outcome, timeout):
    """In a thread: one N-step add of the next step that the limiter holds back."""
    step = {key: value[0] for key, value in batch_of(1, 9).items()}
    began = time.monotonic()
    try:
        rb.add(**step, timeout=timeout)
        outcome["result"] = "added"
    except (TimeoutError, ValueError) as error:
        outcome["result"] = f"{type(error).__name__}: {error}"
    outcome["seconds"] = time.monotonic() - began


def nstep_buffer_that_holds_adds_back(**options):
    limiter = SampleToInsertRatio(1.0, 1, (-2.0, 2.0))
    rb = ReplayBuffer(32, ENV, Nstep=NSTEP, rate_limiter=limiter, **options)
    for k in range(4):   # diff 2 = max_diff: the next commit waits for a sample
        rb.add(**{key: value[0] for key, value in batch_of(1, k).items()}, timeout=0)
    assert rb.stats()["nstep_staged"] == 2
    return rb


@contextlib.contextmanager
def add_held_back_in_a_thread(rb, timeout):
    """An N-step add on `rb` that the limiter holds back, in another thread, 0.3 s into its
    wait: yields its outcome (filled when it ends); joins the thread and closes `rb` after."""
    outcome = {}
    thread = threading.Thread(target=held_back_nstep_add, args=(rb, outcome, timeout))
    thread.start()
    try:
        time.sleep(0.3)
        yield outcome
    finally:
        thread.join(TIMEOUT)
        assert not thread.is_alive(), "the held-back add never returned"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            rb.close()


@pytest.mark.parametrize("lanes", LANED, ids=["plain", "laned"])
def test_an_nstep_add_waiting_through_a_clear_commits_its_row_after_it(lanes):
    # The add waits while another thread clears the buffer: it is ordered after the clear and
    # commits the row its step finishes, made of steps staged before the clear (2, 3 and its
    # own 9). In a laned buffer the clear had wiped those steps' lane rows: the row was
    # skipped without a word and add returned a slot all the same.
    rb = nstep_buffer_that_holds_adds_back(**lanes)
    with add_held_back_in_a_thread(rb, 20.0) as outcome:
        rb.clear()
        deadline = time.monotonic() + TIMEOUT
        while "result" not in outcome and time.monotonic() < deadline:
            time.sleep(0.01)
        assert outcome.get("result") == "added"
        rows = rb.get_all_transitions()
        assert rows["act"].ravel().tolist() == [2]
        assert rows["rew"][0, 0] == pytest.approx(1.0 + 0.5 * 1.5 + 0.25 * 4.5)
        assert rb.get_stored_size() == 1


def test_close_ends_an_nstep_add_waiting_in_another_thread():
    # The waiting add holds the handle's N-step staging; close() must not wait for it (it
    # waited the add's whole timeout, and for good with timeout=None).
    rb = nstep_buffer_that_holds_adds_back()
    view = ReplayBuffer.attach(rb.name)
    try:
        with add_held_back_in_a_thread(rb, 20.0) as outcome:
            began = time.monotonic()
            with pytest.warns(RuntimeWarning, match="N-step step"):
                rb.close()
            closed_in = time.monotonic() - began
        assert closed_in < 2.0, f"close() waited {closed_in:.1f} s for the held-back add"
        assert outcome["seconds"] < 5.0
        assert "closed while this call waited for its rate limiter" in outcome["result"]
        assert view.get_stored_size() == 2    # what was committed stays; nothing else came
    finally:
        view.close()


def test_on_episode_end_keeps_its_timeout_while_another_thread_waits_in_add():
    rb = nstep_buffer_that_holds_adds_back()
    with add_held_back_in_a_thread(rb, 5.0) as outcome:
        began = time.monotonic()
        with pytest.raises(TimeoutError, match="on_episode_end: another thread's call"):
            rb.on_episode_end(timeout=0.3)
        assert time.monotonic() - began < 2.0
        while "result" not in outcome and time.monotonic() - began < TIMEOUT:
            time.sleep(0.05)
        assert outcome["result"].startswith("TimeoutError: add of 1 row held back")
        assert rb.get_stored_size() == 2 and rb.stats()["nstep_staged"] == 2


def fork_child_ends_its_episode(rb, conn):
    """A forked child: uses the handle whose staging a thread of the parent held at the fork."""
    try:
        rb.on_episode_end(timeout=1.0)
        rb.add(**{key: value[0] for key, value in batch_of(1, 50).items()}, timeout=1.0)
        staged = rb.stats()["nstep_staged"]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")   # the limiter holds the staged step back: dropped
            rb.close()
        conn.send(("done", staged))
    except BaseException as error:
        conn.send(("error", repr(error)))


@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="no fork")
@pytest.mark.filterwarnings("ignore:.*fork.*:DeprecationWarning")
def test_a_fork_while_an_nstep_add_waits_leaves_the_child_a_usable_handle():
    ctx = multiprocessing.get_context("fork")
    rb = nstep_buffer_that_holds_adds_back()
    child = None
    with add_held_back_in_a_thread(rb, 3.0) as outcome:
        try:
            parent_end, child_end = ctx.Pipe()
            child = ctx.Process(target=fork_child_ends_its_episode, args=(rb, child_end))
            child.start()
            # The child's staging lock was held by the parent's waiting thread: it hung for good.
            assert receive(parent_end, "the forked child's calls", 8.0) == ("done", 1)
            child.join(TIMEOUT)
            assert child.exitcode == 0
        finally:
            if child is not None and child.is_alive():
                os.kill(child.pid, signal.SIGKILL)
                child.join(TIMEOUT)
    assert outcome["result"].startswith("TimeoutError")


def test_close_drops_staged_steps_the_limiter_refuses_with_a_warning():
    limiter = SampleToInsertRatio(1.0, 1, (-2.0, 2.0))
    rb = ReplayBuffer(32, ENV, Nstep=NSTEP, rate_limiter=limiter)
    view = ReplayBuffer.attach(rb.name)
    try:
        for k in range(4):
            rb.add(**{key: value[0] for key, value in batch_of(1, k).items()})
        with pytest.warns(RuntimeWarning, match="held back the 2 N-step step"):
            rb.close()
        assert view.get_stored_size() == 2
    finally:
        view.close()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            rb.close()


def test_close_commits_staged_steps_the_limiter_admits():
    with ReplayBuffer(32, ENV, Nstep=NSTEP, rate_limiter=MinSize(1)) as rb:
        with contextlib.closing(ReplayBuffer.attach(rb.name)) as view:
            view.add(**batch_of(2))
            assert view.stats()["nstep_staged"] == 2
        assert rb.get_stored_size() == 2


# -- checkpoints ----------------------------------------------------------------------------------

@pytest.mark.parametrize("limiter", [MinSize(5), SampleToInsertRatio(2.0, 4, (2.0, 12.0))],
                         ids=repr)
def test_a_checkpoint_keeps_the_limiter_and_its_counts(tmp_path, limiter):
    file = str(tmp_path / "limited.ckpt")
    with PrioritizedReplayBuffer(64, ENV, rate_limiter=limiter, seed=2) as rb:
        rb.add(**batch_of(6))
        rb.sample(3)
        rb.clear()                    # the counts start again: the checkpoint has these ones
        rb.add(**batch_of(5))
        sample(rb, 4)
        before = rb.stats()["rate_limiter"]
        rb.save(file)
    with PrioritizedReplayBuffer.load(file) as copy:
        assert copy.rate_limiter == limiter
        after = copy.stats()["rate_limiter"]
        for key in ("kind", "inserts", "samples", "diff", "can_insert", "can_sample",
                    "min_diff", "max_diff"):
            assert after[key] == before[key], key
        assert after["insert_blocks"] == 0
        # ... and the loaded buffer decides as the saved one would have.
        model = ReverbModel(limiter, 64)
        model.inserts, model.samples, model.stored = 5, 4, 5
        for rows in (1, 2, 3, 6):
            assert model.can_sample(rows) == _admitted(lambda k=rows: sample(copy, k, 0))
            if model.can_sample(rows):
                model.samples += rows
        assert model.can_insert(6) == _admitted(lambda: copy.add(**batch_of(6), timeout=0))


def test_a_checkpoint_without_a_limiter_loads_without_one(tmp_path):
    file = str(tmp_path / "plain.ckpt")
    with ReplayBuffer(8, ENV) as rb:
        rb.add(**batch_of(3))
        rb.save(file)
    with ReplayBuffer.load(file) as copy:
        assert copy.rate_limiter is None and copy.stats()["rate_limiter"] is None


def test_a_crafted_limiter_in_a_checkpoint_is_refused(tmp_path):
    from cpprb_ray import checkpoint

    file = str(tmp_path / "limited.ckpt")
    with ReplayBuffer(8, ENV, rate_limiter=MinSize(2)) as rb:
        rb.add(**batch_of(3))
        rb.save(file)
    description, sections = checkpoint.read_file(file)
    for key, value, words in (("min_size_to_sample", 9, "larger than the buffer"),
                              ("kind", "Queue", "unknown rate limiter"),
                              ("inserts", -1, "rate limiter counts"),
                              # Fewer inserts since the last clear than rows stored, or more
                              # than ever added: no writer leaves either.
                              ("inserts", 2, "rate limiter inserts 2 with 3 rows stored"),
                              ("inserts", 4, "rate limiter inserts 4 with 3 rows stored and "
                                             "3 ever added")):
        crafted = dict(description)
        crafted["rate_limiter"] = dict(description["rate_limiter"], **{key: value})
        del crafted["sections"]
        checkpoint.write_file(file, crafted, [(name, sections[name]) for name in
                                              ("rows", "tail_generations", "leaves")])
        with pytest.raises(ValueError, match=words):
            ReplayBuffer.load(file)


def _admitted(call) -> bool:
    try:
        call()
        return True
    except TimeoutError:
        return False


STATS_READER = """
import json, sys
import cpprb_ray
rb = cpprb_ray.attach(sys.argv[1])
trace_me()
limiter = rb.stats()["rate_limiter"]
with open(sys.argv[2], "w") as out:
    json.dump(limiter, out)
rb.close()
"""


def python_method(library, name):
    """The symbol of ReplayStore.`name`'s Python entry point (Cython's wrapper): its name holds
    the method's position in the class, which a method added before it moves."""
    listing = subprocess.run(["nm", "--defined-only", library], check=True,
                             stdout=subprocess.PIPE, text=True).stdout
    return re.search(rf"__pyx_pw_\w*?(ReplayStore_\d+{name})$", listing, re.M).group(1)


def test_stats_reads_the_limiters_counts_as_one_snapshot(tmp_path):
    """A reader stopped at every instruction of stats() (ptrace), while between any two of
    its instructions this process adds 3 rows and samples 3 (the limiter's diff stays in its
    window throughout): the reader's inserts, samples and diff are of one moment, inside the
    window. Read one by one without the lock, the inserts of one moment and the samples of
    a later one made a diff below min_diff (as 1 poll in 602,260 of a real run did)."""
    import _ptrace

    if not _ptrace.SUPPORTED:
        pytest.skip("ptrace single-stepping is implemented for Linux x86_64 only")
    from cpprb_ray import _store

    limiter = SampleToInsertRatio(samples_per_insert=1.0, min_size_to_sample=1, error_buffer=4)
    with ReplayBuffer(64, ENV, rate_limiter=limiter) as rb:
        rb.add(**batch_of(1))
        low, high = rb.stats()["rate_limiter"]["min_diff"], rb.stats()["rate_limiter"]["max_diff"]
        said = tmp_path / "stats.json"
        reader = _ptrace.Tracee(STATS_READER, [rb.name, str(said)])
        try:
            reader.run_to_function(_store.__file__, python_method(_store.__file__, "counters"))
            moved = 0
            while reader.step():
                if rb._store.lock_owner() == 0:      # the reader holds no lock: go on
                    rb.add(**batch_of(3), timeout=0)
                    rb.sample(3, timeout=0)
                    moved += 1
                    assert low <= rb.stats()["rate_limiter"]["diff"] <= high
            assert moved > 100
        finally:
            status = reader.finish() if reader.alive else reader.process.returncode
        assert status == 0
    seen = json.loads(said.read_text())
    assert seen["diff"] == seen["inserts"] - seen["samples"]
    assert low <= seen["diff"] <= high, (
        f"the reader saw inserts {seen['inserts']} and samples {seen['samples']}: diff "
        f"{seen['diff']} outside [{low}, {high}]")
