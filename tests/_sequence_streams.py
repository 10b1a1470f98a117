"""Episodes whose every step says where it came from, for the sequence buffer tests.

A step's obs encodes (stream, episode, step) and its other columns are functions of them, and
each episode's length and ending (terminal: done=1 on its last step; truncated: on_episode_end)
come from (seed, episode) alone. So any sampled sequence can be checked, step by step, padding
and mask included, against the oracle's sequence for its (stream, episode, start), whatever
the pattern of adds that wrote it.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Dict, Iterator, Tuple

import numpy as np

ENV = {"obs": {"shape": 4}, "core": {"shape": (2, 3)}, "act": {"dtype": np.int64}, "done": {}}
LENGTH = 6
PERIOD = 3


def step(stream: int, episode: int, t: int, last: bool, terminal: bool) -> Dict[str, np.ndarray]:
    """The values of one step (one row of each column)."""
    base = (stream * 1000 + episode) * 1000 + t
    return {"obs": np.array([stream, episode, t, base % 97], dtype=np.float32),
            "core": (np.arange(6, dtype=np.float32).reshape(2, 3) + base * 0.5),
            "act": np.array([base * 3 + 1], dtype=np.int64),
            "done": np.array([1.0 if last and terminal else 0.0], dtype=np.float32)}


def episode_of(seed: int, episode: int, length: int = LENGTH) -> Tuple[int, bool]:
    """(steps, terminal) of an episode: shorter than, equal to and longer than `length`."""
    random = np.random.default_rng([seed, episode])
    steps = int(random.choice([1, 2, length - 1, length, length + 1, 2 * length + 2,
                               int(random.integers(1, 4 * length))]))
    return max(steps, 1), bool(random.random() < 0.5)


def expected(seed_of, stream: int, episode: int, start: int, length: int = LENGTH):
    """(columns, mask) of the oracle's sequence of (stream, episode, start)."""
    steps, terminal = episode_of(seed_of(stream), episode, length)
    valid = min(length, steps - start)
    columns: Dict[str, np.ndarray] = {}
    rows = [step(stream, episode, start + j, start + j == steps - 1, terminal)
            for j in range(valid)]
    for name in ENV:
        shape = rows[0][name].shape
        out = np.zeros((length,) + shape, dtype=rows[0][name].dtype)
        for j, row in enumerate(rows):
            out[j] = row[name]
        columns[name] = out
    return columns, np.arange(length) < valid


def identify(batch, k: int) -> Tuple[int, int, int]:
    stream, episode, start, _ = batch["obs"][k, 0]
    return int(stream), int(episode), int(start)


def check(batch, seed_of, length: int = LENGTH, period: int = PERIOD) -> int:
    """Assert that every sequence of a sample (or of get_all_transitions) is, step by step, the
    oracle's for its (stream, episode, start); returns how many were checked."""
    count = len(batch["mask"])
    for k in range(count):
        assert batch["mask"][k, 0], f"sequence {k} has no first step"
        stream, episode, start = identify(batch, k)
        assert start % period == 0, f"sequence {k} starts at step {start}"
        columns, mask = expected(seed_of, stream, episode, start, length)
        assert (batch["mask"][k] == mask).all(), (k, stream, episode, start, "mask")
        for name in ENV:
            assert (batch[name][k] == columns[name]).all(), (k, stream, episode, start, name)
    return count


class Stream:
    """One writer's episodes (episode_of), cut into adds of 1 to 7 steps; an add may run past a
    terminal end into the next episode, a truncated end is an on_episode_end()."""

    def __init__(self, stream: int, seed: int, length: int = LENGTH):
        self.stream = stream
        self.seed = seed
        self.length = length
        self.random = np.random.default_rng(seed + 1_000_003)
        self.episode = 0
        self.t = 0
        self.steps, self.terminal = episode_of(seed, 0, length)

    def chunks(self) -> Iterator[Tuple[Dict[str, np.ndarray], bool, list]]:
        """(add's keyword arguments, whether on_episode_end follows, [(episode, t)] of its
        steps), for ever."""
        while True:
            wanted = int(self.random.integers(1, 8))
            rows, names = [], []
            truncated = False
            while len(rows) < wanted:
                last = self.t == self.steps - 1
                rows.append(step(self.stream, self.episode, self.t, last, self.terminal))
                names.append((self.episode, self.t))
                self.t += 1
                if last:
                    truncated = not self.terminal
                    self.episode += 1
                    self.t = 0
                    self.steps, self.terminal = episode_of(self.seed, self.episode, self.length)
                    if truncated:
                        break
            yield ({name: np.stack([row[name] for row in rows]) for name in ENV}, truncated,
                   names)


def seed_of_stream(stream: int) -> int:
    return 500 + stream


def write(rb, source: Stream, adds: int, random=None) -> list:
    """`adds` adds of `source` into `rb` (with per-step priorities when `random`); the
    (episode, t) of every step written, in order."""
    written = []
    chunks = source.chunks()
    for _ in range(adds):
        values, truncated, names = next(chunks)
        if random is not None:
            rb.add(priorities=random.random(len(names)) + 0.1, **values)
        else:
            rb.add(**values)
        if truncated:
            rb.on_episode_end()
        written += names
    return written


def write_until_killed(sender, handle, stream: int) -> None:
    """A writer process: adds its stream until it is SIGKILLed (or told to stop by a closed
    pipe: it then closes its handle); says its pid and lane after its first add."""
    rb = handle
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    source = Stream(stream, seed_of_stream(stream))
    random = np.random.default_rng(stream) if hasattr(rb, "update_priorities") else None
    told = False
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        write(rb, source, 1, random)
        if not told:
            sender.send((os.getpid(), rb._writer.lane))
            told = True
