"""examples/r2d2.py and its numpy recurrent Q-network (examples/r2d2_numpy.py).

The GRU's backpropagation through time is checked against finite differences, the n-step
targets inside sequences against a step-by-step reference, the actors' cutting of episodes into
sequences against the contract (starts every period, padding, mask), and the example runs for
real in a subprocess (its own local Ray, real actors, the shared buffer) on a short budget.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
if TESTS_DIR not in sys.path:
    sys.path.insert(0, TESTS_DIR)

from _examples import EXAMPLES, load  # noqa: E402

R2D2_SCRIPT = os.path.join(EXAMPLES, "r2d2.py")


rnn = load("r2d2_numpy")
r2d2 = load("r2d2")
# r2d2.py imports apex by name. Leave no module of that name in sys.modules: doctest asks
# inspect.getmodule (a lookup by name) whether a function belongs to the module it tests, and
# would take test_apex_example.py's own copy of apex for another module (testing nothing).
sys.modules.pop("apex", None)


def random_batch(rng, rows=3, length=8, hidden=5):
    batch = {"obs": rng.normal(size=(rows, length, 2)), "act": rng.integers(0, 2, (rows, length)),
             "rew": 0.1 * rng.normal(size=(rows, length)), "done": np.zeros((rows, length)),
             "mask": np.ones((rows, length), bool), "core": 0.5 * rng.normal(size=(rows, hidden)),
             "weights": rng.uniform(0.5, 1.0, rows)}
    batch["done"][1, 5] = 1.0          # terminated: no bootstrap past step 5
    batch["mask"][1, 6:] = False
    batch["mask"][2, 7:] = False       # truncated: step 6 has no successor, no loss
    return batch


def numeric_gradient(loss, params, eps=1e-6):
    grads = []
    for param in params:
        grad = np.zeros_like(param)
        for index in np.ndindex(param.shape):
            old = param[index]
            param[index] = old + eps
            plus = loss()
            param[index] = old - eps
            minus = loss()
            param[index] = old
            grad[index] = (plus - minus) / (2 * eps)
        grads.append(grad)
    return grads


# ---------------------------------------------------------------------------------------------
# The network and the update.

def test_gru_backward_matches_finite_differences():
    rng = np.random.default_rng(0)
    gru = rnn.GRU(3, 4, seed=1, dtype=np.float64)
    inputs, start = rng.normal(size=(6, 2, 3)), rng.normal(size=(2, 4))
    upstream = rng.normal(size=(6, 2, 4))

    def loss():
        return float(np.sum(upstream * gru.forward(inputs, start, keep=False)[0]))

    states, cache = gru.forward(inputs, start)
    grads, grad_start = gru.backward(cache, upstream)
    for got, expected in zip(grads, numeric_gradient(loss, gru.params)):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-8)
    np.testing.assert_allclose(grad_start, numeric_gradient(loss, [start])[0], rtol=1e-5,
                               atol=1e-8)


def test_r2d2_loss_gradient_matches_finite_differences():
    """The whole update without burn-in: GRU (BPTT), the ReLU head, masks, n-step double-DQN
    targets (the target network differs from the online one), Huber loss, importance
    weights."""
    rng = np.random.default_rng(1)
    learner = rnn.R2D2(rnn.RecurrentQ(2, 5, 7, 2, seed=2, dtype=np.float64), burn_in=0, nstep=3,
                       gamma=0.9)
    learner.target.set_weights([p + rng.normal(scale=0.3, size=p.shape)
                                for p in learner.network.params])
    batch = random_batch(rng)
    batch["rew"][0, 2] = 3.0
    loss, abs_td, has, grads = learner.loss_and_grads(batch)
    assert has.sum() == 7 + 6 + 6 and loss > 0
    assert np.abs(abs_td).max() > 1.0     # some errors in Huber's linear part too
    expected = numeric_gradient(lambda: learner.loss_and_grads(batch)[0],
                                learner.network.params)
    for got, want in zip(grads, expected):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-8)


def test_burn_in_warms_the_state_without_gradient():
    """With burn-in b, the loss and gradients equal those of no burn-in on the last L - b
    steps started from the state the first b steps lead to (R2D2 stops the gradient there)."""
    rng = np.random.default_rng(2)
    net = rnn.RecurrentQ(2, 5, 7, 2, seed=3, dtype=np.float64)
    batch = random_batch(rng)
    with_burn_in = rnn.R2D2(net, burn_in=3, nstep=3, gamma=0.9)
    loss, abs_td, has, grads = with_burn_in.loss_and_grads(batch)
    assert not has[:3].any()
    _, warmed, _ = net.unroll(np.swapaxes(batch["obs"][:, :3], 0, 1), batch["core"], keep=False)
    rest = {name: (column[:, 3:] if name not in ("core", "weights") else column)
            for name, column in batch.items()}
    rest["core"] = warmed
    without = rnn.R2D2(net, burn_in=0, nstep=3, gamma=0.9)
    loss2, abs_td2, has2, grads2 = without.loss_and_grads(rest)
    assert loss == pytest.approx(loss2)
    np.testing.assert_allclose(abs_td[3:], abs_td2)
    np.testing.assert_array_equal(has[3:], has2)
    for got, want in zip(grads, grads2):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


def reference_targets(rew, done, mask, q_online, q_target, nstep, gamma):
    """Step by step, one sequence at a time: the window of each step with a successor."""
    steps, rows = rew.shape
    targets = np.zeros((steps, rows))
    has = np.zeros((steps, rows), bool)

    def usable(t, b):
        return t < steps and mask[t, b] and (done[t, b] or (t + 1 < steps and mask[t + 1, b]))

    for b in range(rows):
        for t in range(steps):
            if not usable(t, b):
                continue
            has[t, b] = True
            total, k = 0.0, 0
            while True:
                total += gamma ** k * rew[t + k, b]
                k += 1
                if done[t + k - 1, b]:
                    targets[t, b] = total
                    break
                if k == nstep or not usable(t + k, b):
                    best = int(np.argmax(q_online[t + k, b]))
                    targets[t, b] = total + gamma ** k * q_target[t + k, b, best]
                    break
    return targets, has


def test_nstep_targets_match_the_reference():
    rng = np.random.default_rng(3)
    for trial in range(20):
        steps, rows = 12, 6
        rew = rng.normal(size=(steps, rows))
        done = np.zeros((steps, rows))
        mask = np.ones((steps, rows), bool)
        for b in range(rows):
            end = int(rng.integers(1, steps + 1))
            mask[end:, b] = False
            if rng.random() < 0.5:
                done[end - 1, b] = 1.0
        q_online, q_target = rng.normal(size=(2, steps, rows, 3))
        nstep = int(rng.integers(1, 6))
        got, got_has = rnn.nstep_targets(rew, done, mask, q_online, q_target, nstep, 0.95)
        want, want_has = reference_targets(rew, done, mask, q_online, q_target, nstep, 0.95)
        np.testing.assert_array_equal(got_has, want_has, err_msg=f"trial {trial}")
        np.testing.assert_allclose(got, want, err_msg=f"trial {trial}")


def test_learner_fits_a_sequence_that_needs_memory():
    """A recall task: reward 1 at the last step for repeating the sign seen at the first one
    (the observations in between are zeros). Only a network that carries its state through
    time can do better than chance; after training it does it every time."""
    rng = np.random.default_rng(4)
    length, rows = 5, 64
    learner = rnn.R2D2(rnn.RecurrentQ(2, 16, 16, 2, seed=5, dtype=np.float64), burn_in=0,
                       nstep=1, gamma=1.0, learning_rate=1e-2, target_every=20)
    for _ in range(300):
        sign = rng.integers(0, 2, rows)
        obs = np.zeros((rows, length, 2))
        obs[:, 0, 0] = 2.0 * sign - 1.0
        act = rng.integers(0, 2, (rows, length))
        rew = np.zeros((rows, length))
        rew[:, -1] = (act[:, -1] == sign).astype(float)
        done = np.zeros((rows, length))
        done[:, -1] = 1.0
        batch = {"obs": obs, "act": act, "rew": rew, "done": done,
                 "mask": np.ones((rows, length), bool), "core": np.zeros((rows, 16)),
                 "weights": np.ones(rows)}
        learner.train_step(batch)
    probe = np.zeros((length, 2, 2))
    probe[0, :, 0] = [-1.0, 1.0]
    q, _, _ = learner.network.unroll(probe, learner.network.initial_state(2), keep=False)
    assert list(np.argmax(q[-1], axis=1)) == [0, 1]


# ---------------------------------------------------------------------------------------------
# The actor's sequences.

def test_episode_hands_out_steps_once_their_priority_is_known():
    """Each step once, in order, `nstep` steps late (all at the end), with its n-step TD error
    under the actor's Q-values: checked against nstep_targets over the whole episode."""
    rng = np.random.default_rng(6)
    for terminated in (True, False):
        episode = r2d2.Episode(nstep=3, batch=2)
        length = 11
        q = rng.normal(size=(length, 2))
        rew = rng.normal(size=length)
        act = rng.integers(0, 2, length)
        handed = []
        for t in range(length):
            end = t == length - 1
            episode.append(np.array([t, -t]), int(act[t]), float(rew[t]), terminated and end,
                           np.full(3, t), q[t])
            ready = episode.ready(end=end)
            if ready is not None:
                columns, priorities = ready
                assert end or len(columns["rew"]) >= 2
                assert end or t - 3 >= int(columns["obs"][-1, 0])  # n steps behind
                handed.append((columns, priorities))
        obs = np.concatenate([columns["obs"][:, 0] for columns, _ in handed])
        np.testing.assert_array_equal(obs, np.arange(length))
        core = np.concatenate([columns["core"][:, 0] for columns, _ in handed])
        np.testing.assert_array_equal(core, np.arange(length))   # the state before each step
        done = np.zeros((length, 1))
        done[-1] = float(terminated)
        targets, has = rnn.nstep_targets(rew[:, None], done, np.ones((length, 1), bool),
                                         q[:, None], q[:, None], 3, r2d2.GAMMA)
        expected = np.where(has[:, 0], np.abs(q[np.arange(length), act] - targets[:, 0]), 0.0)
        np.testing.assert_allclose(np.concatenate([p for _, p in handed]), expected, rtol=1e-6)
        # A truncated episode's last step has no successor: no target, priority 0.
        assert (expected[-1] == 0.0) == (not terminated)


def test_parse_args_refuses_bad_sequences():
    with pytest.raises(SystemExit):
        r2d2.parse_args(["--burn-in", "30", "--length", "30"])
    with pytest.raises(SystemExit):
        r2d2.parse_args(["--period", "31", "--length", "30"])
    with pytest.raises(SystemExit):
        r2d2.parse_args(["--buffer-size", "50", "--actors", "2", "--length", "30"])
    assert r2d2.parse_args(["--lr", "0"]).learning_rate == 0.0


# ---------------------------------------------------------------------------------------------
# The example, end to end.

REQUIRED = {"actors": int, "seconds": float, "sequences_added": int, "learner_steps": int,
            "mean_return_last_20": float, "solved_at_seconds": (float, type(None)),
            "env_steps": int, "episodes": int}


def test_example_runs_and_reports_one_json_line(tmp_path):
    pytest.importorskip("ray")
    pytest.importorskip("gymnasium")
    plot = tmp_path / "r2d2.png"
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")
    env.pop("RAY_ADDRESS", None)
    completed = subprocess.run(
        [sys.executable, R2D2_SCRIPT, "--actors", "1", "--seconds", "10", "--seed", "3",
         "--buffer-size", "512", "--min-size", "16", "--batch-size", "8", "--hidden", "8",
         "--publish-every", "10", "--no-progress", "--plot", str(plot)],
        capture_output=True, text=True, timeout=150, env=env, cwd=str(tmp_path))
    assert completed.returncode == 0, completed.stderr[-4000:]
    lines = completed.stdout.strip().splitlines()
    assert len(lines) == 1, completed.stdout  # stdout is the JSON line and nothing else
    result = json.loads(lines[0])
    for key, kind in REQUIRED.items():
        assert isinstance(result[key], kind), (key, result[key])
    assert 10.0 <= result["seconds"] < 40.0
    assert result["sequences_added"] > 16       # past --min-size: the learner could start
    assert result["learner_steps"] > 0
    assert result["episodes"] > 0 and result["mean_return_last_20"] >= 8  # CartPole's minimum
    # Every episode makes at least one sequence (a sequence starts every 10 of its steps);
    # the actor adds each step once, but for those still waiting at the stop: the n-step
    # window (5) and an add batch (8) being collected, and one the limiter held back.
    assert result["sequences_added"] >= result["episodes"]
    assert result["env_steps"] - (5 + 2 * 8) <= result["steps_added"] <= result["env_steps"]
    limit = result["rate_limit"]
    assert result["learner_steps"] * 8 <= (limit["samples_per_insert"]
                                           * result["sequences_added"]
                                           + limit["error_buffer"] + 8)
    # The learner's batches were prefetched (the default): the thread may have drawn one
    # batch beyond the last the learner took, which the limiter counted.
    assert result["prefetch"] is True
    sampled = result["buffer_stats"]["rate_limiter"]["samples"]
    assert result["learner_steps"] * 8 <= sampled <= (result["learner_steps"] + 1) * 8
    assert 0 <= result["learner_wait_s"] <= result["seconds"]
    assert result["learner_wait_us_per_step"] == pytest.approx(
        1e6 * result["learner_wait_s"] / result["learner_steps"], rel=0.01, abs=0.1)
    assert plot.stat().st_size > 0


@pytest.mark.parametrize("module", [rnn, r2d2], ids=["r2d2_numpy", "r2d2"])
def test_docstring_examples(module):
    # examples/ is not a package, so test_doctests.py (which imports by name) cannot reach it.
    import doctest

    result = doctest.testmod(module, verbose=False, report=True,
                             optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0
