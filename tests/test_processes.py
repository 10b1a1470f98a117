"""Real child processes (spawn, forkserver, fork) and threads sharing one buffer in place.

Children get the buffer by pickle (as a Process argument, or as pickled bytes), inherit it (fork)
or attach it by name; they see the parent's rows, the parent sees theirs, and after they exit --
however they exit -- the segment is still there and the owner still works (the resource-tracker
trap of CPython < 3.13 must not bite: a process that attached must never unlink).
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import subprocess
import sys
import threading
import time

import pytest

import cpprb_ray

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
if TESTS_DIR not in sys.path:  # spawn/forkserver children import _workers from the parent's path
    sys.path.insert(0, TESTS_DIR)

import _workers  # noqa: E402
from _workers import ENV, rows  # noqa: E402

REPO = os.path.dirname(TESTS_DIR)
METHODS = [m for m in ("spawn", "forkserver", "fork")
           if m in multiprocessing.get_all_start_methods()]
TIMEOUT = 120.0

if "forkserver" in METHODS:
    # Collection imports every test module before any test starts a forkserver, so this takes
    # effect: forkserver children (here and in test_crash) then start in milliseconds.
    multiprocessing.get_context("forkserver").set_forkserver_preload(["numpy", "cpprb_ray"])

# (transport, how the child finishes): every way in, every way out.
CHILDREN = [("arg", "return"), ("pickled", "exit"), ("name", "close"), ("class", "drop")]


def segment_file(rb) -> str:
    return os.path.join("/dev/shm", rb.name) if rb.backend == "shm" else rb.name


def reap(processes) -> None:
    """Join our children; SIGKILL (by pid) any that outlived the timeout, then fail."""
    deadline = time.monotonic() + TIMEOUT
    stuck = []
    for process in processes:
        process.join(max(0.1, deadline - time.monotonic()))
        if process.is_alive():
            stuck.append(process.pid)
            process.kill()
            process.join(10)
    assert not stuck, f"children {stuck} hung"


def receive(conn, what: str):
    assert conn.poll(TIMEOUT), f"no {what} from a child within {TIMEOUT} s"
    tag, payload = conn.recv()
    assert tag != "error", f"child failed:\n{payload}"
    return payload


@pytest.fixture
def owner(backend):
    rb = cpprb_ray.PrioritizedReplayBuffer(4096, ENV, backend=backend, seed=3)
    try:
        yield rb
    finally:
        rb.close()


@pytest.mark.filterwarnings("ignore:.*fork.*:DeprecationWarning")
@pytest.mark.parametrize("method", METHODS)
def test_children_share_the_buffer_in_place(owner, method):
    ctx = multiprocessing.get_context(method)
    owner.add(**rows(0, 100))
    processes, conns = [], []
    try:
        for k, (how, end) in enumerate(CHILDREN):
            handle = {"arg": owner, "pickled": pickle.dumps(owner)}.get(how, owner.name)
            parent_end, child_end = ctx.Pipe()
            process = ctx.Process(target=_workers.process_child,
                                  args=(child_end, handle, how, 10_000 * (k + 1), 50, end))
            process.start()
            child_end.close()
            processes.append(process)
            conns.append(parent_end)
        attached = [receive(conn, "attach report") for conn in conns]
        # Written after every child attached: they must see it live, not a copy.
        owner.add(**rows(100, 100))
        for conn in conns:
            conn.send((0, 200))
        results = [receive(conn, "result") for conn in conns]
        reap(processes)
    finally:
        for process in processes:
            if process.is_alive():
                process.kill()
                process.join(10)
        for conn in conns:
            conn.close()

    assert [p.exitcode for p in processes] == [0] * len(CHILDREN)
    for (how, end), info, result in zip(CHILDREN, attached, results):
        assert info["pid"] != os.getpid()
        assert info["is_owner"] is False, (how, method)  # even the handle fork inherited
        assert info["type"] == "PrioritizedReplayBuffer"
        assert info["stored"] >= 100
        assert result["missing_parent_rows"] == [], (how, end)
        assert result["problems"] == [] and result["sampled_known"], (how, end)
        assert result["applied"] >= 0
        if end == "close":
            assert result["closed"] is True

    # The children are gone; the segment is not, and the owner still works.
    assert os.path.exists(segment_file(owner))
    assert owner.is_owner and not owner.closed
    everything = owner.get_all_transitions()
    assert _workers.torn(everything).size == 0
    expected = set(range(200))
    for k in range(len(CHILDREN)):
        expected.update(range(10_000 * (k + 1), 10_000 * (k + 1) + 50))
    assert set(_workers.serials_of(everything).tolist()) == expected
    assert owner.get_stored_size() == len(expected) == owner._store.rows_added
    batch = owner.sample(128)
    assert _workers.check_sample(owner, batch) == []
    owner.add(**rows(500, 10))
    assert owner.get_stored_size() == len(expected) + 10
    with cpprb_ray.attach(owner.name) as again:
        assert again.get_stored_size() == len(expected) + 10


@pytest.mark.filterwarnings("ignore:.*fork.*:DeprecationWarning")
@pytest.mark.parametrize("method", METHODS)
def test_segment_survives_children_that_only_attach(owner, method):
    """Children that attach by name and exit at once (the resource-tracker trap)."""
    ctx = multiprocessing.get_context(method)
    owner.add(**rows(0, 10))
    processes = [ctx.Process(target=_workers.open_buffer, args=(owner.name, how))
                 for how in ("name", "class", "name")]
    for process in processes:
        process.start()
    reap(processes)
    assert [p.exitcode for p in processes] == [0, 0, 0]
    assert os.path.exists(segment_file(owner))
    assert owner.sample(4)["obs"].shape == (4, 4)


@pytest.mark.skipif("fork" not in METHODS, reason="no fork on this platform")
@pytest.mark.filterwarnings("ignore:.*fork.*:DeprecationWarning")
def test_forked_children_do_not_sample_alike(backend):
    """Handles inherited through fork must not share a random stream: every worker would
    draw the same 'random' rows (unpickled handles already get a fresh seed)."""
    rb = cpprb_ray.PrioritizedReplayBuffer(100_000, ENV, backend=backend)
    try:
        rb.add(**rows(0, 100_000))
        ctx = multiprocessing.get_context("fork")
        samples = []
        for _ in range(2):
            receiver, sender = ctx.Pipe(duplex=False)
            child = ctx.Process(target=_workers.sample_indexes, args=(sender, rb, 16))
            child.start()
            sender.close()
            samples.append(receive_raw(receiver))
            reap([child])
        samples.append(rb.sample(16)["indexes"].tolist())
        assert samples[0] != samples[1], "two forked children sampled the same rows"
        assert samples[2] not in samples[:2], "a forked child sampled the parent's rows"
    finally:
        rb.close()


def receive_raw(conn):
    assert conn.poll(TIMEOUT), f"nothing from a child within {TIMEOUT} s"
    return conn.recv()


@pytest.mark.parametrize("method", [m for m in METHODS if m != "fork"])
def test_views_outlive_the_owner(backend, method):
    """The owner closes (and unlinks) while a child holds a view: the child keeps working on
    the memory, and when it exits nothing is left behind."""
    ctx = multiprocessing.get_context(method)
    rb = cpprb_ray.PrioritizedReplayBuffer(100, ENV, backend=backend)
    path = segment_file(rb)
    conn, child_end = ctx.Pipe()
    child = ctx.Process(target=_workers.outlive_the_owner, args=(child_end, rb))
    try:
        rb.add(**rows(0, 10))
        child.start()
        child_end.close()
        assert receive(conn, "attach report") == 10
    finally:
        rb.close()
    try:
        assert not os.path.exists(path)
        conn.send("closed")
        result = receive(conn, "result")
        reap([child])
    finally:
        if child.is_alive():
            child.kill()
            child.join(10)
        conn.close()
    assert child.exitcode == 0
    assert result == {"stored": 30, "problems": [], "owner": False}
    assert not os.path.exists(path)


_ATTACH_SCRIPT = r"""
import sys
sys.path.insert(0, {tests!r})
import cpprb_ray
from _workers import check_sample, rows
view = cpprb_ray.attach({name!r})
assert not view.is_owner
view.add(**rows(1000, 5))
assert check_sample(view, view.sample(8)) == []
{ending}
"""


@pytest.mark.parametrize("ending", ["pass", "view.close()", "sys.exit(0)", "del view"])
def test_segment_survives_an_unrelated_interpreter(owner, ending):
    """A separate Python process (like a Ray worker: not a multiprocessing child, with its own
    resource tracker) attaches by name and exits normally: the segment must stay. With
    multiprocessing.shared_memory.SharedMemory on CPython < 3.13 it would be unlinked here."""
    owner.add(**rows(0, 10))
    script = _ATTACH_SCRIPT.format(tests=TESTS_DIR, name=owner.name, ending=ending)
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                          text=True, timeout=TIMEOUT)
    assert done.returncode == 0, done.stderr
    assert "leaked" not in done.stderr, done.stderr
    assert os.path.exists(segment_file(owner))
    assert owner.get_stored_size() == 15
    assert set(_workers.serials_of(owner.get_all_transitions()).tolist()) == (
        set(range(10)) | set(range(1000, 1005)))


_FORK_SCRIPT = r"""
import gc, os, sys
sys.path.insert(0, {tests!r})
import cpprb_ray
from _workers import ENV, rows
rb = cpprb_ray.PrioritizedReplayBuffer(64, ENV, backend={backend!r})
rb.add(**rows(0, 8))
path = os.path.join("/dev/shm", rb.name) if rb.backend == "shm" else rb.name
for ending in ("close", "drop", "keep"):
    pid = os.fork()
    if pid == 0:
        # The child inherited the OWNER handle; it is not the owner here.
        assert not rb.is_owner, "forked child thinks it owns the buffer"
        rb.add(**rows(100, 4))
        if ending == "close":
            rb.close()
        elif ending == "drop":
            del rb
            gc.collect()
        sys.exit(0)   # normal interpreter exit: atexit hooks and finalizers run
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, (ending, status)
    assert os.path.exists(path), "a forked child's exit (%s) removed the segment" % ending
    assert rb.is_owner
    rb.sample(4)
    with cpprb_ray.attach(rb.name) as view:
        assert view.get_stored_size() == rb.get_stored_size()
assert rb.get_stored_size() == 20, rb.get_stored_size()
rb.close()
assert not os.path.exists(path), "the owner's close left the segment"
print("OK")
"""


@pytest.mark.skipif("fork" not in METHODS, reason="no fork on this platform")
def test_forked_child_exit_and_close_keep_the_segment(backend):
    """os.fork children that inherit the owner handle and exit through the interpreter (so the
    handle's finalizer and atexit run), after close(), after dropping it, or just exiting."""
    script = _FORK_SCRIPT.format(tests=TESTS_DIR, backend=backend)
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                          text=True, timeout=TIMEOUT)
    assert done.returncode == 0 and done.stdout.strip() == "OK", done.stdout + done.stderr


def test_threads_share_one_handle(backend):
    """Two adding threads and two sampling/updating threads on one handle."""
    rb = cpprb_ray.PrioritizedReplayBuffer(1000, ENV, backend=backend)
    stop = threading.Event()
    problems: list = []
    errors: list = []

    def guarded(function, *args):
        try:
            function(*args)
        except BaseException as error:  # reported below
            errors.append(repr(error))

    writers = [threading.Thread(target=guarded, args=(_workers.thread_writer, rb, k * 100_000,
                                                      3000, 1 + 7 * k))
               for k in range(2)]
    samplers = [threading.Thread(target=guarded, args=(_workers.thread_sampler, rb, stop,
                                                       problems))
                for _ in range(2)]
    try:
        for thread in samplers + writers:
            thread.daemon = True
            thread.start()
        for thread in writers:
            thread.join(TIMEOUT)
        stop.set()
        for thread in samplers:
            thread.join(TIMEOUT)
        assert not any(t.is_alive() for t in writers + samplers), "a thread hung"
        assert errors == [] and problems[:5] == []
        assert rb._store.rows_added == 6000
        assert rb.get_stored_size() == 1000
        everything = rb.get_all_transitions()
        assert _workers.torn(everything).size == 0 and len(everything["act"]) == 1000
        assert _workers.tree_problems(rb._store.check_tree()) == []
    finally:
        stop.set()
        if not any(t.is_alive() for t in writers + samplers):
            rb.close()
