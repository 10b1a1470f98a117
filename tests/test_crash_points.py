"""A holder killed at EVERY instruction of add, update and clear leaves a buffer that the next
locker repairs to a state the operation allows: untouched, rolled back or committed.

test_crash.py kills writers at random moments; a window of a few instructions hides there. Here
a child is single-stepped (tests/_ptrace.py) through the compiled kernel, and the segment is
copied after every instruction that changed it. Each copy is what a SIGKILL at that instruction
leaves, once the kernel has done what it does for a robust mutex whose owner died: the lock word
becomes FUTEX_OWNER_DIED (keeping FUTEX_WAITERS). Each copy is opened as a buffer of its own,
whose first locker repairs it, and checked. A few of the points are also checked with real
SIGKILLs, which confirms that the copies stand for what a kill leaves.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import struct
import sys
from typing import Any, Dict, Iterator, List, Optional, Tuple

import numpy as np
import pytest

import cpprb_ray
from cpprb_ray import _core, _segment

sys.path.insert(0, os.path.dirname(__file__))
import _ptrace  # noqa: E402
import _workers  # noqa: E402
from _workers import ENV, rows  # noqa: E402

pytestmark = pytest.mark.skipif(not _ptrace.SUPPORTED,
                                reason="the single-stepping helper drives x86_64 Linux only")

CAPACITY = 8
FUTEX_WAITERS = 0x80000000
FUTEX_OWNER_DIED = 0x40000000
FUTEX_TID_MASK = 0x3FFFFFFF
REAL_KILLS = 5

# The child: attach, get the inputs ready, stop for the tracer, then do the one operation.
CHILD = """
import sys
sys.path.insert(0, sys.argv[1])
import numpy as np
import cpprb_ray
from _workers import rows
path, operation, first, count = sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
rb = cpprb_ray.attach(path)
data = rows(first, count)
if operation == "add-priorities":
    data["priorities"] = np.linspace(0.5, 4.0, count)
indexes = np.arange(count, dtype=np.int64) * 3 % rb.get_stored_size()
priorities = np.linspace(5.0, 0.25, count)
generations = rb._store.generations_of(indexes) if operation == "update" else None
trace_me()
if operation.startswith("add"):
    rb.add(**data)
elif operation == "update":
    rb.update_priorities(indexes, priorities, generations)
else:
    rb.clear()
rb.close()
"""

# case: (buffer class, rows already there, rows the operation adds, what the child does,
#        the traced kernel)
CASES = {
    "add-uniform": (cpprb_ray.ReplayBuffer, 6, 4, "add", "store_add"),  # wraps the ring
    "add-priorities": (cpprb_ray.PrioritizedReplayBuffer, 6, 4, "add-priorities", "store_add"),
    # Not full, and the new priorities raise the maximum.
    "add-max-priority": (cpprb_ray.PrioritizedReplayBuffer, 3, 3, "add-priorities",
                         "store_add"),
    "update": (cpprb_ray.PrioritizedReplayBuffer, 8, 5, "update", "store_update"),
    "clear": (cpprb_ray.PrioritizedReplayBuffer, 5, 0, "clear", "store_clear"),
    # With a rate limiter: its counts derive from rows_added and rows_sampled, so a rolled-back
    # add must take its inserts back, and a repaired clear must start them from zero.
    "add-limited": (cpprb_ray.PrioritizedReplayBuffer, 6, 4, "add-priorities", "store_add"),
    "clear-limited": (cpprb_ray.PrioritizedReplayBuffer, 5, 0, "clear", "store_clear"),
}
LIMITED = {"add-limited", "clear-limited"}


def prioritized(rb) -> bool:
    return isinstance(rb, cpprb_ray.PrioritizedReplayBuffer)


def fresh_buffer(case: str):
    kind, prefill = CASES[case][:2]
    limiter = cpprb_ray.SampleToInsertRatio(1.0, 2, 100.0) if case in LIMITED else None
    rb = kind(CAPACITY, ENV, backend="mmap", rate_limiter=limiter)
    extra: Dict[str, Any] = {}
    if prioritized(rb):
        extra["priorities"] = np.linspace(1.0, 2.0, prefill)
    try:
        rb.add(**rows(0, prefill), **extra)
        if limiter is not None:
            rb.sample(3)   # so that the limiter's sample count is not 0 either
    except BaseException:
        rb.close()
        raise
    return rb


def fingerprint(rb) -> Dict[str, Any]:
    """What a user can see of the buffer, per slot; taking the lock repairs it first."""
    everything = rb.get_all_transitions()
    stored = rb.get_stored_size()
    parity = (rb._store.generations_of(np.arange(stored)) % 2).tolist()
    serials = iter(_workers.serials_of(everything).tolist())
    assert stored == 0 or _workers.torn(everything).size == 0, "a torn row is stored as committed"
    state: Dict[str, Any] = {
        "rows_added": rb._store.rows_added, "next_index": rb.get_next_index(),
        "stored_size": stored,
        "slots": tuple(next(serials) if odd == 0 else "torn" for odd in parity)}
    assert next(serials, None) is None
    limiter = rb.stats()["rate_limiter"]
    if limiter is not None:
        # (compared with the states the operation allows: an add rolled back has the inserts
        # of before it, a clear repaired or done has 0 and 0)
        state["limiter"] = (limiter["inserts"], limiter["samples"])
    if prioritized(rb):
        tree = rb._store.check_tree()
        assert _workers.tree_problems(tree) == []
        state["leaves"] = tuple(tree[1].tolist())
        state["max_priority"] = rb.get_max_priority()
    return state


def allowed_states(case: str, before: Dict[str, Any],
                   after: Dict[str, Any]) -> List[Dict[str, Any]]:
    """The states a kill may leave, once repaired: the operation not begun, or done; for an
    add also rolled back (its slots torn, its rows gone); for an update, any mix of old and
    new leaves (each leaf is one store, the tree is rebuilt from them)."""
    allowed = [before, after]
    if case.startswith("add"):
        _, prefill, count = CASES[case][:3]
        rolled_back = dict(before)
        slots = list(before["slots"])
        pending = [(prefill + k) % CAPACITY for k in range(count)]
        for slot in pending:
            if slot < len(slots):
                slots[slot] = "torn"
        rolled_back["slots"] = tuple(slots)
        if "leaves" in before:
            leaves = list(before["leaves"])
            for slot in pending:
                leaves[slot] = 0.0
            rolled_back["leaves"] = tuple(leaves)
        allowed.append(rolled_back)
    return allowed


def check_state(case: str, state: Dict[str, Any], before: Dict[str, Any],
                after: Dict[str, Any], where: str) -> None:
    if case == "update" and state not in (before, after):
        mixed = {key: value for key, value in state.items() if key != "leaves"}
        assert mixed == {key: value for key, value in before.items() if key != "leaves"} or \
            mixed == {key: value for key, value in after.items() if key != "leaves"}, where
        for slot, leaf in enumerate(state["leaves"]):
            assert leaf in (before["leaves"][slot], after["leaves"][slot]), (where, slot)
        return
    assert state in allowed_states(case, before, after), (
        f"{where}: the repaired buffer is in a state the operation does not allow\n"
        f"  got    {state}\n  before {before}\n  after  {after}")


def snapshot_as_killed(snapshot: bytes, holder: int) -> Tuple[bytes, bool]:
    """The segment as the kernel leaves it when `holder` dies, and whether it held the lock.

    The kernel walks a dying thread's robust list: a lock word naming it becomes
    FUTEX_OWNER_DIED, keeping FUTEX_WAITERS (futex(2), "robust futexes")."""
    copy = bytearray(snapshot)
    word, = struct.unpack_from("<I", copy, _segment.MUTEX_OFFSET)
    if word & FUTEX_TID_MASK != holder:
        assert word & FUTEX_TID_MASK == 0, f"the lock names thread {word & FUTEX_TID_MASK}"
        return bytes(copy), False
    struct.pack_into("<I", copy, _segment.MUTEX_OFFSET, (word & FUTEX_WAITERS) | FUTEX_OWNER_DIED)
    return bytes(copy), True


def start_child(case: str, rb) -> _ptrace.Tracee:
    _, prefill, count, operation, _ = CASES[case]
    return _ptrace.Tracee(CHILD, [os.path.dirname(__file__), rb._segment.location, operation,
                                  str(100 + prefill), str(count)])


def trace(case: str) -> Tuple[Dict[str, Any], Dict[str, Any], int, List[Tuple[int, bytes]]]:
    """Step a child through the case's kernel: (before, after, child's pid, distinct states)."""
    rb = fresh_buffer(case)
    child: Optional[_ptrace.Tracee] = None
    try:
        before = fingerprint(rb)
        child = start_child(case, rb)
        memory = rb._segment.memory
        states = _ptrace.step_through(child, _core.__file__, "_core_" + CASES[case][4],
                                      lambda: memory[:])
        pid = child.pid
        assert child.finish() == 0
        after = fingerprint(rb)
        assert after != before
        return before, after, pid, states
    finally:
        if child is not None:
            child.kill()
        rb.close()


@contextlib.contextmanager
def opened_as_killed(snapshot: bytes, holder: int, label: str) -> Iterator[Tuple[Any, bool]]:
    """(a view of a copy of `snapshot` as the kernel leaves it when `holder` dies, whether
    `holder` held the lock); the copy is removed afterwards."""
    killed, held = snapshot_as_killed(snapshot, holder)
    path = f"/dev/shm/cpprb_ray_killed_{os.getpid()}_{label}"
    with open(path, "wb") as handle:
        handle.write(killed)
    try:
        view = cpprb_ray.attach(path)
        try:
            yield view, held
        finally:
            view.close()
    finally:
        os.unlink(path)


@pytest.mark.parametrize("case", sorted(CASES))
def test_killed_at_every_instruction(case):
    before, after, pid, states = trace(case)
    assert len(states) > 3, "the traced kernel changed the segment less often than it writes"
    seen = []
    for steps, snapshot in states:
        with opened_as_killed(snapshot, pid, str(steps)) as (view, held):
            state = fingerprint(view)
            check_state(case, state, before, after, f"killed after {steps} instructions")
            assert view._store.repairs == int(held), (
                "the first locker after a kill did not repair" if held else
                "a repair without a dead holder")
            seen.append(state == after)
    # The walk starts before the operation and ends after its commit.
    assert seen[0] is False and seen[-1] is True


# The repairer: attach a segment whose lock holder died, and take the lock.
REPAIRER = """
import sys
import cpprb_ray
rb = cpprb_ray.attach(sys.argv[1])
trace_me()
rb.get_all_transitions()
rb.close()
"""


@pytest.mark.parametrize("case", ["add-priorities", "add-uniform", "clear", "add-limited",
                                  "clear-limited"])
def test_repairer_killed_at_every_instruction(case):
    """Repair is idempotent: a repairer killed at any instruction of the repair leaves a
    segment that the next locker repairs to what one uninterrupted repair gives."""
    _, _, pid, states = trace(case)
    # A holder killed halfway through the operation, while it held the lock.
    middle = [(steps, snapshot) for steps, snapshot in states
              if snapshot_as_killed(snapshot, pid)[1]]
    steps, snapshot = middle[len(middle) // 2]
    with opened_as_killed(snapshot, pid, "reference") as (view, held):
        assert held
        reference = fingerprint(view)
        assert view._store.repairs == 1
    killed, _ = snapshot_as_killed(snapshot, pid)
    path = f"/dev/shm/cpprb_ray_killed_{os.getpid()}_holder"
    with open(path, "wb") as handle:
        handle.write(killed)
    repairer = None
    try:
        with open(path, "r+b") as handle, mmap.mmap(handle.fileno(), 0) as memory:
            repairer = _ptrace.Tracee(REPAIRER, [path])
            repairs = _ptrace.step_through(repairer, _core.__file__, "_core_store_repair",
                                           lambda: memory[:])
            assert repairer.finish() == 0
            assert len(repairs) > 3
            for count, during in repairs:
                with opened_as_killed(during, repairer.pid, f"repair_{count}") as (view, held):
                    assert held, "the repairer did not hold the lock"
                    assert fingerprint(view) == reference, (
                        f"the holder killed after {steps} instructions, its repairer after "
                        f"{count}: the next repair differs from an uninterrupted one")
    finally:
        if repairer is not None:
            repairer.kill()
        os.unlink(path)


@pytest.mark.parametrize("case", ["add-uniform", "add-priorities", "update", "add-limited"])
def test_real_sigkill_at_spread_instructions(case):
    """The same checks with real SIGKILLs at a few of those points: no copy, the kernel's own
    robust-mutex handling and the repair in the parent's handle."""
    before, after, _, states = trace(case)
    for steps in _ptrace.spread([s for s, _ in states], REAL_KILLS):
        rb = fresh_buffer(case)
        child = None
        try:
            assert fingerprint(rb) == before
            repairs = rb._store.repairs
            child = start_child(case, rb)
            child.run_to_function(_core.__file__, "_core_" + CASES[case][4])
            for _ in range(steps):
                child.step()
            assert child.kill() == -9
            state = fingerprint(rb)
            check_state(case, state, before, after, f"SIGKILL after {steps} instructions")
            assert rb._store.repairs == repairs + 1
            rb.add(**rows(1000, 2), **({"priorities": [1.0, 1.0]} if prioritized(rb) else {}))
            assert rb._store.rows_added == state["rows_added"] + 2
        finally:
            if child is not None:
                child.kill()
            rb.close()
