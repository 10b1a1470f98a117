"""N-step returns (``Nstep=``): the rows a handle commits, against a reference written from the
definition (tests/_nstep_reference.py), for every way an episode can end, batched adds,
priorities, views, forks, spawn children and a SIGKILLed writer; bad specs and bad input."""

from __future__ import annotations

import mmap
import multiprocessing
import os
import pickle
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cpprb_ray
from cpprb_ray import PrioritizedReplayBuffer, ReplayBuffer

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
if TESTS_DIR not in sys.path:  # spawn children import _nstep_reference from the parent's path
    sys.path.insert(0, TESTS_DIR)

import _nstep_reference as ref  # noqa: E402
from _nstep_reference import ENV, Episode, assert_rows_match, feed, nstep_spec  # noqa: E402

TIMEOUT = 120.0
SIMPLE_ENV = {"obs": {}, "rew": {}, "next_obs": {}, "done": {}}


def simple_rows(rb):
    rows = rb.get_all_transitions()
    return {key: rows[key].ravel().tolist() for key in rows}


def add_steps(rb, rewards, done_last, first=0):
    """One-by-one adds of obs = first + t, next_obs = obs + 1."""
    for t, reward in enumerate(rewards):
        rb.add(obs=first + t, rew=reward, next_obs=first + t + 1,
               done=float(done_last and t == len(rewards) - 1))


# -- the ends of an episode, by hand ----------------------------------------------------------

def test_terminated_episode_by_hand(backend):
    with ReplayBuffer(32, SIMPLE_ENV, backend=backend, Nstep=nstep_spec(3, 0.5)) as rb:
        add_steps(rb, [1.0, 2.0, 4.0, 8.0, 16.0], done_last=True)
        assert rb._writer.staged == 0   # done=1 committed everything at once
        rows = simple_rows(rb)
    assert rows["obs"] == [0, 1, 2, 3, 4]
    assert rows["rew"] == [1 + 1 + 1, 2 + 2 + 2, 4 + 4 + 4, 8 + 8, 16]
    assert rows["next_obs"] == [3, 4, 5, 5, 5]
    # The window of step 2 reaches the terminal step 4: done, no bootstrap (cpprb says 0 here).
    assert rows["done"] == [0, 0, 1, 1, 1]
    assert rows["discounts"] == [0.125, 0.125, 0.125, 0.25, 0.5]


def test_truncated_episode_by_hand(backend):
    with ReplayBuffer(32, SIMPLE_ENV, backend=backend, Nstep=nstep_spec(3, 0.5)) as rb:
        add_steps(rb, [1.0, 2.0, 4.0, 8.0, 16.0], done_last=False)
        assert rb.get_stored_size() == 3 and rb._writer.staged == 2
        rb.on_episode_end()
        assert rb._writer.staged == 0
        rows = simple_rows(rb)
    assert rows["rew"] == [3, 6, 12, 16, 16]
    assert rows["next_obs"] == [3, 4, 5, 5, 5]   # the last next state, for every short window
    assert rows["done"] == [0, 0, 0, 0, 0]
    assert rows["discounts"] == [0.125, 0.125, 0.125, 0.25, 0.5]


@pytest.mark.parametrize("terminated", [True, False])
def test_episode_shorter_than_n(terminated):
    with ReplayBuffer(32, SIMPLE_ENV, Nstep=nstep_spec(4, 0.5)) as rb:
        add_steps(rb, [1.0, 2.0], done_last=terminated)
        assert rb.get_stored_size() == (2 if terminated else 0)
        rb.on_episode_end()
        rows = simple_rows(rb)
    assert rows["rew"] == [2, 2]
    assert rows["next_obs"] == [2, 2]
    assert rows["done"] == ([1, 1] if terminated else [0, 0])
    assert rows["discounts"] == [0.25, 0.5]


def test_back_to_back_episodes_without_on_episode_end():
    # done=1 ends the episode: the next add starts a new one even without on_episode_end.
    with ReplayBuffer(32, SIMPLE_ENV, Nstep=nstep_spec(3, 0.5)) as rb:
        add_steps(rb, [1.0, 1.0, 1.0], done_last=True)
        add_steps(rb, [10.0, 10.0, 10.0, 10.0], done_last=True, first=10)
        rb.on_episode_end()   # nothing left to do
        rows = simple_rows(rb)
    assert rows["obs"] == [0, 1, 2, 10, 11, 12, 13]
    assert rows["rew"] == [1.75, 1.5, 1.0, 17.5, 17.5, 15.0, 10.0]
    assert rows["next_obs"] == [3, 3, 3, 13, 14, 14, 14]
    assert rows["done"] == [1, 1, 1, 0, 1, 1, 1]


def test_back_to_back_truncated_episodes():
    with ReplayBuffer(32, SIMPLE_ENV, Nstep=nstep_spec(2, 1.0)) as rb:
        add_steps(rb, [1.0, 2.0, 3.0], done_last=False)
        rb.on_episode_end()
        rb.on_episode_end()   # twice is harmless
        add_steps(rb, [5.0], done_last=False, first=10)
        rb.on_episode_end()
        rows = simple_rows(rb)
    assert rows["obs"] == [0, 1, 2, 10]
    assert rows["rew"] == [3, 5, 3, 5]
    assert rows["next_obs"] == [2, 3, 3, 11]
    assert rows["discounts"] == [1, 1, 1, 1]


def test_size_one_commits_each_step_at_once():
    with ReplayBuffer(8, SIMPLE_ENV, Nstep=nstep_spec(1, 0.9)) as rb:
        assert rb.add(obs=0, rew=2.0, next_obs=1, done=0) == 0
        assert rb.add(obs=1, rew=3.0, next_obs=2, done=1) == 1
        rows = simple_rows(rb)
    assert rows["rew"] == [2, 3] and rows["next_obs"] == [1, 2] and rows["done"] == [0, 1]
    np.testing.assert_allclose(rows["discounts"], [0.9, 0.9], rtol=1e-7)


def test_add_returns_the_first_slot_it_committed_or_none():
    with ReplayBuffer(8, SIMPLE_ENV, Nstep=nstep_spec(3, 0.5)) as rb:
        assert rb.add(obs=[0, 1], rew=[1, 1], next_obs=[1, 2], done=[0, 0]) is None
        assert rb.add(obs=2, rew=1, next_obs=3, done=0) == 0
        assert rb.add(obs=[3, 4, 5], rew=[1, 1, 1], next_obs=[4, 5, 6], done=[0, 0, 1]) == 1


# -- against the reference ----------------------------------------------------------------------

def episodes_of_every_kind():
    # terminated, truncated, shorter than n, of length 1 and exactly n, back to back.
    return ref.stream(100, [5, 4, 2, 1, 3, 7, 1, 3],
                      [True, False, True, False, True, True, True, False], seed=4)


@pytest.mark.parametrize("size,gamma", [(1, 0.9), (3, 0.99), (3, 0.5), (5, 0.0), (4, 1.0)])
def test_one_by_one_adds_match_the_reference(size, gamma):
    episodes = episodes_of_every_kind()
    with PrioritizedReplayBuffer(256, ENV, Nstep=nstep_spec(size, gamma)) as rb:
        feed(rb, episodes, [[1] * len(e) for e in episodes], [False] * len(episodes))
        assert rb._writer.staged == 0
        rows = rb.get_all_transitions()
    assert_rows_match(rows, ref.reference_rows(episodes, size, gamma))


@pytest.mark.parametrize("seed", range(4))
def test_batched_adds_give_the_rows_of_one_by_one_adds(seed):
    episodes = episodes_of_every_kind()
    rng = np.random.default_rng(seed)
    splits = [ref.split_randomly(len(e), rng) for e in episodes]
    with ReplayBuffer(256, ENV, Nstep=nstep_spec(3, 0.9)) as batched, \
            ReplayBuffer(256, ENV, Nstep=nstep_spec(3, 0.9)) as single:
        feed(batched, episodes, splits, [False] * len(episodes))
        feed(single, episodes, [[1] * len(e) for e in episodes], [False] * len(episodes))
        batched_rows, single_rows = batched.get_all_transitions(), single.get_all_transitions()
    for key in single_rows:
        np.testing.assert_array_equal(batched_rows[key], single_rows[key], err_msg=key)
    assert_rows_match(batched_rows, ref.reference_rows(episodes, 3, 0.9))


def test_a_batch_spanning_episodes_commits_in_one_store_add():
    # Three episodes in one batch (terminated, terminated, open): one commit of 2 + 3 + 1 rows.
    first, second, third = ref.stream(0, [2, 3, 4], [True, True, False], seed=1)
    steps = [e.steps() for e in (first, second, third)]
    batch = {key: np.concatenate([s[key] for s in steps]) for key in steps[0]}
    with ReplayBuffer(64, ENV, Nstep=nstep_spec(3, 0.5)) as rb:
        rb.commits = []
        sink = rb._writer._sink     # the N-step writer's sink into the ring: one commit a call
        commit = sink.commit

        def counting(rows, priorities, weights, timeout=None):
            rb.commits.append(rows["discounts"].shape[0])
            return commit(rows, priorities, weights, timeout)

        sink.commit = counting
        assert rb.add(**batch) == 0
        assert rb.commits == [2 + 3 + 2] and rb._writer.staged == 2
        rb.on_episode_end()
        assert rb.commits == [7, 2]
        rows = rb.get_all_transitions()
    assert_rows_match(rows, ref.reference_rows([first, second, third], 3, 0.5))


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(size=st.integers(1, 6),
       gamma=st.one_of(st.sampled_from([0.0, 0.5, 1.0]), st.floats(0.0, 1.0)),
       episodes=st.lists(st.tuples(st.integers(1, 12), st.booleans(), st.booleans()),
                         min_size=1, max_size=8),
       seed=st.integers(0, 2**32 - 1),
       prioritized=st.booleans())
def test_random_streams_match_the_reference(size, gamma, episodes, seed, prioritized):
    rng = np.random.default_rng(seed)
    stream = ref.stream(0, [e[0] for e in episodes], [e[1] for e in episodes], seed)
    splits = [ref.split_randomly(len(e), rng) for e in stream]
    ends = [e[2] for e in episodes]   # on_episode_end after a terminated one too, or not
    cls = PrioritizedReplayBuffer if prioritized else ReplayBuffer
    with cls(128, ENV, Nstep=nstep_spec(size, gamma)) as rb:
        feed(rb, stream, splits, ends)
        rows = rb.get_all_transitions()
    expected = ref.reference_rows(stream, size, gamma)
    assert_rows_match(rows, expected)


# -- priorities ------------------------------------------------------------------------------

def row_priorities(rb, draws=4000):
    """{obs: priority / min priority} from importance weights (alpha=1, eps=0, beta=1:
    weight = p_min / p)."""
    batch = rb.sample(draws, beta=1.0)
    ratios = {}
    for obs, weight in zip(batch["obs"].ravel(), batch["weights"].ravel()):
        ratios[float(obs)] = 1.0 / float(weight)
    return ratios


def test_priorities_go_with_their_steps_rows(backend):
    episode = Episode(0, [1.0] * 6, terminated=False)
    steps = episode.steps()
    given = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    with PrioritizedReplayBuffer(64, ENV, alpha=1.0, eps=0.0, backend=backend, seed=5,
                                 Nstep=nstep_spec(3, 0.9)) as rb:
        rb.add(priorities=given[:2], **{k: v[:2] for k, v in steps.items()})
        rb.add(priorities=given[2], **{k: v[2] for k, v in steps.items()})
        rb.add(priorities=given[3:], **{k: v[3:] for k, v in steps.items()})
        assert rb.get_stored_size() == 4
        rb.on_episode_end()
        ratios = row_priorities(rb)
        assert rb.get_max_priority() == 6.0
    assert sorted(ratios) == [0, 1, 2, 3, 4, 5]
    for obs, ratio in ratios.items():
        assert ratio == pytest.approx(given[int(obs)] / given[0], rel=1e-5), obs


def test_steps_without_priorities_get_the_max_priority():
    episode = Episode(0, [1.0] * 4, terminated=True)
    steps = episode.steps()
    with PrioritizedReplayBuffer(64, ENV, alpha=1.0, eps=0.0, seed=2,
                                 Nstep=nstep_spec(2, 0.9)) as rb:
        rb.add(priorities=[4.0, 2.0], **{k: v[:2] for k, v in steps.items()})
        rb.add(**{k: v[2:] for k, v in steps.items()})   # committed with step 1's row
        ratios = row_priorities(rb)
    # Rows 0 and 1 carry 4 and 2; rows 2 and 3 the largest seen when committed (4).
    assert ratios == pytest.approx({0.0: 2.0, 1.0: 1.0, 2.0: 2.0, 3.0: 2.0}, rel=1e-5)


def test_bad_priorities_leave_buffer_and_staging_unchanged():
    steps = Episode(0, [1.0] * 3, terminated=False).steps()
    with PrioritizedReplayBuffer(64, ENV, Nstep=nstep_spec(2, 0.9)) as rb:
        rb.add(priorities=1.0, **{k: v[0] for k, v in steps.items()})
        with pytest.raises(ValueError, match="priorities must be finite and >= 0; got nan"):
            rb.add(priorities=[1.0, np.nan], **{k: v[1:] for k, v in steps.items()})
        with pytest.raises(ValueError, match="priorities must have 2 entries"):
            rb.add(priorities=[1.0], **{k: v[1:] for k, v in steps.items()})
        assert rb.get_stored_size() == 0 and rb._writer.staged == 1
        rb.add(**{k: v[1:] for k, v in steps.items()})
        rb.on_episode_end()
        rows = rb.get_all_transitions()
    assert_rows_match(rows, ref.reference_rows([Episode(0, [1.0] * 3, False)], 2, 0.9))


def test_a_bad_priority_of_a_single_step_leaves_the_lane_unchanged():
    # A laned buffer writes each staged step into its lane: a bad priority must be refused
    # before that, or every refused add takes a slot of the ring (and evicts a row once full).
    def run(bad_adds):
        with PrioritizedReplayBuffer(16, SIMPLE_ENV, lanes=1, Nstep=nstep_spec(2, 0.5)) as rb:
            slots = [rb.add(obs=t, rew=1.0, next_obs=t + 1, done=0.0, priorities=1.0)
                     for t in range(10)]
            for _ in range(bad_adds):
                with pytest.raises(ValueError, match="priorities must be finite and >= 0"):
                    rb.add(obs=10, rew=1.0, next_obs=11, done=0.0, priorities=-1.0)
                assert rb._writer.staged == 1
            slots += [rb.add(obs=t, rew=1.0, next_obs=t + 1, done=float(t == 13),
                             priorities=1.0) for t in range(10, 14)]
            return slots, rb.get_stored_size(), simple_rows(rb)

    assert run(6) == run(0)


@pytest.mark.parametrize("timeout, error", [(float("nan"), ValueError), (-1, ValueError),
                                            ("1", TypeError), (True, TypeError)])
def test_bad_timeouts_are_refused_when_nothing_would_be_committed(timeout, error):
    with ReplayBuffer(8, SIMPLE_ENV, Nstep=nstep_spec(3, 0.5)) as rb:
        with pytest.raises(error, match="timeout must be None or a number of seconds"):
            rb.add(obs=0, rew=1.0, next_obs=1, done=0.0, timeout=timeout)   # would be staged
        with pytest.raises(error, match="timeout must be None or a number of seconds"):
            rb.on_episode_end(timeout=timeout)                             # nothing staged
        assert rb._writer.staged == 0 and rb.get_stored_size() == 0
        rb.add(obs=0, rew=1.0, next_obs=1, done=0.0)
        with pytest.raises(error, match="timeout must be None or a number of seconds"):
            rb.add(obs=1, rew=1.0, next_obs=2, done=0.0, timeout=timeout)
        assert rb._writer.staged == 1 and rb.get_stored_size() == 0


# -- lifetime: close, clear, views, fork -----------------------------------------------------

def test_close_commits_the_staged_steps_as_a_truncated_end(backend):
    with ReplayBuffer(32, SIMPLE_ENV, backend=backend, Nstep=nstep_spec(3, 0.5)) as owner:
        writer = ReplayBuffer.attach(owner.name)
        add_steps(writer, [1.0, 2.0, 4.0, 8.0], done_last=False)
        assert owner.get_stored_size() == 2
        writer.close()
        assert writer.closed
        rows = simple_rows(owner)
    assert rows["rew"] == [3, 6, 8, 8]
    assert rows["next_obs"] == [3, 4, 4, 4]
    assert rows["done"] == [0, 0, 0, 0]


def test_owner_close_commits_before_freeing(backend):
    owner = ReplayBuffer(32, SIMPLE_ENV, backend=backend, Nstep=nstep_spec(3, 0.5))
    view = ReplayBuffer.attach(owner.name)
    try:
        add_steps(owner, [1.0, 2.0], done_last=False)
        assert view.get_stored_size() == 0
        owner.close()   # commits, then frees the name; the view keeps the memory mapped
        assert simple_rows(view)["rew"] == [2, 2]
    finally:
        owner.close()
        view.close()


def test_clear_drops_the_staged_steps():
    with ReplayBuffer(32, SIMPLE_ENV, Nstep=nstep_spec(3, 0.5)) as rb:
        add_steps(rb, [1.0, 2.0, 4.0], done_last=False)
        rb.clear()
        assert rb._writer.staged == 0 and rb.get_stored_size() == 0
        add_steps(rb, [1.0], done_last=False, first=10)
        rb.on_episode_end()
        assert simple_rows(rb)["obs"] == [10]


def test_views_have_the_config_and_their_own_empty_staging(backend):
    spec = {"size": 3, "gamma": 0.5, "rew": ["rew"], "next": ["next_obs"]}
    with PrioritizedReplayBuffer(32, SIMPLE_ENV, backend=backend, Nstep=spec) as rb:
        add_steps(rb, [1.0, 2.0], done_last=False)
        for view in (pickle.loads(pickle.dumps(rb)), cpprb_ray.attach(rb.name)):
            with view:
                assert view.nstep == spec
                assert sorted(view.env_dict) == sorted(SIMPLE_ENV)
                assert view._writer.staged == 0
                add_steps(view, [100.0], done_last=True, first=50)
        assert rb._writer.staged == 2
        rb.on_episode_end()
        rows = simple_rows(rb)
    # Each view's one-step episode, then the owner's two steps: no stream mixed into another.
    assert rows["obs"] == [50, 50, 0, 1]
    assert rows["rew"] == [100, 100, 2, 2]
    assert rows["done"] == [1, 1, 0, 0]


def test_the_nstep_record_in_the_segment_is_validated(tmp_path):
    path = str(tmp_path / "cpprb_ray_nstep_meta")
    rb = ReplayBuffer(8, SIMPLE_ENV, backend="mmap", path=path, Nstep=nstep_spec(3, 0.5))
    try:
        with open(path, "r+b") as handle, mmap.mmap(handle.fileno(), 0) as memory:
            at = memory.find(b'"gamma": 0.5')
            assert at > 0
            memory[at:at + 12] = b'"gamma": 7.5'   # same length: the JSON stays well-formed
        with pytest.raises(ValueError, match=r"not a valid cpprb_ray buffer.*gamma.*\[0, 1\]"):
            ReplayBuffer.attach(path)
    finally:
        rb.close()


def fork_child_adds(rb, conn):
    # The inherited handle's staging held the parent's 2 steps; the child must not commit them.
    try:
        conn.send(("staged", rb._writer.staged))
        add_steps(rb, [7.0], done_last=False, first=70)
        rb.on_episode_end()
        conn.send(("done", None))
    except BaseException as error:
        conn.send(("error", repr(error)))


@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="no fork")
@pytest.mark.filterwarnings("ignore:.*fork.*:DeprecationWarning")
def test_a_forked_child_starts_with_empty_staging():
    ctx = multiprocessing.get_context("fork")
    with ReplayBuffer(32, SIMPLE_ENV, Nstep=nstep_spec(3, 0.5)) as rb:
        add_steps(rb, [1.0, 2.0], done_last=False)
        parent_end, child_end = ctx.Pipe()
        child = ctx.Process(target=fork_child_adds, args=(rb, child_end))
        child.start()
        assert receive(parent_end) == 0
        assert receive(parent_end) is None
        child.join(TIMEOUT)
        assert child.exitcode == 0
        rb.on_episode_end()
        rows = simple_rows(rb)
    assert rows["obs"] == [70, 0, 1]
    assert rows["rew"] == [7, 2, 2]


# -- other processes -------------------------------------------------------------------------

def receive(conn):
    assert conn.poll(TIMEOUT), f"no word from a child within {TIMEOUT} s"
    tag, payload = conn.recv()
    assert tag != "error", f"child failed:\n{payload}"
    return payload


def test_spawn_children_add_their_own_streams(backend):
    ctx = multiprocessing.get_context("spawn")
    with PrioritizedReplayBuffer(4096, ENV, backend=backend, Nstep=nstep_spec(3, 0.9)) as rb:
        children, pipes = [], []
        for first, seed in ((0, 11), (100_000, 12)):
            parent_end, child_end = ctx.Pipe()
            child = ctx.Process(target=ref.child_stream, args=(rb, first, seed, child_end))
            child.start()
            children.append(child)
            pipes.append(parent_end)
        try:
            for pipe in pipes:
                receive(pipe)
        finally:
            for child in children:
                child.join(TIMEOUT)
                if child.is_alive():
                    child.kill()
                    child.join(10)
        assert [child.exitcode for child in children] == [0, 0]
        rows = rb.get_all_transitions()
    for first, seed in ((0, 11), (100_000, 12)):
        episodes, _ = ref.child_plan(first, seed)
        mine = (rows["obs"].ravel() >= first) & (rows["obs"].ravel() < first + 100_000)
        assert_rows_match({key: value[mine] for key, value in rows.items()},
                          ref.reference_rows(episodes, 3, 0.9))


def test_a_killed_writer_loses_only_its_staged_steps(backend):
    ctx = multiprocessing.get_context("spawn")
    episode = Episode(0, [1.0, 2.0, 4.0, 8.0, 16.0], terminated=False)
    with ReplayBuffer(64, ENV, backend=backend, Nstep=nstep_spec(3, 0.5)) as rb:
        parent_end, child_end = ctx.Pipe()
        child = ctx.Process(target=ref.child_killed_with_steps_staged,
                            args=(rb, episode, child_end))
        child.start()
        try:
            assert receive(parent_end) == 2   # n - 1 steps staged in the child
        finally:
            child.kill()
            child.join(TIMEOUT)
        rows = rb.get_all_transitions()
        assert rb.get_stored_size() == 3
        # The committed rows are whole and right; the last two steps are gone.
        expected = ref.reference_rows([Episode(0, [1.0, 2.0, 4.0, 8.0, 16.0], False)], 3, 0.5)
        assert_rows_match(rows, {key: value[:3] for key, value in expected.items()})
        # The buffer works on: a new writer adds.
        rb.add(**{k: v[:1] for k, v in Episode(50, [1.0], True).steps().items()})
        assert rb.get_stored_size() == 4


# -- bad specs and bad input -----------------------------------------------------------------

@pytest.mark.parametrize("spec,error,message", [
    ("yes", TypeError, "Nstep must be a dict"),
    ({"gamma": 0.9, "rew": "rew"}, ValueError, r"\('size' required\); unknown \[\]"),
    ({"size": 3, "gamma": 0.9, "rew": "rew", "next": "next_obs", "x": 1}, ValueError,
     r"unknown \['x'\]"),
    ({"size": 0, "gamma": 0.9, "rew": "rew", "next": "next_obs"}, ValueError,
     r"Nstep\['size'\] must be >= 1; got 0"),
    ({"size": 2.0, "gamma": 0.9, "rew": "rew", "next": "next_obs"}, TypeError,
     r"Nstep\['size'\] must be an int"),
    ({"size": 2, "gamma": 1.5, "rew": "rew", "next": "next_obs"}, ValueError,
     r"Nstep\['gamma'\] must be in \[0, 1\]; got 1.5"),
    ({"size": 2, "gamma": float("nan"), "rew": "rew", "next": "next_obs"}, ValueError,
     r"Nstep\['gamma'\] must be in \[0, 1\]"),
    ({"size": 2, "gamma": "0.9", "rew": "rew", "next": "next_obs"}, TypeError,
     r"Nstep\['gamma'\] must be a real number"),
    ({"size": 2, "gamma": 10**400, "rew": "rew", "next": "next_obs"}, ValueError,
     r"Nstep\['gamma'\] must be in \[0, 1\]; got 1000"),   # not float()'s OverflowError
    ({"size": 2, "gamma": 0.9, "rew": "reward", "next": "next_obs"}, ValueError,
     r"Nstep\['rew'\] names 'reward', which is not a column"),
    ({"size": 2, "gamma": 0.9, "rew": "rew", "next": ["next_obs", "nope"]}, ValueError,
     r"Nstep\['next'\] names 'nope'"),
    ({"size": 2, "gamma": 0.9, "rew": [], "next": "next_obs"}, TypeError,
     r"Nstep\['rew'\] must be a column name or a non-empty list"),
    ({"size": 2, "gamma": 0.9, "rew": ["rew", "rew"], "next": "next_obs"}, ValueError,
     "names a column twice"),
    ({"size": 2, "gamma": 0.9, "rew": "rew", "next": "rew"}, ValueError, "must not share"),
    ({"size": 2, "gamma": 0.9, "rew": "done", "next": "next_obs"}, ValueError,
     "must not name the 'done' column"),
    ({"size": 2, "gamma": 0.9, "rew": "act", "next": "next_obs"}, TypeError,
     "must have a floating dtype"),
    # A window no process could stage: it was numpy's "Maximum allowed size exceeded" or a
    # MemoryError, naming nothing.
    ({"size": 2**63, "gamma": 0.9, "rew": "rew", "next": "next_obs"}, ValueError,
     r"Nstep\['size'\] 9223372036854775808 needs .* bytes of staging in each handle's process, "
     r"more than the .* bytes this process may use"),
    ({"size": 2**40, "gamma": 0.9, "rew": "rew", "next": "next_obs"}, ValueError,
     r"Nstep\['size'\] 1099511627776 needs"),
    ({"size": 10**400, "gamma": 0.9, "rew": "rew", "next": "next_obs"}, ValueError,
     r"Nstep\['size'\] 100000000000000000000000\.\.\. needs"),
])
def test_bad_specs_are_refused(spec, error, message):
    env = dict(ENV)
    with pytest.raises(error, match=message):
        ReplayBuffer(8, env, Nstep=spec)


def test_env_dict_needs_done_and_reserves_discounts():
    with pytest.raises(ValueError, match="Nstep needs a 'done' column"):
        ReplayBuffer(8, {"rew": {}, "next_obs": {}}, Nstep=nstep_spec(2, 0.9))
    with pytest.raises(TypeError, match="'done' column must be one number per step"):
        ReplayBuffer(8, {"rew": {}, "next_obs": {}, "done": {"shape": 2}},
                     Nstep=nstep_spec(2, 0.9))
    for nstep in (None, nstep_spec(2, 0.9)):
        with pytest.raises(ValueError, match="'discounts' is reserved"):
            PrioritizedReplayBuffer(8, dict(SIMPLE_ENV, discounts={}), Nstep=nstep)


def test_bad_adds_leave_buffer_and_staging_unchanged():
    with ReplayBuffer(8, SIMPLE_ENV, Nstep=nstep_spec(2, 0.9)) as rb:
        rb.add(obs=0, rew=1, next_obs=1, done=0)
        with pytest.raises(ValueError, match=r"missing \[\], unknown \['discounts'\]"):
            rb.add(obs=1, rew=1, next_obs=2, done=0, discounts=0.5)
        with pytest.raises(ValueError, match=r"missing \['done'\]"):
            rb.add(obs=1, rew=1, next_obs=2)
        with pytest.raises(ValueError, match="ragged batch"):
            rb.add(obs=[1, 2], rew=[1, 1], next_obs=[2, 3], done=[0])
        with pytest.raises(TypeError, match="cannot cast complex128"):
            rb.add(obs=1, rew=1j, next_obs=2, done=0)
        with pytest.raises(ValueError, match="at least one row"):
            rb.add(obs=[], rew=[], next_obs=[], done=[])
        with pytest.raises(ValueError, match=r"unknown \['priorities'\]"):
            rb.add(obs=1, rew=1, next_obs=2, done=0, priorities=1.0)
        assert rb._writer.staged == 1 and rb.get_stored_size() == 0
        rb.add(obs=1, rew=1, next_obs=2, done=1)
        assert simple_rows(rb)["rew"] == pytest.approx([1.9, 1.0])


def test_a_closed_handle_refuses_adds():
    rb = ReplayBuffer(8, SIMPLE_ENV, Nstep=nstep_spec(2, 0.9))
    rb.close()
    rb.close()
    with pytest.raises(ValueError, match="closed buffer"):
        rb.add(obs=0, rew=1, next_obs=1, done=0)   # would only be staged: refused all the same
    rb.on_episode_end()   # nothing staged, nothing to do


# -- list keys and shaped columns --------------------------------------------------------------

def test_list_keys_and_shaped_reward_columns():
    env = {"obs": {}, "rew": {"shape": 2}, "cost": {"dtype": np.float64}, "next_obs": {},
           "next_mask": {"shape": 3, "dtype": np.bool_}, "done": {"dtype": np.bool_}}
    spec = {"size": 2, "gamma": 0.5, "rew": ["rew", "cost"], "next": ["next_obs", "next_mask"]}
    masks = np.eye(3, dtype=bool)
    with ReplayBuffer(8, env, Nstep=spec) as rb:
        rb.add(obs=[0, 1, 2], rew=[[1, 10], [2, 20], [4, 40]], cost=[1.0, 1.0, 1.0],
               next_obs=[1, 2, 3], next_mask=masks, done=[False, False, True])
        rows = rb.get_all_transitions()
    np.testing.assert_array_equal(rows["rew"], [[2, 20], [4, 40], [4, 40]])
    np.testing.assert_array_equal(rows["cost"].ravel(), [1.5, 1.5, 1.0])
    np.testing.assert_array_equal(rows["next_obs"].ravel(), [2, 3, 3])
    np.testing.assert_array_equal(rows["next_mask"], masks[[1, 2, 2]])
    np.testing.assert_array_equal(rows["done"].ravel(), [False, True, True])
    np.testing.assert_array_equal(rows["discounts"].ravel(), [0.25, 0.25, 0.5])


# -- cpprb, for the record ---------------------------------------------------------------------

def test_cpprb_gets_the_ends_wrong_where_we_do_not():
    cpprb = pytest.importorskip("cpprb")
    env = {"obs": {}, "rew": {}, "next_obs": {}, "done": {}}
    results = {}
    for name, cls in (("cpprb", cpprb.ReplayBuffer), ("ours", ReplayBuffer)):
        rb = cls(32, env, Nstep=nstep_spec(3, 0.5))
        add_steps(rb, [1.0, 2.0, 4.0, 8.0, 16.0], done_last=True)
        rb.on_episode_end()
        rows = rb.get_all_transitions()
        results[name] = {key: rows[key].ravel().tolist() for key in ("rew", "next_obs", "done")}
        if name == "ours":
            rb.close()
    # Both sum the rewards alike; cpprb stores step 2 (whose window reaches the terminal step)
    # as not done, and gives the last steps a next_obs that is not the episode's.
    assert results["cpprb"]["rew"] == results["ours"]["rew"] == [3, 6, 12, 16, 16]
    assert results["ours"]["done"] == [0, 0, 1, 1, 1]
    assert results["cpprb"]["done"][2] == 0
    assert results["ours"]["next_obs"] == [3, 4, 5, 5, 5]
    assert results["cpprb"]["next_obs"][3:] != [5, 5]



# -- the single-step path and the batch path agree ---------------------------------------------

def test_single_steps_of_every_value_kind_give_the_batch_rows():
    # Python scalars, numpy scalars of the column's and of other castable dtypes, 0-d and row
    # arrays, lists: each single step takes the fast path or the general one, with equal rows.
    env = {"obs": {"shape": 2, "dtype": np.float32}, "act": {"dtype": np.int32},
           "flag": {"dtype": np.bool_}, "rew": {"dtype": np.float32},
           "next_obs": {"shape": 2, "dtype": np.float32}, "done": {"dtype": np.float32}}
    steps = [
        dict(obs=np.array([0.0, 1.0], np.float32), act=1, flag=True, rew=1.0,
             next_obs=np.array([1.0, 2.0], np.float64), done=0.0),
        dict(obs=[1.0, 2.0], act=np.int32(2), flag=np.bool_(False), rew=np.float64(2.5),
             next_obs=np.array([2.0, 3.0], np.float32), done=False),
        dict(obs=np.array([2, 3], np.int64), act=np.int64(3), flag=False, rew=np.float32(-1),
             next_obs=(3, 4), done=np.float32(0)),
        dict(obs=np.array([3.0, 4.0], np.float32), act=4, flag=np.array(True), rew=3,
             next_obs=np.array([4.0, 5.0], np.float32), done=1),
        dict(obs=np.array([4.0, 5.0], np.float32), act=np.uint8(5), flag=True,
             rew=np.array(0.5, np.float32), next_obs=np.array([5.0, 6.0], np.float32),
             done=np.array([0.0], np.float32)),
        dict(obs=np.array([5.0, 6.0], np.float32), act=6, flag=True, rew=True,
             next_obs=np.array([6.0, 7.0], np.float32), done=0),
    ]
    spec = {"size": 3, "gamma": 0.9, "rew": "rew", "next": "next_obs"}
    with ReplayBuffer(32, env, Nstep=spec) as single, ReplayBuffer(32, env, Nstep=spec) as batch:
        for step in steps:
            single.add(**step)
        single.on_episode_end()
        batch.add(**{key: np.stack([np.asarray(step[key], dtype=env[key]["dtype"]).reshape(-1)
                                    for step in steps]) for key in env})
        batch.on_episode_end()
        single_rows, batch_rows = single.get_all_transitions(), batch.get_all_transitions()
    for key in batch_rows:
        np.testing.assert_array_equal(single_rows[key], batch_rows[key], err_msg=key)
    np.testing.assert_allclose(batch_rows["rew"].ravel(),
                               [1 + 0.9 * 2.5 + 0.81 * -1, 2.5 - 0.9 + 0.81 * 3, -1 + 0.9 * 3,
                                3, 0.5 + 0.9, 1], rtol=1e-6)
    np.testing.assert_array_equal(batch_rows["done"].ravel(), [0, 1, 1, 1, 0, 0])


@pytest.mark.parametrize("bad,error,message", [
    (dict(act=1.5), ValueError, "column 'act' has dtype int64; got 1.5, not a whole number"),
    (dict(act=np.float32(np.nan)), ValueError, "got nan, not a whole number"),
    (dict(obs=np.zeros((2, 2))), ValueError, r"column 'obs' must have shape \(1,\)"),
    (dict(next_obs=np.zeros(3)), ValueError, r"column 'next_obs' must have shape \(2,\)"),
    (dict(act="1"), TypeError, "cannot cast <U1"),
    (dict(done=None), TypeError, "cannot cast object"),
])
def test_single_steps_the_fast_path_declines_are_refused_as_add_refuses(bad, error, message):
    step = dict(obs=0.0, act=1, rew=1.0, next_obs=np.zeros(2), done=0.0)
    with ReplayBuffer(8, ENV, Nstep=nstep_spec(2, 0.5)) as rb:
        rb.add(**step)
        with pytest.raises(error, match=message):
            rb.add(**dict(step, **bad))
        assert rb._writer.staged == 1 and rb.get_stored_size() == 0


def test_a_batch_larger_than_the_staging_then_single_steps():
    # 5000 steps in one call grow the staging past its limit; the next commit shrinks it, and
    # the single steps after a batch of 300 run on a grown one.
    episodes = ref.stream(0, [5000, 40, 5], [False, True, False], seed=3)
    splits = [[5000], [1] * 40, [2, 1, 1, 1]]
    with PrioritizedReplayBuffer(8192, ENV, Nstep=nstep_spec(4, 0.97)) as rb:
        feed(rb, episodes[:1], splits[:1], [False])
        assert rb._writer._staging._capacity == rb._writer._staging._base_capacity
        long_open = ref.stream(10000, [300], [False], seed=5)[0]
        steps = long_open.steps()
        rb.add(**{k: v for k, v in steps.items()})      # stays open: 3 staged
        assert rb._writer.staged == 3
        assert rb._writer._staging._capacity > rb._writer._staging._base_capacity
        tail_steps = Episode(10300, [0.5] * 10, False).steps()
        for t in range(10):
            rb.add(**{k: v[t] for k, v in tail_steps.items()})
        rb.on_episode_end()
        feed(rb, episodes[1:], splits[1:], [False, False])
        rows = rb.get_all_transitions()
    continued = Episode(10000, list(long_open.rewards) + [0.5] * 10, False)
    expected = ref.reference_rows([episodes[0], continued] + episodes[1:], 4, 0.97)
    assert_rows_match(rows, expected)
