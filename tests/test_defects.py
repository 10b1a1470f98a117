"""Defects found by trying to break the store, each reproduced and pinned here.

Calls that used to crash or hang the process run in a child process with a bounded wait, so a
regression shows as a failed test (a segfault's exit status, or a timeout), never as a dead or
stuck test run:

* add(..., priorities=...) on a closed handle, and a close while other threads add with
  priorities: the priority check read the unmapped header (SIGSEGV);
* a fork while another thread is inside a call: the child's close() waited forever for a thread
  that does not exist in the child;
* one corrupt double in a padding node of the tree: sample returned an index past the capacity
  (a read outside the rows), and the repair's rebuild never rewrote padding;
* a lock that is never released (a stopped holder, a flipped lock word): every call blocked
  forever; now TimeoutError after lock_timeout, and Ctrl-C interrupts the wait;
* header fields that no writer leaves, seen by the repair (a pending range of 2**62 slots, a
  stored size of 2**40): a loop holding the lock for ever, or a wild write.
The rest are refused at construction or reported for what they are: parameters whose default
weight overflows, columns add could never fill, a NaN tree, a buffer of torn rows.
"""

from __future__ import annotations

import os
import signal
import struct
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import cpprb_ray
from cpprb_ray import _segment

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
if TESTS_DIR not in sys.path:
    sys.path.insert(0, TESTS_DIR)

import _workers  # noqa: E402

ENV = {"obs": {"shape": 4}, "rew": {}}
OP_ADD = 1


def run_child(code: str, timeout: float = 60.0) -> subprocess.CompletedProcess:
    """Run `code` in a fresh interpreter; a crash is its exit status, a hang its timeout."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=timeout, cwd=TESTS_DIR)


def assert_clean_exit(result: subprocess.CompletedProcess) -> None:
    assert result.returncode == 0, (
        f"child exited with {result.returncode} (negative: killed by that signal)\n"
        f"stdout: {result.stdout}\nstderr: {result.stderr}")


@pytest.mark.parametrize("role", ["owner", "view"])
def test_add_with_priorities_on_a_closed_handle_raises(role):
    result = run_child(f"""
        import cpprb_ray
        rb = cpprb_ray.PrioritizedReplayBuffer(8, {{"obs": {{}}}})
        handle = rb if "{role}" == "owner" else cpprb_ray.attach(rb.name)
        handle.close()
        try:
            handle.add(obs=1.0, priorities=1.0)
        except ValueError as error:
            assert "closed" in str(error), error
        else:
            raise AssertionError("add on a closed handle did not raise")
        rb.close()
    """)
    assert_clean_exit(result)


def test_close_while_other_threads_add_with_priorities():
    # 5 rounds: the crash came in 4 of 5 runs before the fix.
    result = run_child("""
        import threading
        import numpy as np
        import cpprb_ray
        for round in range(5):
            rb = cpprb_ray.PrioritizedReplayBuffer(1 << 12, {"obs": {"shape": 4}})
            started = threading.Barrier(4)
            errors = []
            def add():
                started.wait()
                obs = np.ones((64, 4), np.float32)
                priorities = np.linspace(0.1, 2.0, 64)
                try:
                    while True:
                        rb.add(obs=obs, priorities=priorities)
                except ValueError as error:
                    errors.append(str(error))
            threads = [threading.Thread(target=add) for _ in range(3)]
            for thread in threads:
                thread.start()
            started.wait()
            rb.close()
            for thread in threads:
                thread.join(10)
            assert all("closed" in e for e in errors) and len(errors) == 3, errors
        print("ok")
    """)
    assert_clean_exit(result)
    assert result.stdout.strip() == "ok"


def test_fork_while_another_thread_is_inside_a_call():
    result = run_child("""
        import os, signal, threading, time
        import numpy as np
        import cpprb_ray
        rb = cpprb_ray.PrioritizedReplayBuffer(1 << 16, {"obs": {"shape": 4}})
        rb.add(obs=np.ones((1 << 16, 4), np.float32))
        stop = threading.Event()
        def sample():
            while not stop.is_set():
                rb.sample(1 << 18)   # long calls: the fork lands inside one
        thread = threading.Thread(target=sample)
        thread.start()
        time.sleep(0.2)
        pid = os.fork()
        if pid == 0:
            signal.alarm(20)           # the hang this test is about ends the child here
            rb.add(obs=np.zeros(4))    # usable in the child too
            rb.close()                 # inherited owner handle: unmaps, does not free
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        stop.set()
        thread.join()
        rb.close()
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
        print("ok")
    """)
    assert_clean_exit(result)


def tree_offset_and_padding(rb) -> tuple:
    header = _segment.read_header(rb._segment.memory)
    return header["tree_offset"], header["capacity"]


@pytest.mark.parametrize("backend", ["mmap"])
def test_a_corrupt_padding_leaf_never_becomes_a_sampled_index(backend):
    """Capacity 10: the leaf level is padded to 16. A stray weight in padding leaf 12 (and a
    tree rebuilt over it, as the old repair did) must never be sampled as slot 12."""
    with cpprb_ray.PrioritizedReplayBuffer(10, ENV, backend=backend) as rb:
        rb.add(obs=np.ones((10, 4)), rew=np.zeros(10), priorities=np.full(10, 1.0))
        tree_offset, capacity = tree_offset_and_padding(rb)
        memory = rb._segment.memory
        leaves = np.frombuffer(memory, dtype=np.float64, count=16, offset=tree_offset)
        leaves[12] = 1e6                 # one corrupt double
        # ... and a tree whose inner sums include it, as the old repair's rebuild made it:
        # capacity 10 -> 16 leaf doubles, level 1 (2 nodes, padded to 8) at 16, the root at 24.
        levels = np.frombuffer(memory, dtype=np.float64, offset=tree_offset,
                               count=_segment.tree_nbytes(capacity) // 8)
        levels[16 + 1] += 1e6
        levels[24] += 1e6
        with pytest.raises(ValueError, match="corrupt"):
            for _ in range(50):
                batch = rb.sample(64)
                assert (batch["indexes"] < 10).all(), batch["indexes"]
        # A repair (the next locker after a holder died) rewrites every node, padding included.
        _workers_die(rb)
        batch = rb.sample(256)
        assert (batch["indexes"] < 10).all()
        assert leaves[12] == 0.0 and np.signbit(leaves[12])
        del leaves, levels   # views of the mapping: it cannot be closed under them
        assert _workers.tree_problems(rb._store.check_tree()) == []


def _workers_die(rb, fields=None) -> None:
    """A spawned child takes rb's lock, writes `fields` into the header and dies holding it."""
    import multiprocessing
    child = multiprocessing.get_context("spawn").Process(
        target=_workers.die_holding_the_lock, args=(rb.name, fields or {}))
    child.start()
    child.join(60)
    assert child.exitcode == 0


@pytest.mark.parametrize("fields", [
    {"op": OP_ADD, "pending_start": 3, "pending_count": 2**62},
    {"op": OP_ADD, "pending_start": 2**63, "pending_count": 4, "pending_old_stored": 2**40,
     "pending_old_next": 2**50},
    {"op": 7},
])
def test_repair_of_a_hostile_header_is_bounded(fields):
    """Fields no writer leaves are bounded by the capacity in the repair: no wild write, no
    loop of 2**62 slots under the lock; the buffer comes back consistent."""
    with cpprb_ray.PrioritizedReplayBuffer(64, ENV, backend="mmap", lock_timeout=20) as rb:
        rb.add(obs=np.ones((10, 4)), rew=np.arange(10.0))
        _workers_die(rb, fields)
        start = time.monotonic()
        rb.add(obs=np.ones(4), rew=1.0)   # the next locker repairs
        assert time.monotonic() - start < 10
        assert rb._store.repairs == 1
        assert 1 <= rb.get_stored_size() <= 64
        assert _workers.tree_problems(rb._store.check_tree()) == []
        batch = rb.sample(32)
        assert (batch["indexes"] < rb.get_stored_size()).all()


def test_header_fields_out_of_range_are_refused_not_used():
    with cpprb_ray.PrioritizedReplayBuffer(16, ENV, backend="mmap") as rb:
        rb.add(obs=np.ones((4, 4)), rew=np.zeros(4))
        header = np.frombuffer(rb._segment.memory, dtype=np.uint64,
                               count=_segment.HEADER_NBYTES // 8)
        field = 1 + _segment.HEADER_FIELDS.index("stored_size")
        header[field] = 2**40
        with pytest.raises(ValueError, match="corrupt"):
            rb.sample(8)
        with pytest.raises(ValueError, match="corrupt"):
            rb.add(obs=np.ones(4), rew=0.0)
        header[field] = 4
        del header
        assert rb.sample(8)["indexes"].max() < 4


def test_a_flipped_lock_word_is_a_timeout_not_a_hang():
    """0x80000000 (FUTEX_WAITERS, no owner): nobody will ever wake us. 89 of 193 random lock
    words hung every call before."""
    with cpprb_ray.PrioritizedReplayBuffer(16, ENV, backend="mmap", lock_timeout=0.5) as rb:
        rb.add(obs=np.ones(4), rew=0.0)
        memory = rb._segment.memory
        good, = struct.unpack_from("<I", memory, _segment.MUTEX_OFFSET)
        struct.pack_into("<I", memory, _segment.MUTEX_OFFSET, 0x80000000)
        start = time.monotonic()
        with pytest.raises(TimeoutError, match="lock was not released within 0.5 s"):
            rb.sample(4)
        assert time.monotonic() - start < 5
        struct.pack_into("<I", memory, _segment.MUTEX_OFFSET, good)
        assert rb.sample(4)["indexes"].shape == (4,)


def test_a_stopped_holder_gives_timeout_and_ctrl_c_interrupts_the_wait():
    """SIGSTOP a process inside a long call (docker pause, a debugger): the others get
    TimeoutError after lock_timeout, and SIGINT interrupts a waiter at once."""
    rb = cpprb_ray.PrioritizedReplayBuffer(1 << 16, ENV, backend="mmap")
    holder = None
    try:
        rb.add(obs=np.ones((1 << 16, 4)), rew=np.zeros(1 << 16))
        holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
            import cpprb_ray
            rb = cpprb_ray.attach({rb.name!r})
            print("ready", flush=True)
            while True:
                rb.sample(1 << 20)
        """)], stdout=subprocess.PIPE, text=True)
        assert holder.stdout.readline().strip() == "ready"
        # Stop it while it holds the lock: the lock word names it. Between two tries it runs
        # for a while of its own (a varied one): stopped again at once, on a loaded machine it
        # could be stopped outside the lock for ever, never scheduled in between.
        pauses = np.random.default_rng(0).uniform(0.001, 0.02, 1000)
        for pause in pauses:
            os.kill(holder.pid, signal.SIGSTOP)
            time.sleep(0.005)
            if rb._store.lock_owner() != 0:
                break
            os.kill(holder.pid, signal.SIGCONT)
            time.sleep(pause)
        assert rb._store.lock_owner() != 0, "never stopped the holder inside a call"
        view = cpprb_ray.attach(rb.name, lock_timeout=0.5)
        start = time.monotonic()
        with pytest.raises(TimeoutError):
            view.sample(4)
        assert 0.4 < time.monotonic() - start < 5
        view.close()
        waiter = run_child(f"""
            import faulthandler, os, signal, sys, threading, time
            # Should it ever hang, its stack goes to stderr before the parent's timeout.
            faulthandler.dump_traceback_later(25, exit=True)
            # Python leaves SIGINT ignored when it starts with it ignored (a job started in the
            # background by a shell without job control, as a CI runner may be): ask for it.
            signal.signal(signal.SIGINT, signal.default_int_handler)
            import cpprb_ray
            view = cpprb_ray.attach({rb.name!r})          # lock_timeout 60 s
            print("attached", flush=True, file=sys.stderr)
            threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
            start = time.monotonic()
            try:
                view.sample(4)
            except KeyboardInterrupt:
                print("interrupted after", round(time.monotonic() - start, 1), flush=True)
            view.close()
        """, timeout=40)
        assert_clean_exit(waiter)
        assert waiter.stdout.startswith("interrupted after"), waiter.stdout
    finally:
        if holder is not None:
            holder.kill()
            os.kill(holder.pid, signal.SIGCONT)
            holder.wait(30)
            holder.stdout.close()
        rb.close()


def test_alpha_and_eps_whose_default_weight_overflows_are_refused():
    with pytest.raises(ValueError, match="alpha=1100.0 with eps=1.0"):
        cpprb_ray.PrioritizedReplayBuffer(8, ENV, alpha=1100, eps=1)
    with cpprb_ray.PrioritizedReplayBuffer(8, ENV, alpha=1000, eps=0.1) as rb:   # 1.1**1000 ok
        rb.add(obs=np.ones(4), rew=0.0)
        assert np.isfinite(rb.sample(2, beta=0.5)["weights"]).all()


@pytest.mark.parametrize("env_dict, error, match", [
    ({"self": {}}, ValueError, "reserved"),
    ({"timeout": {}}, ValueError, "reserved"),
    ({"obs": {"dtype": ("f4", (2,))}}, TypeError, "subarray|plain dtype"),
    ({"obs": {"shape": (2**32, 2**32)}}, ValueError, "bytes per row"),
])
def test_columns_add_could_never_fill_are_refused(env_dict, error, match):
    with pytest.raises(error, match=match):
        cpprb_ray.ReplayBuffer(8, env_dict)


def test_a_nan_in_the_tree_is_reported_as_corrupt():
    with cpprb_ray.PrioritizedReplayBuffer(16, ENV, backend="mmap") as rb:
        rb.add(obs=np.ones((4, 4)), rew=np.zeros(4))
        tree_offset, capacity = tree_offset_and_padding(rb)
        levels = np.frombuffer(rb._segment.memory, dtype=np.float64, offset=tree_offset,
                               count=_segment.tree_nbytes(capacity) // 8)
        levels[24] = np.nan   # the root: 16 leaves, level 1 padded to 8 at 16, root at 24
        del levels
        with pytest.raises(ValueError, match="not a finite number: the segment is corrupt"):
            rb.sample(4)


def test_weights_too_small_for_float32_are_its_least_positive_value_not_zero():
    """A priority of 1e-153 beside priorities of 1 (eps=0, alpha=1: a user may give them) puts
    the other rows' weights at 1e-153, below float32's range: they come as its least positive
    value, never 0 (found by tests/fuzz_segment.py, seed 11, case 80)."""
    with cpprb_ray.PrioritizedReplayBuffer(8, ENV, alpha=1.0, eps=0.0, seed=0) as rb:
        rb.add(obs=np.ones((2, 4)), rew=np.zeros(2), priorities=[1e-153, 1.0])
        weights = rb.sample(64, beta=1.0)["weights"]
        indexes = rb.sample(64, beta=1.0)["indexes"]
        assert set(indexes.tolist()) == {1}      # the tiny row is (almost) never drawn
        assert (weights > 0).all() and (weights <= 1).all()
        assert (weights == np.float32(1.401298464324817e-45)).all()   # float32's least positive
        rb.update_priorities([0], [1e-30])       # a ratio float32 holds: exact again
        np.testing.assert_allclose(rb.sample(8, beta=1.0)["weights"], 1e-30, rtol=1e-5)


def test_a_buffer_of_only_torn_rows_says_so():
    with cpprb_ray.PrioritizedReplayBuffer(8, ENV, backend="mmap") as rb:
        rb.add(obs=np.ones((8, 4)), rew=np.zeros(8))
        # A writer died mid-add over every slot: the repair tears all 8 and keeps stored 8.
        _workers_die(rb, {"op": OP_ADD, "pending_start": 0, "pending_count": 8,
                          "pending_old_next": 0, "pending_old_stored": 8,
                          "pending_old_rows_added": 8})
        with pytest.raises(ValueError, match="torn by a writer that died"):
            rb.sample(4)


# -- sample(..., out=): preallocated outputs ----------------------------------------------------

def test_sample_into_out_fills_the_given_arrays_and_checks_them():
    env = {"obs": {"shape": 3}, "act": {"dtype": np.int64}}
    with cpprb_ray.PrioritizedReplayBuffer(64, env, seed=3) as rb, \
            cpprb_ray.PrioritizedReplayBuffer.attach(rb.name, seed=3) as twin:
        rb.add(obs=np.arange(96.0).reshape(32, 3), act=np.arange(32),
               priorities=np.linspace(0.1, 3.0, 32))
        out = rb.sample(16, beta=0.5)
        twin.sample(16, beta=0.5)
        fresh = twin.sample(16, beta=0.5)         # same seed, same history: the same draw
        filled = rb.sample(16, beta=0.5, out=out)
        assert all(filled[key] is out[key] for key in out)
        for key in fresh:
            np.testing.assert_array_equal(filled[key], fresh[key])
        bad = dict(out, obs=np.empty((16, 4), np.float32))
        with pytest.raises(ValueError, match=r"out\['obs'\] must be a writable C-contiguous "
                                             r"float32 array of shape \(16, 3\)"):
            rb.sample(16, out=bad)
        with pytest.raises(ValueError, match=r"out\['weights'\]"):
            rb.sample(16, out={k: v for k, v in out.items() if k != "weights"})
        with pytest.raises(ValueError, match=r"out\['indexes'\]"):
            rb.sample(16, out=dict(out, indexes=out["indexes"][::-1]))   # not contiguous
        with pytest.raises(TypeError, match="out must be a dict"):
            rb.sample(16, out=[1, 2])
        assert rb.get_stored_size() == 32


def test_uniform_sample_into_out():
    with cpprb_ray.ReplayBuffer(8, {"obs": {}}, seed=0) as rb:
        rb.add(obs=[1.0, 2.0, 3.0])
        out = rb.sample(5)
        again = rb.sample(5, out=out)
        assert again["obs"] is out["obs"] and "weights" not in again
        assert set(again["obs"].ravel()) <= {1.0, 2.0, 3.0}


# -- a sample whose outputs cannot fit in memory ------------------------------------------------

HUGE_SAMPLE = """
    import resource, sys
    import cpprb_ray
    if len(sys.argv) > 1:
        limit = int(sys.argv[1])
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    for cls, options in ((cpprb_ray.ReplayBuffer, {}), (cpprb_ray.PrioritizedReplayBuffer, {}),
                         (cpprb_ray.ReplayBuffer, {"next_of": "obs", "lanes": 1})):
        with cls(1024, {"obs": {}, "act": {}}, **options) as rb:
            rb.add(obs=[1.0, 2.0], act=[3.0, 4.0],
                   **({"next_obs": [2.0, 3.0]} if options else {}))
            try:
                rb.sample(2**31)
            except ValueError as error:
                print(error)
            else:
                raise AssertionError("sample(2**31) did not raise")
            assert rb.sample(4)["obs"].shape == (4, 1)     # nothing was left half made
    print("done")
"""


def _assert_huge_sample_refused(result: subprocess.CompletedProcess) -> None:
    assert_clean_exit(result)
    lines = result.stdout.splitlines()
    assert lines[-1] == "done" and len(lines) == 4, result.stdout
    for line in lines[:3]:
        assert line.startswith("batch_size 2147483648 needs ") and "bytes of sample output" in line
        assert "bytes this process may use" in line


def test_a_sample_past_the_memory_limit_is_refused_before_it_allocates():
    """sample(2**31) on a 1,024-row buffer of two floats: about 100 GB of outputs. It was the
    OOM killer's (anon-rss 23 GB on a 24 GB machine); here under a 4 GiB RLIMIT_AS, where it
    was numpy's MemoryError naming nothing: now a ValueError naming batch_size, before
    anything is allocated, and the buffer samples as before."""
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(HUGE_SAMPLE), str(4 << 30)],
                            capture_output=True, text=True, timeout=120, cwd=TESTS_DIR)
    _assert_huge_sample_refused(result)


def _memory_cgroup() -> str:
    """A fresh memory cgroup below this process's, or pytest.skip saying why it cannot be."""
    try:
        with open("/proc/self/cgroup") as handle:
            lines = [line.strip().split(":", 2) for line in handle]
    except OSError as error:
        pytest.skip(f"no /proc/self/cgroup: {error}")
    for _, controllers, path in lines:
        if "memory" in controllers.split(","):
            parent, limit_file = os.path.join("/sys/fs/cgroup/memory", path.lstrip("/")), \
                "memory.limit_in_bytes"
            break
    else:
        parent, limit_file = os.path.join("/sys/fs/cgroup", lines[-1][2].lstrip("/")), \
            "memory.max"
    child = os.path.join(parent, f"cpprb_ray_test_{os.getpid()}")
    try:
        os.mkdir(child)
    except OSError as error:
        pytest.skip(f"cannot make a memory cgroup under {parent}: {error}")
    if not os.path.exists(os.path.join(child, limit_file)):
        os.rmdir(child)
        pytest.skip(f"no memory controller in {parent}")
    with open(os.path.join(child, limit_file), "w") as handle:
        handle.write(str(2 << 30))
    return child


def test_a_sample_past_the_containers_memory_is_refused():
    """The same sample in a container whose cgroup allows 2 GiB (the machine has more): the
    limit that counts is the cgroup's, not the machine's. The cgroup's OOM killer ended the
    child before (it is the only process in that cgroup)."""
    cgroup = _memory_cgroup()
    try:
        def enter() -> None:
            with open(os.path.join(cgroup, "cgroup.procs"), "w") as handle:
                handle.write(str(os.getpid()))

        result = subprocess.run([sys.executable, "-c", textwrap.dedent(HUGE_SAMPLE)],
                                capture_output=True, text=True, timeout=120, cwd=TESTS_DIR,
                                preexec_fn=enter)
        _assert_huge_sample_refused(result)
        assert "more than the 2.15e+09 bytes this process may use" in result.stdout
    finally:
        os.rmdir(cgroup)


@pytest.mark.parametrize("version", ["v1", "v2", "hybrid"])
def test_memory_limit_reads_the_cgroups_above_too(tmp_path, version):
    """The least limit of the process's cgroup and those above it (a container's limit sits
    above the cgroups made inside it), in each cgroup layout; "no limit" values ignored."""
    from cpprb_ray._proc import memory_limit

    machine = memory_limit("/nonexistent", "/nonexistent")
    root = tmp_path / "cgroup"
    if version == "v1":
        base, name, listing = root / "memory", "memory.limit_in_bytes", "4:memory,x:/pod/job\n"
        unlimited = str(0x7FFFFFFFFFFFF000)
    else:
        base = root if version == "v2" else root / "unified"
        name, listing, unlimited = "memory.max", "0::/pod/job\n", "max"
        (base / "pod" / "job").mkdir(parents=True)
        if version == "v2":
            (root / "cgroup.controllers").write_text("memory\n")
    (base / "pod" / "job").mkdir(parents=True, exist_ok=True)
    (base / name).write_text(unlimited + "\n")
    (base / "pod" / name).write_text(f"{3 << 30}\n")             # the container's
    (base / "pod" / "job" / name).write_text(unlimited + "\n")
    proc = tmp_path / "cgroup_of_self"
    proc.write_text(listing)
    assert memory_limit(str(proc), str(root)) == min(machine or 1 << 62, 3 << 30)
    (base / "pod" / "job" / name).write_text(f"{1 << 30}\n")
    assert memory_limit(str(proc), str(root)) == 1 << 30


# -- a corrupt tree node never becomes a weight --------------------------------------------------

CORRUPT_VALUES = [float("nan"), -float("inf"), float("inf"), -1.0, 0.0, 1e-300, 1e300]


def _assert_weights_or_corrupt(call) -> str:
    """`call()` (a sample) raised the corrupt-segment error, or gave weights in (0, 1]."""
    try:
        batch = call()
    except ValueError as error:
        assert "corrupt" in str(error), error
        return "corrupt"
    weights = batch["weights"]
    assert np.isfinite(weights).all() and (weights > 0).all() and (weights <= 1).all(), weights
    return "weights"


@pytest.mark.parametrize("capacity", [9, 100])
def test_a_corrupt_tree_node_gives_the_corrupt_segment_error_never_bad_weights(capacity):
    """Every double of the tree (sums, mins, padding) set in turn to NaN, -inf, inf, -1.0, 0.0,
    or a value no leaf has, through the segment's memory; then a sample, an update of two
    slots and a sample again. Each raises the corrupt-segment error or gives weights in (0, 1]:
    90 of 384 such cases of a 9-slot tree returned NaN, inf, 0 or > 1 before, and one -inf in
    node 37 plus one update made every weight inf."""
    priorities = np.linspace(0.5, 4.0, capacity)
    outcomes = {"corrupt": 0, "weights": 0}
    with cpprb_ray.PrioritizedReplayBuffer(capacity, ENV, seed=1) as rb:
        rb.add(obs=np.ones((capacity, 4)), rew=np.zeros(capacity), priorities=priorities)
        tree_offset, _ = tree_offset_and_padding(rb)
        nodes = np.frombuffer(rb._segment.memory, dtype=np.float64, offset=tree_offset,
                              count=_segment.tree_nbytes(capacity) // 8)
        intact = nodes.copy()
        try:
            for node in range(len(nodes)):
                for value in CORRUPT_VALUES:
                    nodes[:] = intact
                    if nodes[node] == value or (np.isnan(value) and np.isnan(nodes[node])):
                        continue
                    nodes[node] = value
                    first = _assert_weights_or_corrupt(lambda: rb.sample(32, beta=0.4))
                    try:
                        rb.update_priorities([0, capacity - 1], [1.0, 2.0])
                    except ValueError as error:
                        assert "corrupt" in str(error), error
                    try:
                        second = _assert_weights_or_corrupt(lambda: rb.sample(32, beta=0.4))
                    except AssertionError:
                        raise AssertionError(f"node {node} = {value}, after an update: "
                                             f"{nodes.tolist()}") from None
                    outcomes[first] += 1
                    outcomes[second] += 1
            nodes[:] = intact
            rb.update_priorities(np.arange(capacity), priorities)
            assert _assert_weights_or_corrupt(lambda: rb.sample(32, beta=0.4)) == "weights"
        finally:
            del nodes    # its export of the segment: the close unmaps it
    assert outcomes["corrupt"] > 0 and outcomes["weights"] > 0, outcomes
