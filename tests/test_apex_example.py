"""examples/apex.py and its numpy double DQN (examples/dqn_numpy.py).

The example runs for real in a subprocess (its own local Ray, real actors, the shared buffer) on
a short budget; the network's gradients are checked against finite differences, and the double
DQN target against values worked out by hand.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import cpprb_ray

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
if TESTS_DIR not in sys.path:
    sys.path.insert(0, TESTS_DIR)

from _examples import EXAMPLES, load  # noqa: E402

APEX = os.path.join(EXAMPLES, "apex.py")


dqn = load("dqn_numpy")
apex = load("apex")


# ---------------------------------------------------------------------------------------------
# The example, end to end.

REQUIRED = {"actors": int, "seconds": float, "transitions_added": int, "add_rate": float,
            "learner_steps": int, "sample_rate": float, "mean_return_last_20": float,
            "solved_at_seconds": (float, type(None))}


@pytest.mark.parametrize("prefetch", [False, True], ids=["sample", "prefetch"])
def test_example_runs_and_reports_one_json_line(tmp_path, prefetch):
    pytest.importorskip("ray")
    pytest.importorskip("gymnasium")
    plot = tmp_path / "apex.png"
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")
    env.pop("RAY_ADDRESS", None)
    completed = subprocess.run(
        [sys.executable, APEX, "--actors", "1", "--seconds", "12", "--seed", "3",
         "--buffer-size", "4096", "--min-size", "256", "--batch-size", "32",
         "--publish-every", "50", "--no-progress", "--plot", str(plot)]
        + (["--prefetch"] if prefetch else []),
        capture_output=True, text=True, timeout=150, env=env, cwd=str(tmp_path))
    assert completed.returncode == 0, completed.stderr[-4000:]
    lines = completed.stdout.strip().splitlines()
    assert len(lines) == 1, completed.stdout  # stdout is the JSON line and nothing else
    result = json.loads(lines[0])
    for key, kind in REQUIRED.items():
        assert isinstance(result[key], kind), (key, result[key])
    assert result["actors"] == 1
    assert 12.0 <= result["seconds"] < 40.0
    assert result["transitions_added"] > 256       # past --min-size: the learner could start
    assert result["learner_steps"] > 0
    assert result["add_rate"] == pytest.approx(result["transitions_added"] / result["seconds"],
                                               rel=0.01)
    assert result["sample_rate"] == pytest.approx(
        result["learner_steps"] * 32 / result["seconds"], rel=0.01)
    assert result["episodes"] > 0 and result["mean_return_last_20"] >= 8  # CartPole's minimum
    # The buffer's limiter paced the learner: it never got further ahead of the inserts than
    # samples_per_insert allows, give or take its slack.
    limit = result["rate_limit"]
    assert result["learner_steps"] * 32 <= (limit["samples_per_insert"]
                                            * result["transitions_added"]
                                            + limit["error_buffer"] + 32)
    assert result["rate_limiter"] == "SampleToInsertRatio"
    limiter = result["buffer_stats"]["rate_limiter"]
    assert limiter["kind"] == "SampleToInsertRatio"
    # Every batch drawn counts as sampled: with prefetch, those the thread had drawn ahead
    # when the learner stopped count too (depth 4: at most three).
    ahead = limiter["samples"] - result["learner_steps"] * 32
    assert ahead in ((0, 32, 64, 96) if prefetch else (0,)), ahead
    assert result["prefetch"] is prefetch
    assert 0 < result["learner_wait_s"] < result["seconds"]
    assert result["learner_wait_us_per_step"] == pytest.approx(
        1e6 * result["learner_wait_s"] / result["learner_steps"], rel=0.05, abs=1)
    assert limiter["min_diff"] <= limiter["diff"] <= limiter["max_diff"]
    assert result["nstep"] == 3 and result["gamma"] == 0.99
    assert result["ray_nodes"] == ["127.0.0.1"]    # its own single node stays on loopback
    assert "N-step" in completed.stderr and "rate limiter" in completed.stderr
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bad_flags_are_refused_by_name():
    with pytest.raises(SystemExit):
        apex.parse_args(["--actors", "0"])
    with pytest.raises(SystemExit):
        apex.parse_args(["--min-size", "10", "--buffer-size", "5"])
    args = apex.parse_args(["--actors", "3", "--seconds", "5"])
    assert (args.actors, args.seconds, args.batch_size) == (3, 5.0, 64)


def test_epsilon_ladder():
    assert apex.epsilon_ladder(1) == [0.4]
    for actors in (2, 5, 8):
        ladder = apex.epsilon_ladder(actors)
        assert len(ladder) == actors
        assert ladder[0] == pytest.approx(0.4) and ladder[-1] == pytest.approx(0.4 ** 8)
        assert all(a > b for a, b in zip(ladder, ladder[1:]))
    assert apex.epsilon_ladder(3)[1] == pytest.approx(0.4 ** 4.5)


def test_the_buffer_stores_3_step_rows_behind_a_limiter():
    rb = apex.make_buffer(64, 0, 8.0, 1, 1000.0)
    try:
        assert isinstance(rb.rate_limiter, cpprb_ray.SampleToInsertRatio)
        steps = 5
        rb.add(obs=np.ones((steps, 4)), act=np.zeros(steps, dtype=np.int64),
               rew=np.ones(steps), next_obs=np.ones((steps, 4)), done=np.zeros(steps))
        rb.on_episode_end()
        batch = rb.sample(4)
        assert batch["discounts"].dtype == np.float32
        # A truncated 5-step episode: windows of 3, 3, 3, 2 and 1 steps.
        expected = {1.0: 0.99, 1.99: 0.99 ** 2, 2.9701: 0.99 ** 3}
        for rew, discount in zip(batch["rew"].ravel(), batch["discounts"].ravel()):
            assert discount == pytest.approx(expected[round(float(rew), 4)], rel=1e-6)
    finally:
        rb.close()


# ---------------------------------------------------------------------------------------------
# The numpy network and the double-DQN update.

def numeric_gradient(function, param: np.ndarray, step: float = 1e-6) -> np.ndarray:
    grad = np.zeros_like(param)
    for position in np.ndindex(param.shape):
        saved = param[position]
        param[position] = saved + step
        above = function()
        param[position] = saved - step
        below = function()
        param[position] = saved
        grad[position] = (above - below) / (2 * step)
    return grad


def test_mlp_backward_matches_finite_differences():
    rng = np.random.default_rng(0)
    net = dqn.MLP([3, 7, 5, 2], seed=1, dtype=np.float64)
    for param in net.params:   # nonzero biases, so that every parameter matters
        param += rng.normal(0, 0.3, param.shape)
    inputs = rng.normal(size=(6, 3))
    upstream = rng.normal(size=(6, 2))
    outputs, cache = net.forward_with_cache(inputs)
    analytic = net.backward(cache, upstream)
    for param, grad in zip(net.params, analytic):
        numeric = numeric_gradient(lambda: float(np.sum(upstream * net.forward(inputs))), param)
        np.testing.assert_allclose(grad, numeric, rtol=1e-5, atol=1e-7)


def test_loss_gradient_matches_finite_differences():
    """The whole learner loss: action selection, importance weights, Huber on both branches."""
    rng = np.random.default_rng(1)
    net = dqn.MLP([4, 6, 3], seed=2, dtype=np.float64)
    learner = dqn.DoubleDQN(net)
    learner.target.set_weights([p + rng.normal(0, 0.5, p.shape) for p in net.params])
    rows = 8
    batch = {"obs": rng.normal(size=(rows, 4)), "act": rng.integers(0, 3, rows),
             "rew": rng.normal(0, 2, rows), "next_obs": rng.normal(size=(rows, 4)),
             "done": (rng.random(rows) < 0.3).astype(float),
             "weights": rng.uniform(0.2, 1.0, rows)}
    discounts = rng.uniform(0.9, 1.0, rows)
    loss, td_errors, grads = learner.loss_and_grads(batch, discounts)
    assert (np.abs(td_errors) > 1).any() and (np.abs(td_errors) < 1).any()  # both Huber parts

    def loss_with_fixed_targets() -> float:
        # The target is a constant of the loss (a semi-gradient): recompute it from the weights
        # as they were, and only the prediction from the perturbed ones.
        q_values = net.forward(batch["obs"])[np.arange(rows), batch["act"]]
        errors = q_values - (q_values_at_start - td_errors)
        return float(np.mean(batch["weights"] * dqn.huber(errors)[0]))

    q_values_at_start = net.forward(batch["obs"])[np.arange(rows), batch["act"]]
    assert loss == pytest.approx(loss_with_fixed_targets())
    for param, grad in zip(net.params, grads):
        np.testing.assert_allclose(grad, numeric_gradient(loss_with_fixed_targets, param),
                                   rtol=1e-5, atol=1e-8)


def test_double_dqn_target_on_a_hand_made_batch():
    rew = np.array([1.0, 0.5, 2.0, -1.0])
    discounts = np.array([0.99 ** 3, 0.99 ** 3, 0.99 ** 2, 0.99])   # shortened windows too
    done = np.array([0.0, 1.0, 0.0, 0.0])
    # The online network picks the action, the target network values it: here they disagree.
    q_next_online = np.array([[1.0, 5.0], [9.0, 0.0], [3.0, 2.0], [-1.0, -2.0]])
    q_next_target = np.array([[7.0, 4.0], [100.0, 100.0], [6.0, 8.0], [10.0, 20.0]])
    expected = np.array([1.0 + 0.99 ** 3 * 4.0,    # online argmax 1 -> target's 4, not max 7
                         0.5,                       # terminated: no bootstrap
                         2.0 + 0.99 ** 2 * 6.0,     # online argmax 0 -> target's 6, not max 8
                         -1.0 + 0.99 * 10.0])
    got = dqn.double_dqn_targets(rew, discounts, done, q_next_online, q_next_target)
    np.testing.assert_allclose(got, expected)
    # One gamma for every row (1-step rows) is the same as a column of it.
    np.testing.assert_allclose(dqn.double_dqn_targets(rew, 0.5, done, q_next_online,
                                                      q_next_target),
                               dqn.double_dqn_targets(rew, np.full(4, 0.5), done,
                                                      q_next_online, q_next_target))


def test_learner_uses_the_target_network_and_the_discounts_column():
    net = dqn.MLP([1, 2], seed=0, dtype=np.float64)
    net.set_weights([np.zeros((1, 2)), np.array([1.0, 2.0])])      # online Q = (1, 2)
    learner = dqn.DoubleDQN(net)
    learner.target.set_weights([np.zeros((1, 2)), np.array([30.0, 10.0])])   # target Q
    batch = {"obs": np.zeros((2, 1)), "act": np.array([[0], [1]]), "rew": np.array([[1.0], [0.0]]),
             "next_obs": np.zeros((2, 1)), "done": np.array([[0.0], [0.0]]),
             "weights": np.ones(2)}
    _, td_errors, _ = learner.loss_and_grads(batch, np.array([[0.5], [0.25]]))
    # targets: 1 + 0.5 * 10 = 6 and 0 + 0.25 * 10 = 2.5 (argmax online = 1, valued by target)
    np.testing.assert_allclose(td_errors, [1.0 - 6.0, 2.0 - 2.5])


def test_learner_fits_a_one_step_bandit():
    """Training works: Q(s, a) converges to each terminal reward."""
    learner = dqn.DoubleDQN(dqn.MLP([2, 16, 2], seed=0, dtype=np.float64), learning_rate=1e-2,
                            target_every=50)
    batch = {"obs": np.ones((2, 2)), "act": np.array([0, 1]), "rew": np.array([1.0, -1.0]),
             "next_obs": np.ones((2, 2)), "done": np.ones(2), "weights": np.ones(2)}
    for _ in range(400):
        priorities = learner.train_step(batch, 0.99)
    np.testing.assert_allclose(learner.network.forward(np.ones((1, 2)))[0], [1.0, -1.0],
                               atol=0.02)
    assert priorities.max() < 0.02


def test_actor_td_errors():
    net = dqn.MLP([2, 3, 2], seed=4, dtype=np.float64)
    rng = np.random.default_rng(2)
    obs, next_obs = rng.normal(size=(5, 2)), rng.normal(size=(5, 2))
    act = np.array([0, 1, 1, 0, 1])
    rew = rng.normal(size=5)
    done = np.array([0.0, 0.0, 1.0, 0.0, 1.0])
    q_now, q_next = net.forward(obs), net.forward(next_obs)
    expected = [abs(rew[i] + 0.9 * (1 - done[i]) * q_next[i].max() - q_now[i, act[i]])
                for i in range(5)]
    np.testing.assert_allclose(dqn.greedy_td_errors(net, obs, act, rew, next_obs, done, 0.9),
                               expected)


def test_set_weights_refuses_other_shapes():
    net = dqn.MLP([2, 3, 1], seed=0)
    with pytest.raises(ValueError, match="weights must have shapes"):
        net.set_weights([np.zeros((3, 2)), np.zeros(3), np.zeros((3, 1)), np.zeros(1)])
    with pytest.raises(ValueError, match="sizes must be"):
        dqn.MLP([4])


@pytest.mark.parametrize("module", [dqn, apex], ids=["dqn_numpy", "apex"])
def test_docstring_examples(module):
    # examples/ is not a package, so test_doctests.py (which imports by name) cannot reach it.
    import doctest

    result = doctest.testmod(module, verbose=False, report=True,
                             optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0
