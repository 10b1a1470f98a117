"""Frame columns (next_of, stack_compress) and lanes: every row comes back exactly as its writer
added it, with many writers, wrap-around, resets, glitches, kills and reclaimed lanes."""

from __future__ import annotations

import io
import multiprocessing
import os
import pickle
import signal
import time

import numpy as np
import pytest

import cpprb_ray
from cpprb_ray import PrioritizedReplayBuffer, ReplayBuffer, _layout
from cpprb_ray.frames import LaneConfig
from tests import _frame_streams as streams
from tests._workers import Children, tree_problems

CLASSES = [ReplayBuffer, PrioritizedReplayBuffer]
FRAMED = {"next_of": "obs", "stack_compress": "obs"}


def make(cls, size, backend, **options):
    return cls(size, streams.ENV, backend=backend, seed=1, **dict(FRAMED, **options))


def assert_rows_among(ours, theirs):
    """Assert that every row of one buffer's get_all_transitions() is, column for column, the
    row of the same (unique) act in a reference's; returns act -> row of theirs."""
    assert sorted(ours) == sorted(theirs)
    by_act = {int(a): k for k, a in enumerate(theirs["act"].ravel())}
    for k, act in enumerate(ours["act"].ravel()):
        other = by_act[int(act)]
        for name in ours:
            assert (ours[name][k] == theirs[name][other]).all(), (name, int(act))
    return by_act


def add(rb, rows, random):
    if isinstance(rb, PrioritizedReplayBuffer):
        return rb.add(priorities=random.random(len(rows["act"])) + 0.1, **rows)
    return rb.add(**rows)


@pytest.mark.parametrize("cls", CLASSES)
def test_two_streams_wrap_around_and_come_back_exact(cls, backend):
    # Two handles (the owner and a view) interleave their streams, each in its own lane; the
    # ring wraps many times; samples along the way and every row at the end are exact.
    random = np.random.default_rng(0)
    with make(cls, 256, backend, lanes=2) as rb, cls.attach(rb.name) as view:
        sources = [streams.Stream(0, 10), streams.Stream(1, 11)]
        checked = 0
        for round_ in range(400):
            for handle, source in zip((rb, view), sources):
                add(handle, source.transitions(int(random.integers(1, 4))), random)
            if round_ % 20 == 19:
                checked += streams.check(rb.sample(64))
        assert {rb._writer.lane, view._writer.lane} == {0, 1}
        everything = rb.get_all_transitions()
        streams.check(everything)
        stored = rb.get_stored_size()
        assert len(everything["act"]) == stored
        # Compression: a lane holds a stream's rows plus a few fillers per episode.
        assert 150 < stored <= 256
        assert checked == 20 * 64
        assert tree_problems(rb._store.check_tree()) == []


def test_memory_of_the_atari_layout():
    # uint8 (84, 84, 4) obs, next_obs by next_of, stack_compress: 2**20 rows in <= 7.5 GiB
    # (55 GiB with both stacks stored whole).
    env = {"obs": {"shape": (84, 84, 4), "dtype": np.uint8}, "act": {"dtype": np.int64},
           "rew": {}, "done": {}}
    columns = _layout.parse_env_dict(env)
    stored, config = LaneConfig.plan(columns, 2**20, True, "obs", "obs", 4)
    framed = _layout.plan(2**20, stored, True, "shm", lanes=config.to_meta())
    whole = _layout.plan(2**20, _layout.parse_env_dict(
        dict(env, next_obs=env["obs"])), True, "shm")
    assert framed.total_size <= 7.5 * 2**30
    assert whole.total_size > 55 * 2**30
    # One lane (the default) keeps cpprb's 2**20 rows in a ring with room for filler slots.
    stored, config = LaneConfig.plan(columns, 2**20, True, "obs", "obs", None)
    bounded = _layout.plan(config.slots(2**20), stored, True, "shm", lanes=config.to_meta())
    assert config.rows == 2**20 and bounded.total_size <= 7.5 * 2**30
    with ReplayBuffer(64, env, next_of="obs", stack_compress="obs") as rb:
        assert rb.nbytes == rb._segment.size


def test_next_of_alone_and_stack_compress_alone(backend):
    random = np.random.default_rng(1)
    env = {"obs": {"shape": (2, 3), "dtype": np.float32}, "act": {"dtype": np.int64}}
    with ReplayBuffer(64, env, next_of="obs", backend=backend) as rb:
        for t in range(100):
            episode_start = t % 9 == 0
            obs = np.full((2, 3), t, np.float32) + (0.5 if episode_start else 0)
            rb.add(obs=obs, act=t, next_obs=np.full((2, 3), t + 1, np.float32))
        batch = rb.sample(32)
        for k, t in enumerate(batch["act"].ravel()):
            assert (batch["next_obs"][k] == t + 1).all()
            assert (batch["obs"][k] == t + (0.5 if t % 9 == 0 else 0)).all()
    env = {"obs": {"shape": (5, 3), "dtype": np.int32}, "act": {"dtype": np.int64}}
    with PrioritizedReplayBuffer(64, env, stack_compress="obs", backend=backend) as rb:
        for t in range(100):
            obs = np.stack([np.full(5, t - 2 + j + 1000 * (t // 7)) for j in range(3)], -1)
            rb.add(obs=obs, act=t, priorities=random.random() + 0.1)
        batch = rb.sample(32)
        for k, t in enumerate(batch["act"].ravel()):
            expect = np.stack([np.full(5, t - 2 + j + 1000 * (t // 7)) for j in range(3)], -1)
            assert (batch["obs"][k] == expect).all()
        assert "next_obs" not in batch


def test_lanes_without_frames_and_too_many_writers(backend):
    with PrioritizedReplayBuffer(8, {"obs": {}}, lanes=2, backend=backend) as rb, \
            PrioritizedReplayBuffer.attach(rb.name) as first, \
            PrioritizedReplayBuffer.attach(rb.name) as second:
        assert rb.add(obs=[1.0, 2.0]) == 0               # lane 0 is slots [0, 4)
        assert first.add(obs=[3.0, 4.0, 5.0]) == 4       # lane 1 is [4, 8)
        assert first.add(obs=[6.0, 7.0]) == 7            # wraps onto slot 4
        with pytest.raises(cpprb_ray.LaneError, match="lanes"):
            second.add(obs=9.0)
        assert rb.get_stored_size() == 6
        # More rows than a lane holds: the later ones overwrite the earlier, as in a ring.
        assert first.add(obs=np.arange(10.0, 15.0)) == 5
        first.close()    # frees its lane; its rows stay
        assert second.add(obs=9.0) == 6
        assert sorted(rb.get_all_transitions()["obs"].ravel()) == [1, 2, 9, 12, 13, 14]
        assert rb.update_priorities([5], [3.0]) == 1


def test_priorities_generations_and_eviction(backend):
    random = np.random.default_rng(2)
    with make(PrioritizedReplayBuffer, 64, backend) as rb:
        source = streams.Stream(0, 3, glitches=False)
        for _ in range(10):
            add(rb, source.transitions(1), random)
        batch = rb.sample(16)
        streams.check(batch)
        assert rb.update_priorities(batch["indexes"], np.ones(16), batch["generations"]) == 16
        for _ in range(80):     # the ring moves on: every sampled row is evicted
            add(rb, source.transitions(1), random)
        assert rb.update_priorities(batch["indexes"], np.ones(16), batch["generations"]) == 0
        streams.check(rb.sample(64))
        rb.clear()
        assert rb.get_stored_size() == 0
        with pytest.raises(ValueError, match="empty"):
            rb.sample(1)
        add(rb, source.transitions(2), random)
        streams.check(rb.get_all_transitions())
        assert rb.get_stored_size() == 2


def test_bad_input_leaves_the_buffer_unchanged():
    with make(PrioritizedReplayBuffer, 64, "auto") as rb:
        rows = streams.Stream(0, 4).transitions(2)
        rb.add(**rows)
        with pytest.raises(ValueError, match="next_obs"):
            rb.add(**{k: v for k, v in rows.items() if k != "next_obs"})
        with pytest.raises(ValueError, match="obs"):
            rb.add(**dict(rows, obs=rows["obs"][:, :1]))
        with pytest.raises(ValueError, match="column 'obs' .* not a whole number"):
            rb.add(**dict(rows, obs=rows["obs"] + 0.5))     # (whole floats would go in)
        with pytest.raises(ValueError, match="priorities"):
            rb.add(priorities=[1.0, -1.0], **rows)
        with pytest.raises(ValueError, match="rows"):
            rb.add(**dict(rows, act=[1, 2, 3]))
        assert rb.get_stored_size() == 2
        streams.check(rb.get_all_transitions())
    with pytest.raises(ValueError, match="next_of"):
        ReplayBuffer(64, streams.ENV, next_of="nope")
    with pytest.raises(ValueError, match="lanes"):
        ReplayBuffer(64, streams.ENV, next_of="obs", stack_compress="obs", lanes=8)
    with pytest.raises(ValueError, match="Nstep"):
        ReplayBuffer(64, streams.ENV, next_of="obs",
                     Nstep={"size": 3, "gamma": 0.9, "rew": "rew", "next": "next_observation"})


def test_sample_out_and_pickle_round_trip():
    with make(ReplayBuffer, 64, "auto", lanes=2) as rb:
        rb.add(**streams.Stream(0, 5).transitions(5))
        first = rb.sample(4)
        again = rb.sample(4, out=first)
        assert again["obs"] is first["obs"]
        streams.check(again)
        with pickle.loads(pickle.dumps(rb)) as view:
            view.add(**streams.Stream(1, 6).transitions(3))
            assert {view._writer.lane, rb._writer.lane} == {0, 1}   # a handle of its own
            streams.check(rb.get_all_transitions())
            assert rb.get_stored_size() == 8


@pytest.mark.parametrize("cls", CLASSES)
def test_writer_processes_a_learner_and_a_killed_writer(cls):
    backend = "auto"   # both backends: test_two_streams_wrap_around_and_come_back_exact
    # Three writer processes in three lanes while this process samples, checks and updates;
    # a writer SIGKILLed mid-stream leaves its rows exact, and a new writer reclaims its lane.
    context = multiprocessing.get_context("spawn")
    random = np.random.default_rng(3)
    with make(cls, 3 * 512, backend, lanes=3) as rb, Children(context) as children:
        writers = [children.launch(streams.write_until_killed, rb, stream, 100 + stream)
                   for stream in range(3)]
        started = []
        for _, said in writers:
            assert said.poll(60), "a writer did not start"
            started.append(said.recv())
        assert sorted(lane for _, lane in started) == [0, 1, 2]
        with pytest.raises(cpprb_ray.LaneError, match="lanes"):
            rb.add(**streams.Stream(9, 9).transitions(1))   # all three lanes are taken

        def learn(seconds):
            checked = 0
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                batch = rb.sample(32)
                checked += streams.check(batch)
                if cls is PrioritizedReplayBuffer:
                    rb.update_priorities(batch["indexes"], random.random(32) + 0.1,
                                         batch["generations"])
            return checked

        assert learn(1.0) > 0
        (victim, _), (victim_pid, victim_lane) = writers[0], started[0]
        os.kill(victim_pid, signal.SIGKILL)
        children.join(victim)
        # The dead writer's lane goes to the next claimer (the other two are alive).
        replacement, said = children.launch(streams.write, rb, 3, 103, 1.0)
        assert said.poll(60), "the replacement writer did not start"
        assert said.recv() == victim_lane
        assert learn(0.5) > 0
        for process, _ in writers[1:]:
            os.kill(process.pid, signal.SIGKILL)
            children.join(process)
        assert said.poll(60)
        added, lane = said.recv()
        assert added > 0 and lane == victim_lane
        children.join(replacement)
        everything = rb.get_all_transitions()
        streams.check(everything)
        assert len(everything["act"]) == rb.get_stored_size()
        # (The replacement may have overwritten every row the victim left in its lane.)
        assert {1, 2, 3} <= {(int(a) >> 1) // 10**9 for a in everything["act"].ravel()} \
            <= {0, 1, 2, 3}
        assert tree_problems(rb._store.check_tree()) == []


def test_writers_killed_mid_add_leave_nothing_torn():
    backend = "mmap"
    # Writers SIGKILLed at random moments of a tight add loop (most land inside an add, many
    # while holding the lock): the next locker repairs, and every row stays exact.
    context = multiprocessing.get_context("spawn")
    random = np.random.default_rng(4)
    with make(PrioritizedReplayBuffer, 2 * 256, backend, lanes=2) as rb, \
            Children(context) as children:
        for round_ in range(6):
            process, said = children.launch(streams.write_until_killed, rb, round_, 200 + round_)
            assert said.poll(60)
            said.recv()
            time.sleep(float(random.uniform(0.0, 0.05)))
            os.kill(process.pid, signal.SIGKILL)
            children.join(process)
            everything = rb.get_all_transitions()
            streams.check(everything)
            assert len(everything["act"]) == rb.get_stored_size()
            streams.check(rb.sample(64))
        assert tree_problems(rb._store.check_tree()) == []


def test_ray_actors_add_episodes(request):
    pytest.importorskip("ray")    # (the debug and sanitizer venvs have no Ray)
    ray = request.getfixturevalue("ray_session")
    backend = "auto"

    @ray.remote(num_cpus=0)
    class Writer:
        def __init__(self, rb, stream):
            self.rb = rb
            self.source = streams.Stream(stream, 300 + stream)

        def run(self, count):
            for _ in range(count):   # episodes of random length, 2 steps per add
                self.rb.add(**self.source.transitions(2))
            return self.rb._writer.lane

        def close(self):
            self.rb.close()

    with make(ReplayBuffer, 2 * 512, backend, lanes=2) as rb:
        writers = [Writer.remote(rb, stream) for stream in (0, 1)]
        runs = [w.run.remote(300) for w in writers]
        checked = 0
        while ray.wait(runs, num_returns=2, timeout=0)[1]:   # a learner meanwhile
            if rb.get_stored_size():
                checked += streams.check(rb.sample(32))
        assert sorted(ray.get(runs)) == [0, 1]
        streams.check(rb.get_all_transitions())
        ray.get([w.close.remote() for w in writers])
        for w in writers:
            ray.kill(w)


@pytest.mark.parametrize("cls", CLASSES)
def test_nstep_rows_equal_those_of_a_buffer_without_frames(cls, backend):
    # The same episodes (resets, glitches, truncations, batches, priorities) into a framed
    # buffer and into a plain N-step buffer that stores both stacks whole: every row, the
    # n-step rew, done, discounts and next_obs included, is the same.
    spec = {"size": 3, "gamma": 0.5, "rew": "rew", "next": "next_obs"}
    env = dict(streams.ENV, next_obs=streams.ENV["obs"])
    random = np.random.default_rng(7)
    with make(cls, 2 * 256, backend, Nstep=spec, lanes=2) as rb, \
            cls(4096, env, Nstep=spec) as reference, cls.attach(rb.name) as view, \
            cls.attach(reference.name) as reference_view:
        # One handle per stream in each buffer: N-step staging is per handle.
        sources = [(rb, reference, streams.Stream(0, 20)),
                   (view, reference_view, streams.Stream(1, 21))]
        for round_ in range(150):
            for handle, twin, source in sources:
                rows = source.transitions(int(random.integers(1, 3)))
                for target in (handle, twin):
                    add(target, rows, np.random.default_rng(round_))
                if round_ % 37 == 36:     # a truncated episode
                    handle.on_episode_end()
                    twin.on_episode_end()
                    source.episode += 1
                    source.step = 0
            if round_ % 30 == 29:
                batch = rb.sample(32)
                assert (batch["discounts"] > 0).all()
        ours, theirs = rb.get_all_transitions(), reference.get_all_transitions()
        by_act = assert_rows_among(ours, theirs)
        assert len(ours["act"]) == rb.get_stored_size() > 150
        batch = rb.sample(64)
        for k, act in enumerate(batch["act"].ravel()):
            other = by_act[int(act)]
            assert (batch["next_obs"][k] == theirs["next_obs"][other]).all()
            assert batch["discounts"][k] == theirs["discounts"][other]
        assert tree_problems(rb._store.check_tree()) == []


def test_nstep_adds_under_a_rate_limiter_keep_the_window_and_lose_no_row():
    # Framed N-step steps go into the lane (in pieces of at most 8 here) before their rows
    # complete. The limiter used to admit each piece on its own, not the rows the add
    # completes, and a batch went in past max_diff. Now: every held-back add changes nothing
    # (stored rows, inserts, staged steps), the diff never passes max_diff, and the rows are
    # those of a twin buffer without frames or a limiter that got only the admitted adds.
    from cpprb_ray.rate_limiters import SampleToInsertRatio
    spec = {"size": 3, "gamma": 0.5, "rew": "rew", "next": "next_obs"}
    env = dict(streams.ENV, next_obs=streams.ENV["obs"])
    limiter = SampleToInsertRatio(1.0, 1, (-1.0, 12.0))
    random = np.random.default_rng(3)
    with make(ReplayBuffer, 256, "auto", Nstep=spec, rate_limiter=limiter) as rb, \
            ReplayBuffer(4096, env, Nstep=spec) as twin:
        source = streams.Stream(0, 12)
        held_back = 0
        for _ in range(120):
            rows = source.transitions(int(random.integers(1, 13)))
            before = (rb.get_stored_size(), rb.stats()["inserts"], rb.stats()["nstep_staged"])
            try:
                rb.add(timeout=0, **rows)
            except TimeoutError:
                held_back += 1
                assert (rb.get_stored_size(), rb.stats()["inserts"],
                        rb.stats()["nstep_staged"]) == before
                while True:          # the learner samples (what min_diff lets it) until it goes
                    room = int(rb.stats()["rate_limiter"]["diff"]) + 1
                    rb.sample(min(room, int(random.integers(2, 5))), timeout=0)
                    try:
                        rb.add(timeout=0, **rows)
                        break
                    except TimeoutError:
                        pass
            twin.add(**rows)
            state = rb.stats()["rate_limiter"]
            assert state["diff"] <= 12.0, state
        assert held_back > 10
        while True:
            try:
                rb.on_episode_end(timeout=0)
                break
            except TimeoutError:
                rb.sample(1, timeout=0)
        twin.on_episode_end()
        ours = rb.get_all_transitions()
        assert_rows_among(ours, twin.get_all_transitions())
        assert len(ours["act"]) == rb.get_stored_size() > 100


def test_nstep_steps_staged_before_a_clear_commit_after_it_as_in_a_plain_ring():
    # A clear() by another handle wiped the lane rows of this handle's staged N-step steps,
    # and the rows their windows finished later were skipped without a word (add even
    # returned a slot). Now the staged steps are written again and commit after the clear,
    # as a plain ring's staged steps do: the same rows in both.
    spec = {"size": 3, "gamma": 0.5, "rew": "rew", "next": "next_obs"}
    env = dict(streams.ENV, next_obs=streams.ENV["obs"])
    with make(ReplayBuffer, 256, "auto", Nstep=spec, lanes=2) as rb, \
            ReplayBuffer.attach(rb.name) as other, ReplayBuffer(256, env, Nstep=spec) as twin, \
            ReplayBuffer.attach(twin.name) as twin_other:
        source = streams.Stream(0, 4, glitches=False)
        for round_ in range(12):
            rows = source.transitions(2 if round_ % 3 else 1)
            rb.add(**rows)
            twin.add(**rows)
            if round_ % 4 == 1:
                staged = rb.stats()["nstep_staged"]
                other.clear()
                twin_other.clear()
                assert rb.get_stored_size() == 0 and rb.stats()["nstep_staged"] == staged
        rb.on_episode_end()
        twin.on_episode_end()
        ours, theirs = rb.get_all_transitions(), twin.get_all_transitions()
        assert sorted(ours["act"].ravel().tolist()) == sorted(theirs["act"].ravel().tolist())
        assert_rows_among(ours, theirs)
        assert rb.get_stored_size() == twin.get_stored_size() > 0


def test_get_next_index_names_the_slot_a_laned_add_writes_first():
    # It used to be 0 whatever a laned buffer held (the plain ring's index, unused there).
    with ReplayBuffer(256, {"obs": {}}, lanes=2) as rb, ReplayBuffer.attach(rb.name) as view:
        assert rb.get_next_index() == 0 and view.get_next_index() == 0   # lane 0 is free
        for handle, count in ((rb, 3), (rb, 5), (rb, 1)):
            expected = handle.get_next_index()
            assert handle.add(obs=np.arange(float(count))) == expected
        assert rb.get_next_index() == 9
        assert view.get_next_index() == 128           # lane 1, the one it would claim now
        assert view.add(obs=[1.0, 2.0]) == 128 and view.get_next_index() == 130
        assert rb.add(obs=np.arange(119.0)) == 9 and rb.get_next_index() == 0    # lane 0 wraps
    with make(ReplayBuffer, 64, "auto") as rb:     # frames: a continuing stream needs no filler
        source = streams.Stream(0, 5, glitches=False)
        rb.add(**source.transitions(1))
        for _ in range(5):
            expected = rb.get_next_index()
            if source.step == 0:                        # a new episode starts with fillers
                assert rb.add(**source.transitions(1)) > expected
            else:
                assert rb.add(**source.transitions(1)) == expected


def test_python_numbers_go_in_by_the_rules_of_every_add():
    # Python numbers take a fast path into exact columns; anything else follows the same rule
    # as a plain buffer's add (_rules.column_array: a fraction into an int column, or an int
    # past its column's range, a ValueError, each naming the column, nothing added).
    env = {"obs": {"shape": (2, 2), "dtype": np.uint8}, "act": {"dtype": np.int64},
           "small": {"dtype": np.uint8}, "rew": {}}
    with ReplayBuffer(64, env, next_of="obs") as rb:
        obs = np.zeros((2, 2), np.uint8)
        rb.add(obs=obs, act=7, small=True, rew=0.5, next_obs=obs + 1)
        rb.add(obs=obs + 1, act=8, small=np.uint8(3), rew=2, next_obs=obs + 2)
        for bad, name, error in ((dict(act=2**70), "act", ValueError),
                                 (dict(act=1.5), "act", ValueError),
                                 (dict(small=300), "small", ValueError)):
            with pytest.raises(error, match=name):
                rb.add(**dict(dict(obs=obs, act=1, small=True, rew=0.0, next_obs=obs), **bad))
        rows = rb.get_all_transitions()
        assert rows["act"].ravel().tolist() == [7, 8]
        assert rows["small"].ravel().tolist() == [1, 3]
        assert rows["rew"].ravel().tolist() == [0.5, 2.0]
        assert rb.get_stored_size() == 2


@pytest.mark.parametrize("cls", CLASSES)
def test_next_of_and_stack_compress_take_a_list_of_names_only(cls):
    # Not a str nor a list: a TypeError naming the argument. An iterator used to be read twice
    # (empty the second time), so next_of=iter(["obs"]) silently stored next_obs whole.
    for value in (5, b"obs", iter(["obs"]), {"obs": 1}):
        for argument in ("next_of", "stack_compress"):
            with pytest.raises(TypeError, match=argument):
                cls(64, streams.ENV, **{argument: value})
    # A column that next_of derives is not stored: naming it again used to make the segment
    # and then refuse it as "not a valid cpprb_ray buffer".
    env = dict(streams.ENV, next_obs=streams.ENV["obs"])
    for options in ({"next_of": ["obs", "next_obs"]},
                    {"next_of": "obs", "stack_compress": "next_obs"}):
        with pytest.raises(ValueError, match="next_obs.*derives"):
            cls(64, env, **options)
    with cls(64, streams.ENV, next_of=("obs",), stack_compress=["obs"]) as rb:
        assert type(rb._writer).__name__ == "LaneWriter" and "next_obs" in rb.get_all_transitions()


@pytest.mark.parametrize("cls", CLASSES)
def test_laned_buffers_load_their_own_transitions_files(cls):
    # save_transitions then load_transitions, into the buffer itself and into a fresh one: the
    # rows come back exactly. A framed buffer used to refuse its own file (its next_obs is
    # not stored) or fail to reshape it; a laned N-step one wrote the rows into the plain ring
    # behind the lanes' backs (get_stored_size counted rows get_all_transitions never saw).
    spec = {"size": 3, "gamma": 0.5, "rew": "rew", "next": "next_obs"}
    whole = dict(streams.ENV, next_obs=streams.ENV["obs"])
    configs = [(streams.ENV, FRAMED), (streams.ENV, dict(FRAMED, Nstep=spec)),
               (whole, {"lanes": 2, "Nstep": spec}), (whole, {"lanes": 2})]
    for env, options in configs:
        with cls(512, env, **options) as rb, cls(512, env, **options) as fresh:
            rb.add(**streams.Stream(0, 8).transitions(30))
            rb.on_episode_end()
            saved = rb.get_all_transitions()
            file = io.BytesIO()
            rb.save_transitions(file)
            for target, copies in ((fresh, 1), (rb, 2)):
                file.seek(0)
                target.load_transitions(file)
                rows = target.get_all_transitions()
                assert len(rows["act"]) == target.get_stored_size() == copies * len(saved["act"])
                order = np.argsort(rows["act"].ravel(), kind="stable")[::copies]
                mine = np.argsort(saved["act"].ravel(), kind="stable")
                assert sorted(rows) == sorted(saved)
                for name in saved:
                    assert (rows[name][order] == saved[name][mine]).all(), (options, name)
                assert tree_problems(target._store.check_tree()) == []
            if "Nstep" not in options:
                streams.check(rb.sample(64))


def test_get_all_transitions_of_a_laned_buffer_shuffles():
    # shuffle=True used to be ignored (and shuffle="yes" accepted) by a laned buffer.
    with make(ReplayBuffer, 256, "auto") as rb:
        rb.add(**streams.Stream(0, 9).transitions(60))
        np.random.seed(0)   # noqa: NPY002 (cpprb's global random state, as the plain buffer)
        rows = rb.get_all_transitions(shuffle=True)
        acts = rows["act"].ravel()
        assert len(acts) == 60 and not (np.diff(acts) > 0).all()
        streams.check(rows)
        assert sorted(acts) == sorted(rb.get_all_transitions()["act"].ravel())
        with pytest.raises(TypeError, match="shuffle"):
            rb.get_all_transitions(shuffle="yes")


def test_an_add_larger_than_a_lane_under_a_rate_limiter_adds_nothing():
    # A laned add of more rows than a lane takes at once goes in several kernel calls, each
    # admitted by the limiter on its own: a TimeoutError after the first used to leave its
    # rows committed (8 of 20 here). Now such an add is refused up front, nothing added.
    from cpprb_ray.rate_limiters import SampleToInsertRatio
    limiter = SampleToInsertRatio(1.0, 1, (-1.0, 12.0))
    # (One lane keeps cpprb's 64 rows in a larger ring, and takes 64 rows at once: 80 are
    # over.)
    with make(ReplayBuffer, 64, "auto", rate_limiter=limiter) as rb:
        source = streams.Stream(0, 10, glitches=False)
        rows = source.transitions(80)
        with pytest.raises(ValueError, match="at most 64 rows"):
            rb.add(timeout=0, **rows)
        assert rb.get_stored_size() == 0 and rb.stats()["inserts"] == 0
        rb.add(timeout=0, **{name: value[:8] for name, value in rows.items()})
        streams.check(rb.get_all_transitions())
        assert rb.get_stored_size() == 8
