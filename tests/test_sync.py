"""Tests for the robust process-shared mutex (``cpprb_ray._sync.SharedMutex``).

Mutual exclusion is checked across two spawned processes sharing one segment, and robustness by
SIGKILLing a child while it holds the lock: the next acquire must report the dead owner at once.
Every wait in these tests is bounded, so a broken mutex fails a test instead of hanging the run.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import queue
import runpy
import signal
import tempfile
import threading
import time
import traceback
import uuid

import numpy as np
import pytest

from cpprb_ray._sync import MUTEX_NBYTES, SharedMutex

try:  # Python >= 3.8
    from multiprocessing import shared_memory
except ImportError:  # pragma: no cover - Python 3.7
    shared_memory = None

# Not "cpprb_ray...": these are bare mutexes, not buffers, and the leak check of a pytest run
# beside this one (tests/conftest.py) would take them for its own unreadable segments.
SEGMENT_PREFIX = "cpprbray_mutex_test_"

# A spawned child runs this file through runpy under this name (see the end of the file), so it
# needs neither the tests directory on sys.path nor pytest's module name for this file.
CHILD_RUN_NAME = "__cpprb_ray_sync_child__"

# The segment: the mutex, then an int64 counter and an int64 "someone is inside" flag.
COUNTER_OFFSET = MUTEX_NBYTES
SEGMENT_SIZE = MUTEX_NBYTES + 64
INCREMENTS = 20000  # per child

TIMEOUT = 60.0  # seconds; only reached when something is broken


# ---------------------------------------------------------------------------------------------
# Helpers


@contextlib.contextmanager
def make_segment(kind: str, size: int = SEGMENT_SIZE):
    """Yield (memory, params for attach()) of a zeroed segment; close and remove it after."""
    if kind == "shm":
        name = SEGMENT_PREFIX + uuid.uuid4().hex[:12]
        segment = shared_memory.SharedMemory(name=name, create=True, size=size)
        try:
            yield segment.buf, {"kind": "shm", "name": name}
        finally:
            segment.close()
            segment.unlink()
    else:
        descriptor, path = tempfile.mkstemp(prefix=SEGMENT_PREFIX, dir=tempfile.gettempdir())
        try:
            os.ftruncate(descriptor, size)
            with mmap.mmap(descriptor, size) as memory:
                yield memory, {"kind": "mmap", "path": path}
        finally:
            os.close(descriptor)
            os.unlink(path)


def attach(params: dict):
    """In a child: (memory, closeable) for the parent's segment."""
    if params["kind"] == "shm":
        segment = shared_memory.SharedMemory(name=params["name"])
        return segment.buf, segment
    with open(params["path"], "r+b") as handle:  # mmap keeps its own descriptor
        memory = mmap.mmap(handle.fileno(), 0)
    return memory, memory


def spawn(function_name: str, params: dict):
    """Start a spawned process running ``function_name(params)`` from this file.

    Returns (process, error queue); a failing child puts its traceback on the queue.
    """
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    errors = context.Queue()
    init = {"CHILD_FUNCTION": function_name, "CHILD_PARAMS": params, "CHILD_ERRORS": errors}
    process = context.Process(
        target=runpy.run_path, args=(os.path.abspath(__file__), init, CHILD_RUN_NAME)
    )
    process.start()
    return process, errors


def child_error(errors) -> str:
    try:
        message = errors.get(timeout=1.0)
    except queue.Empty:
        message = ""
    errors.close()
    errors.join_thread()
    return message


def join_or_kill(process, timeout: float = TIMEOUT) -> None:
    process.join(timeout)
    if process.is_alive():  # pragma: no cover - only when a child hangs
        process.kill()
        process.join()
        pytest.fail(f"child {process.pid} did not finish in {timeout} s")


def wait_for(event, process, timeout: float = TIMEOUT) -> bool:
    """Wait until `event` is set; False as soon as `process` has exited without setting it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if event.wait(0.05):
            return True
        if not process.is_alive():
            return event.is_set()
    return False


def in_thread(function, timeout: float = TIMEOUT):
    """Run `function` in a daemon thread; return its result, re-raise its error, or fail.

    A mutex is owned by a thread, so a sequence acquire ... release must run in one thread;
    the daemon thread lets the test run end even if the mutex deadlocks.
    """
    outcome = {}

    def target():
        try:
            outcome["result"] = function()
        except BaseException as error:  # handed to the test thread below
            outcome["error"] = error

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        pytest.fail(f"{getattr(function, '__name__', function)} did not return in {timeout} s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]


# ---------------------------------------------------------------------------------------------
# Children (run in spawned processes)


def child_count(params: dict) -> None:
    """Increment the shared counter INCREMENTS times under the mutex, checking exclusivity."""
    memory, segment = attach(params)
    mutex = SharedMutex(memory)
    words = np.frombuffer(memory, dtype=np.int64, count=2, offset=COUNTER_OFFSET)
    try:
        # Both children pass this barrier together, so their loops really overlap (without it
        # one child is done before the other has imported numpy, and no lock is needed).
        params["start"].wait(TIMEOUT)
        for _ in range(INCREMENTS):
            assert mutex.acquire() is False
            # A non-atomic read-modify-write, plus a flag that no two holders may see set.
            assert words[1] == 0, "two processes inside the critical section"
            words[1] = 1
            value = int(words[0])
            words[0] = value + 1
            words[1] = 0
            mutex.release()
    finally:
        del words
        mutex.close()
        segment.close()


def child_hold_and_wait(params: dict) -> None:
    """Acquire the mutex, tell the parent, and wait to be SIGKILLed while holding it."""
    memory, _segment = attach(params)
    mutex = SharedMutex(memory)
    assert mutex.acquire() is False
    words = np.frombuffer(memory, dtype=np.int64, count=1, offset=COUNTER_OFFSET)
    words[0] = 41  # a half-done update the next holder has to repair
    params["held"].set()
    time.sleep(TIMEOUT)  # the parent kills us long before this


# ---------------------------------------------------------------------------------------------
# Across processes


def test_mutual_exclusion_across_two_spawned_processes(backend):
    with make_segment(backend) as (memory, params):
        mutex = SharedMutex(memory, initialize=True)
        words = np.frombuffer(memory, dtype=np.int64, count=2, offset=COUNTER_OFFSET)
        try:
            import multiprocessing

            start = multiprocessing.get_context("spawn").Barrier(2)
            children = [spawn("child_count", dict(params, start=start)) for _ in range(2)]
            for process, errors in children:
                join_or_kill(process)
                message = child_error(errors)
                assert process.exitcode == 0 and not message, message or process.exitcode
            assert words[0] == 2 * INCREMENTS
            assert words[1] == 0
            # The mutex was left unlocked and consistent.
            assert in_thread(lambda: (mutex.acquire(), mutex.release())) == (False, None)
        finally:
            words = None  # drop the view's export so the segment can close
            mutex.close()


def test_owner_killed_while_holding_next_acquire_reports_it_at_once(backend):
    with make_segment(backend) as (memory, params):
        mutex = SharedMutex(memory, initialize=True)
        words = np.frombuffer(memory, dtype=np.int64, count=1, offset=COUNTER_OFFSET)
        try:
            import multiprocessing

            held = multiprocessing.get_context("spawn").Event()
            process, errors = spawn("child_hold_and_wait", dict(params, held=held))
            try:
                got_it = wait_for(held, process)
            finally:
                if process.is_alive():
                    os.kill(process.pid, signal.SIGKILL)
                join_or_kill(process)
            message = child_error(errors)
            assert got_it and not message, message or "the child never got the lock"
            assert process.exitcode == -signal.SIGKILL

            def recover():
                owner_died = mutex.acquire()  # bounded by in_thread's timeout: must not wait
                words[0] = 0  # repair the dead holder's half-done update
                mutex.mark_consistent()
                mutex.release()
                return owner_died

            assert in_thread(recover) is True
            assert words[0] == 0

            # After repair it is an ordinary mutex again, for any thread.
            def use():
                results = []
                for _ in range(3):
                    results.append(mutex.acquire())
                    words[0] += 1
                    mutex.release()
                return results

            assert in_thread(use) == [False, False, False]
            assert mutex.acquire() is False
            mutex.release()
            assert words[0] == 3
        finally:
            words = None  # drop the view's export so the segment can close
            mutex.close()


# ---------------------------------------------------------------------------------------------
# In one process


def aligned_memory(nbytes: int = MUTEX_NBYTES) -> np.ndarray:
    """8-byte aligned writable memory (numpy aligns its allocations to at least 16)."""
    return np.zeros(nbytes, dtype=np.uint8)


def test_mutex_nbytes():
    assert isinstance(MUTEX_NBYTES, int)
    # Room for pthread_mutex_t (40 bytes on x86_64 glibc, 48 on aarch64), in whole words.
    assert MUTEX_NBYTES >= 48 and MUTEX_NBYTES % 8 == 0


def test_acquire_release_in_one_thread():
    mutex = SharedMutex(aligned_memory(), initialize=True)
    for _ in range(3):
        assert mutex.acquire() is False
        mutex.release()
    mutex.close()


def test_a_second_handle_on_the_same_memory_is_the_same_mutex():
    memory = aligned_memory()
    first = SharedMutex(memory, initialize=True)
    second = SharedMutex(memory)  # attach: initialize=False is the default
    got_it = threading.Event()

    def contend():
        second.acquire()
        got_it.set()
        second.release()

    assert first.acquire() is False
    thread = threading.Thread(target=contend, daemon=True)
    thread.start()
    # While `first` holds it, the other handle must not get through. (Not a timing check:
    # whatever the wait, getting through would be a bug.)
    thread.join(0.2)
    assert thread.is_alive() and not got_it.is_set()
    first.release()
    thread.join(TIMEOUT)
    assert got_it.is_set() and not thread.is_alive()
    first.close()
    second.close()


def test_thread_exiting_while_holding_reports_owner_died():
    """Robustness also covers a thread that ends while holding the lock (same robust list)."""
    mutex = SharedMutex(aligned_memory(), initialize=True)
    in_thread(mutex.acquire)  # that thread ends holding it

    def recover():
        owner_died = mutex.acquire()
        mutex.mark_consistent()
        mutex.release()
        return owner_died, mutex.acquire(), mutex.release()

    assert in_thread(recover) == (True, False, None)
    mutex.close()


def test_release_without_mark_consistent_makes_the_mutex_unrecoverable():
    """The documented contract: mark_consistent() before release() after an owner died."""
    mutex = SharedMutex(aligned_memory(), initialize=True)
    in_thread(mutex.acquire)

    def release_unrepaired():
        assert mutex.acquire() is True
        mutex.release()

    in_thread(release_unrepaired)
    with pytest.raises(OSError) as raised:
        in_thread(mutex.acquire)
    assert raised.value.errno == errno.ENOTRECOVERABLE
    mutex.close()


def test_release_by_a_non_owner_is_refused():
    mutex = SharedMutex(aligned_memory(), initialize=True)
    with pytest.raises(OSError) as raised:
        mutex.release()  # not held at all
    assert raised.value.errno == errno.EPERM
    assert mutex.acquire() is False
    with pytest.raises(OSError) as raised:
        in_thread(mutex.release)  # held, but by another thread
    assert raised.value.errno == errno.EPERM
    mutex.release()
    mutex.close()


def test_mark_consistent_on_a_consistent_mutex_is_refused():
    mutex = SharedMutex(aligned_memory(), initialize=True)
    assert mutex.acquire() is False
    with pytest.raises(OSError) as raised:
        mutex.mark_consistent()
    assert raised.value.errno == errno.EINVAL
    mutex.release()
    mutex.close()


def test_closed_mutex_refuses_every_call_and_frees_the_memory():
    memory = bytearray(MUTEX_NBYTES)
    mutex = SharedMutex(memory, initialize=True)
    mutex.close()
    mutex.close()  # idempotent
    memory.append(0)  # no exported buffer left: the bytearray can be resized
    for call in (mutex.acquire, mutex.release, mutex.mark_consistent):
        with pytest.raises(ValueError, match="closed"):
            call()


@pytest.mark.parametrize(
    "make_memory",
    [
        lambda: bytearray(MUTEX_NBYTES - 1),
        lambda: memoryview(aligned_memory(MUTEX_NBYTES + 8))[4:],
        lambda: memoryview(aligned_memory(MUTEX_NBYTES + 8))[1:],
    ],
    ids=["too-small", "misaligned-4", "misaligned-1"],
)
def test_invalid_memory_is_refused(make_memory):
    memory = make_memory()
    before = bytes(memory)
    with pytest.raises(ValueError, match="memory"):
        SharedMutex(memory, initialize=True)
    assert bytes(memory) == before  # nothing was initialized there


def test_read_only_or_non_buffer_memory_is_refused():
    # BufferError is what the buffer protocol raises; the class does not wrap it (yet).
    with pytest.raises((TypeError, BufferError)):
        SharedMutex(bytes(MUTEX_NBYTES), initialize=True)
    with pytest.raises(TypeError):
        SharedMutex([0] * MUTEX_NBYTES, initialize=True)


# ---------------------------------------------------------------------------------------------
# Entry point of a spawned child (run through runpy.run_path with CHILD_RUN_NAME).

if __name__ == CHILD_RUN_NAME:
    try:
        globals()[globals()["CHILD_FUNCTION"]](globals()["CHILD_PARAMS"])
    except BaseException:
        globals()["CHILD_ERRORS"].put(traceback.format_exc())
        raise
    finally:
        globals()["CHILD_ERRORS"].close()
        globals()["CHILD_ERRORS"].join_thread()
