"""Gymnasium helpers: an ``env_dict`` from an environment's spaces, and the dict ``add`` takes.

cpprb's ``cpprb.util.create_env_dict`` and ``create_before_add_func``, with the same names,
arguments and results. They need gymnasium (or the older gym) only when called: importing
this module does not.

Examples
--------
>>> import gymnasium as gym
>>> from cpprb_ray import ReplayBuffer
>>> from cpprb_ray.util import create_before_add_func, create_env_dict
>>> env = gym.make("CartPole-v1")
>>> env_dict = create_env_dict(env)
>>> sorted(env_dict), env_dict["obs"]["shape"], env_dict["act"]["dtype"]
(['act', 'done', 'next_obs', 'obs', 'rew'], (4,), <class 'numpy.int32'>)
>>> before_add = create_before_add_func(env)
>>> with ReplayBuffer(8, env_dict) as rb:
...     obs, _ = env.reset(seed=0)
...     act = env.action_space.sample()
...     next_obs, rew, done, _, _ = env.step(act)
...     rb.add(**before_add(obs, act, next_obs, rew, done))
...     print(rb.get_stored_size())
0
1
"""

from __future__ import annotations

from typing import Any, Callable, Dict

import numpy as np

__all__ = ["create_before_add_func", "create_env_dict"]


def _spaces() -> Any:
    """gymnasium's spaces module (else gym's): ImportError naming both when neither is there."""
    try:
        from gymnasium import spaces
    except ImportError:
        try:
            from gym import spaces  # type: ignore[no-redef,import-not-found,unused-ignore]
        except ImportError:
            raise ImportError("cpprb_ray.util needs gymnasium (pip install gymnasium) or "
                              "gym") from None
    return spaces


def _from_space(space: Any, int_type: Any, float_type: Any) -> Dict[str, Any]:
    spaces = _spaces()
    if isinstance(space, spaces.Discrete):
        return {"dtype": int_type, "shape": 1}
    if isinstance(space, spaces.MultiDiscrete):
        return {"dtype": int_type, "shape": space.nvec.shape}
    if isinstance(space, spaces.Box):
        return {"dtype": float_type, "shape": space.shape}
    if isinstance(space, spaces.MultiBinary):
        return {"dtype": int_type, "shape": space.n}
    raise NotImplementedError(f"create_env_dict: no column for a {type(space).__name__} space "
                              f"(Discrete, MultiDiscrete, Box, MultiBinary, and Tuple or Dict "
                              f"of them at the top level)")


def create_env_dict(env: Any, *, int_type: Any = None, float_type: Any = None) -> Dict[str, Any]:
    """An ``env_dict`` for `env`'s observation and action spaces (cpprb's function).

    Columns: ``obs`` and ``next_obs`` (a Tuple space: ``obs0``, ``next_obs0``, ...; a Dict
    space: ``obs_<key>``, ``next_obs_<key>``), ``act`` (likewise ``act0``, ... or
    ``act_<key>``), ``rew`` and ``done``: the names :func:`create_before_add_func` gives.

    Parameters
    ----------
    env : gymnasium.Env
        Any object with ``observation_space`` and ``action_space``.
    int_type : numpy dtype, optional
        Dtype of Discrete, MultiDiscrete and MultiBinary columns (default int32).
    float_type : numpy dtype, optional
        Dtype of Box columns, ``rew`` and ``done`` (default float32).

    Returns
    -------
    dict
        ``{name: {"shape": ..., "dtype": ...}}``.

    Examples
    --------
    >>> from gymnasium.spaces import Box, Discrete, Tuple
    >>> class Env:
    ...     observation_space = Box(-1.0, 1.0, (3,))
    ...     action_space = Tuple([Discrete(3), Discrete(2)])
    >>> sorted(create_env_dict(Env()))
    ['act0', 'act1', 'done', 'next_obs', 'obs', 'rew']
    """
    spaces = _spaces()
    int_type = int_type or np.int32
    float_type = float_type or np.float32
    env_dict: Dict[str, Any] = {"rew": {"shape": 1, "dtype": float_type},
                                "done": {"shape": 1, "dtype": float_type}}
    observation_space = env.observation_space
    if isinstance(observation_space, spaces.Tuple):
        for i, space in enumerate(observation_space.spaces):
            env_dict[f"obs{i}"] = _from_space(space, int_type, float_type)
            env_dict[f"next_obs{i}"] = _from_space(space, int_type, float_type)
    elif isinstance(observation_space, spaces.Dict):
        # Named as create_before_add_func names them (cpprb's two helpers disagree here: its
        # env_dict has "key" and "next_key", its add dict "obs_key" and "next_obs_key").
        for name, space in observation_space.spaces.items():
            env_dict[f"obs_{name}"] = _from_space(space, int_type, float_type)
            env_dict[f"next_obs_{name}"] = _from_space(space, int_type, float_type)
    else:
        env_dict["obs"] = _from_space(observation_space, int_type, float_type)
        env_dict["next_obs"] = _from_space(observation_space, int_type, float_type)
    action_space = env.action_space
    if isinstance(action_space, spaces.Tuple):
        for i, space in enumerate(action_space.spaces):
            env_dict[f"act{i}"] = _from_space(space, int_type, float_type)
    elif isinstance(action_space, spaces.Dict):
        for name, space in action_space.spaces.items():
            env_dict[f"act_{name}"] = _from_space(space, int_type, float_type)
    else:
        env_dict["act"] = _from_space(action_space, int_type, float_type)
    return env_dict


def create_before_add_func(env: Any) -> Callable[..., Dict[str, Any]]:
    """A function ``(obs, act, next_obs, rew, done) -> dict`` for ``add(**...)``, splitting
    Tuple and Dict spaces into the columns :func:`create_env_dict` made (cpprb's function).

    Parameters
    ----------
    env : gymnasium.Env
        Any object with ``observation_space`` and ``action_space``.

    Returns
    -------
    callable
        The function.

    Examples
    --------
    >>> from gymnasium.spaces import Discrete, Tuple
    >>> class Env:
    ...     observation_space = Discrete(4)
    ...     action_space = Tuple([Discrete(3), Discrete(2)])
    >>> create_before_add_func(Env())(1, (2, 0), 3, 0.5, False)
    {'obs': 1, 'act0': 2, 'act1': 0, 'next_obs': 3, 'rew': 0.5, 'done': False}
    """
    spaces = _spaces()

    def as_is(name: str, value: Any) -> Dict[str, Any]:
        return {name: value}

    def from_tuple(name: str, values: Any) -> Dict[str, Any]:
        return {f"{name}{i}": value for i, value in enumerate(values)}

    def from_dict(name: str, values: Any) -> Dict[str, Any]:
        return {f"{name}_{key}": value for key, value in values.items()}

    def splitter(space: Any) -> Callable[[str, Any], Dict[str, Any]]:
        if isinstance(space, spaces.Tuple):
            return from_tuple
        if isinstance(space, spaces.Dict):
            return from_dict
        return as_is

    split_obs = splitter(env.observation_space)
    split_act = splitter(env.action_space)

    def before_add(obs: Any, act: Any, next_obs: Any, rew: Any, done: Any) -> Dict[str, Any]:
        return {**split_obs("obs", obs), **split_act("act", act),
                **split_obs("next_obs", next_obs), "rew": rew, "done": done}

    return before_add
