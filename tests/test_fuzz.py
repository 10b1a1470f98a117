"""The segment fuzzer (tests/fuzz_segment.py) for a bounded time, and what it found, pinned.

The fuzz run takes CPPRB_RAY_FUZZ_SECONDS (default 30) seconds; run the script by hand for
longer. Each defect below crashed or misreported before its fix; the ones that crashed run in a
child process whose mappings sit between guard pages (fuzz_segment.Guards), so that a read
outside the segment is a SIGSEGV here, not a silent read of a neighbouring mapping.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import struct
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import cpprb_ray
from cpprb_ray import _segment

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
if TESTS_DIR not in sys.path:
    sys.path.insert(0, TESTS_DIR)

import _workers  # noqa: E402
import fuzz_segment  # noqa: E402

ENV = {"obs": {"shape": 4}, "rew": {}}


def run_guarded(code: str, timeout: float = 60.0) -> subprocess.CompletedProcess:
    """Run `code` in a fresh interpreter whose segment mappings have guard pages around them."""
    prelude = "import fuzz_segment\nfuzz_segment.Guards()\n"
    result = subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)],
                            capture_output=True, text=True, timeout=timeout, cwd=TESTS_DIR)
    assert result.returncode == 0, (
        f"child exited with {result.returncode} (negative: killed by that signal)\n"
        f"stdout: {result.stdout}\nstderr: {result.stderr}")
    return result


def test_the_fuzzer_finds_no_crash_no_hang_and_no_unexpected_exception(tmp_path):
    seconds = float(os.environ.get("CPPRB_RAY_FUZZ_SECONDS", 30))
    report = tmp_path / "fuzz.json"
    result = subprocess.run(
        [sys.executable, os.path.join(TESTS_DIR, "fuzz_segment.py"), "--seconds", str(seconds),
         "--seed", os.environ.get("CPPRB_RAY_FUZZ_SEED", "0"), "--json", str(report)],
        capture_output=True, text=True, timeout=seconds + 120, cwd=TESTS_DIR)
    print(result.stdout)
    summary = json.loads(report.read_text())
    assert summary["failures"] == [], result.stdout
    assert result.returncode == 0, result.stdout + result.stderr
    # It did fuzz: cases of every kind ran, and their operations ran on mutated segments.
    assert summary["cases"] >= min(20, 2 * seconds)
    if seconds >= 30:
        assert set(summary["categories"]) == set(fuzz_segment.CATEGORIES), summary["categories"]
    assert summary["guarded_mappings"] > 0 and summary["unguarded_mappings"] == 0
    outcomes = summary["outcomes"]
    assert outcomes.get("sample:ok", 0) > 0 and outcomes.get("sample:ValueError", 0) > 0
    # Nothing waited past its bound: lock_timeout, or attach's look at the lock word.
    assert summary["slowest_op_s"] < fuzz_segment.LOCK_TIMEOUT_S + fuzz_segment.ATTACH_CHECK_S + 5


def test_the_same_case_is_the_same_mutation():
    tids = [1]
    first = fuzz_segment.Case(0, 58, tids)
    again = fuzz_segment.Case(0, 58, tids)
    assert (first.category, first.capacity, first.fill, first.backend) == (
        again.category, again.capacity, again.fill, again.backend)
    with cpprb_ray.PrioritizedReplayBuffer(first.capacity, ENV, backend="mmap") as a, \
            cpprb_ray.PrioritizedReplayBuffer(first.capacity, ENV, backend="mmap") as b:
        done_a = [mutate(fuzz_segment.Segment(a._segment.memory)) for mutate in first.mutations]
        done_b = [mutate(fuzz_segment.Segment(b._segment.memory)) for mutate in again.mutations]
    assert done_a == done_b


def test_guard_pages_turn_a_read_past_the_segment_into_a_fault():
    env = dict(os.environ)
    if "ASAN_OPTIONS" in env:   # make test-asan: the fault is wanted, not a finding to log
        env["ASAN_OPTIONS"] += ":handle_segv=0"
    result = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import ctypes, numpy as np, cpprb_ray, fuzz_segment
        fuzz_segment.Guards()
        rb = cpprb_ray.ReplayBuffer(8, {"obs": {}}, backend="mmap")
        export = np.frombuffer(rb._segment.memory, np.uint8)
        end = export.ctypes.data + rb._segment.size
        del export
        name = rb.name
        rb.close()                      # frees the file; the guards stay until the mapping goes
        print(ctypes.string_at(end - 1, 1), flush=True)
    """)], capture_output=True, text=True, timeout=60, cwd=TESTS_DIR, env=env)
    # Closed above, so the last byte is unmapped too: a fault, as any read outside would be.
    assert result.returncode < 0, (result.returncode, result.stdout, result.stderr)


# -- found by the fuzzer, fixed, pinned ------------------------------------------------------------

def test_a_search_steered_into_a_padding_node_stays_inside_the_tree():
    """A positive padding node that the root counts (two doubles) steered tree_search past its
    level's live nodes and on below them, reading up to 8**depth leaves past the tree:
    SIGSEGV where the tree ends at a mapping's end (found as case 58 of seed 0). Now the walk
    stays on live nodes and the sample reports the corruption."""
    run_guarded("""
        import numpy as np, cpprb_ray
        from cpprb_ray import _segment
        from fuzz_segment import tree_levels
        for capacity in (9, 65, 513, 4097):
            rb = cpprb_ray.PrioritizedReplayBuffer(capacity, {"obs": {}}, backend="mmap")
            rb.add(obs=np.ones(capacity))
            header = _segment.read_header(rb._segment.memory)
            levels, _ = tree_levels(capacity)
            tree = np.frombuffer(rb._segment.memory, np.float64, offset=header["tree_offset"],
                                 count=_segment.tree_nbytes(capacity) // 8)
            offset, live, padded = levels[-2]
            tree[offset + padded - 1] = 1e12          # the root's last child: padding
            tree[levels[-1][0]] = 1e12 + capacity     # the root counts it
            del tree
            try:
                rb.sample(64)
            except ValueError as error:
                assert "corrupt" in str(error), error
            else:
                raise AssertionError("a walk through a corrupt padding node was not seen")
            rb.close()
    """)


def test_a_min_path_steered_into_a_padding_node_stays_inside_the_tree():
    """The check of the min tree's path (a root min some leaf must have) followed the first
    child holding the root's min, padding included: a padding min node equal to a corrupt root
    min led it below the padding, past the tree's end (SIGSEGV in sample and update: seed 12
    case 650, seed 13 case 252). Now it looks at live children only and reports the
    corruption."""
    run_guarded("""
        import numpy as np, cpprb_ray
        from cpprb_ray import _segment
        from fuzz_segment import tree_levels
        for capacity in (9, 65, 513, 4097):
            rb = cpprb_ray.PrioritizedReplayBuffer(capacity, {"obs": {}}, backend="mmap")
            rb.add(obs=np.ones(capacity))
            header = _segment.read_header(rb._segment.memory)
            levels, sum_doubles = tree_levels(capacity)
            tree = np.frombuffer(rb._segment.memory, np.float64, offset=header["tree_offset"],
                                 count=_segment.tree_nbytes(capacity) // 8)
            def min_node(level, node):
                return sum_doubles + levels[level][0] - levels[1][0] + node
            top = len(levels) - 1
            tree[min_node(top, 0)] = 0.0                    # a root min no leaf has ...
            for level in range(1, top):                     # ... in a padding node below it
                tree[min_node(level, levels[level][2] - 1)] = 0.0
            del tree
            for call in (lambda: rb.sample(16), lambda: rb.update_priorities([0], [2.0])):
                try:
                    call()
                except ValueError as error:
                    assert "corrupt" in str(error), error
                else:
                    raise AssertionError("a min path through a padding node was not seen")
            rb.close()
    """)


@pytest.mark.parametrize("kind", [0xB832DCB3, 0, 0x30, 0xFFFFFFFF])
def test_a_corrupt_mutex_kind_is_a_corrupt_segment_not_an_abort(kind):
    """The mutex's kind word (glibc's __kind) overwritten, its holder dead: glibc took the
    path of another kind of mutex (priority inheritance) against our lock word and aborted
    the process on an assertion (SIGABRT: seed 14, case 244). Now every lock checks the kind
    first: the corrupt-segment error, in a view attached before and one attached after."""
    run_guarded(f"""
        import struct, numpy as np, cpprb_ray
        from cpprb_ray import _segment
        from fuzz_segment import DEAD_TID, FUTEX_OWNER_DIED
        rb = cpprb_ray.PrioritizedReplayBuffer(16, {{"obs": {{}}}}, backend="mmap",
                                               lock_timeout=2.0)
        rb.add(obs=np.ones(4))
        struct.pack_into("<I", rb._segment.memory, _segment.MUTEX_OFFSET + 16, {kind})
        struct.pack_into("<I", rb._segment.memory, _segment.MUTEX_OFFSET,
                         FUTEX_OWNER_DIED | DEAD_TID)
        late = None
        try:
            late = cpprb_ray.attach(rb.name, lock_timeout=2.0)
        except ValueError as error:
            assert "not a valid cpprb_ray buffer" in str(error), error
        for handle in (rb, late):
            if handle is None:
                continue
            for call in (lambda: handle.sample(2), lambda: handle.add(obs=[1.0]),
                         lambda: handle.update_priorities([0], [1.0])):
                try:
                    call()
                except ValueError as error:
                    assert "corrupt" in str(error), error
                else:
                    raise AssertionError("a lock of a mutex of another kind went through")
        location = rb.name
        for handle in (late, rb):
            try:
                handle is not None and handle.close()
            except ValueError:
                pass
        cpprb_ray._memory.unlink("mmap", location)
    """)


def test_a_bounded_lanes_numbers_take_a_counter_near_2_64():
    """A bounded lane (next_of) numbers its rows from the rows added since the last clear; a
    counter of 2**63 (a hostile header; seed 14, case 168) overflowed numpy's int64 in
    get_all_transitions. The numbers are those modulo the lane's size, as for any count."""
    env = {"obs": {"shape": 2}, "act": {}}
    with cpprb_ray.ReplayBuffer(8, env, next_of="obs", backend="mmap") as rb:
        for t in range(3):
            rb.add(obs=[t, t], act=t, next_obs=[t + 1, t + 1])
        before = rb.get_all_transitions()
        offset = 8 * (("magic",) + _segment.HEADER_FIELDS).index("rows_added")
        added = struct.unpack_from("<Q", rb._segment.memory, offset)[0]
        struct.pack_into("<Q", rb._segment.memory, offset, added + 2**63)
        after = rb.get_all_transitions()
        for name in before:
            np.testing.assert_array_equal(after[name], before[name])


def test_a_segment_tree_on_guarded_memory_survives_corrupt_padding():
    run_guarded("""
        import ctypes, mmap, numpy as np
        from cpprb_ray._segtree import Random, SegmentTree
        from fuzz_segment import tree_levels
        libc = ctypes.CDLL(None)
        libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        for capacity in (9, 65, 513):
            nbytes = SegmentTree.nbytes(capacity)
            pages = (nbytes + 4095) // 4096
            region = mmap.mmap(-1, (pages + 64) * 4096)
            address = ctypes.addressof(ctypes.c_char.from_buffer(region))
            assert libc.mprotect(address + pages * 4096, 64 * 4096, 0) == 0
            tree = SegmentTree(region, capacity, offset=pages * 4096 - nbytes)  # ends at guard
            tree.set(np.arange(capacity), np.ones(capacity))
            nodes = np.frombuffer(region, np.float64, offset=pages * 4096 - nbytes,
                                  count=nbytes // 8)
            levels, _ = tree_levels(capacity)
            offset, live, padded = levels[-2]
            nodes[offset + padded - 1] = 1e12
            nodes[levels[-1][0]] = 1e12 + capacity
            for call in (lambda: tree.sample(256, Random(0)),
                         lambda: tree.search([0.5, 1e11, 2e12])):
                try:
                    call()
                except ValueError as error:
                    assert "corrupt" in str(error), error
                else:
                    raise AssertionError("a walk through a corrupt padding node was not seen")
            assert tree.search([0.5]).tolist() == [0]   # walks that stay on live nodes: fine
    """)


def test_the_repair_of_a_clear_is_bounded_by_the_capacity():
    """A holder that died in clear() with a stored size of 2**40: the repair's clear walked
    2**40 records (SIGSEGV on the first one past the rows)."""
    run_guarded(f"""
        import multiprocessing, numpy as np, cpprb_ray, _workers
        if __name__ == "__main__":
            rb = cpprb_ray.PrioritizedReplayBuffer(16, {ENV!r}, backend="mmap")
            rb.add(obs=np.ones((10, 4)), rew=np.arange(10.0))
            child = multiprocessing.get_context("spawn").Process(
                target=_workers.die_holding_the_lock,
                args=(rb.name, {{"op": 3, "stored_size": 2**40}}))
            child.start(); child.join(60)
            assert child.exitcode == 0
            rb.add(obs=np.ones(4), rew=1.0)     # the next locker repairs: the clear, bounded
            assert rb.get_stored_size() == 1 and rb._store.repairs == 1
            assert _workers.tree_problems(rb._store.check_tree()) == []
            rb.close()
    """)


def test_a_capacity_changed_after_attach_does_not_widen_the_checks():
    """The header check compared next_index and stored_size with the header's own capacity
    field: with capacity and stored size both raised, a handle attached before sampled 2**40
    rows' worth of records (SIGSEGV)."""
    run_guarded(f"""
        import numpy as np, cpprb_ray
        from cpprb_ray import _segment
        for kind in (cpprb_ray.ReplayBuffer, cpprb_ray.PrioritizedReplayBuffer):
            rb = kind(16, {ENV!r}, backend="mmap")
            rb.add(obs=np.ones((4, 4)), rew=np.zeros(4))
            header = np.frombuffer(rb._segment.memory, np.uint64, count=_segment.HEADER_NBYTES // 8)
            field = lambda name: 1 + _segment.HEADER_FIELDS.index(name)
            header[field("capacity")] = 2**62
            header[field("stored_size")] = 2**40
            header[field("next_index")] = 2**39
            for call in (lambda: rb.sample(8), lambda: rb.add(obs=np.ones(4), rew=0.0),
                         rb.clear, rb.get_all_transitions):
                try:
                    call()
                except ValueError as error:
                    assert "corrupt" in str(error), error
                else:
                    raise AssertionError("a corrupt header was used")
            header[field("capacity")] = 16
            header[field("stored_size")] = 4
            header[field("next_index")] = 4
            del header
            assert rb.sample(8)["indexes"].max() < 4
            rb.close()
    """)


@pytest.mark.parametrize("field, value", [("stored_size", 2**63), ("next_index", 16)])
def test_sizes_no_writer_leaves_read_as_corrupt_not_as_overflow(field, value):
    """len() of a buffer whose stored size read 2**63 was an OverflowError, and
    get_all_transitions tried to allocate that many rows."""
    with cpprb_ray.ReplayBuffer(16, ENV, backend="mmap") as rb:
        rb.add(obs=np.ones((4, 4)), rew=np.zeros(4))
        offset = 8 * (1 + _segment.HEADER_FIELDS.index(field))
        good, = struct.unpack_from("<Q", rb._segment.memory, offset)
        struct.pack_into("<Q", rb._segment.memory, offset, value)
        getter = rb.get_stored_size if field == "stored_size" else rb.get_next_index
        for call in ((len, getter, rb.get_all_transitions) if field == "stored_size"
                     else (getter,)):
            with pytest.raises(ValueError, match="corrupt"):
                call(rb) if call is len else call()
        struct.pack_into("<Q", rb._segment.memory, offset, good)
        assert len(rb) == 4


def test_layout_json_nested_thousands_deep_is_refused_as_corrupt():
    """json.loads raised RecursionError (not the ValueError attach promises), and the owner's
    close() raised it too while checking the segment's token before unlinking."""
    rb = cpprb_ray.ReplayBuffer(16, ENV, backend="mmap")
    header = _segment.read_header(rb._segment.memory)
    room = header["data_offset"] - header["layout_offset"]
    nested = b"[" * (room // 2) + b"]" * (room // 2)
    rb._segment.memory[header["layout_offset"]:header["layout_offset"] + len(nested)] = nested
    struct.pack_into("<Q", rb._segment.memory,
                     8 * (1 + _segment.HEADER_FIELDS.index("layout_length")), len(nested))
    with pytest.raises(ValueError, match="not a valid cpprb_ray buffer: unreadable layout"):
        cpprb_ray.attach(rb.name)
    location = rb.name
    rb.close()   # cannot prove the segment is ours any more: it stays, and no error
    assert os.path.exists(location)
    os.unlink(location)


@pytest.mark.parametrize("op", [1, 2, 3, 99])
def test_a_dead_holder_with_hostile_pending_fields(op):
    """What the "repair" category fuzzes, for each in-flight op: the next locker's repair is
    bounded, and leaves a consistent buffer (an add rolled back, a clear finished) or one that
    reports its corruption on every call (an update or an unknown op restores no sizes)."""
    with cpprb_ray.PrioritizedReplayBuffer(16, ENV, backend="mmap", lock_timeout=10) as rb:
        rb.add(obs=np.ones((10, 4)), rew=np.arange(10.0))
        child = multiprocessing.get_context("spawn").Process(
            target=_workers.die_holding_the_lock,
            args=(rb.name, {"op": op, "pending_start": 2**64 - 1, "pending_count": 2**63,
                            "pending_old_next": 2**64 - 1, "pending_old_stored": 2**40,
                            "stored_size": 2**40}))
        child.start()
        child.join(60)
        assert child.exitcode == 0
        if op in (1, 3):
            rb.add(obs=np.ones(4), rew=1.0)
            assert rb._store.repairs == 1
            assert 1 <= rb.get_stored_size() <= 16
            assert _workers.tree_problems(rb._store.check_tree()) == []
            rb.sample(8)
        else:
            for call in (lambda: rb.sample(8), lambda: rb.add(obs=np.ones(4), rew=1.0),
                         rb.clear, rb.get_stored_size):
                with pytest.raises(ValueError, match="corrupt"):
                    call()
            assert rb._store.repairs == 1
