"""The orphan tools: ``python -m cpprb_ray ls | rm NAME | rm --orphans`` and their functions.

An owner killed with SIGKILL cannot unlink its segment; these tests kill a real owner process,
check that ``ls`` reports it dead, that ``rm --orphans`` removes its segment but not the segment
of an owner that is alive, and that views of a removed segment keep working.

Every sweep here is given the name prefix of the buffers its test made (the `segment_prefix`
fixture): a sweep of the whole host would remove the orphans of anybody else's job on it, a
crashed training run's buffer waiting to be inspected or another test run's deliberate orphan.
The one sweep without a prefix runs in a private /dev/shm (its own mount namespace).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest

import cpprb_ray
from cpprb_ray import PrioritizedReplayBuffer, ReplayBuffer, _segment
from cpprb_ray.__main__ import main

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(cpprb_ray.__file__)))

OWNER_SCRIPT = """
import sys, time
from cpprb_ray import PrioritizedReplayBuffer, ReplayBuffer
from cpprb_ray.__main__ import main
cls = PrioritizedReplayBuffer if sys.argv[2] == "per" else ReplayBuffer
rb = cls(16, {"obs": {"shape": 2}}, backend=sys.argv[1], name=sys.argv[3])
rb.add(obs=[[1.0, 2.0], [3.0, 4.0]])
print(rb.name, flush=True)
time.sleep(120)
"""


def child_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO_ROOT, env.get("PYTHONPATH")) if p)
    return env


def cli(*arguments: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cpprb_ray", *arguments], capture_output=True,
                          text=True, env=child_env(), timeout=60)


def file_of(backend: str, name: str) -> str:
    return os.path.join("/dev/shm", name) if backend == "shm" else name


def named(prefix: str) -> str:
    """A fresh buffer name under `prefix`."""
    return prefix + os.urandom(4).hex()


class Owner:
    """A child process that owns a buffer and sleeps until it is killed."""

    def __init__(self, backend: str, prefix: str, kind: str = "per") -> None:
        self.backend = backend
        self.process = subprocess.Popen(
            [sys.executable, "-c", OWNER_SCRIPT, backend, kind, named(prefix)],
            stdout=subprocess.PIPE, text=True, env=child_env())
        self.name = self.process.stdout.readline().strip()
        assert self.name, "the owner process printed no buffer name"
        self.pid = self.process.pid

    @property
    def file(self) -> str:
        return file_of(self.backend, self.name)

    def kill(self) -> None:
        if self.process.poll() is None:
            os.kill(self.pid, signal.SIGKILL)
        self.process.wait(timeout=30)      # reaped: a zombie would still look alive
        self.process.stdout.close()

    def cleanup(self) -> None:
        self.kill()
        if os.path.exists(self.file):
            os.unlink(self.file)


def ls_rows() -> dict:
    """`python -m cpprb_ray ls` as {name: (backend, size text, rows, pid, alive)}."""
    result = cli("ls")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split()[:2] == ["NAME", "BACKEND"] and "ALIVE" in lines[0]
    rows = {}
    for line in lines[1:]:
        fields = line.split()
        rows[fields[0]] = (fields[1], " ".join(fields[2:4]), fields[4], int(fields[5]), fields[6])
    return rows


def entry_for(name: str):
    matches = [entry for entry in cpprb_ray.list_buffers() if entry["name"] == name]
    assert len(matches) <= 1
    return matches[0] if matches else None


def test_killed_owner_is_an_orphan(backend, segment_prefix):
    dead, alive = Owner(backend, segment_prefix), Owner(backend, segment_prefix, "uniform")
    view = None
    try:
        view = PrioritizedReplayBuffer.attach(dead.name)
        assert entry_for(dead.name)["owner_alive"] is True

        dead.kill()
        rows = ls_rows()
        assert rows[dead.name][0] == backend and rows[dead.name][3] == dead.pid
        assert rows[dead.name][2] == "2/16" and rows[dead.name][1].endswith("KiB")
        assert rows[dead.name][4] == "no"
        assert rows[alive.name][4] == "yes" and rows[alive.name][3] == alive.pid
        entry = entry_for(dead.name)
        assert entry["owner_alive"] is False and entry["owner_pid"] == dead.pid
        assert entry["backend"] == backend and entry["prioritized"] is True
        assert entry["capacity"] == 16 and entry["stored"] == 2
        assert entry["size"] == os.path.getsize(dead.file)
        assert entry_for(alive.name)["owner_alive"] is True
        assert entry_for(alive.name)["prioritized"] is False

        result = cli("rm", "--orphans", "--prefix", segment_prefix)
        assert result.returncode == 0, result.stderr
        assert result.stdout.splitlines() == [f"removed orphan {dead.name}"]
        assert not os.path.exists(dead.file)
        assert os.path.exists(alive.file)                  # its owner lives: not an orphan
        assert entry_for(dead.name) is None and entry_for(alive.name) is not None

        # The view of the removed orphan still works until it closes.
        np.testing.assert_array_equal(view.get_all_transitions()["obs"], [[1, 2], [3, 4]])
        view.add(obs=[5.0, 6.0])
        assert view.sample(3)["obs"].shape == (3, 2) and view.get_stored_size() == 3

        # rm NAME removes a buffer whatever its owner's state.
        result = cli("rm", alive.name)
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == f"removed {alive.name}"
        assert not os.path.exists(alive.file)
        assert alive.process.poll() is None                # the owner itself is not touched
    finally:
        if view is not None:
            view.close()
        dead.cleanup()
        alive.cleanup()


def test_functions_on_orphans(backend, segment_prefix):
    dead = Owner(backend, segment_prefix)
    try:
        with PrioritizedReplayBuffer(8, {"x": {}}, backend=backend,
                                     name=named(segment_prefix)) as mine:
            entry = entry_for(mine.name)
            assert entry["owner_pid"] == os.getpid() and entry["owner_alive"] is True
            dead.kill()
            assert entry_for(dead.name)["owner_alive"] is False
            removed = cpprb_ray.remove_orphans(prefix=segment_prefix)
            assert removed == [dead.name]
            assert not os.path.exists(dead.file) and os.path.exists(file_of(backend, mine.name))
            assert cpprb_ray.remove_buffer(dead.name) is False      # already gone
    finally:
        dead.cleanup()


def test_remove_buffer_function(backend):
    rb = ReplayBuffer(8, {"x": {}}, backend=backend)
    try:
        rb.add(x=[1.0, 2.0])
        path = file_of(backend, rb.name)
        assert cpprb_ray.remove_buffer(rb.name) is True
        assert not os.path.exists(path)
        assert entry_for(rb.name) is None
        rb.add(x=3.0)                                  # the handle keeps its mapping
        assert rb.get_stored_size() == 3 and rb.sample(2)["x"].shape == (2, 1)
        with pytest.raises(FileNotFoundError):
            ReplayBuffer.attach(rb.name)
        assert cpprb_ray.remove_buffer(rb.name) is False
    finally:
        rb.close()                                     # the name is gone already: no error


def test_reused_pid_is_not_a_live_owner(backend):
    """A segment whose recorded owner pid now belongs to another process (different start time)
    counts as orphaned."""
    with PrioritizedReplayBuffer(8, {"x": {}}, backend=backend) as rb:
        with open(file_of(backend, rb.name), "rb") as handle:
            data = bytearray(handle.read())
    header = _segment.read_header(data)
    start, length = header["layout_offset"], header["layout_length"]
    document = json.loads(bytes(data[start:start + length]))
    assert document["meta"]["owner_pid"] == os.getpid()
    document["meta"]["owner_start"] = 1                # our pid, somebody else's start time
    text = json.dumps(document).encode()
    assert len(text) <= length
    data[start:start + length] = text.ljust(length, b" ")
    name = "cpprb_ray_test_reused_" + os.urandom(6).hex()
    path = os.path.join("/dev/shm", name)
    with open(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600), "wb") as handle:
        handle.write(data)
    try:
        entry = [e for e in cpprb_ray.list_buffers() if e["path"] == path]
        assert len(entry) == 1
        assert entry[0]["owner_pid"] == os.getpid() and entry[0]["owner_alive"] is False
    finally:
        os.unlink(path)


def test_rm_errors(capsys):
    name = "cpprb_ray_test_absent_" + os.urandom(6).hex()
    result = cli("rm", name)
    assert result.returncode == 1 and "no such buffer" in result.stderr
    assert cpprb_ray.remove_buffer(name) is False

    # Something that is not a buffer is refused, and kept.
    path = os.path.join("/dev/shm", "cpprb_ray_test_foreign_" + os.urandom(6).hex())
    with open(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600), "wb") as handle:
        handle.write(b"not a buffer" * 1000)
    try:
        result = cli("rm", os.path.basename(path))
        assert result.returncode == 1 and "refused" in result.stderr
        assert os.path.exists(path)
        assert main(["rm", path]) == 1                 # as a path (mmap) too
        assert "refused" in capsys.readouterr().err
        with pytest.raises(ValueError):
            cpprb_ray.remove_buffer(path)
        assert os.path.exists(path)
        assert all(entry["path"] != path for entry in cpprb_ray.list_buffers())
    finally:
        os.unlink(path)

    result = cli("rm")                                 # neither NAME nor --orphans
    assert result.returncode == 2 and "--orphans" in result.stderr
    with pytest.raises(SystemExit) as exit_info:
        main(["frobnicate"])
    assert exit_info.value.code == 2
    with pytest.raises(SystemExit) as exit_info:
        main(["rm"])
    assert exit_info.value.code == 2


def test_main_in_process(capsys, backend):
    """The CLI's main() called directly (as the cpprb-ray console script does)."""
    with PrioritizedReplayBuffer(4, {"x": {}}, backend=backend) as rb:
        assert main(["ls"]) == 0
        out = capsys.readouterr().out
        line = [row for row in out.splitlines() if row.split()[0] == rb.name]
        assert len(line) == 1 and line[0].split()[-1] == "yes"
        assert str(os.getpid()) in line[0].split()
        assert main(["rm", rb.name]) == 0
        assert capsys.readouterr().out.strip() == f"removed {rb.name}"
        assert main(["rm", rb.name]) == 1


def test_wide_buffer_is_listed_and_removable(backend):
    env = {f"column_{i:04d}": {} for i in range(1200)}     # ~100 KB of layout JSON
    rb = ReplayBuffer(2, env, backend=backend)
    try:
        entry = entry_for(rb.name)
        assert entry is not None and entry["owner_alive"] is True
        assert cpprb_ray.remove_buffer(rb.name) is True
    finally:
        rb.close()


NAMESPACED_OWNER = """
import sys
import cpprb_ray
rb = cpprb_ray.PrioritizedReplayBuffer(16, {"obs": {"shape": 2}}, backend=sys.argv[1],
                                       name=sys.argv[2])
rb.add(obs=[1.0, 2.0])
print(rb.name, flush=True)
sys.stdin.readline()
"""


def test_owner_in_another_pid_namespace_is_unknown(backend, segment_prefix):
    """A live owner in another pid namespace sharing /dev/shm (a container with --ipc=host)
    has a pid that means nothing here (it is pid 1 there): ls says "unknown", rm --orphans
    keeps its buffer unless --force."""
    probe = subprocess.run(["unshare", "-p", "-f", "--mount-proc", "true"], capture_output=True,
                           text=True, timeout=60)
    if probe.returncode != 0:
        pytest.skip(f"cannot make a pid namespace here: {probe.stderr.strip()}")
    owner = subprocess.Popen(
        ["unshare", "-p", "-f", "--mount-proc", "--kill-child", sys.executable, "-c",
         NAMESPACED_OWNER, backend, named(segment_prefix)], stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, text=True, env=child_env())
    name = owner.stdout.readline().strip()
    try:
        assert name, "the namespaced owner printed no name"
        entry = entry_for(name)
        assert entry["owner_status"] == "unknown" and entry["owner_alive"] is False
        assert entry["owner_pid"] == 1 and "another pid namespace" in entry["owner_why"]
        listed = cli("ls")
        assert ls_rows()[name][3:] == (1, "unknown")
        assert f"{name}: owner unknown: its owner (pid 1) runs in another pid namespace" in (
            listed.stderr)

        result = cli("rm", "--orphans", "--prefix", segment_prefix)
        assert result.returncode == 0, result.stderr
        assert name not in result.stdout
        # (Only an outside sweep fails this: a cpprb_ray without namespaces in its metadata,
        # run by somebody else's `rm --orphans` on this host, takes pid 1 for a dead owner.)
        assert os.path.exists(file_of(backend, name)), "removed by another process"
        assert f"skipped {name}: its owner (pid 1) runs in another pid namespace" in result.stderr
        assert "--force" in result.stderr
        assert os.path.exists(file_of(backend, name)) and owner.poll() is None
        assert cpprb_ray.remove_orphans(prefix=segment_prefix) == []
        assert os.path.exists(file_of(backend, name))

        result = cli("rm", "--orphans", "--force", "--prefix", segment_prefix)
        assert result.returncode == 0, result.stderr
        assert f"removed orphan {name}" in result.stdout.splitlines()
        assert not os.path.exists(file_of(backend, name))
    finally:
        owner.communicate("\n", timeout=60)
        if name and os.path.exists(file_of(backend, name)):
            os.unlink(file_of(backend, name))
    assert owner.returncode == 0


def test_rm_of_what_is_not_a_buffer_is_a_message(tmp_path):
    directory = os.path.join("/dev/shm", "cpprb_ray_test_directory_" + os.urandom(6).hex())
    os.mkdir(directory)
    try:
        for target in (os.path.basename(directory), str(tmp_path)):   # as a name, as a path
            result = cli("rm", target)
            assert result.returncode == 1
            assert f"refused {target}:" in result.stderr and "is a directory" in result.stderr
            assert "Traceback" not in result.stderr
        with pytest.raises(ValueError, match="is a directory, not a cpprb_ray buffer"):
            cpprb_ray.remove_buffer(str(tmp_path))
        assert os.path.isdir(directory) and os.path.isdir(tmp_path)
    finally:
        os.rmdir(directory)

    result = cli("rm", "--force", "somebuffer")
    assert result.returncode == 2 and "--force goes with --orphans" in result.stderr
    with pytest.raises(TypeError, match="force must be a bool"):
        cpprb_ray.remove_orphans(force="yes")


def test_damaged_header_does_not_break_ls_or_rm():
    """Our magic followed by garbage: its owner pid is any 64-bit number. `ls` still lists
    every buffer (that one as dead), and `rm NAME` removes it, without a traceback."""
    path = os.path.join("/dev/shm", "cpprb_ray_test_damaged_" + os.urandom(6).hex())
    with open(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600), "wb") as handle:
        handle.write(_segment.MAGIC + b"\xff" * 70000)
    try:
        with ReplayBuffer(4, {"x": {}}) as rb:
            rows = ls_rows()                     # asserts a zero exit status
            assert rows[rb.name][4] == "yes"
            assert rows[os.path.basename(path)][4] == "no"
            entry = entry_for(os.path.basename(path))
            assert entry["valid"] is False and entry["owner_status"] == "dead"
        result = cli("rm", os.path.basename(path))
        assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
        assert not os.path.exists(path)
    finally:
        if os.path.exists(path):
            os.unlink(path)


MAIN_THREAD_EXITS = """
import ctypes, os, sys, threading
import cpprb_ray
rb = cpprb_ray.ReplayBuffer(16, {"obs": {}}, backend=sys.argv[1], name=sys.argv[2])
def serve():
    rb.add(obs=1.0)
    print(rb.name, flush=True)
    sys.stdin.readline()
    rb.close()
    os._exit(0)   # the interpreter cannot finalize without its main thread
threading.Thread(target=serve).start()
ctypes.CDLL(None).pthread_exit(None)   # the main thread ends; the process goes on in serve()
"""


def test_owner_whose_main_thread_exited_is_alive(backend, segment_prefix):
    """A main thread that called pthread_exit is a zombie in /proc while the process runs on in
    its other threads: the owner is alive (stopped too), and `rm --orphans` keeps its buffer."""
    owner = subprocess.Popen([sys.executable, "-c", MAIN_THREAD_EXITS, backend,
                              named(segment_prefix)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                             env=child_env())
    name = owner.stdout.readline().strip()
    try:
        assert name, "the owner printed no name"
        assert entry_for(name)["owner_status"] == "alive"
        os.kill(owner.pid, signal.SIGSTOP)
        try:
            assert entry_for(name)["owner_status"] == "alive"
            result = cli("rm", "--orphans", "--prefix", segment_prefix)
            assert result.returncode == 0 and name not in result.stdout
            assert os.path.exists(file_of(backend, name))
        finally:
            os.kill(owner.pid, signal.SIGCONT)
    finally:
        owner.communicate("\n", timeout=60)
        if name and os.path.exists(file_of(backend, name)):
            os.unlink(file_of(backend, name))
    assert owner.returncode == 0
    assert not os.path.exists(file_of(backend, name))       # freed by its owner's close


EXECS = """
import os, sys
import cpprb_ray
rb = cpprb_ray.ReplayBuffer(16, {"obs": {}}, backend=sys.argv[1], name=sys.argv[3])
print(rb.name, flush=True)
os.execv(sys.argv[2], [sys.argv[2], "60"])   # nothing of ours runs from here on
"""


def test_owner_that_exec_d_another_program_is_gone(backend, segment_prefix):
    """An owner that exec'd another program keeps its pid and start time but can never free
    its segment: the buffer is an orphan for `ls` and `rm --orphans`, not alive for ever."""
    sleep = "/bin/sleep" if os.path.exists("/bin/sleep") else "/usr/bin/sleep"
    owner = subprocess.Popen([sys.executable, "-c", EXECS, backend, sleep,
                              named(segment_prefix)],
                             stdout=subprocess.PIPE, text=True, env=child_env())
    name = owner.stdout.readline().strip()
    try:
        assert name, "the owner printed no name"
        deadline = 50
        while os.readlink(f"/proc/{owner.pid}/exe") != os.path.realpath(sleep) and deadline:
            subprocess.run(["sleep", "0.1"], check=True)
            deadline -= 1
        assert owner.poll() is None                           # the same pid, running on
        assert entry_for(name)["owner_status"] == "dead"
        result = cli("rm", "--orphans", "--prefix", segment_prefix)
        assert result.returncode == 0 and result.stdout.splitlines() == [f"removed orphan {name}"]
        assert not os.path.exists(file_of(backend, name))
    finally:
        owner.kill()
        owner.wait(timeout=60)
        owner.stdout.close()
        if name and os.path.exists(file_of(backend, name)):
            os.unlink(file_of(backend, name))


def test_unreadable_buffer_of_an_owner_in_another_pid_namespace_is_unknown():
    """A buffer this version cannot read (another layout version) whose JSON says its owner
    runs in another pid namespace: unknown, and kept by `rm --orphans`, as a readable one is."""
    gone = subprocess.Popen(["true"])
    gone.wait(timeout=60)                                     # a pid with no process now
    with ReplayBuffer(4, {"x": {}}) as rb:
        with open(file_of("shm", rb.name), "rb") as handle:
            data = bytearray(handle.read())
    header = _segment.read_header(data)
    start, length = header["layout_offset"], header["layout_length"]
    document = json.loads(bytes(data[start:start + length]))
    document["meta"].update(owner_pid=gone.pid, owner_pidns="pid:[1]")
    text = json.dumps(document).encode()
    assert len(text) <= length
    data[start:start + length] = text.ljust(length, b" ")
    for field, value in (("version", header["version"] + 1), ("owner_pid", gone.pid)):
        offset = 8 * (1 + _segment.HEADER_FIELDS.index(field))
        data[offset:offset + 8] = int(value).to_bytes(8, sys.byteorder)
    name = "cpprb_ray_test_other_version_" + os.urandom(6).hex()
    path = os.path.join("/dev/shm", name)
    with open(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600), "wb") as handle:
        handle.write(data)
    try:
        entry = entry_for(name)
        assert entry["valid"] is False and "layout version" in entry["problem"]
        assert entry["owner_status"] == "unknown" and "another pid namespace" in entry["owner_why"]
        result = cli("rm", "--orphans", "--prefix", name)
        assert result.returncode == 0 and f"skipped {name}:" in result.stderr
        assert os.path.exists(path)
    finally:
        os.unlink(path)


def test_ls_into_a_closed_pipe_is_no_traceback():
    """`python -m cpprb_ray ls | head -0`: the reader is gone before ls writes."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        with ReplayBuffer(4, {"x": {}}):
            result = subprocess.run([sys.executable, "-m", "cpprb_ray", "ls"], stdout=write_end,
                                    stderr=subprocess.PIPE, text=True, env=child_env(),
                                    timeout=60)
    finally:
        os.close(write_end)
    assert result.returncode == 1 and result.stderr == ""


def _limit_memory() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))


@pytest.mark.parametrize("damage", ["past the data", "up to the data"])
def test_damaged_layout_length_is_not_read_whole(damage):
    """A header whose layout length says gigabytes (damaged; no env_dict makes more than a
    few MiB of layout): `ls` and `rm` read the fixed header, not the segment, to say so."""
    size = 2 << 30                                            # sparse: costs no memory
    with ReplayBuffer(4, {"x": {}}) as rb:
        with open(file_of("shm", rb.name), "rb") as handle:
            data = bytearray(handle.read())
    fields = {"layout_length": 1 << 40} if damage == "past the data" else {
        "layout_length": size - _segment.LAYOUT_OFFSET, "data_offset": size, "total_size": size}
    for field, value in fields.items():
        offset = 8 * (1 + _segment.HEADER_FIELDS.index(field))
        data[offset:offset + 8] = int(value).to_bytes(8, sys.byteorder)
    name = "cpprb_ray_test_long_layout_" + os.urandom(6).hex()
    path = os.path.join("/dev/shm", name)
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    try:
        os.write(fd, data)
        os.ftruncate(fd, size)
        env = dict(child_env(), OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
        listed = subprocess.run([sys.executable, "-m", "cpprb_ray", "ls"], capture_output=True,
                                text=True, env=env, timeout=60, preexec_fn=_limit_memory)
        assert listed.returncode == 0 and "Traceback" not in listed.stderr, listed.stderr
        assert name in listed.stdout
        assert entry_for(name)["valid"] is False
        # What an owner's close reads before it unlinks (the same header reader).
        token = subprocess.run([sys.executable, "-c", "from cpprb_ray import _layout; "
                                f"print(_layout.token_at('shm', {name!r}))"],
                               capture_output=True, text=True, env=env, timeout=60,
                               preexec_fn=_limit_memory)
        assert token.returncode == 0 and token.stdout.strip() == "None", token.stderr
        removed = subprocess.run([sys.executable, "-m", "cpprb_ray", "rm", name],
                                 capture_output=True, text=True, env=env, timeout=60,
                                 preexec_fn=_limit_memory)
        assert removed.returncode == 0 and removed.stdout.strip() == f"removed {name}", (
            removed.stderr)
    finally:
        os.close(fd)
        if os.path.exists(path):
            os.unlink(path)


def test_a_prefix_sweeps_one_job_and_leaves_another_alone(backend, segment_prefix):
    """Two jobs' orphans on one host: `rm --orphans --prefix A` (and remove_orphans(prefix=A))
    removes A's and leaves B's, still to be inspected; `ls --prefix` lists one job's."""
    job_a, job_b = segment_prefix + "a_", segment_prefix + "b_"
    owners = [Owner(backend, job_a), Owner(backend, job_b), Owner(backend, job_b)]
    try:
        for owner in owners:
            owner.kill()
        listed = cli("ls", "--prefix", job_b)
        assert listed.returncode == 0, listed.stderr
        assert sorted(line.split()[0] for line in listed.stdout.splitlines()[1:]) == sorted(
            [owners[1].name, owners[2].name])
        assert [entry["name"] for entry in cpprb_ray.list_buffers(prefix=job_a)] == [
            owners[0].name]

        result = cli("rm", "--orphans", "--prefix", job_a)
        assert result.returncode == 0, result.stderr
        assert result.stdout.splitlines() == [f"removed orphan {owners[0].name}"]
        assert not os.path.exists(owners[0].file)
        assert os.path.exists(owners[1].file) and os.path.exists(owners[2].file)

        assert cpprb_ray.remove_orphans(prefix=job_a) == []
        assert sorted(cpprb_ray.remove_orphans(prefix=job_b)) == sorted(
            [owners[1].name, owners[2].name])
        assert not any(os.path.exists(owner.file) for owner in owners)
    finally:
        for owner in owners:
            owner.cleanup()


def test_bad_prefix_is_refused_by_name():
    for bad in ("", "a/b", "a\0b"):
        with pytest.raises(ValueError, match="prefix must be the start of a buffer's file name"):
            cpprb_ray.remove_orphans(prefix=bad)
        with pytest.raises(ValueError, match="prefix"):
            cpprb_ray.list_buffers(prefix=bad)
    with pytest.raises(TypeError, match="prefix must be a str or None; got int"):
        cpprb_ray.remove_orphans(prefix=3)
    for arguments in (("rm", "--orphans", "--prefix", "a/b"), ("ls", "--prefix", ""),
                      ("rm", "somebuffer", "--prefix", "cpprb_ray_")):
        result = cli(*arguments)
        assert result.returncode == 2 and "prefix" in result.stderr, result.stderr
        assert "Traceback" not in result.stderr
    assert "--prefix goes with --orphans" in cli("rm", "x", "--prefix", "y").stderr


SWEEP_EVERYTHING = """
import json, os, signal, subprocess, sys
owner = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2], "per", "cpprb_ray_x"],
                         stdout=subprocess.PIPE, text=True)
name = owner.stdout.readline().strip()
owner.kill()
owner.wait()
swept = subprocess.run([sys.executable, "-m", "cpprb_ray", "rm", "--orphans"],
                       capture_output=True, text=True)
print(json.dumps({"name": name, "out": swept.stdout, "status": swept.returncode,
                  "left": sorted(os.listdir("/dev/shm"))}))
"""


def test_a_sweep_without_prefix_in_a_private_dev_shm(backend):
    """What a user's bare `rm --orphans` does (every orphan of this user), run where it can
    remove nothing of anybody else: a private mount namespace with its own tmpfs on /dev/shm."""
    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1) on this machine")
    command = 'mount -t tmpfs -o size=16m tmpfs /dev/shm && exec "$@"'
    result = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "bash", "-c", command, "bash",
         sys.executable, "-c", SWEEP_EVERYTHING, OWNER_SCRIPT, backend],
        capture_output=True, text=True, env=child_env(), timeout=120)
    if result.returncode != 0 and "mount" in result.stderr and not result.stdout:
        pytest.skip(f"cannot mount a private /dev/shm here: {result.stderr.strip()}")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["status"] == 0 and report["name"]
    assert report["out"].splitlines() == [f"removed orphan {report['name']}"]
    assert report["left"] == []
