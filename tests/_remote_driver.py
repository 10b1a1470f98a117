"""The Ray driver of tests/test_remote.py, run as its own process against the two-node cluster.

``python tests/_remote_driver.py ADDRESS RESULTS_JSON``: connects, runs every check below
(one failing does not stop the others) and writes ``{check: "ok" or its traceback}``. Run
apart from pytest so that the session's local Ray runtime (conftest's ray_session) and this
cluster never meet in one process. This process is the owner of every buffer: it runs on the
head node; the workers pinned to the second node (resource "remote") cannot see its /dev/shm.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import traceback
from typing import Any, Callable, Dict

import numpy as np

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(TESTS_DIR))
sys.path.insert(0, TESTS_DIR)

import _frame_streams as streams  # noqa: E402
import _nstep_reference as reference  # noqa: E402
import _sequence_streams as sequence_streams  # noqa: E402
import _workers  # noqa: E402
import ray  # noqa: E402
from _workers import ENV, rows  # noqa: E402
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # noqa: E402

import cpprb_ray  # noqa: E402
from benchmarks._two_nodes import REMOTE_RESOURCE, kill_mount_namespace_of, wait_for_nodes  # noqa: E402
from cpprb_ray import remote  # noqa: E402

for _module in (_workers, streams, reference):
    ray.cloudpickle.register_pickle_by_value(_module)
TIMEOUT = 60.0
CALL_TIMEOUT = 20.0   # the remote handles' bound on an unanswered call
# Ray 2.7.2 (CPython 3.7's) cannot make a call from an actor that exit_actor() is ending: its
# .remote() hangs in atexit (cpprb_ray gives up after _client.EXIT_SECONDS). Later Rays can.
SENDS_AT_EXIT = tuple(int(part) for part in ray.__version__.split(".")[:2]) > (2, 7)
ON_REMOTE = {"num_cpus": 0, "resources": {REMOTE_RESOURCE: 0.01}, "max_restarts": 0}
NSTEP = {"size": 3, "gamma": 0.5, "rew": "rew", "next": "next_obs"}
NSTEP_ENV = {"obs": {}, "rew": {}, "next_obs": {}, "done": {}}
FRAMED = {"next_of": "obs", "stack_compress": "obs"}
LEASE = 4.0   # the writer lease of the remote writers killed below (the default is 60 s)


def shm_path(rb: Any) -> str:
    return os.path.join("/dev/shm", rb.name) if rb.backend == "shm" else rb.name


@ray.remote(**ON_REMOTE)
class RemoteUser:
    """A Ray actor on the second node: receives buffers as arguments and uses them."""

    def node(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def configure(self, **settings: Any) -> Dict[str, Any]:
        return remote.configure(**settings)

    def decoy(self, backend: str, name: str) -> bool:
        """Make a buffer of our own under `name` in this node's /dev/shm (another segment with
        the owner's name, as another host could have)."""
        where = {"path": name} if backend == "mmap" else {"name": name}
        self.decoy_rb = cpprb_ray.PrioritizedReplayBuffer(8, ENV, backend=backend, **where)
        self.decoy_rb.add(**rows(-5, 1))
        return os.path.exists(shm_path(self.decoy_rb))

    def drop_decoy(self) -> int:
        stored = self.decoy_rb.get_stored_size()
        self.decoy_rb.close()
        return stored

    def keep(self, rb: Any) -> Dict[str, Any]:
        """Hold `rb` (unpickled here, in this process) and describe it."""
        self.rb = rb
        return {"remote": rb.is_remote, "owner": rb.is_owner, "visible": os.path.exists(
            shm_path(rb)), "type": type(rb).__name__, "size": rb.get_buffer_size(),
                "repr": repr(rb)}

    def use(self, first: int) -> Dict[str, Any]:
        """add (one row, batches, with priorities), sample, update, stats, get_all_transitions."""
        rb = self.rb
        rb.add(**rows(first, 1))
        for start in range(first + 1, first + 301, 50):
            rb.add(**rows(start, 50))
        rb.add(priorities=np.full(20, 2.0), **rows(first + 301, 20))
        batch = rb.sample(64)
        problems = _workers.check_sample(rb, batch)
        applied = rb.update_priorities(batch["indexes"], np.full(64, 3.0), batch["generations"])
        out = rb.sample(64, out=batch)
        stats = rb.stats()
        every = rb.get_all_transitions()
        return {"problems": problems, "applied": applied, "refilled": out["obs"] is batch["obs"],
                "inserts": stats["inserts"], "updates": stats["updates"],
                "torn": _workers.torn(every).tolist(),
                "serials": sorted(_workers.serials_of(every).tolist()),
                "max_priority": rb.get_max_priority()}

    def bad_input(self) -> Dict[str, str]:
        """Bad input is refused at the call, with the local messages."""
        found = {}
        for label, call in (
                ("column", lambda: self.rb.add(obs=np.zeros(4))),
                ("priority", lambda: self.rb.add(priorities=[np.nan], **rows(0, 1))),
                ("index", lambda: self.rb.update_priorities([10**9], [1.0]))):
            try:
                call()
            except (ValueError, TypeError, IndexError) as error:
                found[label] = f"{type(error).__name__}: {error}"
            else:
                found[label] = "no error"
        return found

    def prefetched(self, batches: int) -> Dict[str, Any]:
        """rb.prefetch through the proxy: `batches` batches (checked as samples), then, on a
        buffer whose limiter holds samples back, the limiter's TimeoutError at next()."""
        problems = []
        refills = set()
        with self.rb.prefetch(16, depth=3) as ahead:
            for _ in range(batches):
                batch = next(ahead)
                problems += _workers.check_sample(self.rb, batch)
                refills.add(id(batch["obs"]))
                self.rb.update_priorities(batch["indexes"], np.full(16, 2.0),
                                          batch["generations"])
            taken = ahead.batches
        return {"problems": problems, "taken": taken, "sets": len(refills),
                "remote": self.rb.is_remote}

    def prefetch_held_back(self) -> Dict[str, Any]:
        found: Dict[str, Any] = {}
        started = time.monotonic()
        with self.rb.prefetch(4, timeout=0.3) as ahead:
            try:
                next(ahead)
            except TimeoutError as error:
                found["timeout"] = str(error)
        found["seconds"] = time.monotonic() - started
        return found

    def call_after_proxy_killed(self, first: int) -> Dict[str, Any]:
        started = time.monotonic()
        try:
            self.rb.add(**rows(first, 5))
            self.rb.flush()
        except remote.RemoteBufferError as error:
            failed = f"{type(error).__name__}: {error}"
        else:
            failed = ""
        seconds = time.monotonic() - started
        self.rb.add(**rows(first + 10, 5))   # a new proxy serves the next call
        return {"error": failed, "seconds": seconds, "stored": self.rb.get_stored_size()}

    def call_after_close(self) -> Dict[str, Any]:
        """Two calls after the buffer's end: the first meets the dead proxy, the second a new
        one that refuses the buffer. Both must fail, clearly and soon."""
        found: Dict[str, Any] = {}
        for attempt in ("error", "again"):
            started = time.monotonic()
            try:
                self.rb.add(**rows(0, 1))
                self.rb.flush()
                found[attempt] = ""
            except remote.RemoteBufferError as error:
                found[attempt] = f"{type(error).__name__}: {error}"
            found["seconds"] = max(found.get("seconds", 0.0), time.monotonic() - started)
        return found

    def episodes(self) -> Any:
        """N-step: a terminated episode of 5 steps, then a truncated one of 2 (one row a call,
        and a batch)."""
        rb = self.rb
        for t in range(5):
            rb.add(obs=t, rew=1.0 + t, next_obs=t + 1, done=float(t == 4))
        rb.add(obs=[10, 11], rew=[1.0, 2.0], next_obs=[11, 12], done=[0.0, 0.0])
        rb.on_episode_end()
        rb.close()
        return True

    def limited(self) -> Dict[str, Any]:
        """A SampleToInsertRatio buffer: an add past max_diff waits and times out, nothing added;
        one with timeout=None waits until the owner samples; a sample the limiter holds back
        times out."""
        rb = self.rb
        found: Dict[str, Any] = {}
        rb.add(**rows(0, 4))                      # diff 4 = max_diff
        started = time.monotonic()
        try:
            rb.add(timeout=0.5, **rows(4, 1))
        except TimeoutError:
            found["add_timed_out_after"] = time.monotonic() - started
        found["stored_after_timeout"] = rb.get_stored_size()
        try:
            rb.sample(4, timeout=0.3)               # diff 4 - 4 = 0 >= min_diff: goes
            rb.sample(4, timeout=0.3)               # diff -4 < min_diff (-2): held back
        except TimeoutError:
            found["sample_timed_out"] = True
        return found

    def limited_wait(self) -> int:
        """Waits (timeout=None) until the owner samples room for it."""
        self.rb.add(**rows(100, 4))
        return self.rb.get_stored_size()

    def save_and_clear(self, path: str) -> int:
        """save() from here (the file is written by this process), then clear()."""
        self.rb.save(path)
        self.rb.clear()
        return self.rb.get_stored_size()

    def add_and_return(self, first: int, count: int) -> None:
        """Add rows and return: they stay queued until the age flush sends them."""
        self.rb.add(**rows(first, count))

    def add_and_exit(self, first: int, count: int) -> None:
        """Add rows (no age flush for 30 s), then end this actor's process: the exit sends them."""
        remote.configure(flush_seconds=30.0)
        self.rb.add(**rows(first, count))
        ray.actor.exit_actor()

    def released_by_own_sampler(self) -> float:
        """An add held back by the limiter (timeout None) while a thread of this process
        samples through the same handle: the sample must not wait for the add."""
        def sample_later() -> None:
            time.sleep(0.5)
            self.rb.sample(4, timeout=10.0)
        sampler = threading.Thread(target=sample_later)
        sampler.start()
        started = time.monotonic()
        self.rb.add(**rows(200, 1))
        waited = time.monotonic() - started
        sampler.join()
        return waited

    def add_forever(self, first: int, batch: int) -> None:
        """Single rows with serials first, first + 1, ..., sent every `batch` rows, until
        killed."""
        remote.configure(flush_rows=batch, flush_seconds=30.0)
        serial = first
        while True:
            self.rb.add(**rows(serial, 1))
            serial += 1

    # -- laned buffers: the writer of each remote handle lives in the proxy ------------------

    def frames(self, stream: int, seed: int, adds: int) -> Dict[str, Any]:
        """Frame transitions of one stream (1 to 3 an add, with priorities), then a sample
        here, checked against the stream's oracle, refilled into out= and updated."""
        rb = self.rb
        source = streams.Stream(stream, seed)
        for _ in range(adds):
            count = int(source.random.integers(1, 4))
            rb.add(priorities=source.random.random(count) + 0.1, **source.transitions(count))
        batch = rb.sample(32)
        checked = streams.check(batch)
        again = rb.sample(32, out=batch)
        checked += streams.check(again)
        applied = rb.update_priorities(batch["indexes"], np.full(32, 2.0), batch["generations"])
        return {"checked": checked, "refilled": again["obs"] is batch["obs"],
                "applied": applied, "weights": batch["weights"].dtype.name}

    def sequences(self, stream: int, adds: int) -> Dict[str, Any]:
        """Episodes of a sequence stream (adds of 1 to 7 steps with per-step priorities, done
        and on_episode_end ends), then a sample here checked against the oracle, updated."""
        rb = self.rb
        seed_of = sequence_streams.seed_of_stream
        source = sequence_streams.Stream(stream, seed_of(stream))
        sequence_streams.write(rb, source, adds, np.random.default_rng(stream))
        sequence_streams.finish_episode(rb, source)
        batch = rb.sample(16)
        checked = sequence_streams.check(batch, seed_of)
        again = rb.sample(16, out=batch)
        checked += sequence_streams.check(again, seed_of)
        applied = rb.update_priorities(batch["indexes"], np.full(16, 2.0), batch["generations"])
        rb.close()      # (its open sequences committed as a truncated end, its lane given back)
        return {"checked": checked, "applied": applied, "shape": list(batch["obs"].shape),
                "refilled": again["mask"] is batch["mask"]}

    def frames_forever(self, stream: int, seed: int) -> None:
        """Frame transitions until killed, sent every few rows, with a short writer lease."""
        remote.configure(flush_rows=8, flush_seconds=30.0, writer_lease=LEASE)
        source = streams.Stream(stream, seed)
        while True:
            self.rb.add(**source.transitions(int(source.random.integers(1, 4))))

    def try_add(self, stream: int) -> str:
        """One add of a new stream (a laned buffer's first add is sent at once): "ok", or the
        error it raised."""
        try:
            self.rb.add(priorities=[1.0], **streams.Stream(stream, stream).transitions(1))
        except Exception as error:  # noqa: BLE001 - reported
            return f"{type(error).__name__}: {error}"
        return "ok"

    def close(self) -> bool:
        self.rb.close()
        return self.rb.closed

    def nstep_frames(self, seed: int, rounds: int) -> Dict[str, Any]:
        """N-step in a lane, with frames: the steps of feed_nstep_frames, then a sample here
        (a uniform laned buffer's: no weights), returned."""
        rb = self.rb
        feed_nstep_frames(rb, seed, rounds)
        found = {"batch": rb.sample(16), "staged": rb.stats()["nstep_staged"]}
        rb.close()
        return found

    def nstep_episodes(self, first: int, seed: int, extra: Any) -> Dict[str, Any]:
        """N-step in a lane: a stream of episodes (random batch splits; every truncated one
        ended by on_episode_end), then the steps of `extra`, one an add, left staged for
        close() to commit as a truncated episode end."""
        rb = self.rb
        episodes, splits = reference.child_plan(first, seed)
        reference.feed(rb, episodes, splits, [False] * len(episodes))
        steps = extra.steps()
        for t in range(len(extra)):
            rb.add(**{key: value[t] for key, value in steps.items()})
        found = {"staged": rb.stats()["nstep_staged"], "next": rb.get_next_index(),
                 "steps": sum(len(e) for e in episodes) + len(extra)}
        rb.close()
        return found

    def nstep_staged(self, episode: Any) -> int:
        """The steps of `episode` one an add, all sent (flush), with a short writer lease;
        returns how many the writer in the proxy keeps staged. The actor is killed next."""
        remote.configure(writer_lease=LEASE)
        steps = episode.steps()
        for t in range(len(episode)):
            self.rb.add(**{key: value[t] for key, value in steps.items()})
        self.rb.flush()
        return int(self.rb.stats()["nstep_staged"])


def feed_nstep_frames(rb: Any, seed: int, rounds: int) -> None:
    """One stream of frame transitions, 1 or 2 an add, an episode truncated by on_episode_end
    now and then and at the end (the same steps into the remote handle and a local twin)."""
    random = np.random.default_rng(seed)
    source = streams.Stream(0, seed)
    for round_ in range(rounds):
        rb.add(**source.transitions(int(random.integers(1, 3))))
        if round_ % 37 == 36:
            rb.on_episode_end()
            source.episode += 1
            source.step = 0
    rb.on_episode_end()


@ray.remote(num_cpus=0, max_restarts=0)
class Owner:
    """A buffer's owner that is not the driver (on the head), to be killed."""

    def make(self) -> Any:
        self.rb = cpprb_ray.PrioritizedReplayBuffer(1000, ENV)
        self.rb.add(**rows(0, 10))
        return self.rb


@ray.remote(num_cpus=0, resources={REMOTE_RESOURCE: 0.01}, max_retries=0)
def remote_task(rb: Any, first: int) -> Dict[str, Any]:
    """A task on the second node: adds (sent when the task's handle is collected), samples."""
    info = {"remote": rb.is_remote, "visible": os.path.exists(shm_path(rb))}
    for start in range(first, first + 200, 40):
        rb.add(**rows(start, 40))
    batch = rb.sample(32)
    info["problems"] = _workers.check_sample(rb, batch)
    rb.add(**rows(first + 200, 10))   # left queued: sent by age or when `rb` is collected
    return info


@ray.remote(num_cpus=0, resources={REMOTE_RESOURCE: 0.01}, max_retries=0)
def add_forever_task(rb: Any, first: int, batch: int) -> None:
    """A task on the second node adding single rows (serials first, first + 1, ...), sent
    every `batch` rows, until it is cancelled (its worker killed)."""
    remote.configure(flush_rows=batch, flush_seconds=30.0)
    serial = first
    while True:
        rb.add(**rows(serial, 1))
        serial += 1


def check_whole_batches(rb: Any, before: int, first: int, last: int, batch: int) -> int:
    """What a killed writer sent (serials first..last-1): whole batches, in order, untorn;
    returns how many rows."""
    serials = _workers.serials_of(rb.get_all_transitions())
    written = np.sort(serials[(serials >= first) & (serials < last)])
    arrived = rb.stats()["inserts"] - before
    assert arrived % batch == 0 and arrived >= 20 * batch, arrived
    assert np.array_equal(written, np.arange(first, first + arrived)), written[-5:]
    assert rb.get_stored_size() < rb.get_buffer_size()
    assert_intact(rb)
    return arrived


@ray.remote(num_cpus=0)
def local_task(rb: Any) -> Dict[str, Any]:
    """A task on the owner's node: attaches in place."""
    return {"remote": rb.is_remote, "node": ray.get_runtime_context().get_node_id()}


def proxies_of(rb: Any) -> list:
    name = remote.proxy_name(rb.backend, rb.name, rb._layout.token)
    return [a for a in ray.util.list_named_actors(all_namespaces=True)
            if a["name"] == name and a["namespace"] == remote.NAMESPACE]


def wait_for(predicate: Callable[[], bool], seconds: float, what: str) -> float:
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > seconds:
            raise AssertionError(f"{what}: not within {seconds} s")
        time.sleep(0.05)
    return time.monotonic() - started


def assert_intact(rb: Any) -> None:
    everything = rb.get_all_transitions()
    assert _workers.torn(everything).size == 0, _workers.torn(everything)[:8]
    assert _workers.tree_problems(rb._store.check_tree()) == []
    assert _workers.check_sample(rb, rb.sample(64)) == []


# ---------------------------------------------------------------------------------------------


def check_tasks_and_actors(user: Any, here: str) -> None:
    rb = cpprb_ray.PrioritizedReplayBuffer(10_000, ENV)
    try:
        rb.add(**rows(0, 100))
        # A task on the owner's node attaches in place, never through the actor.
        on_owner_node = NodeAffinitySchedulingStrategy(here, soft=False)
        local = ray.get(local_task.options(scheduling_strategy=on_owner_node).remote(rb),
                        timeout=TIMEOUT)
        assert local == {"remote": False, "node": here}, local
        # The actor holds a decoy: another buffer under the owner's name in its node's
        # /dev/shm. Unpickling there must not take it for ours (the token decides).
        assert ray.get(user.decoy.remote(rb.backend, rb.name), timeout=TIMEOUT) is True
        kept = ray.get(user.keep.remote(rb), timeout=TIMEOUT)
        assert kept["remote"] is True and kept["owner"] is False and kept["visible"] is True, kept
        assert kept["type"] == "PrioritizedReplayBuffer" and kept["size"] == 10_000, kept
        used = ray.get(user.use.remote(1000), timeout=TIMEOUT)
        assert used["problems"] == [] and used["torn"] == [], used
        assert used["applied"] == 64 and used["refilled"] is True, used
        assert used["max_priority"] == 3.0, used
        expected = set(range(100)) | set(range(1000, 1321))
        assert set(used["serials"]) == expected and used["inserts"] == len(expected), used
        assert ray.get(user.drop_decoy.remote(), timeout=TIMEOUT) == 1   # the decoy untouched
        errors = ray.get(user.bad_input.remote(), timeout=TIMEOUT)
        # (ColumnsError: a ValueError, and a KeyError as cpprb raises for a missing column)
        assert errors["column"].startswith("ColumnsError: add needs exactly the columns"), errors
        assert errors["priority"].startswith("ValueError: priorities must be finite"), errors
        assert errors["index"].startswith(("ValueError", "IndexError")), errors
        # A task there, the buffer as an argument (and once through the object store).
        infos = ray.get([remote_task.remote(rb, 2000), remote_task.remote(ray.put(rb), 3000)],
                        timeout=TIMEOUT)
        for info in infos:
            assert info == {"remote": True, "visible": False, "problems": []}, info
        expected |= set(range(2000, 2210)) | set(range(3000, 3210))
        # Rows the tasks left queued arrive by age (or when their handles are collected).
        wait_for(lambda: rb.stats()["inserts"] == len(expected), 10.0, "the tasks' rows")
        everything = rb.get_all_transitions()
        assert set(_workers.serials_of(everything).tolist()) == expected
        assert rb.get_max_priority() == 3.0
        assert_intact(rb)
        # One proxy for the buffer, named after it, on the owner's node.
        found = proxies_of(rb)
        assert len(found) == 1, found
        proxy = ray.get_actor(found[0]["name"], namespace=remote.NAMESPACE)
        assert ray.get(proxy.ping.remote(), timeout=TIMEOUT)["node"] == here
    finally:
        rb.close()
    # The owner's close ends it.
    wait_for(lambda: not proxies_of(rb), 10.0, "the proxy's end after the owner's close")
    result = ray.get(user.call_after_close.remote(), timeout=TIMEOUT)
    assert result["error"].startswith("RemoteBufferError"), result
    assert result["again"].startswith("RemoteBufferError"), result
    assert result["seconds"] < 30.0, result


def check_nstep(user: Any, here: str) -> None:
    rb = cpprb_ray.ReplayBuffer(64, NSTEP_ENV, Nstep=NSTEP)
    reference = cpprb_ray.ReplayBuffer(64, NSTEP_ENV, Nstep=NSTEP)
    try:
        kept = ray.get(user.keep.remote(rb), timeout=TIMEOUT)
        assert kept["remote"] is True, kept
        ray.get(user.episodes.remote(), timeout=TIMEOUT)
        # The same steps through a local handle: the rows must be the same.
        for t in range(5):
            reference.add(obs=t, rew=1.0 + t, next_obs=t + 1, done=float(t == 4))
        reference.add(obs=[10, 11], rew=[1.0, 2.0], next_obs=[11, 12], done=[0.0, 0.0])
        reference.on_episode_end()
        got, want = rb.get_all_transitions(), reference.get_all_transitions()
        assert len(want["obs"]) == 7
        for key in want:
            assert np.array_equal(got[key], want[key]), (key, got[key], want[key])
    finally:
        rb.close()
        reference.close()


def check_rate_limiter(user: Any, here: str) -> None:
    limiter = cpprb_ray.SampleToInsertRatio(samples_per_insert=1.0, min_size_to_sample=1,
                                            error_buffer=(-2.0, 4.0))
    rb = cpprb_ray.PrioritizedReplayBuffer(64, ENV, rate_limiter=limiter)
    try:
        assert ray.get(user.keep.remote(rb), timeout=TIMEOUT)["remote"] is True
        found = ray.get(user.limited.remote(), timeout=TIMEOUT)
        assert 0.4 <= found.get("add_timed_out_after", -1) < 5.0, found
        assert found["stored_after_timeout"] == 4, found
        assert found.get("sample_timed_out") is True, found
        # diff is now 4 - 4 = 0: room for 4 inserts. Take it, then a waiting add (timeout
        # None) goes through once the owner samples.
        rb.add(**rows(50, 4))
        waiting = user.limited_wait.remote()
        ready, _ = ray.wait([waiting], timeout=1.0)
        assert not ready, "a remote add past the limiter did not wait"
        rb.sample(4)
        assert ray.get(waiting, timeout=TIMEOUT) == 12
        waited = ray.get(user.released_by_own_sampler.remote(), timeout=TIMEOUT)
        assert 0.4 <= waited < 10.0, waited
        assert rb.get_stored_size() == 13
        stats = rb.stats()["rate_limiter"]
        assert stats["insert_timeouts"] == 1 and stats["sample_timeouts"] == 1, stats
    finally:
        rb.close()


def check_prefetch(user: Any, here: str) -> None:
    """rb.prefetch on a remote handle: its batches are the buffer's rows, the ring's sets cycle,
    every batch drawn counts (at most depth - 1 ahead of the learner's), and the limiter's
    TimeoutError reaches next() through the proxy."""
    rb = cpprb_ray.PrioritizedReplayBuffer(256, ENV)
    limited = cpprb_ray.PrioritizedReplayBuffer(64, ENV, rate_limiter=cpprb_ray.MinSize(32))
    try:
        rb.add(**rows(0, 100))
        assert ray.get(user.keep.remote(rb), timeout=TIMEOUT)["remote"] is True
        found = ray.get(user.prefetched.remote(6), timeout=TIMEOUT)
        assert found["remote"] is True and found["problems"] == [], found
        assert found["taken"] == 6 and found["sets"] == 3, found
        stats = rb.stats()
        assert 6 * 16 <= stats["samples"] <= 8 * 16, stats
        assert stats["updates"] == 6 * 16, stats
        assert ray.get(user.keep.remote(limited), timeout=TIMEOUT)["remote"] is True
        held = ray.get(user.prefetch_held_back.remote(), timeout=TIMEOUT)
        assert "held back by the rate limiter" in held.get("timeout", ""), held
        assert held["seconds"] < 10.0, held
        assert limited.stats()["samples"] == 0
    finally:
        rb.close()
        limited.close()


def check_flushes(user: Any, here: str) -> None:
    """Rows left queued arrive by age (no other call); an actor's exit sends what it queued."""
    rb = cpprb_ray.ReplayBuffer(1000, ENV)
    try:
        assert ray.get(user.keep.remote(rb), timeout=TIMEOUT)["remote"] is True
        ray.get(user.add_and_return.remote(0, 7), timeout=TIMEOUT)
        wait_for(lambda: rb.get_stored_size() == 7, 5.0, "the rows queued, by age")
        expected = set(range(7))
        if SENDS_AT_EXIT:
            leaving = RemoteUser.remote()
            ray.get(leaving.keep.remote(rb), timeout=TIMEOUT)
            try:
                ray.get(leaving.add_and_exit.remote(100, 5), timeout=TIMEOUT)
            except ray.exceptions.RayActorError:
                pass   # the actor ended itself
            wait_for(lambda: rb.get_stored_size() == 12, 10.0, "the rows queued at the exit")
            expected |= set(range(100, 105))
        before = rb.get_all_transitions()
        assert set(_workers.serials_of(before).tolist()) == expected
        # save() and clear() through the proxy (the second node shares this /tmp, not /dev/shm).
        path = os.path.join(os.path.dirname(os.path.abspath(sys.argv[2])), "remote.ckpt")
        assert ray.get(user.save_and_clear.remote(path), timeout=TIMEOUT) == 0
        assert rb.get_stored_size() == 0
        with cpprb_ray.ReplayBuffer.load(path) as copy:
            after = copy.get_all_transitions()
            for key in before:
                assert np.array_equal(before[key], after[key]), key
    finally:
        rb.close()


def check_owner_died(user: Any, here: str) -> None:
    """The owner killed: its proxy ends, a client's next call fails clearly and soon."""
    # On the head, beside this driver (num_cpus=0 would fit it on either node).
    owner = Owner.options(scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=False)
                          ).remote()
    rb = ray.get(owner.make.remote(), timeout=TIMEOUT)   # a view here, on the owner's node
    name = rb.name
    try:
        assert not rb.is_owner and not rb.is_remote
        assert ray.get(user.keep.remote(rb), timeout=TIMEOUT)["remote"] is True
        ray.get(user.add_and_return.remote(10, 5), timeout=TIMEOUT)
        wait_for(lambda: rb.get_stored_size() == 15, 5.0, "the rows, through the proxy")
        assert len(proxies_of(rb)) == 1
        ray.kill(owner, no_restart=True)
        wait_for(lambda: not proxies_of(rb), 10.0, "the proxy's end after the owner's death")
        result = ray.get(user.call_after_close.remote(), timeout=TIMEOUT)
        assert result["error"].startswith("RemoteBufferError"), result
        assert result["again"].startswith("RemoteBufferError"), result
        assert "is dead" in result["again"], result
        assert result["seconds"] < 30.0, result
    finally:
        rb.close()
        cpprb_ray.remove_buffer(name)   # the dead owner's orphan


def check_failures(user: Any, here: str) -> None:
    rb = cpprb_ray.PrioritizedReplayBuffer(100_000, ENV)
    try:
        assert ray.get(user.keep.remote(rb), timeout=TIMEOUT)["remote"] is True
        ray.get(user.use.remote(0), timeout=TIMEOUT)
        # The proxy killed: the next call fails clearly and soon; the one after works again.
        (proxy_entry,) = proxies_of(rb)
        ray.kill(ray.get_actor(proxy_entry["name"], namespace=remote.NAMESPACE),
                 no_restart=True)
        wait_for(lambda: not proxies_of(rb), 10.0, "the killed proxy's end")
        result = ray.get(user.call_after_proxy_killed.remote(10_000), timeout=TIMEOUT)
        assert result["error"].startswith("RemoteBufferError"), result
        assert "gone" in result["error"], result
        assert result["seconds"] < 10.0, result
        assert len(proxies_of(rb)) == 1
        serials = set(_workers.serials_of(rb.get_all_transitions()).tolist())
        assert set(range(10_010, 10_015)) <= serials
        assert not serials & set(range(10_000, 10_005))   # the failed flush's rows: lost
        # A writer killed while it adds: what arrived is whole batches, in order, untorn.
        batch = 97
        writer = RemoteUser.remote()
        ray.get(writer.keep.remote(rb), timeout=TIMEOUT)
        before = rb.stats()["inserts"]   # nothing else adds from here on
        looping = writer.add_forever.remote(50_000, batch)
        wait_for(lambda: rb.stats()["inserts"] >= before + 20 * batch, 30.0, "the writer's rows")
        ray.kill(writer, no_restart=True)
        try:
            ray.get(looping, timeout=TIMEOUT)
            raise AssertionError("the killed writer's call returned")
        except ray.exceptions.RayActorError:
            pass
        time.sleep(0.5)
        check_whole_batches(rb, before, 50_000, 1_000_000, batch)
        # The same with a task, its worker killed (ray.cancel(force=True)).
        batch = 89
        before = rb.stats()["inserts"]
        looping = add_forever_task.remote(rb, 1_000_000, batch)
        wait_for(lambda: rb.stats()["inserts"] >= before + 20 * batch, 30.0, "the task's rows")
        # Not recursive: Ray would cancel the task's call to the proxy first, and the task
        # could end on that call's error instead of being killed.
        ray.cancel(looping, force=True, recursive=False)
        try:
            ray.get(looping, timeout=TIMEOUT)
            raise AssertionError("the cancelled task returned")
        except (ray.exceptions.TaskCancelledError, ray.exceptions.WorkerCrashedError):
            pass
        time.sleep(0.5)
        check_whole_batches(rb, before, 1_000_000, 2_000_000, batch)
    finally:
        rb.close()


def sample_while(rb: Any, pending: Any, check: Callable[[Any], Any]) -> int:
    """Sample and check every row until the remote call `pending` returns; how many rows."""
    checked = 0
    while ray.wait([pending], timeout=0)[1]:
        if rb.get_stored_size():
            check(rb.sample(64))
            checked += 64
        time.sleep(0.02)
    return checked


def check_laned_frames(user: Any, here: str) -> None:
    """Frames (next_of + stack_compress) in 2 lanes, written by remote handles whose writers
    live in the proxy: the owner samples meanwhile, every row exactly its writer's; a third
    writer gets LaneError; a writer's close gives its lane back; a writer killed mid-stream
    keeps its lane for its lease only, and no row is ever torn."""
    rb = cpprb_ray.PrioritizedReplayBuffer(2 * 256, streams.ENV, lanes=2, seed=1, **FRAMED)
    killed, third = RemoteUser.remote(), RemoteUser.remote()
    try:
        for actor in (user, killed, third):
            kept = ray.get(actor.keep.remote(rb), timeout=TIMEOUT)
            assert kept["remote"] is True and kept["size"] == 512, kept
        looping = killed.frames_forever.remote(1, 11)
        writing = user.frames.remote(0, 10, 300)
        checked = sample_while(rb, writing, streams.check)
        found = ray.get(writing, timeout=TIMEOUT)
        # (The killed writer's lane wraps meanwhile: an update skips the rows it overwrote.)
        assert found["checked"] == 64 and found["refilled"] is True, found
        assert 0 < found["applied"] <= 32 and found["weights"] == "float32", found
        assert checked > 0
        # Both lanes have a live writer: a third one's first add is refused, nothing added.
        refused = ray.get(third.try_add.remote(2), timeout=TIMEOUT)
        assert refused.startswith("LaneError: every one of the buffer's 2 lanes"), refused
        # A closed handle gives its lane back (its writer in the proxy closes).
        assert ray.get(user.close.remote(), timeout=TIMEOUT) is True
        assert ray.get(third.try_add.remote(2), timeout=TIMEOUT) == "ok"
        # The writer killed mid-stream: its lane stays its own for its lease, then the proxy
        # closes its writer and a new handle takes the lane (frames exact: it writes fillers).
        ray.get(user.keep.remote(rb), timeout=TIMEOUT)
        ray.kill(killed, no_restart=True)
        killed_at = time.monotonic()
        assert ray.get(user.try_add.remote(3), timeout=TIMEOUT).startswith("LaneError")
        try:
            ray.get(looping, timeout=TIMEOUT)
            raise AssertionError("the killed writer's loop returned")
        except ray.exceptions.RayActorError:
            pass
        while True:
            streams.check(rb.sample(64))
            outcome = ray.get(user.try_add.remote(3), timeout=TIMEOUT)
            if outcome == "ok":
                break
            assert outcome.startswith("LaneError"), outcome
            assert time.monotonic() - killed_at < LEASE + 15.0, "the lease never ran out"
        print(f"laned: lane free {time.monotonic() - killed_at:.1f} s after the writer was killed "
              f"(lease {LEASE} s)", flush=True)
        found = ray.get(user.frames.remote(3, 30, 40), timeout=TIMEOUT)
        assert found["checked"] == 64 and found["applied"] == 32, found
        everything = rb.get_all_transitions()
        assert streams.check(everything) == rb.get_stored_size() > 100
        assert {0, 2, 3} <= set(((everything["act"].ravel() >> 1) // 10**9).tolist())
        assert _workers.tree_problems(rb._store.check_tree()) == []
    finally:
        for actor in (killed, third):
            ray.kill(actor, no_restart=True)
        rb.close()


def check_laned_sequences(user: Any, here: str) -> None:
    """A sequence buffer (sequence=) in 2 lanes, written by a remote handle whose writer (its
    stream, its open sequences) lives in the proxy: the owner samples meanwhile, every sequence
    step by step the oracle's; the remote handle samples and updates through the proxy."""
    seed_of = sequence_streams.seed_of_stream
    rb = cpprb_ray.PrioritizedReplayBuffer(
        2 * 60, sequence_streams.ENV, lanes=2, seed=1,
        sequence={"length": sequence_streams.LENGTH, "period": sequence_streams.PERIOD})
    try:
        kept = ray.get(user.keep.remote(rb), timeout=TIMEOUT)
        assert kept["remote"] is True, kept
        writing = user.sequences.remote(4, 150)
        checked = sample_while(rb, writing, lambda batch: sequence_streams.check(batch, seed_of))
        found = ray.get(writing, timeout=TIMEOUT)
        assert found["checked"] == 32 and found["shape"] == [16, sequence_streams.LENGTH, 4]
        assert found["refilled"] is True, found
        assert 0 < found["applied"] <= 16, found
        everything = rb.get_all_transitions()
        assert sequence_streams.check(everything, seed_of) == rb.get_stored_size() > 10
        print(f"laned sequences: {checked} sampled while the remote handle wrote", flush=True)
        assert _workers.tree_problems(rb._store.check_tree()) == []
        # save() through the proxy (a format-3 file: the sequences), loaded here: the same
        # sequences, each the oracle's, sampled as in the original.
        ray.get(user.keep.remote(rb), timeout=TIMEOUT)
        path = os.path.join(os.path.dirname(os.path.abspath(sys.argv[2])), "sequences.ckpt")
        assert ray.get(user.save_and_clear.remote(path), timeout=TIMEOUT) == 0
        with cpprb_ray.PrioritizedReplayBuffer.load(path, seed=2) as copy:
            loaded = copy.get_all_transitions()
            for key in everything:
                assert np.array_equal(everything[key], loaded[key]), key
            assert sequence_streams.check(copy.sample(16), seed_of) == 16
    finally:
        rb.close()


def check_laned_nstep(user: Any, here: str) -> None:
    """N-step in lanes through remote handles: with frames, every row sampled while the
    remote writer adds, and every row at the end, equals a local twin's (without frames or
    lanes) given the same steps; without frames, every row equals the N-step reference,
    the steps staged at close() committed, and those staged by a writer killed committed as
    a truncated episode end once its lease ran out."""
    spec = reference.nstep_spec(3, 0.5)
    rb = cpprb_ray.ReplayBuffer(2 * 256, streams.ENV, lanes=2, Nstep=spec, **FRAMED)
    twin = cpprb_ray.ReplayBuffer(4096, dict(streams.ENV, next_obs=streams.ENV["obs"]),
                                  Nstep=spec)
    try:
        feed_nstep_frames(twin, 5, 150)
        theirs = twin.get_all_transitions()
        by_act = {int(act): k for k, act in enumerate(theirs["act"].ravel())}

        def same_as_twin(batch: Dict[str, np.ndarray]) -> None:
            for k, act in enumerate(batch["act"].ravel()):
                for name in theirs:
                    assert (batch[name][k] == theirs[name][by_act[int(act)]]).all(), (name, act)

        assert ray.get(user.keep.remote(rb), timeout=TIMEOUT)["remote"] is True
        writing = user.nstep_frames.remote(5, 150)
        checked = sample_while(rb, writing, same_as_twin)
        found = ray.get(writing, timeout=TIMEOUT)
        assert sorted(found["batch"]) == ["act", "discounts", "done", "generations", "indexes",
                                          "next_obs", "obs", "rew"] and found["staged"] == 0
        same_as_twin(found["batch"])
        ours = rb.get_all_transitions()
        same_as_twin(ours)
        assert len(ours["act"]) == rb.get_stored_size() > 150 and checked > 0
        assert "weights" not in rb.sample(8)
    finally:
        rb.close()
        twin.close()
    rb = cpprb_ray.PrioritizedReplayBuffer(2 * 256, reference.ENV, lanes=2, Nstep=spec)
    killed = RemoteUser.remote()
    try:
        assert ray.get(user.keep.remote(rb), timeout=TIMEOUT)["remote"] is True
        episodes = reference.child_plan(0, 3)[0]
        closed = reference.Episode(1000, [0.5, -1.0, 2.0, 0.25], terminated=False)
        found = ray.get(user.nstep_episodes.remote(0, 3, closed), timeout=TIMEOUT)
        # N-step steps wait in the proxy (n - 1 of them), the lane's next slot is after them.
        assert found["staged"] == 2 and found["next"] % 256 == found["steps"], found
        assert rb.get_stored_size() == sum(len(e) for e in episodes) + len(closed)
        cut = reference.Episode(2000, [1.0, 2.0, 3.0, 4.0, 5.0], terminated=False)
        assert ray.get(killed.keep.remote(rb), timeout=TIMEOUT)["remote"] is True
        assert ray.get(killed.nstep_staged.remote(cut), timeout=TIMEOUT) == 2
        ray.kill(killed, no_restart=True)
        killed_at = time.monotonic()
        stored = rb.get_stored_size()
        assert stored == sum(len(e) for e in episodes) + len(closed) + len(cut) - 2
        wait_for(lambda: rb.get_stored_size() == stored + 2, LEASE + 15.0,
                 "the killed writer's staged steps, after its lease")
        print(f"laned N-step: staged steps committed {time.monotonic() - killed_at:.1f} s after "
              f"the writer was killed (lease {LEASE} s)", flush=True)
        rows = rb.get_all_transitions()
        order = np.argsort(rows["obs"].ravel(), kind="stable")
        reference.assert_rows_match({key: value[order] for key, value in rows.items()},
                                    reference.reference_rows(episodes + [closed, cut], 3, 0.5))
    finally:
        ray.kill(killed, no_restart=True)
        rb.close()


def check_owner_node_died(user: Any, here: str) -> None:
    """The owner's whole node gone (every process in its mount namespace SIGKILLed, as a host
    that dies): a client's calls fail clearly within its call timeout, never hang. Run last: the
    cluster keeps only the head."""
    node2 = int(os.environ["CPPRB_RAY_NODE2_PID"])
    owner = Owner.options(resources={REMOTE_RESOURCE: 0.01}).remote()
    rb = ray.get(owner.make.remote(), timeout=TIMEOUT)   # the owner's node is node 2
    # This driver cannot see node 2's /dev/shm: a client of a proxy over there.
    assert rb.is_remote and not os.path.exists(shm_path(rb))
    rb.add(**rows(10, 5))
    assert rb.sample(8)["obs"].shape[0] == 8 and rb.get_stored_size() == 15
    assert kill_mount_namespace_of(node2) >= 3   # ray start, the raylet, workers, ...
    outcomes = []
    for _ in range(2):   # the call that meets the death, and one after it
        started = time.monotonic()
        try:
            rb.sample(8)
            outcomes.append(("returned", time.monotonic() - started))
        except remote.RemoteBufferError as error:
            outcomes.append((str(error), time.monotonic() - started))
    print(f"owner's node killed: {outcomes}", flush=True)
    for message, seconds in outcomes:
        assert message != "returned", outcomes
        assert seconds < CALL_TIMEOUT + 10.0, outcomes
    rb.close()


CHECKS = {"tasks_and_actors": check_tasks_and_actors, "nstep": check_nstep,
          "rate_limiter": check_rate_limiter, "flushes": check_flushes,
          "owner_died": check_owner_died, "failures": check_failures,
          "laned_frames": check_laned_frames, "laned_nstep": check_laned_nstep,
          "laned_sequences": check_laned_sequences, "prefetch": check_prefetch,
          "owner_node_died": check_owner_node_died}


def main() -> int:
    address, results_path = sys.argv[1], sys.argv[2]
    started = time.monotonic()
    ray.init(address=address, log_to_driver=False)
    results: Dict[str, Any] = {}
    try:
        wait_for_nodes(ray, 2)
        results["node_addresses"] = sorted(node["NodeManagerAddress"] for node in ray.nodes()
                                           if node["Alive"])
        here = ray.get_runtime_context().get_node_id()
        user = RemoteUser.remote()
        node = ray.get(user.node.remote(), timeout=TIMEOUT)
        assert node != here, "the driver and the 'remote' actor are on one node"
        ray.get(user.configure.remote(call_timeout=CALL_TIMEOUT), timeout=TIMEOUT)
        remote.configure(call_timeout=CALL_TIMEOUT)
        for name, check in CHECKS.items():
            began = time.monotonic()
            try:
                check(user, here)
                results[name] = "ok"
            except BaseException:  # noqa: BLE001 - reported, the next check runs
                results[name] = traceback.format_exc()
            results[name + "_seconds"] = round(time.monotonic() - began, 2)
    finally:
        results["driver_seconds"] = round(time.monotonic() - started, 2)
        with open(results_path, "w") as handle:
            json.dump(results, handle)
        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
