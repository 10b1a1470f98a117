"""Identity: a handle opens only this user's segments, and an owner frees only its own segment.

- A segment of the same name made by another user -- a real one, made by ``nobody`` with mode
  0666 -- is refused by attach and by unpickling (its rows would otherwise go to the impostor),
  and ``rm`` says so instead of printing a traceback.
- Each segment carries a random token; the owner's close (or finalizer) unlinks the name only if
  it still holds that token, so a same-named buffer made after ours was removed survives.
"""

from __future__ import annotations

import gc
import os
import pickle
import pwd
import re
import shutil
import stat
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import cpprb_ray
from cpprb_ray import _layout

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def file_of(backend: str, name: str) -> str:
    return os.path.join("/dev/shm", name) if backend == "shm" else name


def fresh_name(what: str) -> str:
    return f"cpprb_ray_test_{what}_" + os.urandom(6).hex()


def child_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH")) if p)
    return env


@pytest.fixture
def nobody():
    """The `nobody` user, and a way to run a command as that user (we must be root)."""
    if os.geteuid() != 0:
        pytest.skip("creating a segment as another user needs root")
    if shutil.which("setpriv") is None:
        pytest.skip("no setpriv(1) on this machine")
    try:
        return pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no user named nobody")


def write_as(user, path: str, data: bytes) -> None:
    """Create `path` (O_EXCL, mode 0666) holding `data`, as `user`. A shell, not Python: our
    interpreter may live where `nobody` cannot run it."""
    subprocess.run(["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}",
                    "--clear-groups", "/bin/sh", "-c", 'umask 0; set -C; cat > "$1"', "sh", path],
                   input=data, check=True, timeout=60)


def test_attach_refuses_another_users_segment(backend, nobody):
    name = fresh_name("impostor")
    rb = cpprb_ray.PrioritizedReplayBuffer(8, {"x": {}}, backend=backend, name=name)
    rb.add(x=[1.0, 2.0])
    pickled = pickle.dumps(rb)
    location = rb.name
    path = file_of(backend, location)
    rb.close()                                       # our segment is gone; the name is free
    # The impostor: a well-formed buffer (a copy of one of ours), owned by nobody, mode 0666.
    with cpprb_ray.PrioritizedReplayBuffer(8, {"x": {}}, backend=backend) as template:
        template.add(x=[5.0, 6.0, 7.0])
        with open(file_of(backend, template.name), "rb") as source:
            image = source.read()
    write_as(nobody, path, image)
    try:
        status = os.stat(path)
        assert status.st_uid == nobody.pw_uid and stat.S_IMODE(status.st_mode) == 0o666
        refusal = re.escape(f"belongs to {nobody.pw_name} (uid {nobody.pw_uid})")
        with pytest.raises(PermissionError, match=refusal):
            pickle.loads(pickled)                    # a late unpickle must not attach to it
        with pytest.raises(PermissionError, match=refusal):
            cpprb_ray.PrioritizedReplayBuffer.attach(location)
        with pytest.raises(PermissionError, match="refusing another user's segment"):
            cpprb_ray.attach(location)
        with open(path, "rb") as source:
            assert source.read() == image            # nothing was written to it

        # Not ours to list or remove: a message and a nonzero status, not a traceback.
        assert all(entry["path"] != path for entry in cpprb_ray.list_buffers())
        with pytest.raises(PermissionError, match=refusal):
            cpprb_ray.remove_buffer(location)
        result = subprocess.run([sys.executable, "-m", "cpprb_ray", "rm", location],
                                capture_output=True, text=True, env=child_env(), timeout=60)
        assert result.returncode == 1
        assert f"refused {location}:" in result.stderr and nobody.pw_name in result.stderr
        assert "Traceback" not in result.stderr
        assert os.path.exists(path)
        # Its token is not one we can vouch for: not ours.
        assert _layout.token_at(backend, location) is None
    finally:
        os.unlink(path)


def test_another_user_attaching_to_ours_is_told_whose_it_is(backend, nobody):
    """Our segment (mode 0600), attached by `nobody`: the PermissionError names its owner, not
    only a path; a sequence buffer as any other. The child drops to `nobody` after Python has
    started (our interpreter may live where `nobody` cannot run it)."""
    env = {"obs": {"shape": 2}, "done": {}}
    with cpprb_ray.PrioritizedReplayBuffer(64, env, backend=backend,
                                           sequence={"length": 4, "period": 2}) as rb:
        rb.add(obs=np.ones((6, 2)), done=np.zeros(6))
        code = textwrap.dedent(f"""
            import os, cpprb_ray
            os.setgroups([]); os.setgid({nobody.pw_gid}); os.setuid({nobody.pw_uid})
            try:
                cpprb_ray.attach({rb.name!r})
            except PermissionError as error:
                print(error)
            """)
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              env=child_env(), cwd="/", timeout=120)
        assert done.returncode == 0, done.stderr
        assert "belongs to root (uid 0), not to this user" in done.stdout, done.stdout
        assert f"{nobody.pw_name} (uid {nobody.pw_uid})" in done.stdout
        assert len(rb) == 2                              # two sequences, untouched


def test_token_identifies_the_segment(backend):
    with cpprb_ray.ReplayBuffer(4, {"x": {}}, backend=backend) as first, \
            cpprb_ray.ReplayBuffer(4, {"x": {}}, backend=backend) as second:
        token = first._layout.token
        assert re.fullmatch("[0-9a-f]{32}", token)
        assert token != second._layout.token
        assert _layout.token_at(backend, first.name) == token
        with cpprb_ray.attach(first.name) as view:
            assert view._layout.token == token       # read from the segment itself
        name = first.name
    assert _layout.token_at(backend, name) is None


@pytest.mark.parametrize("ending", ["close", "collect"])
def test_owner_frees_only_its_own_segment(backend, ending):
    """Ours is removed, another buffer takes the name; our close (or finalizer) spares it."""
    name = fresh_name("successor")
    ours = cpprb_ray.ReplayBuffer(4, {"x": {}}, backend=backend, name=name)
    location = ours.name
    assert cpprb_ray.remove_buffer(location) is True
    theirs = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, cpprb_ray\n"
         "rb = cpprb_ray.ReplayBuffer(4, {'y': {}}, backend=sys.argv[1], name=sys.argv[2])\n"
         "rb.add(y=3.0)\nprint(rb.name, flush=True)\nsys.stdin.readline()\n",
         backend, name], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env=child_env())
    try:
        assert theirs.stdout.readline().strip() == location
        if ending == "close":
            ours.close()
        else:
            del ours
            gc.collect()
        assert os.path.exists(file_of(backend, location))
        with cpprb_ray.attach(location) as view:
            assert list(view.env_dict) == ["y"] and view.get_stored_size() == 1
    finally:
        theirs.communicate("\n", timeout=60)
    assert theirs.returncode == 0
    assert not os.path.exists(file_of(backend, location))      # freed by its own owner


def test_a_constructor_that_fails_after_creating_frees_the_segment_and_its_claim(backend):
    """lock_timeout is refused only once the segment exists and its header is written (the
    store checks it when it binds): the constructor frees the file through the claim it took at
    open, and keeps no claim."""
    from cpprb_ray import _ownership

    name = fresh_name("failed")
    claims = len(_ownership._live)
    with pytest.raises(ValueError, match="lock_timeout"):
        cpprb_ray.PrioritizedReplayBuffer(64, {"obs": {}}, backend=backend, name=name,
                                          lock_timeout=-1.0)
    assert not os.path.exists(os.path.join("/dev/shm", name))
    assert len(_ownership._live) == claims


CLOSE_OVER_A_FIFO = """
import os, sys, cpprb_ray
backend, name = sys.argv[1], sys.argv[2]
rb = cpprb_ray.ReplayBuffer(4, {"x": {}}, backend=backend, name=name)
assert cpprb_ray.remove_buffer(rb.name)           # somebody's `rm NAME`
os.mkfifo(os.path.join("/dev/shm", name), 0o666)  # ... and a FIFO takes the name
rb.close()                                        # reads the token at the name: must not wait
print("closed", flush=True)
"""


def test_owner_close_does_not_wait_on_a_fifo_that_took_the_name(backend):
    """Anybody may make a FIFO under a name once our segment is gone; the owner's close (and its
    SIGTERM handler) read the token at the name before unlinking, and opening a FIFO to read
    blocks until a writer comes: the close must neither hang nor remove the FIFO."""
    name = fresh_name("fifo")
    fifo = os.path.join("/dev/shm", name)
    try:
        result = subprocess.run([sys.executable, "-c", CLOSE_OVER_A_FIFO, backend, name],
                                capture_output=True, text=True, env=child_env(), timeout=30)
        assert result.returncode == 0 and result.stdout.strip() == "closed", result.stderr
        assert stat.S_ISFIFO(os.lstat(fifo).st_mode)           # not ours: left alone
        assert _layout.token_at(backend, name if backend == "shm" else fifo) is None
        with pytest.raises(ValueError, match="not a cpprb_ray buffer"):
            cpprb_ray.attach(name)
    except subprocess.TimeoutExpired:
        pytest.fail("the owner's close() waited on a FIFO under its name")
    finally:
        if os.path.lexists(fifo):
            os.unlink(fifo)
