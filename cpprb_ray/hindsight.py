"""Hindsight Experience Replay (HER) in shared memory: many actors add episodes, a learner
samples transitions with relabeled goals.

Andrychowicz et al. (2017, arXiv:1707.01495): a failed episode is also a success at reaching
the states it did reach. Each handle stages the steps of its own episode; ``on_episode_end(goal)``
writes the episode to the shared buffer once with the episode's goal and ``additional_goals``
more times with goals taken from states the episode reached (the strategy says which), each
row's reward recomputed by ``reward_func`` for its goal: one add, so the rows of an episode go
in together whichever actors add at the same time. The handle pickles to its buffer (a few
hundred bytes) and its functions, so Ray actors and multiprocessing children each get a handle
of the same buffer with an empty staging of their own; a learner samples as from any buffer.

cpprb's ``HindsightReplayBuffer`` (same arguments, attributes and rows) is a single-process
class; this one is shared.

Examples
--------
>>> import numpy as np
>>> from cpprb_ray import HindsightReplayBuffer
>>> reward = lambda state, action, goal: np.where(state == goal, 0.0, -1.0)
>>> with HindsightReplayBuffer(16, {"obs": {}, "act": {}, "next_obs": {}}, max_episode_len=4,
...                            reward_func=reward, strategy="final", seed=0) as her:
...     for t in range(3):
...         her.add(obs=t, act=0, next_obs=t + 1)
...     her.on_episode_end(goal=9)
...     rows = her.get_all_transitions()
>>> rows["goal"].ravel().tolist(), rows["rew"].ravel().tolist()
([9.0, 9.0, 9.0, 3.0, 3.0, 3.0], [-1.0, -1.0, -1.0, -1.0, -1.0, 0.0])
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from cpprb_ray import _layout, _rules, nstep
from cpprb_ray.buffer import PrioritizedReplayBuffer, ReplayBuffer

__all__ = ["HindsightReplayBuffer"]

STRATEGIES = ("future", "episode", "random", "final")


def _identity(state: np.ndarray) -> np.ndarray:
    return state


class HindsightReplayBuffer:
    """A replay buffer for HER, shared between processes (cpprb's ``HindsightReplayBuffer``).

    Parameters
    ----------
    size : int
        Capacity in rows of the shared buffer.
    env_dict : dict
        A step's columns (it needs `state`, `action` and `next_state`). The buffer's columns
        are these, ``"rew"`` (float32, replacing any given) and ``"goal"``.
    max_episode_len : int
        The most steps one episode stages (an add past it is a ValueError).
    reward_func : callable
        ``reward_func(next_states, actions, goals) -> rewards``, on batches.
    goal_func : callable, optional
        ``goal_func(states) -> goals``, on a batch (default: the state is the goal).
    goal_shape : int or tuple, optional
        The goal's shape (default: the state's).
    state, action, next_state : str
        The column names (``"obs"``, ``"act"``, ``"next_obs"``).
    strategy : {"future", "episode", "random", "final"}
        Where additional goals come from, for a step t: a state reached at t or later in its
        episode ("future"), anywhere in its episode ("episode"), any stored row's or this
        episode's ("random"), the episode's last ("final": one goal, whatever
        `additional_goals` says).
    additional_goals : int
        Relabeled copies of each step (>= 0).
    prioritized : bool
        A :class:`~cpprb_ray.PrioritizedReplayBuffer` (default, as cpprb) or a uniform one.
    seed : int, optional
        Seed of this handle's goal draws (an unpickled handle draws a fresh one).
    **kwargs
        Passed on to the buffer's constructor (``alpha``, ``backend``, ``name``, ...).

    Examples
    --------
    >>> from cpprb_ray import HindsightReplayBuffer
    >>> her = HindsightReplayBuffer(32, {"obs": {"shape": 2}, "act": {}, "next_obs": {"shape": 2}},
    ...                             max_episode_len=8,
    ...                             reward_func=lambda s, a, g: -1.0 * (abs(s - g).sum(1) > 0),
    ...                             additional_goals=2, prioritized=True, seed=1)
    >>> for t in range(4):
    ...     her.add(obs=[t, 0], act=1, next_obs=[t + 1, 0])
    >>> her.on_episode_end([9, 9])
    >>> her.get_stored_size(), sorted(her.sample(4))[:3]
    (12, ['act', 'generations', 'goal'])
    >>> her.close()
    """

    def __init__(self, size: int, env_dict: Mapping[str, Any], max_episode_len: int,
                 reward_func: Callable[..., Any], *,
                 goal_func: Optional[Callable[[np.ndarray], Any]] = None,
                 goal_shape: Union[None, int, Sequence[int]] = None, state: str = "obs",
                 action: str = "act", next_state: str = "next_obs", strategy: str = "future",
                 additional_goals: int = 4, prioritized: bool = True,
                 seed: Optional[int] = None, **kwargs: Any) -> None:
        if strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {list(STRATEGIES)}; got {strategy!r}")
        if not callable(reward_func) or (goal_func is not None and not callable(goal_func)):
            raise TypeError("reward_func (and goal_func, if given) must be callable")
        if not isinstance(prioritized, (bool, np.bool_)):
            raise TypeError(f"prioritized must be a bool; got {type(prioritized).__name__}")
        if not isinstance(env_dict, Mapping):
            raise TypeError(f"env_dict must be a dict; got {type(env_dict).__name__}")
        for argument, name in (("state", state), ("action", action),
                               ("next_state", next_state)):
            if name not in env_dict:
                raise ValueError(f"{argument}={name!r} is not an env_dict key "
                                 f"({sorted(env_dict)})")
        goals = _rules.as_count(additional_goals, "additional_goals")
        if goals < 0:
            raise ValueError(f"additional_goals must be >= 0; got {additional_goals!r}")
        spec = env_dict[state] or {}
        goal_spec = dict(spec, shape=goal_shape) if goal_shape else dict(spec)
        cls = PrioritizedReplayBuffer if prioritized else ReplayBuffer
        buffer = cls(size, {**env_dict, "rew": {}, "goal": goal_spec}, **kwargs)
        try:
            config = {"max_episode_len": max_episode_len, "reward_func": reward_func,
                      "goal_func": goal_func, "state": state, "action": action,
                      "next_state": next_state, "strategy": strategy,
                      "additional_goals": 1 if strategy == "final" else goals,
                      "env_dict": dict(env_dict)}
            self._setup(buffer, config, seed)
        except BaseException:
            buffer.close()
            raise

    def _setup(self, buffer: ReplayBuffer, config: Dict[str, Any], seed: Optional[int]) -> None:
        """Bind this handle to `buffer` with an empty staging (construction and unpickling)."""
        self._config = config
        self.rb = buffer
        self.prioritized = isinstance(buffer, PrioritizedReplayBuffer)
        self.max_episode_len = _rules.as_count(config["max_episode_len"], "max_episode_len")
        if self.max_episode_len <= 0:
            raise ValueError(f"max_episode_len must be > 0; got {config['max_episode_len']!r}")
        self.reward_func = config["reward_func"]
        self.goal_func = config["goal_func"] or _identity
        self.state, self.action = config["state"], config["action"]
        self.next_state, self.strategy = config["next_state"], config["strategy"]
        self.additional_goals = config["additional_goals"]
        goal = buffer.env_dict["goal"]
        self.goal_shape = np.array(goal["shape"], ndmin=1)
        self._goal_dtype = goal["dtype"]
        self._columns = _layout.parse_env_dict(config["env_dict"])
        self._steps = {c.name: np.empty((self.max_episode_len,) + c.shape, dtype=c.dtype)
                       for c in self._columns}
        self._staged = 0
        self.rng = np.random.default_rng(seed)

    # -- the episode ------------------------------------------------------------------------

    def add(self, **steps: Any) -> None:
        """Stage one step or a batch of steps of this handle's episode (every env_dict column,
        as for a buffer's add). Nothing reaches the buffer before :meth:`on_episode_end`.

        Raises
        ------
        ValueError
            When the episode would exceed ``max_episode_len`` steps (nothing staged), or for
            what a buffer's add refuses.
        """
        arrays, count = nstep.cast_steps(self._columns, steps)
        if self._staged + count > self.max_episode_len:
            raise ValueError(f"the episode would have {self._staged + count} steps; "
                             f"max_episode_len is {self.max_episode_len}")
        for column, array in zip(self._columns, arrays):
            self._steps[column.name][self._staged:self._staged + count] = array
        self._staged += count

    def on_episode_end(self, goal: Any, *, timeout: Optional[float] = None) -> None:
        """End this handle's episode: write its steps with `goal` (the goal it was played for)
        and with ``additional_goals`` relabeled goals each, in one add to the shared buffer.

        Parameters
        ----------
        goal : array_like
            The episode's goal, broadcast to every step.
        timeout : float, optional
            How long a rate limiter may hold the add back (as for a buffer's add).
        """
        length = self._staged
        if length == 0:
            return
        trajectory = {name: array[:length] for name, array in self._steps.items()}
        shape = (length,) + tuple(int(d) for d in self.goal_shape)
        goals = [np.broadcast_to(np.asarray(goal, dtype=self._goal_dtype), shape)]
        goals += [self._goal_of(states) for states in self._relabel_states(trajectory)]
        rows: Dict[str, Any] = {name: np.concatenate([column] * len(goals))
                                for name, column in trajectory.items()}
        rows["goal"] = np.concatenate(goals)
        rows["rew"] = np.asarray(self.reward_func(rows[self.next_state], rows[self.action],
                                                  rows["goal"]))
        self.rb.add(timeout=timeout, **rows)
        self._staged = 0

    def _goal_of(self, states: np.ndarray) -> np.ndarray:
        goals = np.asarray(self.goal_func(states))
        shape = (len(states),) + tuple(int(d) for d in self.goal_shape)
        if goals.size != int(np.prod(shape)):
            raise ValueError(f"goal_func returned shape {goals.shape}; the goals of {len(states)} "
                             f"states have shape {shape}")
        return goals.reshape(shape)

    def _relabel_states(self, trajectory: Dict[str, np.ndarray]) -> list:
        """The states whose goals relabel the episode: one batch of `length` states per
        additional goal."""
        reached = trajectory[self.next_state]
        length = len(reached)
        count = self.additional_goals
        if self.strategy == "final":
            return [np.broadcast_to(reached[-1], reached.shape)]
        if self.strategy == "future":
            # Step t's goal from a state reached at t or later.
            starts = np.arange(length)
            return [reached[self.rng.integers(starts, length)] for _ in range(count)]
        if self.strategy == "episode":
            return [reached[self.rng.integers(0, length, size=length)] for _ in range(count)]
        # "random": any stored row's reached state or this episode's (cpprb draws from the rows
        # stored once this episode's own are in; here the episode goes in with its goals).
        stored = self.rb.get_stored_size()
        picks = self.rng.integers(0, stored + length, size=count * length)
        states = np.empty((count * length,) + reached.shape[1:], dtype=reached.dtype)
        own = picks >= stored
        states[own] = reached[picks[own] - stored]
        if (~own).any():
            states[~own] = self.rb._encode_sample(picks[~own])[self.next_state]
        return list(states.reshape((count, length) + reached.shape[1:]))

    # -- the buffer -------------------------------------------------------------------------

    def sample(self, batch_size: int, **kwargs: Any) -> Dict[str, np.ndarray]:
        """Sample the shared buffer (``beta=`` and the other arguments of its sample)."""
        return self.rb.sample(batch_size, **kwargs)

    def update_priorities(self, indexes: Any, priorities: Any) -> int:
        """As :meth:`~cpprb_ray.PrioritizedReplayBuffer.update_priorities`; ValueError for a
        buffer made with ``prioritized=False``."""
        if not self.prioritized:
            raise ValueError("update_priorities: this HindsightReplayBuffer was made with "
                             "prioritized=False")
        return self.rb.update_priorities(indexes, priorities)  # type: ignore[attr-defined]

    def get_max_priority(self) -> float:
        """The largest priority seen; ValueError for ``prioritized=False``."""
        if not self.prioritized:
            raise ValueError("get_max_priority: this HindsightReplayBuffer was made with "
                             "prioritized=False")
        return self.rb.get_max_priority()  # type: ignore[attr-defined]

    def get_stored_size(self) -> int:
        """Rows in the shared buffer (every process's episodes, relabeled copies included)."""
        return self.rb.get_stored_size()

    def get_buffer_size(self) -> int:
        """The shared buffer's capacity in rows."""
        return self.rb.get_buffer_size()

    def get_all_transitions(self, shuffle: bool = False) -> Dict[str, np.ndarray]:
        """Every row of the shared buffer (as a buffer's ``get_all_transitions``)."""
        return self.rb.get_all_transitions(shuffle)

    def clear(self) -> None:
        """Forget every row of the shared buffer and this handle's staged steps."""
        self.rb.clear()
        self._staged = 0

    def close(self) -> None:
        """Close the shared buffer's handle (the owner frees it; staged steps are dropped)."""
        self._staged = 0
        self.rb.close()

    def __enter__(self) -> HindsightReplayBuffer:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def __reduce__(self) -> Tuple[Callable[..., Any], Tuple[Any, ...]]:
        # The buffer pickles by name (it re-attaches in place); the functions travel as they
        # are (Ray's cloudpickle takes lambdas, pickle needs module-level functions).
        return (_rebuild, (self.rb, self._config))


def _rebuild(buffer: ReplayBuffer, config: Dict[str, Any]) -> HindsightReplayBuffer:
    """Unpickling: a handle of the same buffer, with an empty staging and a fresh seed."""
    handle = HindsightReplayBuffer.__new__(HindsightReplayBuffer)
    handle._setup(buffer, config, None)
    return handle
