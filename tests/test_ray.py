"""Real Ray: tasks and actors get the buffer as an argument and work on it in place.

The owner (the test process) sees what workers add without anything being returned; workers
exiting, and actors killed with ray.kill (idle, or in the middle of adding), leave the buffer
intact and usable. After the owner closes, nothing is left (the leak fixture checks).
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np
import pytest

import cpprb_ray

ray = pytest.importorskip("ray")

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
if TESTS_DIR not in sys.path:
    sys.path.insert(0, TESTS_DIR)

import _workers  # noqa: E402
from _workers import ENV, rows  # noqa: E402

# Ray workers cannot import the tests directory; ship _workers' code by value.
ray.cloudpickle.register_pickle_by_value(_workers)

TIMEOUT = 120.0


def segment_file(rb) -> str:
    return os.path.join("/dev/shm", rb.name) if rb.backend == "shm" else rb.name


def wait_gone(pid: int, timeout: float = TIMEOUT) -> None:
    """Wait until process `pid` (a Ray worker; we only look, never signal it) has exited."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                if stat.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                    return
        except (FileNotFoundError, ProcessLookupError):
            return
        time.sleep(0.05)
    raise AssertionError(f"Ray worker {pid} did not exit within {timeout} s")


def assert_intact(rb, expected: set) -> None:
    """The owner still has every expected row, consistent, and can add and sample."""
    assert os.path.exists(segment_file(rb))
    assert rb.is_owner and not rb.closed
    everything = rb.get_all_transitions()
    assert _workers.torn(everything).size == 0
    assert expected <= set(_workers.serials_of(everything).tolist())
    before = rb.get_stored_size()
    rb.add(**rows(900_000_000, 3))
    assert rb.get_stored_size() == min(before + 3, rb.get_buffer_size())
    assert _workers.check_sample(rb, rb.sample(64)) == []
    assert _workers.tree_problems(rb._store.check_tree()) == []


def test_tasks_write_and_sample_in_place(ray_session, backend):
    rb = cpprb_ray.PrioritizedReplayBuffer(10_000, ENV, backend=backend)
    try:
        rb.add(**rows(0, 100))
        # max_calls=1: each worker process exits after its task, so "after the workers exit"
        # is really after.
        fill = ray.remote(num_cpus=0.5, max_calls=1)(_workers.ray_fill)
        refs = [fill.remote(rb, 1000, 200),                  # the handle itself
                fill.remote(ray.put(rb), 2000, 200),         # through the object store
                fill.remote(rb, 3000, 200)]
        results = ray.get(refs, timeout=TIMEOUT)
        for result in results:
            assert result["pid"] != os.getpid()
            assert result["is_owner"] is False
            assert result["type"] == "PrioritizedReplayBuffer"
            assert result["problems"] == [] and result["applied"] >= 0
        # Nothing was returned but counts; the rows are here.
        expected = set(range(100)) | set(range(1000, 1200)) | set(range(2000, 2200)) | set(
            range(3000, 3200))
        assert set(_workers.serials_of(rb.get_all_transitions()).tolist()) == expected
        assert rb._store.rows_added == len(expected)
        for pid in {r["pid"] for r in results}:
            wait_gone(pid)
        assert_intact(rb, expected)
    finally:
        rb.close()
    assert not os.path.exists(segment_file(rb))
    with pytest.raises(FileNotFoundError):
        cpprb_ray.attach(rb.name)


def test_actors_killed_idle_and_while_adding(ray_session, backend):
    rb = cpprb_ray.PrioritizedReplayBuffer(5000, ENV, backend=backend)
    try:
        rb.add(**rows(0, 100))
        Actor = ray.remote(num_cpus=0.5, max_restarts=0)(_workers.BufferActor)
        idle, busy = Actor.remote(rb), Actor.remote(rb)
        infos = ray.get([idle.info.remote(), busy.info.remote()], timeout=TIMEOUT)
        assert all(info["is_owner"] is False and info["name"] == rb.name for info in infos)
        assert ray.get(idle.add.remote(10_000, 50), timeout=TIMEOUT) >= 150
        assert ray.get(idle.sample.remote(32), timeout=TIMEOUT) == []
        assert set(range(10_000, 10_050)) <= set(
            _workers.serials_of(rb.get_all_transitions()).tolist())

        # Kill the idle one: it held a view, nothing else.
        ray.kill(idle, no_restart=True)
        wait_gone(infos[0]["pid"])
        assert_intact(rb, set(range(100)) | set(range(10_000, 10_050)))

        # Kill the busy one while it loops adding 512-row batches (most likely mid-add).
        added_before = rb._store.rows_added
        looping = busy.add_forever.remote(1_000_000, 512)
        deadline = time.monotonic() + TIMEOUT
        while rb._store.rows_added < added_before + 20 * 512:
            assert time.monotonic() < deadline, "the actor never added"
            time.sleep(0.01)
        ray.kill(busy, no_restart=True)
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(looping, timeout=TIMEOUT)
        wait_gone(infos[1]["pid"])
        # The loop overwrote the ring (5000 rows) many times: the oldest rows are gone, but
        # every stored row must be consistent and the owner fully usable.
        assert_intact(rb, set())
        assert rb.get_stored_size() == 5000
        assert rb._store.rows_added >= added_before + 20 * 512
    finally:
        rb.close()
    assert not os.path.exists(segment_file(rb))


def test_a_proxy_adds_a_batch_whole_or_not_at_all(ray_session, backend):
    """A remote handle's batch reaches the buffer through its proxy's add: checked whole before
    anything is written, one store add, true counts. (A 4-row batch whose later rows had
    priority -1.0 raised but left the earlier rows, when the proxy made one add per run of rows
    with and without priorities.)"""
    from cpprb_ray.remote import _proxy

    nan = float("nan")
    with cpprb_ray.PrioritizedReplayBuffer(16, {"obs": {}}, backend=backend) as rb, \
            cpprb_ray.PrioritizedReplayBuffer(16, {"obs": {}}, backend=backend) as local:
        actor = _proxy.proxy_class(ray).remote(rb.backend, rb.name, rb._layout.token)
        obs = np.arange(4.0)
        bad = [([obs], np.array([nan, nan, -1.0, 1.0]), ValueError, "priorities"),
               ([obs], np.array([1.0, 2.0]), ValueError, "priorities"),
               ([obs, obs[:3]], None, ValueError, "column"),
               ([obs[:2].reshape(2, 1), obs], None, ValueError, "column")]
        for arrays, priorities, error, words in bad:
            with pytest.raises(error, match=words):
                ray.get(actor.add.remote(arrays, priorities, None), timeout=TIMEOUT)
            assert rb.get_stored_size() == 0 and rb.stats()["inserts"] == 0

        # Rows with and without priorities in one batch: one add, the rows without one
        # weighted as local adds in that order weigh them (the largest priority seen so far,
        # the batch's own earlier rows included).
        first, count = ray.get(actor.add.remote([obs], np.array([nan, 5.0, nan, 2.0]), None),
                               timeout=TIMEOUT)
        assert (first, count) == (0, 4)
        assert rb.get_stored_size() == 4 and rb.stats()["inserts"] == 4
        local.add(obs=obs[:1])
        local.add(obs=obs[1:2], priorities=[5.0])
        local.add(obs=obs[2:3])
        local.add(obs=obs[3:], priorities=[2.0])
        assert rb._store.check_tree()[1].tolist() == local._store.check_tree()[1].tolist()
        assert rb.get_max_priority() == local.get_max_priority() == 5.0
        ray.kill(actor)


def test_the_tests_own_ray_runtime_stays_on_loopback(ray_session):
    """The single node the tests start (conftest: RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 before
    ray is imported, node ip 127.0.0.1) listens on loopback only: Ray 2.60 bound it to the
    machine's outward address, even given 127.0.0.1."""
    nodes = [node for node in ray.nodes() if node["Alive"]]
    assert [node["NodeManagerAddress"] for node in nodes] == ["127.0.0.1"]
    assert ray.util.get_node_ip_address() == "127.0.0.1"
    assert ray.get(ray.remote(lambda: ray.util.get_node_ip_address()).remote(),
                   timeout=TIMEOUT) == "127.0.0.1"
