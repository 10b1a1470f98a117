"""Every way an owner process ends, with real processes: what frees its segment, and what not.

- SIGTERM (docker stop, Kubernetes, Process.terminate()): the handler frees the segment and the
  process still dies of SIGTERM, or runs the program's own handler; SIG_IGN is left alone, and
  ``install_sigterm_handler(False)`` turns it off.
- multiprocessing children (fork, forkserver, spawn) that created a buffer free it when they
  return (fork and forkserver children end with os._exit) and when they are terminated; a
  closed buffer's finalizer never removes a same-named successor.
- A fork child that merely inherited the owner's handle never frees the parent's segment.
- SIGKILL and os._exit cannot free anything: ``ls`` reports the orphan and ``rm --orphans``
  removes it.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import time

import pytest

import cpprb_ray

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
if TESTS_DIR not in sys.path:  # spawn/forkserver children import the helpers by name
    sys.path.insert(0, TESTS_DIR)

import _ending_children  # noqa: E402

REPO = os.path.dirname(TESTS_DIR)
METHODS = [m for m in ("spawn", "forkserver", "fork")
           if m in multiprocessing.get_all_start_methods()]
TIMEOUT = 60.0

OWNER_SCRIPT = """
import os, select, signal, sys
import cpprb_ray
backend, setup = sys.argv[1], sys.argv[2]
if setup == "handler":
    def handler(signum, frame):
        print("handled", signum, flush=True)
        sys.exit(3)
    signal.signal(signal.SIGTERM, handler)
elif setup == "ignore":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
elif setup == "optout":
    cpprb_ray.install_sigterm_handler(False)
rb = cpprb_ray.PrioritizedReplayBuffer(8, {"obs": {"shape": 2}}, backend=backend,
                                       name=sys.argv[3])
rb.add(obs=[1.0, 2.0])
print(rb.name, flush=True)
if setup == "os_exit":
    os._exit(0)
# Wait for stdin in 50 ms slices, not in one read(): a signal that lands after the interpreter's
# last check for pending handlers and before read() blocks would otherwise never be handled
# (CPython runs Python handlers only between bytecodes; read() restarts on nothing it missed).
while not select.select([sys.stdin], [], [], 0.05)[0]:
    pass
sys.stdin.readline()
"""

FORKING_SCRIPT = """
import os, signal, sys, time
import cpprb_ray
rb = cpprb_ray.ReplayBuffer(8, {"obs": {}}, backend=sys.argv[1])
file = os.path.join("/dev/shm", rb.name) if rb.backend == "shm" else rb.name
statuses = []
for end in ("exit", "sigterm"):
    pid = os.fork()
    if pid == 0:  # the child holds the parent's owner handle
        rb.add(obs=1.0)
        if end == "sigterm":
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(30)
        sys.exit(0)  # runs atexit and multiprocessing's finalizers, as a normal exit does
    statuses.append(os.waitpid(pid, 0)[1])
print(statuses, os.path.exists(file), rb.get_stored_size(), flush=True)
rb.close()
print(os.path.exists(file), flush=True)
"""


def child_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH")) if p)
    return env


def file_of(backend: str, name: str) -> str:
    return os.path.join("/dev/shm", name) if backend == "shm" else name


def cli(*arguments: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cpprb_ray", *arguments], capture_output=True,
                          text=True, env=child_env(), timeout=TIMEOUT)


class OwnerProcess:
    """A plain Python process that owns a buffer and waits on stdin."""

    def __init__(self, backend: str, setup: str = "default") -> None:
        self.backend = backend
        self.process = subprocess.Popen(
            [sys.executable, "-c", OWNER_SCRIPT, backend, setup,
             # Its own name: the sweep of assert_orphan_listed_and_removed takes only it.
             f"cpprb_ray_test_ending_{os.getpid()}_{os.urandom(4).hex()}"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env())
        self.name = self.process.stdout.readline().strip()
        assert self.name, f"the owner printed no name: {self.process.stderr.read()}"
        self.file = file_of(backend, self.name)

    def wait(self) -> int:
        return self.process.wait(timeout=TIMEOUT)

    def cleanup(self) -> None:
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
        self.process.communicate(timeout=TIMEOUT)
        if os.path.exists(self.file):
            os.unlink(self.file)


def test_sigterm_frees_and_still_dies_of_sigterm(backend):
    owner = OwnerProcess(backend)
    try:
        assert os.path.exists(owner.file)
        owner.process.send_signal(signal.SIGTERM)
        assert owner.wait() == -signal.SIGTERM          # killed by SIGTERM, as without us
        assert not os.path.exists(owner.file)
    finally:
        owner.cleanup()


def test_sigterm_chains_to_the_programs_handler(backend):
    owner = OwnerProcess(backend, "handler")
    try:
        owner.process.send_signal(signal.SIGTERM)
        assert owner.wait() == 3                        # the program's handler ran: sys.exit(3)
        assert owner.process.stdout.read().split() == ["handled", str(int(signal.SIGTERM))]
        assert not os.path.exists(owner.file)
    finally:
        owner.cleanup()


def test_sigterm_ignored_stays_ignored(backend):
    owner = OwnerProcess(backend, "ignore")
    try:
        owner.process.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        assert owner.process.poll() is None             # SIG_IGN was not replaced
        assert os.path.exists(owner.file)
        owner.process.stdin.write("\n")
        owner.process.stdin.flush()
        assert owner.wait() == 0                        # a normal exit still frees it
        assert not os.path.exists(owner.file)
    finally:
        owner.cleanup()


CREATING_SCRIPT = """
import sys
import cpprb_ray
backend, name = sys.argv[1], sys.argv[2]
# 2**24 rows: about 680 MiB, whose reservation alone (posix_fallocate) takes 0.1 s or more.
cpprb_ray.PrioritizedReplayBuffer(2**24, {"obs": {"shape": 4}}, backend=backend, name=name)
print("created", flush=True)
"""


@pytest.mark.parametrize("delay", [0.01, 0.25])
def test_sigterm_while_the_segment_is_being_created_frees_it(backend, delay):
    """The segment's file exists from its open on, and filling it (the reservation, the header,
    the huge pages) takes a while for a large buffer: a SIGTERM then frees it too, and the
    process still dies of SIGTERM. A file with fewer bytes allocated than its size at the kill
    (tmpfs allocates them as the reservation goes) says that the kill landed inside it."""
    name = f"cpprb_ray_test_creating_{os.getpid()}_{int(delay * 1000)}"
    file = os.path.join("/dev/shm", name)   # both backends' default place
    process = subprocess.Popen(
        [sys.executable, "-c", CREATING_SCRIPT, backend, name], stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, env=child_env())
    try:
        deadline = time.monotonic() + TIMEOUT
        while not os.path.exists(file):
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "the segment never appeared"
            time.sleep(0.0005)
        time.sleep(delay)
        stat = os.stat(file)
        process.send_signal(signal.SIGTERM)
        size, allocated = stat.st_size, stat.st_blocks * 512
        out, err = process.communicate(timeout=TIMEOUT)
        assert process.returncode == -signal.SIGTERM, err
        assert "created" not in out
        assert not os.path.exists(file), f"left behind (size {size} at the kill)"
        if delay < 0.1:
            assert allocated < size or size == 0, "the kill did not land inside the reservation"
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate(timeout=TIMEOUT)
        if os.path.exists(file):
            os.unlink(file)


def assert_orphan_listed_and_removed(owner: OwnerProcess, pid: int) -> None:
    assert os.path.exists(owner.file)
    listed = [line.split() for line in cli("ls").stdout.splitlines()[1:]]
    mine = [fields for fields in listed if fields[0] == owner.name]
    assert len(mine) == 1 and int(mine[0][5]) == pid and mine[0][6] == "no", listed
    result = cli("rm", "--orphans", "--prefix", os.path.basename(owner.file))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [f"removed orphan {owner.name}"]
    assert not os.path.exists(owner.file)


def test_sigterm_handler_opt_out_leaves_an_orphan(backend):
    owner = OwnerProcess(backend, "optout")
    try:
        owner.process.send_signal(signal.SIGTERM)
        assert owner.wait() == -signal.SIGTERM
        assert_orphan_listed_and_removed(owner, owner.process.pid)
    finally:
        owner.cleanup()


@pytest.mark.parametrize("ending", ["sigkill", "os_exit"])
def test_what_cannot_free_leaves_an_orphan_for_rm(backend, ending):
    owner = OwnerProcess(backend, "os_exit" if ending == "os_exit" else "default")
    try:
        if ending == "sigkill":
            owner.process.kill()
            assert owner.wait() == -signal.SIGKILL
        else:
            assert owner.wait() == 0
        assert_orphan_listed_and_removed(owner, owner.process.pid)
    finally:
        owner.cleanup()


def receive(conn, tag: str):
    assert conn.poll(TIMEOUT), f"no {tag!r} from the child within {TIMEOUT} s"
    got, payload = conn.recv()
    assert got != "error", f"child failed:\n{payload}"
    assert got == tag, (got, payload)
    return payload


def finish(process, expected_exitcode: int) -> None:
    process.join(TIMEOUT)
    if process.is_alive():
        process.kill()
        process.join(10)
        pytest.fail(f"child {process.pid} hung")
    assert process.exitcode == expected_exitcode


@pytest.mark.filterwarnings("ignore:.*fork.*:DeprecationWarning")
@pytest.mark.parametrize("method", METHODS)
def test_child_owner_frees_on_return(backend, method):
    ctx = multiprocessing.get_context(method)
    parent_conn, child_conn = ctx.Pipe()
    process = ctx.Process(target=_ending_children.create_and_end,
                          args=(child_conn, backend, None, "return"))
    process.start()
    name = receive(parent_conn, "name")
    try:
        assert os.path.exists(file_of(backend, name))
        with cpprb_ray.attach(name) as view:
            assert view.get_stored_size() == 1 and not view.is_owner
        parent_conn.send("go")
        finish(process, 0)
        assert not os.path.exists(file_of(backend, name))
    finally:
        process.join(TIMEOUT)
        cpprb_ray.remove_buffer(name)


@pytest.mark.filterwarnings("ignore:.*fork.*:DeprecationWarning")
@pytest.mark.parametrize("method", METHODS)
def test_child_owner_frees_on_terminate(backend, method):
    ctx = multiprocessing.get_context(method)
    parent_conn, child_conn = ctx.Pipe()
    process = ctx.Process(target=_ending_children.create_and_end,
                          args=(child_conn, backend, None, "block"))
    process.start()
    name = receive(parent_conn, "name")
    try:
        assert os.path.exists(file_of(backend, name))
        process.terminate()
        finish(process, -signal.SIGTERM)
        assert not os.path.exists(file_of(backend, name))
    finally:
        process.join(TIMEOUT)
        cpprb_ray.remove_buffer(name)


@pytest.mark.filterwarnings("ignore:.*fork.*:DeprecationWarning")
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("how", ["closed", "removed"])
def test_child_owner_never_frees_a_successor(backend, method, how):
    """The child's buffer is closed (by the child) or removed (by somebody else), another buffer
    takes the name, the child exits: its exit finalizers must leave the successor alone."""
    name = "cpprb_ray_test_successor_" + os.urandom(6).hex()
    ctx = multiprocessing.get_context(method)
    parent_conn, child_conn = ctx.Pipe()
    process = ctx.Process(target=_ending_children.create_and_end,
                          args=(child_conn, backend, name,
                                "close_then_wait" if how == "closed" else "return"))
    process.start()
    location = receive(parent_conn, "name")
    successor = None
    try:
        if how == "closed":
            assert receive(parent_conn, "closed") == location
        else:
            assert cpprb_ray.remove_buffer(location) is True
        assert not os.path.exists(file_of(backend, location))
        successor = cpprb_ray.ReplayBuffer(4, {"x": {}}, backend=backend, name=name)
        assert successor.name == location
        parent_conn.send("go")
        finish(process, 0)
        assert os.path.exists(file_of(backend, location))
        successor.add(x=1.0)
        assert successor.get_stored_size() == 1
    finally:
        process.join(TIMEOUT)
        if successor is not None:
            successor.close()
    assert not os.path.exists(file_of(backend, location))


@pytest.mark.filterwarnings("ignore:.*fork.*:DeprecationWarning")
@pytest.mark.skipif("fork" not in METHODS, reason="no fork start method on this platform")
@pytest.mark.parametrize("end", ["return", "terminate"])
def test_fork_child_holding_the_owner_handle_never_frees(backend, end):
    ctx = multiprocessing.get_context("fork")
    rb = cpprb_ray.ReplayBuffer(8, _ending_children.ENV, backend=backend)
    try:
        parent_conn, child_conn = ctx.Pipe()
        # With fork, Process arguments are inherited, not pickled: the child holds the owner
        # handle itself, finalizer and all.
        process = ctx.Process(target=_ending_children.use_inherited,
                              args=(child_conn, rb, "block" if end == "terminate" else "return"))
        process.start()
        assert receive(parent_conn, "added") == (False, 1)
        if end == "terminate":
            process.terminate()
        finish(process, -signal.SIGTERM if end == "terminate" else 0)
        assert os.path.exists(file_of(backend, rb.name))
        with cpprb_ray.attach(rb.name) as view:
            assert view.get_stored_size() == 1
        assert rb.is_owner
    finally:
        rb.close()
    assert not os.path.exists(file_of(backend, rb.name))


def test_os_fork_child_holding_the_owner_handle_never_frees(backend):
    """Plain os.fork (not multiprocessing): a child that exits normally (atexit and
    multiprocessing's exit finalizers run) or dies of SIGTERM (our handler runs) keeps the
    parent's segment."""
    result = subprocess.run([sys.executable, "-c", FORKING_SCRIPT, backend], capture_output=True,
                            text=True, env=child_env(), timeout=TIMEOUT)
    assert result.returncode == 0, result.stderr
    first, second = result.stdout.splitlines()
    assert first == f"[0, {int(signal.SIGTERM)}] True 2"    # exit 0, killed by SIGTERM; kept
    assert second == "False"                                # the owner's close frees it
