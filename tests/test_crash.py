"""Stress and crash tests in real processes on one real segment.

* Stress: two writer processes and one sampling/updating process hammer one prioritized buffer
  for CPPRB_RAY_STRESS_SECONDS (12; benchmarks/soak.py runs longer, with kills) seconds; no
  sampled row is ever torn, and afterwards the tree, the sizes and rows_added agree with what
  the writers say they did.
* Kill -9: a writer adding big batches (so that most kills land inside add, holding the lock) is
  SIGKILLed at random moments, at least CPPRB_RAY_KILLS (40) times and until
  CPPRB_RAY_KILL_SECONDS (6) seconds have passed, while a sampler keeps sampling. The
  next locker repairs; no torn row is ever sampled, every row committed before a kill stays,
  and the ring's bookkeeping stays exact. The same for a uniform buffer, and for a process
  that samples and updates priorities.
* Deterministic repairs: a child takes the lock, leaves the header as a holder killed at a
  chosen point would, and dies; the next locker must repair exactly.

Every wait is bounded: a hang is a failure, not a stuck run.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import random
import signal
import sys
import threading
import time

import numpy as np
import pytest

import cpprb_ray

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
if TESTS_DIR not in sys.path:  # spawn/forkserver children import _workers from the parent's path
    sys.path.insert(0, TESTS_DIR)

import _workers  # noqa: E402
from _workers import ENV, Children, rows  # noqa: E402

STRESS_SECONDS = float(os.environ.get("CPPRB_RAY_STRESS_SECONDS", "12"))
KILLS = int(os.environ.get("CPPRB_RAY_KILLS", "40"))          # at least this many kills
KILL_SECONDS = float(os.environ.get("CPPRB_RAY_KILL_SECONDS", "6"))  # and more until then
TIMEOUT = 60.0
PRELOAD = ["numpy", "cpprb_ray"]
# At collection, before any test can have started the forkserver (see context()).
multiprocessing.get_context("forkserver").set_forkserver_preload(PRELOAD)


def context():
    """forkserver: cheap, clean children (the pytest process may run Ray's threads, so no fork).
    Preloading numpy and cpprb_ray (set when this module is imported) makes a child start in
    milliseconds; it only takes effect if no forkserver ran before, and children work anyway."""
    return multiprocessing.get_context("forkserver")


def bounded(function, timeout: float = TIMEOUT):
    """Run a call into the buffer in a thread and fail (instead of hanging) past `timeout`."""
    box: dict = {}

    def run():
        try:
            box["value"] = function()
        except BaseException as error:  # re-raised in the test's thread
            box["error"] = error

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise TimeoutError(f"{function} hung for {timeout} s (a lock never came back?)")
    if "error" in box:
        raise box["error"]
    return box["value"]


def receive(conn, what: str, timeout: float = TIMEOUT):
    assert conn.poll(timeout), f"no {what} report within {timeout} s (a child hung?)"
    tag, payload = conn.recv()
    assert tag != "error", f"{what} failed:\n{payload}"
    return payload


def assert_tree_consistent(rb) -> None:
    assert _workers.tree_problems(bounded(rb._store.check_tree)) == []


# -- stress ---------------------------------------------------------------------------------------

def test_stress_two_writers_one_sampler():
    ctx = context()
    capacity = 6007  # not a power of two: adds wrap mid-batch, the tree has a ragged last node
    rb = cpprb_ray.PrioritizedReplayBuffer(capacity, ENV, alpha=0.7, eps=1e-3)
    hung = False
    try:
        with Children() as children:
            start = ctx.Event()
            pipes = []
            for writer in range(2):
                receiver, sender = ctx.Pipe(duplex=False)
                children.start(ctx.Process(target=_workers.stress_writer, args=(
                    sender, rb, writer, STRESS_SECONDS, start, 100 + writer)))
                sender.close()
                pipes.append(receiver)
            receiver, sender = ctx.Pipe(duplex=False)
            children.start(ctx.Process(target=_workers.stress_sampler, args=(
                sender, rb, STRESS_SECONDS, start, 7)))
            sender.close()
            pipes.append(receiver)
            start.set()
            wait = STRESS_SECONDS + TIMEOUT
            reports = [receive(pipe, "stress child", wait) for pipe in pipes]
            for process in children.processes:
                children.join(process)
                assert process.exitcode == 0
        writers, sampler = reports[:2], reports[2]

        assert sampler["problems"] == []
        assert sampler["samples"] > 0 and sampler["applied"] > 0
        total = sum(w["rows"] for w in writers)
        assert all(w["calls"] > 0 for w in writers)
        assert bounded(lambda: rb._store.rows_added) == total
        assert rb.get_stored_size() == min(total, capacity)
        assert rb.get_next_index() == total % capacity
        assert_tree_consistent(rb)

        everything = bounded(rb.get_all_transitions)
        serials = _workers.serials_of(everything)
        assert len(serials) == min(total, capacity)
        assert _workers.torn(everything).size == 0
        assert len(np.unique(serials)) == len(serials)
        for w in writers:  # every stored row is one this writer says it wrote
            mine = serials[(serials >= w["base"]) & (serials < w["base"] + (1 << 36))]
            assert mine.size == 0 or mine.max() < w["base"] + w["rows"]
        assert sum(((serials >= w["base"]) & (serials < w["base"] + w["rows"])).sum()
                   for w in writers) == len(serials)
        slots = np.arange(rb.get_stored_size())
        assert not (rb._store.generations_of(slots) % 2).any()
        _, leaf_sums, _, _ = rb._store.check_tree()
        assert (leaf_sums[: rb.get_stored_size()] > 0).all()
        assert _workers.check_sample(rb, rb.sample(512)) == []
    except TimeoutError:
        hung = True
        raise
    finally:
        if not hung:  # never unmap under a thread that may still be inside the buffer
            rb.close()


# -- kill -9 --------------------------------------------------------------------------------------

BATCH = 4096


def check_after_kill(rb, capacity: int, reported_end: int) -> int:
    """Invariants once the killed writer is gone; returns the last committed serial.

    Serial s always goes to slot s % capacity (the ring starts full with serials 0..capacity-1
    and each writer continues from the last committed serial), so the committed rows are
    exactly the serials (last - capacity, last] minus the slots of rolled-back adds.
    """
    everything = bounded(rb.get_all_transitions)  # the first locker after a kill repairs
    generations = rb._store.generations_of(np.arange(capacity))
    committed = np.flatnonzero(generations % 2 == 0)
    serials = _workers.serials_of(everything)
    assert rb.get_stored_size() == capacity
    assert len(serials) == len(committed)
    assert _workers.torn(everything).size == 0, "a torn row is stored as committed"
    assert (serials % capacity == committed).all(), "a row is not in its slot"
    last = int(serials.max())
    assert last + 1 >= reported_end, (
        f"rows committed before the kill were lost: the writer reported {reported_end}, "
        f"the buffer ends at {last + 1}")
    assert rb.get_next_index() == (last + 1) % capacity
    # Only the slots right after the last commit may be torn (one batch at most).
    assert capacity - len(committed) <= BATCH
    assert serials.min() >= last - capacity + 1
    assert (serials > last - (capacity - BATCH)).sum() == capacity - BATCH
    assert rb._store.rows_added == last + 1, (
        f"rows_added {rb._store.rows_added} != rows committed {last + 1}: a rolled-back add "
        f"was counted")
    if isinstance(rb, cpprb_ray.PrioritizedReplayBuffer):
        assert_tree_consistent(rb)
        _, leaf_sums, _, _ = rb._store.check_tree()
        torn_slots = np.flatnonzero(generations % 2 == 1)
        assert (leaf_sums[torn_slots] == 0).all(), "a torn slot can still be sampled"
        assert (leaf_sums[committed] > 0).all()
    return last


@contextlib.contextmanager
def paused(sampler, control):
    """Hold the sampler out of the buffer (see _workers.kill_sampler) while the body runs."""
    control[0] += 1
    deadline = time.monotonic() + TIMEOUT
    while control[1] != control[0]:
        assert sampler.is_alive(), "the sampler died"
        assert time.monotonic() < deadline, "the sampler did not pause (stuck in the buffer?)"
        time.sleep(0.0005)
    try:
        yield
    finally:
        control[0] += 1


def kill_writers_repeatedly(rb, capacity: int) -> None:
    ctx = context()
    rng = random.Random(1234)
    bounded(lambda: rb.add(**rows(0, capacity)))
    last = capacity - 1
    repairs_before = rb._store.repairs
    hung = False
    try:
        with Children() as children:
            stop = ctx.Event()
            receiver, sender = ctx.Pipe(duplex=False)
            control = ctx.RawArray("q", 2)
            sampler = children.start(ctx.Process(target=_workers.kill_sampler,
                                                 args=(sender, rb, stop, control, 0.4)))
            sender.close()
            progress = ctx.RawValue("q", 0)
            ready = ctx.Event()
            kills = 0
            deadline = time.monotonic() + KILL_SECONDS
            while kills < KILLS or (time.monotonic() < deadline and kills < 20 * KILLS):
                progress.value = last + 1
                ready.clear()
                writer = children.start(ctx.Process(target=_workers.kill_writer, args=(
                    rb, last + 1, BATCH, progress, ready)))
                assert ready.wait(TIMEOUT), "writer never started"
                time.sleep(rng.uniform(0.0, 0.04))
                os.kill(writer.pid, signal.SIGKILL)  # our own child, by pid
                children.join(writer)
                assert writer.exitcode == -signal.SIGKILL
                kills += 1
                assert sampler.is_alive(), "the sampler died"
                with paused(sampler, control):
                    last = check_after_kill(rb, capacity, progress.value)
            stop.set()
            report = receive(receiver, "sampler")
            children.join(sampler)
            assert sampler.exitcode == 0
        assert kills >= KILLS
        assert report["problems"] == []
        assert report["samples"] > 0
        repairs = rb._store.repairs - repairs_before
        print(f"{type(rb).__name__}: {kills} kills, {repairs} repairs, "
              f"{report['samples']} samples")
        assert repairs > 0, "no kill landed while holding the lock; nothing was repaired"
        # Still fully usable after all that.
        bounded(lambda: rb.add(**rows(last + 1, 10)))
        assert _workers.check_sample(rb, bounded(lambda: rb.sample(256))) == []
        check_after_kill(rb, capacity, last + 11)
    except TimeoutError:
        hung = True
        raise
    finally:
        if not hung:
            rb.close()


def test_kill9_writer_prioritized():
    capacity = 3 * BATCH + 1001  # batches wrap around the ring's end at changing places
    rb = cpprb_ray.PrioritizedReplayBuffer(capacity, ENV, alpha=0.6)
    kill_writers_repeatedly(rb, capacity)


def test_kill9_writer_uniform():
    capacity = 3 * BATCH + 1001
    rb = cpprb_ray.ReplayBuffer(capacity, ENV, backend="mmap")
    kill_writers_repeatedly(rb, capacity)


def test_kill9_updater():
    """A process sampling and updating priorities (4096 at a time) killed again and again: the
    rows never change, the tree always agrees with its leaves."""
    ctx = context()
    capacity = 20_000
    rb = cpprb_ray.PrioritizedReplayBuffer(capacity, ENV, alpha=0.6)
    rng = random.Random(99)
    hung = False
    try:
        bounded(lambda: rb.add(**rows(0, capacity)))
        repairs_before = rb._store.repairs
        with Children() as children:
            ready = ctx.Event()
            for _ in range(max(10, KILLS // 2)):
                ready.clear()
                updater = children.start(ctx.Process(target=_workers.kill_updater,
                                                     args=(rb, ready)))
                assert ready.wait(TIMEOUT), "updater never started"
                time.sleep(rng.uniform(0.0, 0.03))
                os.kill(updater.pid, signal.SIGKILL)
                children.join(updater)
                assert updater.exitcode == -signal.SIGKILL
                everything = bounded(rb.get_all_transitions)
                assert (_workers.serials_of(everything) == np.arange(capacity)).all()
                assert _workers.torn(everything).size == 0
                assert rb._store.rows_added == capacity and rb.get_next_index() == 0
                assert_tree_consistent(rb)
        assert rb._store.repairs > repairs_before, "no kill landed while holding the lock"
        assert _workers.check_sample(rb, bounded(lambda: rb.sample(1024))) == []
    except TimeoutError:
        hung = True
        raise
    finally:
        if not hung:
            rb.close()


# -- a holder dead at a chosen point (deterministic repairs) ---------------------------------------

OP_ADD, OP_CLEAR = 1, 3


def die_holding_the_lock(rb, fields) -> None:
    """A child takes `rb`'s lock, writes header `fields` and dies without unlocking."""
    ctx = context()
    with Children() as children:
        child = children.start(ctx.Process(target=_workers.die_holding_the_lock,
                                           args=(rb.name, fields)))
        children.join(child)
        assert child.exitcode == 0
    header = cpprb_ray._segment.read_header(rb._segment.memory)
    for field, value in fields.items():  # the header is laid out as the child assumed
        assert header[field] == value, (field, header[field], value)


@pytest.mark.parametrize("state", ["idle", "mid-clear", "after-commit-stores"])
def test_repair_after_a_holder_died(state, backend):
    """The next locker repairs whatever the dead holder was doing: nothing (a sampler died),
    a clear (finished for it) or an add whose commit stores were done but not its final
    "op = none" (rolled back like any unfinished add: the rows are gone, the ring as before)."""
    rb = cpprb_ray.PrioritizedReplayBuffer(64, ENV, backend=backend)
    try:
        rb.add(**rows(0, 10))
        rb.add(**rows(10, 5))  # leaves its pending range (slots 10..14) in the header
        fields = {"idle": {}, "mid-clear": {"op": OP_CLEAR},
                  "after-commit-stores": {"op": OP_ADD}}[state]
        die_holding_the_lock(rb, fields)
        kept = {"idle": 15, "mid-clear": 0, "after-commit-stores": 10}[state]
        everything = bounded(rb.get_all_transitions)  # takes the lock: repairs
        assert rb._store.repairs == 1
        assert sorted(_workers.serials_of(everything).tolist()) == list(range(kept))
        assert rb.get_stored_size() == kept and rb.get_next_index() == kept
        assert_tree_consistent(rb)
        _, leaf_sums, _, _ = rb._store.check_tree()
        assert (leaf_sums[:kept] > 0).all() and (leaf_sums[kept:] == 0).all()
        if state == "after-commit-stores":  # the rolled-back slots can never be sampled
            assert (rb._store.generations_of(np.arange(10, 15)) % 2 == 1).all()
        if kept:
            assert _workers.check_sample(rb, rb.sample(64)) == []
        else:
            with pytest.raises(ValueError):
                rb.sample(1)
        rb.add(**rows(100, 3))  # and it goes on working
        assert rb.get_stored_size() == kept + 3
        assert _workers.check_sample(rb, rb.sample(64)) == []
    finally:
        rb.close()


def test_rows_added_rolled_back_with_the_add(backend):
    """rows_added counts committed rows; an add the repair rolls back was not committed."""
    rb = cpprb_ray.PrioritizedReplayBuffer(64, ENV, backend=backend)
    try:
        rb.add(**rows(0, 10))
        rb.add(**rows(10, 5))
        die_holding_the_lock(rb, {"op": OP_ADD})  # killed just before "op = none"
        bounded(rb.get_all_transitions)          # repairs: the 5 rows are rolled back
        assert rb.get_stored_size() == 10
        assert rb._store.rows_added == 10
    finally:
        rb.close()
