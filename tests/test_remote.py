"""Beyond one host: the same handle on a Ray node that cannot see the owner's segment.

A two-node Ray cluster on this machine (benchmarks/_two_nodes.py): the head, and a second node
in its own mount namespace over a private /dev/shm, which sees none of the head's segments,
exactly as a second host would not. The driver (tests/_remote_driver.py, its own process, so
that this session's local Ray runtime never meets the cluster) owns every buffer; a task and
an actor pinned to the second node get the buffers as arguments and use them through the
proxy actor. What each check covers is in the driver's docstrings; the cluster is started
once for the module and ended (its own process groups) after it.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest

pytest.importorskip("ray")

from benchmarks._two_nodes import TwoNodes, can_unshare  # noqa: E402

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(TESTS_DIR)
DRIVER_TIMEOUT = 240


@pytest.fixture(scope="module")
def remote_results(tmp_path_factory):
    """Start the cluster, run every check of the driver once, end the cluster; the results."""
    why_not = can_unshare()
    if why_not is not None:
        pytest.skip(f"the second node needs a private mount namespace: {why_not}")
    results_path = str(tmp_path_factory.mktemp("remote") / "results.json")
    cluster = TwoNodes([REPO_ROOT, TESTS_DIR])
    started = time.monotonic()
    try:
        address = cluster.start()
        env = dict(cluster.env())
        env["CPPRB_RAY_NODE2_PID"] = str(cluster.processes[1].pid)   # in node 2's namespace
        driver = subprocess.run(
            [sys.executable, os.path.join(TESTS_DIR, "_remote_driver.py"), address,
             results_path], cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=DRIVER_TIMEOUT)
        output = driver.stdout.decode(errors="replace")[-6000:]
        if not os.path.exists(results_path):
            pytest.fail(f"the driver wrote no results (exit {driver.returncode}):\n{output}\n"
                        f"head:\n{cluster.log('head.log')}\nnode2:\n{cluster.log('node2.log')}")
        with open(results_path) as handle:
            results = json.load(handle)
        results["output"] = output
        results["node_ip"] = cluster.node_ip
    finally:
        cluster.stop()
    results["module_seconds"] = time.monotonic() - started
    # The cluster's processes are gone: nothing of it outlives the module.
    assert not any(os.path.exists(os.path.join(cluster.directory, name))
                   for name in ("head", "node2"))
    return results


def _check(results, name):
    outcome = results.get(name)
    assert outcome == "ok", f"{name}:\n{outcome}\n\ndriver output:\n{results['output']}"


def test_tasks_and_actors_on_another_node(remote_results):
    """A task and an actor there add, sample and update; the owner sees their rows untorn; a
    same-named segment on that node is not taken for the owner's; one proxy, on the owner's
    node, gone after the owner's close, after which the client's calls fail clearly."""
    _check(remote_results, "tasks_and_actors")


def test_nstep_and_rate_limiter_across_nodes(remote_results):
    """N-step rows made on the other node equal a local handle's; the rate limiter holds
    remote adds and samples back (timeouts, and a wait released by the owner's sample)."""
    _check(remote_results, "nstep")
    _check(remote_results, "rate_limiter")


def test_proxy_and_writer_killed(remote_results):
    """The proxy killed: the next call fails clearly within seconds, the one after works; a
    writer (an actor, and a task) killed while adding leaves whole batches, in order, untorn."""
    _check(remote_results, "failures")


def test_flushes_and_the_owners_death(remote_results):
    """Queued rows arrive by age and at an actor's exit; the owner killed: its proxy ends and
    a client's calls fail clearly (a new proxy refuses a dead owner's segment)."""
    _check(remote_results, "flushes")
    _check(remote_results, "owner_died")


def test_laned_buffers_through_remote_writers(remote_results):
    """Frames and N-step in lanes, written by remote handles (their writers in the proxy):
    every row sampled meanwhile and at the end is exactly its writer's (the frame streams'
    oracle, a local twin, the N-step reference); a third writer gets LaneError; a closed or
    killed writer's lane goes to the next one (a killed one's after its lease), its staged
    N-step steps committed as a truncated episode end."""
    _check(remote_results, "laned_frames")
    _check(remote_results, "laned_nstep")


def test_sequence_buffers_through_remote_writers(remote_results):
    """A sequence buffer written by a remote handle (its writer, with its stream, in the
    proxy): every sequence sampled meanwhile and at the end is, step by step, the oracle's;
    saved through the proxy and loaded here, the same sequences."""
    _check(remote_results, "laned_sequences")


def test_prefetch_through_the_proxy(remote_results):
    """rb.prefetch on a handle on the other node: batches sampled ahead through the proxy,
    the ring's sets cycling, every batch counted, the limiter's TimeoutError at next()."""
    _check(remote_results, "prefetch")


def test_the_owners_node_dies(remote_results):
    """The owner on the second node, a client on the head; the second node SIGKILLed whole,
    as a host that dies: the client's calls raise RemoteBufferError within its call timeout."""
    _check(remote_results, "owner_node_died")


def test_core_without_ray():
    """cpprb_ray imports, pickles and works where Ray cannot be imported at all."""
    script = (
        "import sys, pickle\n"
        "class NoRay:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'ray' or name.startswith('ray.'):\n"
        "            raise ImportError('no ray here')\n"
        "sys.meta_path.insert(0, NoRay())\n"
        "import cpprb_ray\n"
        "with cpprb_ray.PrioritizedReplayBuffer(8, {'obs': {}}) as rb:\n"
        "    rb.add(obs=[1.0, 2.0])\n"
        "    view = pickle.loads(pickle.dumps(rb))\n"
        "    assert not view.is_remote and view.get_stored_size() == 2\n"
        "    assert view.flush() == 0 and len(view.sample(4)['obs']) == 4\n"
        "    view.close()\n"
        "assert 'ray' not in sys.modules\n"
        "print('ok')\n")
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True,
                            text=True, timeout=60,
                            env=dict(os.environ, PYTHONPATH=REPO_ROOT))
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


def test_the_two_node_cluster_binds_only_this_machines_address(remote_results):
    """Both nodes listen on the address the harness gave them, one of this machine's own (a
    socket binds to it), and say so; loopback cannot hold a second node."""
    address = remote_results["node_ip"]
    assert remote_results["node_addresses"] == [address, address]
    with socket.socket() as probe:
        probe.bind((address, 0))
