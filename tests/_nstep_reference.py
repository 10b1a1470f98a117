"""An independent, plainly-written N-step reference and the streams the N-step tests feed.

Also the targets of the N-step multi-process tests (spawn children import this module by name
from the parent's ``sys.path``).

A stream is a list of episodes; an episode is a list of steps plus whether it terminated (its
last step has done=1) or was truncated (ended by on_episode_end / close with done=0). Every
step's obs is a serial number unique in the test, so a stored row names the step it starts at.
"""

from __future__ import annotations

import os
import signal
import traceback
from typing import Dict, List, Sequence, Tuple

import numpy as np

ENV = {
    "obs": {"dtype": np.float64},
    "act": {"dtype": np.int64},
    "rew": {"dtype": np.float32},
    "next_obs": {"shape": 2, "dtype": np.float64},
    "done": {"dtype": np.float32},
}


def nstep_spec(size: int, gamma: float) -> dict:
    return {"size": size, "gamma": gamma, "rew": "rew", "next": "next_obs"}


class Episode:
    """Steps of one episode: serials `first`, first + 1, ...; rewards given; `terminated` sets
    done=1 on the last step."""

    def __init__(self, first: int, rewards: Sequence[float], terminated: bool) -> None:
        self.first = first
        self.rewards = [float(np.float32(r)) for r in rewards]   # as the column stores them
        self.terminated = terminated

    def __len__(self) -> int:
        return len(self.rewards)

    def steps(self) -> Dict[str, np.ndarray]:
        """The columns of every step, as add() takes a batch."""
        length = len(self.rewards)
        serials = np.arange(self.first, self.first + length, dtype=np.float64)
        done = np.zeros(length, dtype=np.float32)
        if self.terminated:
            done[-1] = 1.0
        return {"obs": serials, "act": serials.astype(np.int64) * 7,
                "rew": np.asarray(self.rewards, dtype=np.float32),
                "next_obs": np.stack([serials + 0.5, -serials], axis=1), "done": done}


def reference_rows(episodes: Sequence[Episode], size: int, gamma: float) -> Dict[str, np.ndarray]:
    """The N-step rows of `episodes`, step by step, straight from the definition."""
    obs, act, rew, next_obs, done, discounts = [], [], [], [], [], []
    for episode in episodes:
        length = len(episode)
        for t in range(length):
            steps_left = length - t
            m = min(size, steps_left)
            total = 0.0
            for k in range(m):
                total += gamma ** k * episode.rewards[t + k]
            last_serial = episode.first + t + m - 1
            reaches_the_end = t + m == length
            obs.append(episode.first + t)
            act.append((episode.first + t) * 7)
            rew.append(total)
            next_obs.append([last_serial + 0.5, -last_serial])
            done.append(1.0 if (episode.terminated and reaches_the_end) else 0.0)
            discounts.append(gamma ** m)
    return {"obs": np.array(obs, dtype=np.float64).reshape(-1, 1),
            "act": np.array(act, dtype=np.int64).reshape(-1, 1),
            "rew": np.array(rew, dtype=np.float64).reshape(-1, 1),
            "next_obs": np.array(next_obs, dtype=np.float64).reshape(-1, 2),
            "done": np.array(done, dtype=np.float32).reshape(-1, 1),
            "discounts": np.array(discounts, dtype=np.float64).reshape(-1, 1)}


def assert_rows_match(rows: Dict[str, np.ndarray], expected: Dict[str, np.ndarray]) -> None:
    """Row for row: exact for copied columns, float32 rounding for the computed ones."""
    assert rows["obs"].shape == expected["obs"].shape, (rows["obs"].ravel(),
                                                        expected["obs"].ravel())
    np.testing.assert_array_equal(rows["obs"], expected["obs"])
    np.testing.assert_array_equal(rows["act"], expected["act"])
    np.testing.assert_array_equal(rows["next_obs"], expected["next_obs"])
    np.testing.assert_array_equal(rows["done"], expected["done"])
    np.testing.assert_allclose(rows["rew"], expected["rew"], rtol=2e-6, atol=1e-6)
    # float32 subnormals (gamma**m below 1e-38) are spaced 1.4e-45 apart
    np.testing.assert_allclose(rows["discounts"], expected["discounts"], rtol=2e-7, atol=1e-44)
    assert rows["rew"].dtype == np.float32 and rows["discounts"].dtype == np.float32


def feed(rb, episodes: Sequence[Episode], splits: Sequence[Sequence[int]],
         end_every_episode: Sequence[bool]) -> None:
    """Add each episode in batches of the given sizes; call on_episode_end after it where
    asked (always after a truncated one, which is what makes it truncated)."""
    for episode, split, end in zip(episodes, splits, end_every_episode):
        steps = episode.steps()
        start = 0
        for count in split:
            rb.add(**{key: value[start:start + count] for key, value in steps.items()})
            start += count
        assert start == len(episode)
        if end or not episode.terminated:
            rb.on_episode_end()


def stream(first: int, lengths: Sequence[int], terminated: Sequence[bool],
           seed: int) -> List[Episode]:
    rng = np.random.default_rng(seed)
    episodes = []
    for length, ends in zip(lengths, terminated):
        episodes.append(Episode(first, rng.normal(size=length).round(3), ends))
        first += length
    return episodes


def split_randomly(length: int, rng: np.random.Generator) -> List[int]:
    split = []
    while length:
        count = int(rng.integers(1, length + 1))
        split.append(count)
        length -= count
    return split


# -- multi-process targets -------------------------------------------------------------------

def child_stream(rb, first: int, seed: int, conn) -> None:
    """Add one stream of episodes (random batch splits) through this process's own handle."""
    try:
        episodes, splits = child_plan(first, seed)
        feed(rb, episodes, splits, [False] * len(episodes))
        rb.close()   # a view: commits its staged steps (there are none left here), frees nothing
        conn.send(("done", os.getpid()))
    except BaseException:
        conn.send(("error", traceback.format_exc()))


def child_plan(first: int, seed: int) -> Tuple[List[Episode], List[List[int]]]:
    rng = np.random.default_rng(seed)
    lengths = [int(x) for x in rng.integers(1, 9, size=12)]
    terminated = [bool(x) for x in rng.integers(0, 2, size=12)]
    episodes = stream(first, lengths, terminated, seed)
    return episodes, [split_randomly(len(e), rng) for e in episodes]


def child_killed_with_steps_staged(rb, episode: Episode, conn) -> None:
    """Add a truncated-to-be episode, report, and wait to be SIGKILLed with steps staged."""
    try:
        steps = episode.steps()
        for t in range(len(episode)):
            rb.add(**{key: value[t] for key, value in steps.items()})
        conn.send(("staged", rb._writer.staged))
    except BaseException:
        conn.send(("error", traceback.format_exc()))
        return
    signal.pause()
