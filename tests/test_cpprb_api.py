"""cpprb's whole API on cpprb_ray, in this project's words: the names cpprb exports and the
behaviours of cpprb that cpprb_ray matches (docs/migrating.md). cpprb's own test files run
through `make cpprb-suite` (tools/cpprb_suite/run.py); these tests do not depend on them.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.managers
import os
import pickle
import warnings

import numpy as np
import pytest

import cpprb_ray
from cpprb_ray import (
    HindsightReplayBuffer,
    LaBERlazy,
    LaBERmax,
    LaBERmean,
    MPReplayBuffer,
    NstepBuffer,
    PrioritizedReplayBuffer,
    ReplayBuffer,
    ReverseReplayBuffer,
    SelectiveReplayBuffer,
    create_buffer,
    dict2buffer,
    train,
)

CPPRB_NAMES = ("ReplayBuffer", "PrioritizedReplayBuffer", "MPReplayBuffer",
               "MPPrioritizedReplayBuffer", "SelectiveReplayBuffer", "ReverseReplayBuffer",
               "LaBERmean", "LaBERlazy", "LaBERmax", "HindsightReplayBuffer", "create_buffer",
               "train", "create_env_dict", "create_before_add_func", "NstepBuffer",
               "dict2buffer")


def test_every_name_cpprb_exports_is_here():
    for name in CPPRB_NAMES:
        assert name in cpprb_ray.__all__ and hasattr(cpprb_ray, name), name


# -- behaviours of cpprb kept ----------------------------------------------------------------

def test_nstep_on_observations_alone_with_cpprbs_default_gamma():
    with ReplayBuffer(16, {"obs": {}, "done": {}}, Nstep={"size": 3}) as rb:
        assert rb.nstep == {"size": 3, "gamma": 0.99}
        rb.add(obs=[0, 1, 2, 3], done=[0, 0, 0, 1])
        rows = rb.get_all_transitions()
    assert rows["obs"].ravel().tolist() == [0, 1, 2, 3]       # each step's own observation
    assert rows["done"].ravel().tolist() == [0, 1, 1, 1]      # terminated inside the window
    assert np.allclose(rows["discounts"].ravel(), [0.99**3, 0.99**3, 0.99**2, 0.99])


def test_update_priorities_takes_whole_float_indexes_and_refuses_fractions():
    with PrioritizedReplayBuffer(8, {"obs": {}}, seed=0) as rb:
        rb.add(obs=np.arange(4.0))
        for dtype in (np.float16, np.float32, np.float64, np.longdouble):
            assert rb.update_priorities(np.arange(4, dtype=dtype), np.full(4, 2.0)) == 4
        with pytest.raises(ValueError, match="indexes must be whole numbers; got 0.5"):
            rb.update_priorities(np.array([0.5]), [9.0])
        assert rb.get_max_priority() == 2.0


def test_a_missing_column_is_a_key_error_and_a_value_error():
    with ReplayBuffer(4, {"obs": {}, "act": {}}) as rb:
        for error in (KeyError, ValueError):
            with pytest.raises(error, match=r"missing \['act'\]"):
                rb.add(obs=1.0)
        assert rb.get_stored_size() == 0


def test_episode_length_counts_rows_as_cpprb():
    with ReplayBuffer(8, {"obs": {}}) as rb:
        rb.add(obs=[1.0, 2.0])
        rb.add(obs=3.0)
        assert rb.get_current_episode_len() == 3
        rb.on_episode_end()
        assert rb.get_current_episode_len() == 0


def test_mmap_prefix_puts_the_buffer_in_one_file(tmp_path):
    prefix = str(tmp_path / "replay")
    rb = ReplayBuffer(32, {"done": {}}, mmap_prefix=prefix)
    try:
        assert rb.backend == "mmap" and rb.name.endswith("replay.cpprb_ray")
        assert os.path.exists(prefix + ".cpprb_ray")
    finally:
        rb.close()
    assert not os.path.exists(prefix + ".cpprb_ray")     # freed by its owner, as any buffer
    with pytest.raises(ValueError, match="not both"):
        ReplayBuffer(8, {"done": {}}, mmap_prefix=prefix, backend="shm")


def test_a_shut_down_manager_is_refused_as_cpprb_refuses_it():
    with multiprocessing.managers.SyncManager() as manager:
        pass
    with pytest.raises(multiprocessing.ProcessError, match="shut down"):
        MPReplayBuffer(4, {"done": {}}, ctx=manager)


@pytest.mark.parametrize("next_of, stack", [("obs", 1), (None, 2), ("obs", 3)])
def test_frames_buffer_of_size_n_holds_n_rows_numbered_as_cpprb(next_of, stack):
    """With next_of / stack_compress, a buffer of size 5 holds the newest 5 rows whatever
    filler slots its episodes take, numbers them as cpprb (add count modulo 5), and gives them
    back by those numbers, equal to a buffer that stores every column whole."""
    shape = (2, stack) if stack > 1 else (2,)
    env = {"obs": {"shape": shape}, "next_obs": {"shape": shape}}
    frames = np.arange(200.0).reshape(100, 2)

    def obs(t):
        return frames[t:t + stack].T if stack > 1 else frames[t]

    with ReplayBuffer(5, env) as whole, \
            ReplayBuffer(5, env, next_of=next_of,
                         stack_compress="obs" if stack > 1 else None) as compressed:
        assert compressed.get_buffer_size() == 5
        t = 0
        for added in range(12):
            if added % 3 == 0:
                t += 10        # a new episode (its frames do not continue the last)
            step = {"obs": obs(t), "next_obs": obs(t + 1)}
            assert whole.add(**step) == compressed.add(**step) == added % 5
            t += 1
            stored = min(added + 1, 5)
            assert compressed.get_stored_size() == stored
            assert compressed.get_next_index() == whole.get_next_index()
            if added % 3 == 2:
                compressed.on_episode_end()
            mine = compressed._encode_sample(range(stored))
            theirs = whole._encode_sample(range(stored))
            for name in env:
                assert np.array_equal(mine[name], theirs[name]), (added, name)
            everything = compressed.get_all_transitions()
            assert np.array_equal(everything["obs"], whole.get_all_transitions()["obs"])


def test_stacks_longer_than_64_frames():
    env = {"obs": {"shape": (2, 84), "dtype": np.uint8}}
    planes = np.arange(2 * 120, dtype=np.uint8).reshape(120, 2)
    with ReplayBuffer(8, env, stack_compress="obs") as rb:
        for t in range(10):
            rb.add(obs=planes[t:t + 84].T)
        rows = rb._encode_sample(range(8))["obs"]
    for index, row in enumerate(rows):
        t = index + 8 if index < 2 else index   # rows 8 and 9 took numbers 0 and 1
        assert np.array_equal(row, planes[t:t + 84].T)


def test_encode_sample_reads_rows_by_index_and_refuses_unwritten_ones():
    with ReplayBuffer(8, {"obs": {}}) as rb:
        rb.add(obs=[5.0, 6.0, 7.0])
        assert rb._encode_sample(np.array([2, 0, 2]))["obs"].ravel().tolist() == [7, 5, 7]
        assert rb._encode_sample(1)["obs"].ravel().tolist() == [6.0]
        with pytest.raises(IndexError, match="got 3 at position 1"):
            rb._encode_sample([0, 3])


def test_cpprbs_nstep_files_load_with_gamma_to_the_n(tmp_path):
    env = {"obs": {}, "done": {}}
    transitions = {"obs": np.arange(3.0).reshape(3, 1), "done": np.zeros((3, 1))}
    np.savez_compressed(tmp_path / "cpprb.npz", safe=True, version=1, data=transitions,
                        Nstep=True, cache=None, next_of=None)
    with ReplayBuffer(8, env, Nstep={"size": 2, "gamma": 0.5}) as rb:
        with pytest.warns(RuntimeWarning, match=r"gamma\*\*n = 0.25"):
            rb.load_transitions(tmp_path / "cpprb.npz")
        assert rb.get_all_transitions()["discounts"].ravel().tolist() == [0.25] * 3


# -- the names cpprb has and cpprb_ray had not ---------------------------------------------------

def test_nstep_buffer_hands_rows_back_when_cpprb_does_with_correct_ends():
    env = {"obs": {}, "rew": {}, "next_obs": {}, "done": {}}
    spec = {"size": 3, "gamma": 0.5, "rew": "rew", "next": "next_obs"}
    nb = NstepBuffer(env, spec, discounts=True)
    steps = [dict(obs=t, rew=1.0, next_obs=t + 1, done=float(t == 3)) for t in range(6)]
    handed = [nb.add(**step) for step in steps]
    # A step's row is due once n - 1 = 2 later steps were added, episode end or not.
    assert [None if rows is None else rows["obs"].ravel().tolist() for rows in handed] == \
        [None, None, [0.0], [1.0], [2.0], [3.0]]
    rest = nb.on_episode_end()
    assert rest["obs"].ravel().tolist() == [4.0, 5.0]
    rows = {name: np.concatenate([r[name] for r in handed if r is not None] + [rest[name]])
            for name in rest}
    # The same rows a buffer with Nstep= stores.
    with ReplayBuffer(16, env, Nstep=spec) as rb:
        for step in steps:
            rb.add(**step)
        rb.on_episode_end()
        stored = rb.get_all_transitions()
    for name in stored:
        assert np.array_equal(rows[name], stored[name]), name
    assert nb.get_Nstep_size() == 3
    nb.add(**steps[0])
    nb.clear()
    assert nb.on_episode_end()["obs"].shape == (0, 1)


@pytest.mark.parametrize("cls, uniform, onehot", [
    (LaBERmean, 1.0, 0.25), (LaBERlazy, 4.0, 1.0), (LaBERmax, 1.0, 1.0)])
def test_laber_weights(cls, uniform, onehot):
    assert cls(2, 2)(priorities=[1, 1, 1, 1])["weights"].tolist() == [uniform] * 2
    sample = cls(2, 2, eps=0)(priorities=[1, 0, 0, 0], obs=np.arange(4.0))
    assert sample["indexes"].tolist() == [0, 0] and sample["obs"].tolist() == [0.0, 0.0]
    assert sample["weights"].tolist() == [onehot] * 2
    for bad in ({"priorities": [1, 1, 1]}, {"priorities": [1, 1, 1, -1]},
                {"priorities": [1, 1, 1, 1], "obs": np.arange(3)}):
        with pytest.raises(ValueError):
            cls(2, 2)(**bad)
    with pytest.raises(ValueError, match="eps must be >= 0"):
        cls(2, 2, eps=-1)


def test_laber_draws_in_proportion_to_the_priorities():
    counts = np.bincount(LaBERmean(20000, 1, eps=0, seed=3)(
        priorities=np.r_[np.zeros(19990), [1, 1, 1, 1, 1, 1, 1, 1, 1, 11]])["indexes"] - 19990,
        minlength=10)
    assert counts[9] > 8000 and counts[:9].min() > 500


def test_reverse_walk_and_its_stride_survive_pickling():
    with ReverseReplayBuffer(20, {"obs": {}}, stride=5) as rb:
        rb.add(obs=np.arange(20))
        assert rb.sample(2)["obs"].ravel().tolist() == [19, 14]
        assert rb.sample(2)["obs"].ravel().tolist() == [18, 13]
        view = pickle.loads(pickle.dumps(rb))
        try:
            assert type(view) is ReverseReplayBuffer and view.stride == 5
            assert view.sample(1)["obs"].ravel().tolist() == [19]   # its own walk
        finally:
            view.close()
        with pytest.raises(ValueError, match="stride must be > 0"):
            ReverseReplayBuffer(4, {"obs": {}}, stride=0)


def test_selective_buffer_reads_and_deletes_episodes():
    with SelectiveReplayBuffer(4, obs_dim=1, act_dim=1, Nepisodes=2) as rb:
        rb.add(obs=np.arange(6), act=np.zeros(6), rew=np.ones(6), next_obs=np.arange(1, 7),
               done=[0, 1, 0, 0, 1, 0])
        assert rb.get_stored_episode_size() == 3 and rb.get_next_index() == 6
        assert rb.get_episode(1)["obs"].ravel().tolist() == [2.0, 3.0, 4.0]
        assert rb.delete_episode(0) == 2
        assert rb.get_all_transitions()["obs"].ravel().tolist() == [2, 3, 4, 5]
        assert rb.get_episode(9)["obs"].shape == (0, 1) and rb.delete_episode(9) == 0
        rb.add(obs=np.arange(9), act=np.zeros(9), rew=np.ones(9), next_obs=np.arange(9),
               done=np.zeros(9))
        assert rb.get_stored_size() == rb.get_buffer_size() == 8   # no ring: the rest dropped


def test_create_buffer_and_dict2buffer():
    with create_buffer(8, {"obs": {}}, prioritized=True, alpha=0.5) as rb:
        assert type(rb) is PrioritizedReplayBuffer
    with create_buffer(8, {"obs": {}}) as rb:
        assert type(rb) is ReplayBuffer
    with pytest.raises(TypeError, match="obs_shape"):
        create_buffer(8, obs_shape=(3,), prioritized=True)
    env = {"a": {"shape": (3, 3)}, "b": {"dtype": np.int8}}
    arrays = dict2buffer(10, env, stack_compress="a")
    assert arrays["a"].shape == (10, 3, 3) and arrays["b"].dtype == np.int8
    assert arrays["a"].strides == (12, 4, 12)          # row i + 1 starts one plane later
    assert env == {"a": {"shape": (3, 3)}, "b": {"dtype": np.int8}}


class _Env:
    def reset(self):
        self.t = 0
        return np.zeros(3)

    def step(self, action):
        self.t += 1
        return np.full(3, float(self.t)), 1.0, float(self.t % 4 == 0), {}


@pytest.mark.parametrize("cls", [ReplayBuffer, PrioritizedReplayBuffer])
def test_train_runs_cpprbs_loop(cls):
    env_dict = {"obs": {"shape": 3}, "act": {}, "rew": {}, "next_obs": {"shape": 3},
                "done": {}}
    seen, episodes = [], []
    with cls(32, env_dict) as rb:
        train(rb, _Env(), lambda obs, step, episode, warmup: 0.0,
              lambda batch, step, episode: seen.append((step, episode)) or 0.5,
              max_steps=10, n_warmups=2, batch_size=4, logger=False,
              episode_callback=lambda e, s, r: episodes.append((e, s)))
        assert rb.get_stored_size() == 10
    assert [step for step, _ in seen] == list(range(2, 10))
    assert episodes == [(0, 3), (1, 3)]
    with cls(32, env_dict) as rb, pytest.raises(ValueError, match="max_steps"):
        train(rb, _Env(), lambda *a: 0.0, lambda *a: 0.5, max_steps=2**70)


def test_gymnasium_helpers_make_columns_add_takes():
    gymnasium = pytest.importorskip("gymnasium")
    from cpprb_ray.util import create_before_add_func, create_env_dict

    class Env:
        observation_space = gymnasium.spaces.Dict(
            {"pos": gymnasium.spaces.Box(-1.0, 1.0, (2,)), "key": gymnasium.spaces.Discrete(3)})
        action_space = gymnasium.spaces.Tuple([gymnasium.spaces.Discrete(3),
                                               gymnasium.spaces.MultiBinary(4)])

    env = Env()
    with ReplayBuffer(4, create_env_dict(env)) as rb:
        step = create_before_add_func(env)(env.observation_space.sample(),
                                           env.action_space.sample(),
                                           env.observation_space.sample(), 0.5, False)
        rb.add(**step)
        assert rb.get_stored_size() == 1
        assert rb.env_dict["act1"]["shape"] == (4,) and rb.env_dict["obs_pos"]["shape"] == (2,)


# -- HindsightReplayBuffer -----------------------------------------------------------------------

def _reward(state, action, goal):
    return -1.0 * (np.abs(state - goal).sum(axis=1) > 0)


HER_ENV = {"obs": {"shape": 2}, "act": {}, "next_obs": {"shape": 2}}


def episode_steps(actor, episode, length):
    """Steps whose states name their actor, episode and step: state (code, t + 1) after step t,
    code = 1000 * actor + episode."""
    code = 1000.0 * actor + episode
    return [{"obs": [code, t], "act": float(t), "next_obs": [code, t + 1]} for t in range(length)]


def check_her_rows(rows, strategy, goals_per_step, episodes=None):
    """The oracle: every row's goal is one its strategy may pick for its step, and its reward
    is reward_func's for that goal. Returns how many rows each (code, t) has."""
    assert np.array_equal(rows["rew"].ravel(), _reward(rows["next_obs"], rows["act"],
                                                       rows["goal"]))
    counts = {}
    for obs, goal in zip(rows["obs"], rows["goal"]):
        code, t = obs
        counts[(code, t)] = counts.get((code, t), 0) + 1
        if goal[0] < 0:              # the episode's own goal: (-1, -1) here
            continue
        if strategy == "future":
            assert goal[0] == code and goal[1] >= t + 1, (obs, goal)
        elif strategy == "episode":
            assert goal[0] == code and goal[1] >= 1, (obs, goal)
        elif strategy == "final":
            assert goal[0] == code and goal[1] == episodes[code], (obs, goal)
        else:   # random: a state some stored row reached
            assert goal[1] >= 1 and any(goal[0] == c for c in episodes), (obs, goal)
    assert set(counts.values()) == {1 + goals_per_step}, counts
    return counts


@pytest.mark.parametrize("strategy", ["future", "episode", "final", "random"])
def test_hindsight_relabels_by_its_strategy(strategy):
    lengths = {0.0: 3, 1.0: 5, 2.0: 1}
    with HindsightReplayBuffer(64, HER_ENV, max_episode_len=5, reward_func=_reward,
                               strategy=strategy, additional_goals=2, seed=4,
                               prioritized=False) as her:
        for episode, length in lengths.items():
            for step in episode_steps(0, int(episode), length):
                her.add(**step)
            assert her.get_stored_size() == sum(
                (1 + her.additional_goals) * lengths[e] for e in lengths if e < episode)
            her.on_episode_end([-1, -1])
        goals = 1 if strategy == "final" else 2
        counts = check_her_rows(her.get_all_transitions(), strategy, goals, lengths)
        assert len(counts) == sum(lengths.values())
        with pytest.raises(ValueError, match="prioritized=False"):
            her.update_priorities([0], [1.0])


def test_hindsight_refuses_long_episodes_and_unknown_strategies():
    with HindsightReplayBuffer(8, HER_ENV, max_episode_len=2, reward_func=_reward) as her:
        her.add(obs=[0, 0], act=0, next_obs=[0, 1])
        with pytest.raises(ValueError, match="max_episode_len is 2"):
            her.add(obs=[[0, 1], [0, 2]], act=[0, 0], next_obs=[[0, 2], [0, 3]])
        her.on_episode_end([5, 5])
        assert her.get_stored_size() == 5 and her.get_max_priority() == 1.0
    with pytest.raises(ValueError, match="strategy must be one of"):
        HindsightReplayBuffer(8, HER_ENV, 2, _reward, strategy="best")


def _her_actor_module():
    import sys

    import ray
    # Ray workers cannot import the tests directory: this module's code goes by value.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

    @ray.remote(num_cpus=0)
    class Actor:
        def __init__(self, her, actor):
            self.her = her
            self.actor = actor

        def play(self, episodes, length):
            for episode in range(episodes):
                for step in episode_steps(self.actor, episode, length):
                    self.her.add(**step)
                self.her.on_episode_end([-1, -1])
            return self.her.rb.is_owner

    return Actor


def test_hindsight_shared_by_ray_actors_and_sampled_by_a_learner(ray_session):
    """Two Ray actors add whole episodes to one shared HER buffer; the learner (this process)
    samples relabeled goals, and every row passes the oracle."""
    ray = ray_session
    Actor = _her_actor_module()
    with HindsightReplayBuffer(512, HER_ENV, max_episode_len=6, reward_func=_reward,
                               strategy="future", additional_goals=3, seed=0) as her:
        actors = [Actor.remote(her, actor) for actor in (1, 2)]
        try:
            owners = ray.get([a.play.remote(5, 6) for a in actors], timeout=120)
            assert owners == [False, False]
        finally:
            for actor in actors:
                ray.kill(actor)
        assert her.get_stored_size() == 2 * 5 * 6 * (1 + 3)
        counts = check_her_rows(her.get_all_transitions(), "future", 3)
        assert {code for code, _ in counts} == {1000.0 * a + e for a in (1, 2) for e in range(5)}
        batch = her.sample(256, beta=0.4)
        assert np.array_equal(batch["rew"].ravel(),
                              _reward(batch["next_obs"], batch["act"], batch["goal"]))
        her.update_priorities(batch["indexes"], np.full(256, 2.0))
        assert her.get_max_priority() == 2.0


def test_hindsight_pickles_with_an_empty_staging():
    with HindsightReplayBuffer(16, HER_ENV, max_episode_len=4, reward_func=_reward) as her:
        her.add(obs=[1, 0], act=0, next_obs=[1, 1])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            copy = pickle.loads(pickle.dumps(her))
        try:
            copy.on_episode_end([9, 9])           # nothing staged there: nothing added
            assert her.get_stored_size() == 0
            her.on_episode_end([9, 9])
            assert copy.get_stored_size() == 5    # the same buffer
        finally:
            copy.close()
