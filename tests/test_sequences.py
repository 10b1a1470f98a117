"""Sequence buffers (sequence=): every sampled sequence is, step by step, the oracle's for its
(stream, episode, start), padding and mask included, across wrap-around, episode ends, many
writer processes, a writer killed mid-add, lane reclaim and clear; first priorities, eviction
before overwrite, generations, the rate limiter's unit, out=, attach and bad input."""

from __future__ import annotations

import multiprocessing
import os
import pickle
import signal
import time

import numpy as np
import pytest

import cpprb_ray
from cpprb_ray import PrioritizedReplayBuffer, ReplayBuffer, sequence_priority
from tests import _sequence_streams as streams
from tests._workers import Children, tree_problems

CLASSES = [ReplayBuffer, PrioritizedReplayBuffer]
SEQUENCE = {"length": streams.LENGTH, "period": streams.PERIOD}


def make(cls, size, backend="auto", **options):
    options.setdefault("sequence", SEQUENCE)
    return cls(size, streams.ENV, backend=backend, seed=1, **options)


def live_set(all_rows) -> set:
    return {streams.identify(all_rows, k) for k in range(len(all_rows["mask"]))}


class Oracle:
    """Which sequences of one writer in a one-lane buffer of `slots` steps must be live: those
    committed (all `length` steps written, or their episode ended) whose start the ring has not
    written again (the start is the first slot of a sequence the ring reaches)."""

    def __init__(self, stream: int, seed: int, slots: int, length: int = streams.LENGTH,
                 period: int = streams.PERIOD):
        self.stream, self.seed, self.slots = stream, seed, slots
        self.length, self.period = length, period
        self.written = 0
        self.starts = {}          # (episode, t) -> global step index
        self.episode_steps = {}   # episode -> steps written so far
        self.floor = 0            # steps before this were cleared

    def wrote(self, names) -> None:
        for episode, t in names:
            if t % self.period == 0:
                self.starts[(episode, t)] = self.written
            self.episode_steps[episode] = t + 1
            self.written += 1

    def live(self) -> set:
        found = set()
        for (episode, t), index in self.starts.items():
            if index < max(self.floor, self.written - self.slots):
                continue
            steps, _ = streams.episode_of(self.seed, episode, self.length)
            done = self.episode_steps[episode] == steps
            if done or self.episode_steps[episode] - t >= self.length:
                found.add((self.stream, episode, t))
        return found


@pytest.mark.parametrize("cls", CLASSES)
def test_one_writer_exact_across_wrap_around_and_episode_ends(cls, backend):
    slots = 40
    random = np.random.default_rng(0) if cls is PrioritizedReplayBuffer else None
    seed_of = streams.seed_of_stream
    with make(cls, slots, backend) as rb:
        source = streams.Stream(0, seed_of(0))
        oracle = Oracle(0, seed_of(0), slots)
        checked = 0
        for _ in range(60):      # about 7 laps of the ring
            oracle.wrote(streams.write(rb, source, 1, random))
            everything = rb.get_all_transitions()
            assert live_set(everything) == oracle.live()
            assert rb.get_stored_size() == len(oracle.live())
            streams.check(everything, seed_of)
            if rb.get_stored_size():
                batch = rb.sample(16)
                checked += streams.check(batch, seed_of)
                assert batch["mask"].dtype == np.bool_
                assert batch["obs"].shape == (16, streams.LENGTH, 4)
                assert batch["core"].shape == (16, streams.LENGTH, 2, 3)
                assert batch["indexes"].shape == batch["generations"].shape == (16,)
                assert ("weights" in batch) == (cls is PrioritizedReplayBuffer)
        assert checked > 300
        assert oracle.written > 2 * slots
        assert tree_problems(rb._store.check_tree()) == []


def test_first_priorities_and_updates():
    env = {"obs": {}, "done": {}}
    with PrioritizedReplayBuffer(64, env, alpha=1.0, eps=0.0, seed=0,
                                 sequence={"length": 4, "period": 2, "eta": 0.9}) as rb:
        prios = np.array([1.0, 5.0, 2.0, 3.0, 4.0])
        rb.add(obs=np.arange(5.0), done=[0, 0, 0, 0, 1], priorities=prios)
        _, leaves, _, _ = rb._store.check_tree()
        starts = np.flatnonzero(leaves > 0)
        # Sequences at steps 0 (4 steps), 2 (3 steps, padded) and 4 (1 step, padded).
        assert starts.tolist() == [0, 2, 4]
        mask = np.array([[1, 1, 1, 1], [1, 1, 1, 0], [1, 0, 0, 0]], dtype=bool)
        windows = np.array([prios[0:4], np.r_[prios[2:5], 0.0], np.r_[prios[4:5], 0, 0, 0]])
        first = sequence_priority(windows, mask=mask, eta=0.9)
        assert np.allclose(leaves[starts], first)
        assert rb.get_max_priority() == pytest.approx(first.max())
        # Without priorities: the largest priority seen.
        rb.add(obs=[7.0, 8.0], done=[0, 1])
        _, leaves, _, _ = rb._store.check_tree()
        assert leaves[5] == pytest.approx(first.max())
        batch = rb.sample(8)
        assert rb.update_priorities(batch["indexes"], np.full(8, 0.5), batch["generations"]) == 8
        _, leaves, _, _ = rb._store.check_tree()
        assert np.allclose(leaves[np.unique(batch["indexes"])], 0.5)


def test_eviction_before_overwrite_and_generations():
    env = {"obs": {}}
    with PrioritizedReplayBuffer(8, env, seed=0, sequence={"length": 3, "period": 1}) as rb:
        rb.add(obs=np.arange(8.0))
        assert rb.get_stored_size() == 6          # starts 0..5 complete, 6 and 7 open
        batch = rb.sample(32)
        assert (batch["obs"][:, 1:, 0] == batch["obs"][:, :-1, 0] + 1).all()
        old = {int(i): g for i, g in zip(batch["indexes"], batch["generations"])}
        rb.add(obs=[8.0])                         # slot 0 again: the sequence at 0 is gone
        everything = rb.get_all_transitions()
        assert sorted(everything["obs"][:, 0, 0].tolist()) == [1, 2, 3, 4, 5, 6]
        assert rb.get_stored_size() == 6
        for _ in range(20):
            assert 0.0 not in rb.sample(16)["obs"][:, 0, 0]
        if 0 in old:
            assert rb.update_priorities([0], [9.0], [old[0]]) == 0   # late: skipped
        rb.add(obs=np.arange(9.0, 17.0))          # a whole lap: every old sequence gone
        firsts = sorted(rb.get_all_transitions()["obs"][:, 0, 0].tolist())
        assert firsts == [9, 10, 11, 12, 13, 14]
        applied = rb.update_priorities(list(old), [9.0] * len(old), list(old.values()))
        assert applied == 0
        assert tree_problems(rb._store.check_tree()) == []


def test_truncated_episode_end_pads_and_a_new_episode_starts_again():
    env = {"obs": {}, "done": {}}
    with ReplayBuffer(32, env, seed=0, sequence={"length": 4, "period": 4}) as rb:
        rb.add(obs=[1.0, 2.0], done=[0, 0])
        assert rb.get_stored_size() == 0              # open: never sampled partly written
        with pytest.raises(ValueError):
            rb.sample(1)
        rb.on_episode_end()
        rb.on_episode_end()                           # nothing open: nothing to do
        rb.add(obs=[3.0, 4.0, 5.0, 6.0, 7.0], done=[0, 0, 0, 0, 0])
        everything = rb.get_all_transitions()
        assert everything["obs"][:, :, 0].tolist() == [[1, 2, 0, 0], [3, 4, 5, 6]]
        assert everything["mask"].tolist() == [[True, True, False, False], [True] * 4]
        assert "weights" not in rb.sample(2)


def test_many_lanes_one_per_handle_and_lane_error():
    with make(PrioritizedReplayBuffer, 2 * 20, lanes=2) as rb:
        view = PrioritizedReplayBuffer.attach(rb.name)
        third = PrioritizedReplayBuffer.attach(rb.name)
        try:
            seed_of = streams.seed_of_stream
            streams.write(rb, streams.Stream(0, seed_of(0)), 20)
            streams.write(view, streams.Stream(1, seed_of(1)), 20)
            assert {rb._writer.lane, view._writer.lane} == {0, 1}
            with pytest.raises(cpprb_ray.LaneError):
                streams.write(third, streams.Stream(2, seed_of(2)), 1)
            everything = rb.get_all_transitions()
            assert {s for s, _, _ in live_set(everything)} == {0, 1}
            streams.check(everything, seed_of)
            streams.check(view.sample(64), seed_of)
        finally:
            third.close()
            view.close()


def test_clear_drops_open_sequences_and_later_ones_are_exact():
    seed_of = streams.seed_of_stream
    with make(ReplayBuffer, 40) as rb:
        source = streams.Stream(0, seed_of(0))
        oracle = Oracle(0, seed_of(0), 40)
        oracle.wrote(streams.write(rb, source, 15))
        assert rb.get_stored_size() > 0
        rb.clear()
        assert rb.get_stored_size() == 0 and len(rb.get_all_transitions()["mask"]) == 0
        oracle.floor = oracle.written
        for _ in range(25):
            oracle.wrote(streams.write(rb, source, 1))
            everything = rb.get_all_transitions()
            assert live_set(everything) == oracle.live()
            streams.check(everything, seed_of)


def test_sample_out_rate_limiter_stats_and_pickle():
    limiter = cpprb_ray.SampleToInsertRatio(samples_per_insert=2.0, min_size_to_sample=3,
                                            error_buffer=20)
    env = {"obs": {}, "done": {}}
    with PrioritizedReplayBuffer(64, env, seed=0, rate_limiter=limiter,
                                 sequence={"length": 2, "period": 1}) as rb:
        rb.add(obs=[1.0, 2.0, 3.0], done=[0, 0, 0])   # two sequences (1, 2) and (2, 3)
        with pytest.raises(TimeoutError):
            rb.sample(1, timeout=0)                   # 2 < min_size_to_sample 3
        rb.add(obs=[4.0], done=[1.0])                 # (3, 4) and (4, padded)
        stats = rb.stats()
        assert stats["inserts"] == 4 and stats["stored"] == 4
        batch = rb.sample(4)
        again = rb.sample(4, out=batch)
        assert again["obs"] is batch["obs"] and again["mask"] is batch["mask"]
        assert rb.stats()["samples"] == 8
        # The limiter's unit is one sequence: an add's sequences go in as one insert of that
        # many, and a sample of 4 sequences counts 4.
        copy = pickle.loads(pickle.dumps(rb))
        try:
            assert copy.sample(2)["obs"].shape == (2, 2, 1)
            assert copy.get_stored_size() == 4
        finally:
            copy.close()


def test_bad_input_names_the_argument_and_writes_nothing():
    env = {"obs": {}, "done": {}}
    bad = [({"length": 0}, "length"), ({"length": 4, "period": 0}, "period"),
           ({"length": 4, "period": 5}, "period"), ({"length": 4, "eta": 2.0}, "eta"),
           ({"length": 65}, "longer than a lane"), ({"lenght": 4}, "length"),
           ({"length": "x"}, "length")]
    for sequence, words in bad:
        with pytest.raises((ValueError, TypeError), match=words):
            PrioritizedReplayBuffer(64, env, sequence=sequence)
    with pytest.raises(ValueError, match="longer than a lane"):
        PrioritizedReplayBuffer(64, env, sequence={"length": 40}, lanes=2)
    with pytest.raises(ValueError, match="Nstep"):
        PrioritizedReplayBuffer(64, {"obs": {}, "rew": {}, "next_obs": {}, "done": {}},
                                sequence={"length": 4},
                                Nstep={"size": 3, "rew": "rew", "next": "next_obs"})
    with pytest.raises(ValueError, match="next_of"):
        PrioritizedReplayBuffer(64, env, sequence={"length": 4}, next_of="obs")
    with pytest.raises(ValueError, match="mask"):
        PrioritizedReplayBuffer(64, {"obs": {}, "mask": {}}, sequence={"length": 4})
    with PrioritizedReplayBuffer(64, env, sequence={"length": 2}) as rb:
        rb.add(obs=[1.0, 2.0, 3.0], done=[0, 0, 0])
        before = (rb.get_stored_size(), rb.get_next_index())
        with pytest.raises(ValueError, match="priorities"):
            rb.add(obs=[1.0, 2.0], done=[0, 0], priorities=[1.0])
        with pytest.raises(ValueError, match="priorities"):
            rb.add(obs=[1.0], done=[0], priorities=[-1.0])
        with pytest.raises(ValueError, match="done"):
            rb.add(obs=[1.0])
        # An add of more steps than a lane holds goes in pieces: a bad priority in the last
        # one refuses the whole add all the same.
        with pytest.raises(ValueError, match="priorities"):
            rb.add(obs=np.arange(100.0), done=np.zeros(100),
                   priorities=np.r_[np.ones(99), -1.0])
        assert (rb.get_stored_size(), rb.get_next_index()) == before
        assert rb.get_all_transitions()["obs"][:, :, 0].tolist() == [[1, 2]]
    for args, words in [((np.ones(3),), "abs_td"), ((np.ones((2, 3)), np.ones((2, 2))), "mask")]:
        with pytest.raises(ValueError, match=words):
            sequence_priority(*args)
    with pytest.raises(ValueError, match="eta"):
        sequence_priority(np.ones((2, 3)), eta=1.5)


def test_sequence_priority_mixes_max_and_mean_of_unmasked_steps():
    td = np.array([[1.0, -3.0, 2.0], [0.0, 0.0, 0.0], [4.0, 100.0, 100.0]])
    mask = np.array([[1, 1, 1], [0, 0, 0], [1, 0, 0]], dtype=bool)
    got = sequence_priority(td, mask=mask, eta=0.9)
    assert np.allclose(got, [0.9 * 3 + 0.1 * 2, 0.0, 4.0])
    assert np.allclose(sequence_priority(td[:1]), [0.9 * 3 + 0.1 * 2])


@pytest.mark.parametrize("cls", CLASSES)
def test_writer_processes_a_killed_writer_and_a_reclaimed_lane(cls):
    # Three spawn writers in three lanes while this process samples, checks and updates; one
    # SIGKILLed mid-stream (mostly mid-add), a new writer reclaims its lane; every sequence
    # stays the oracle's.
    context = multiprocessing.get_context("spawn")
    seed_of = streams.seed_of_stream
    random = np.random.default_rng(3)
    with make(cls, 3 * 60, lanes=3) as rb, Children(context) as children:
        writers = [children.launch(streams.write_until_killed, rb, stream)
                   for stream in range(3)]
        started = []
        for _, said in writers:
            assert said.poll(60), "a writer did not start"
            started.append(said.recv())
        assert sorted(lane for _, lane in started) == [0, 1, 2]

        def learn(seconds):
            checked = 0
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                if not rb.get_stored_size():
                    continue
                batch = rb.sample(16)
                checked += streams.check(batch, seed_of)
                if cls is PrioritizedReplayBuffer:
                    rb.update_priorities(batch["indexes"], random.random(16) + 0.1,
                                         batch["generations"])
            return checked

        assert learn(0.5) > 0
        (victim, _), (victim_pid, victim_lane) = writers[0], started[0]
        os.kill(victim_pid, signal.SIGKILL)
        children.join(victim)
        replacement, said = children.launch(streams.write_until_killed, rb, 3)
        assert said.poll(60), "the replacement writer did not start"
        assert said.recv()[1] == victim_lane
        assert learn(0.5) > 0
        for process, _ in writers[1:] + [(replacement, None)]:
            os.kill(process.pid, signal.SIGKILL)
            children.join(process)
        everything = rb.get_all_transitions()
        streams.check(everything, seed_of)
        assert len(everything["mask"]) == rb.get_stored_size()
        assert {1, 2, 3} <= {s for s, _, _ in live_set(everything)} <= {0, 1, 2, 3}
        assert tree_problems(rb._store.check_tree()) == []


def test_writers_killed_mid_add_leave_nothing_torn():
    context = multiprocessing.get_context("spawn")
    seed_of = streams.seed_of_stream
    random = np.random.default_rng(4)
    with make(PrioritizedReplayBuffer, 2 * 30, "mmap", lanes=2) as rb, \
            Children(context) as children:
        for round_ in range(5):
            process, said = children.launch(streams.write_until_killed, rb, round_)
            assert said.poll(60)
            said.recv()
            time.sleep(float(random.uniform(0.0, 0.05)))
            os.kill(process.pid, signal.SIGKILL)
            children.join(process)
            everything = rb.get_all_transitions()
            streams.check(everything, seed_of)
            assert len(everything["mask"]) == rb.get_stored_size()
            if rb.get_stored_size():
                streams.check(rb.sample(32), seed_of)
        assert tree_problems(rb._store.check_tree()) == []


def test_ray_actor_writers(request):
    pytest.importorskip("ray")    # (the debug and sanitizer venvs have no Ray)
    ray = request.getfixturevalue("ray_session")
    seed_of = streams.seed_of_stream

    @ray.remote(num_cpus=0)
    class Writer:
        def __init__(self, rb, stream):
            self.rb = rb
            self.source = streams.Stream(stream, seed_of(stream))

        def run(self, adds):
            streams.write(self.rb, self.source, adds)
            return self.rb._writer.lane

        def close(self):
            self.rb.close()

    with make(PrioritizedReplayBuffer, 2 * 60, lanes=2) as rb:
        writers = [Writer.remote(rb, stream) for stream in (0, 1)]
        runs = [w.run.remote(150) for w in writers]
        checked = 0
        while ray.wait(runs, num_returns=2, timeout=0)[1]:   # a learner meanwhile
            if rb.get_stored_size():
                batch = rb.sample(16)
                checked += streams.check(batch, seed_of)
                rb.update_priorities(batch["indexes"], np.ones(16), batch["generations"])
        assert sorted(ray.get(runs)) == [0, 1]
        everything = rb.get_all_transitions()
        streams.check(everything, seed_of)
        assert {s for s, _, _ in live_set(everything)} == {0, 1}
        ray.get([w.close.remote() for w in writers])
        for w in writers:
            ray.kill(w)


def test_writers_killed_inside_big_adds_are_repaired():
    # Adds of 1,500 steps: most kills land inside the kernel, holding the lock, and the next
    # locker repairs (tears the add's steps, kills every sequence with a torn step). Rounds go
    # on until two repairs were seen (or 30 rounds); every sequence stays the oracle's.
    context = multiprocessing.get_context("spawn")
    seed_of = streams.seed_of_stream
    random = np.random.default_rng(5)
    with make(PrioritizedReplayBuffer, 2 * 2000, lanes=2) as rb, Children(context) as children:
        for round_ in range(30):
            process, said = children.launch(streams.write_big_until_killed, rb, 100 + round_,
                                            1500)
            assert said.poll(60)
            said.recv()
            time.sleep(float(random.uniform(0.0, 0.02)))
            os.kill(process.pid, signal.SIGKILL)
            children.join(process)
            everything = rb.get_all_transitions()
            streams.check(everything, seed_of)
            assert len(everything["mask"]) == rb.get_stored_size()
            streams.check(rb.sample(64), seed_of)
            assert tree_problems(rb._store.check_tree()) == []
            if rb.stats()["repairs"] >= 2:
                break
        assert rb.stats()["repairs"] >= 1


def test_close_commits_open_sequences_and_check_for_update_skips_overwritten():
    env = {"obs": {}, "done": {}}
    with PrioritizedReplayBuffer(16, env, seed=0, check_for_update=True, lanes=2,
                                 sequence={"length": 4, "period": 4}) as rb:
        view = PrioritizedReplayBuffer.attach(rb.name)
        view.add(obs=[1.0, 2.0, 3.0], done=[0, 0, 0])
        assert rb.get_stored_size() == 0                  # open
        view.close()                                      # a truncated end: committed
        everything = rb.get_all_transitions()
        assert everything["obs"][:, :, 0].tolist() == [[1, 2, 3, 0]]
        rb.add(obs=np.arange(10.0, 18.0), done=np.zeros(8))
        batch = rb.sample(4)
        rb.add(obs=np.arange(20.0, 28.0), done=np.zeros(8))   # a lap of rb's lane
        # check_for_update: no generations given, the sampled ones now overwritten skipped
        # (the view's sequence, in the other lane, stays).
        kept = int((batch["obs"][:, 0, 0] == 1.0).sum())
        assert rb.update_priorities(batch["indexes"], np.full(4, 3.0)) == kept
