"""cpprb's ``train``: a minimal off-policy loop (act, step, add, sample, update).

One process steps one environment into a buffer and updates the policy from it. For many actors
feeding one learner, share the buffer instead (docs/ray.md); this loop is cpprb's, for a single
process, and works with any cpprb_ray buffer.

Examples
--------
>>> import numpy as np
>>> from cpprb_ray import ReplayBuffer, train
>>> class Env:
...     def reset(self):
...         self.t = 0
...         return np.zeros(2)
...     def step(self, action):
...         self.t += 1
...         return np.full(2, self.t), 1.0, self.t == 3, {}
>>> updates = []
>>> with ReplayBuffer(16, {"obs": {"shape": 2}, "act": {}, "rew": {},
...                        "next_obs": {"shape": 2}, "done": {}}) as rb:
...     train(rb, Env(), lambda obs, step, episode, is_warmup: 0.0,
...           lambda batch, step, episode: updates.append(step), max_steps=7, batch_size=4,
...           logger=False)
...     print(rb.get_stored_size(), updates)
7 [0, 1, 2, 3, 4, 5, 6]
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Dict, Optional

import numpy as np

from cpprb_ray import _rules
from cpprb_ray.buffer import PrioritizedReplayBuffer, ReplayBuffer

__all__ = ["train"]

_SIZE_T_MAX = 2**64 - 1   # cpprb's bound on max_steps (a size_t)


def _default_logger() -> logging.Logger:
    return logging.getLogger("cpprb_ray.train")


def train(buffer: ReplayBuffer, env: Any, get_action: Callable[..., Any],
          update_policy: Callable[..., Any], *, max_steps: int = int(1e6),
          max_episodes: Optional[int] = None, batch_size: int = 64, n_warmups: int = 0,
          after_step: Optional[Callable[..., Dict[str, Any]]] = None,
          done_check: Optional[Callable[[Dict[str, Any]], Any]] = None,
          obs_update: Optional[Callable[[Dict[str, Any]], Any]] = None,
          rew_sum: Optional[Callable[[float, Dict[str, Any]], float]] = None,
          episode_callback: Optional[Callable[[int, int, float], Any]] = None,
          logger: Any = None) -> None:
    """Train a policy with `buffer` on `env` (cpprb's ``train``, same arguments and order).

    Each step: ``act = get_action(obs, step, episode, is_warmup)``; ``env.step(act)`` (the
    4-tuple ``(next_obs, rew, done, info)``, or ``after_step(obs, act, env.step(act), step,
    episode)`` for anything else) gives the transition added to `buffer`; past the warmup and
    once the buffer holds a row, ``update_policy(buffer.sample(batch_size), step, episode)``,
    whose result is the new priorities of a prioritized buffer's sampled rows. An episode ends
    when ``done_check(transition)`` (default: its ``"done"``) is true: the episode is logged,
    ``episode_callback(episode, episode_step, episode_reward)`` called, ``env.reset()`` and
    ``buffer.on_episode_end()``.

    Parameters
    ----------
    buffer : ReplayBuffer or PrioritizedReplayBuffer
        Where the transitions go.
    env : gymnasium-like environment
        ``reset() -> obs`` and ``step(action)``.
    get_action, update_policy : callable
        As above.
    max_steps : int
        Steps in all (>= 0, below 2**64).
    max_episodes : int, optional
        Stop after this many episodes.
    batch_size : int
        Rows per update.
    n_warmups : int
        Steps before the first update.
    after_step, done_check, obs_update, rew_sum, episode_callback : callable, optional
        cpprb's hooks: the transition from a step, whether it ends the episode, the next obs
        (default: the transition's ``"next_obs"``), the episode's reward (default: the last
        step's ``"rew"``, as cpprb), and a call at each episode's end.
    logger : logging.Logger or False, optional
        Where each episode's line goes (default: the "cpprb_ray.train" logger); False: none.

    Raises
    ------
    ValueError
        ``max_steps`` of 2**64 or more (cpprb's bound), or negative counts.
    TypeError
        A prioritized buffer's ``update_policy`` returned None instead of priorities.
    """
    if max_steps >= _SIZE_T_MAX:
        raise ValueError(f"max_steps ({_rules.shown(max_steps)}) is too big: max_steps < "
                         f"{_SIZE_T_MAX}")
    steps = _rules.as_count(max_steps, "max_steps")
    episodes_max = None if max_episodes is None else _rules.as_count(max_episodes,
                                                                     "max_episodes")
    warmups = _rules.as_count(n_warmups, "n_warmups")
    if steps < 0 or warmups < 0 or (episodes_max is not None and episodes_max < 0):
        raise ValueError("max_steps, max_episodes and n_warmups must be >= 0")
    if logger is None:
        logger = _default_logger()
    prioritized = isinstance(buffer, PrioritizedReplayBuffer)
    episode = episode_step = 0
    episode_reward = 0.0
    obs = env.reset()
    started = time.perf_counter()
    for step in range(steps):
        is_warmup = step < warmups
        action = get_action(obs, step, episode, is_warmup)
        if after_step is not None:
            transition = after_step(obs, action, env.step(action), step, episode)
        else:
            next_obs, reward, done, _ = env.step(action)
            transition = {"obs": obs, "act": action, "rew": reward, "next_obs": next_obs,
                          "done": done}
        buffer.add(**transition)
        # (With Nstep the buffer can still be empty after the add.)
        if buffer.get_stored_size() > 0 and not is_warmup:
            sample = buffer.sample(batch_size)
            priorities = update_policy(sample, step, episode)
            if prioritized:
                if priorities is None:
                    raise TypeError("update_policy must return the sampled rows' new "
                                    "priorities (|TD|) for a PrioritizedReplayBuffer; got None")
                # One |TD| per sampled row, or one for all of them (broadcast).
                indexes = sample["indexes"]
                buffer.update_priorities(indexes, np.broadcast_to(  # type: ignore[attr-defined]
                    np.asarray(priorities, dtype=np.float64), indexes.shape))
        episode_reward = (rew_sum(episode_reward, transition) if rew_sum is not None
                          else transition["rew"])
        if done_check(transition) if done_check is not None else transition["done"]:
            elapsed = max(time.perf_counter() - started, 1e-9)
            if logger:
                logger.info("%6dth Episode: %5d Steps (%7d Total Steps), %+7.2f Reward, "
                            "%+5.2f Steps/s", episode, episode_step + 1, step + 1,
                            float(episode_reward), (episode_step + 1) / elapsed)
            if episode_callback is not None:
                episode_callback(episode, episode_step, episode_reward)
            obs = env.reset()
            buffer.on_episode_end()
            episode_reward = 0.0
            episode_step = 0
            episode += 1
            if episodes_max is not None and episode >= episodes_max:
                break
            started = time.perf_counter()
        else:
            obs = obs_update(transition) if obs_update is not None else transition["next_obs"]
            episode_step += 1
