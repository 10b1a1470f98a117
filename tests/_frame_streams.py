"""Episodes whose every frame says where it came from, for the frames and lanes tests.

A frame encodes (stream, episode, step); a transition's act encodes them too, and whether its
next stack was "glitched" (its newest frame does not continue the obs: a writer that adds
unrelated rows). So any sampled row can be checked against what its writer added, from its
act alone: ``expected(act)`` rebuilds the obs and next_obs stacks.
"""

from __future__ import annotations

import os
import signal
import time

import numpy as np

PLANE = (3, 2)
STACK = 4
DTYPE = np.dtype(np.uint16)
ENV = {"obs": {"shape": PLANE + (STACK,), "dtype": DTYPE}, "act": {"dtype": np.int64},
       "rew": {}, "done": {}}


def frame(stream: int, episode: int, step: int, glitch: bool = False) -> np.ndarray:
    """The plane of (stream, episode, step); steps < 0 are an episode's reset frames."""
    values = [stream, episode % 65536, (step + 1000) % 65536, (episode * 7 + step * 13) % 65536,
              stream * 31 + 1, 9999 if glitch else 1]
    return np.array(values, dtype=DTYPE).reshape(PLANE)


def stack(stream: int, episode: int, step: int) -> np.ndarray:
    """The obs stack at `step`: the frames of steps step - 3 .. step."""
    return np.stack([frame(stream, episode, step - STACK + 1 + j) for j in range(STACK)], -1)


def encode(stream: int, episode: int, step: int, glitch: bool) -> int:
    return ((stream * 10_000 + episode) * 100_000 + step) * 2 + int(glitch)


def expected(act: int):
    """(obs, next_obs) of the transition whose act is `act`."""
    glitch = bool(act & 1)
    act >>= 1
    step = act % 100_000
    stream, episode = divmod(act // 100_000, 10_000)
    obs = stack(stream, episode, step)
    following = stack(stream, episode, step + 1)
    if glitch:
        following[..., -1] = frame(stream, episode, step + 1, glitch=True)
    return obs, following


def check(batch) -> int:
    """Assert that every row of a sample (or of get_all_transitions) is exactly what its writer
    added; returns how many rows were checked."""
    acts = batch["act"].ravel()
    for k, act in enumerate(acts):
        obs, following = expected(int(act))
        assert (batch["obs"][k] == obs).all(), f"row {k} (act {act}): wrong obs"
        assert (batch["next_obs"][k] == following).all(), f"row {k} (act {act}): wrong next_obs"
        assert batch["rew"][k, 0] == float(act % 7), f"row {k}: wrong rew"
    return len(acts)


class Stream:
    """One writer's episodes: random lengths (early resets), now and then a glitched next
    stack, and adds of one to three transitions at a time."""

    def __init__(self, stream: int, seed: int, glitches: bool = True):
        self.stream = stream
        self.random = np.random.default_rng(seed)
        self.episode = 0
        self.step = 0
        self.length = 1
        self.glitches = glitches
        self._new_episode()

    def _new_episode(self) -> None:
        self.episode += 1
        self.step = 0
        self.length = int(self.random.integers(1, 30))

    def transitions(self, count: int):
        """The next `count` transitions as add()'s keyword arguments (batched)."""
        rows = []
        for _ in range(count):
            glitch = self.glitches and self.random.random() < 0.05
            act = encode(self.stream, self.episode, self.step, glitch)
            obs, following = expected(act)
            done = self.step == self.length - 1
            rows.append((obs, act, float(act % 7), float(done), following))
            self.step += 1
            if done or glitch:
                self._new_episode()
        obs, act, rew, done, following = zip(*rows)
        return {"obs": np.stack(obs), "act": np.array(act), "rew": np.array(rew),
                "done": np.array(done), "next_obs": np.stack(following)}


def write(sender, handle, stream: int, seed: int, seconds: float) -> None:
    """A writer process: add this stream's transitions for `seconds` (with priorities when the
    buffer has them); it sends its lane after its first add, then how many it added, and
    closes."""
    rb = handle
    source = Stream(stream, seed)
    prioritized = hasattr(rb, "update_priorities")
    added = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        count = int(source.random.integers(1, 4))
        rows = source.transitions(count)
        if prioritized:
            rb.add(priorities=source.random.random(count) + 0.1, **rows)
        else:
            rb.add(**rows)
        if not added:
            sender.send(rb._writer.lane)
        added += count
    sender.send((added, rb._writer.lane))
    rb.close()


def write_until_killed(sender, handle, stream: int, seed: int) -> None:
    """A writer that adds until it is SIGKILLed; it says when it has added its first rows."""
    rb = handle
    source = Stream(stream, seed)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    told = False
    while True:
        rb.add(**source.transitions(int(source.random.integers(1, 4))))
        if not told:
            sender.send((os.getpid(), rb._writer.lane))
            told = True
