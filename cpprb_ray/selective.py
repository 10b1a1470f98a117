"""cpprb's ``SelectiveReplayBuffer``: whole episodes kept in order, read and deleted by number.

Rows go in one after another until the buffer is full (later rows are dropped, as in cpprb: it
is no ring); an episode ends with a row whose ``done`` is non-zero. ``get_episode(i)`` reads
episode ``i`` and ``delete_episode(i)`` removes it, moving the later rows back. The rows live
in a cpprb_ray buffer (shared memory: other processes may attach it and sample); the episode
bookkeeping is read from its ``done`` column, so every handle sees the same episodes.

Examples
--------
>>> from cpprb_ray import SelectiveReplayBuffer
>>> with SelectiveReplayBuffer(4, obs_dim=1, act_dim=1, Nepisodes=2) as rb:
...     _ = rb.add(obs=[0, 1, 2], act=[0, 0, 0], rew=[1, 1, 1], next_obs=[1, 2, 3],
...                done=[0, 1, 0])
...     print(rb.get_stored_episode_size(), rb.get_episode(0)["obs"].ravel())
...     print(rb.delete_episode(0), rb.get_episode(0)["obs"].ravel())
2 [0. 1.]
2 [2.]
"""

from __future__ import annotations

from typing import Any, Dict, Optional

import numpy as np

from cpprb_ray import _rules
from cpprb_ray.buffer import ReplayBuffer

__all__ = ["SelectiveReplayBuffer"]

_COLUMNS = ("obs", "act", "rew", "next_obs", "done")


class SelectiveReplayBuffer:
    """Episodes in order, selectable (cpprb's ``SelectiveReplayBuffer``, same arguments).

    Parameters
    ----------
    episode_len : int
        The longest episode; the buffer holds ``episode_len * Nepisodes`` rows.
    obs_dim, act_dim : int
        Sizes of ``obs`` / ``next_obs`` and ``act`` (float64 columns, as cpprb's).
    Nepisodes : int
        Episodes the buffer is sized for.
    rew_dim : int
        Size of ``rew``.
    **kwargs
        Passed on to the :class:`~cpprb_ray.ReplayBuffer` that holds the rows (``backend``,
        ``name``, ``seed``, ...).

    Notes
    -----
    An add, ``delete_episode`` and ``clear`` are each several calls on the buffer: one handle
    at a time should change it (others may read and sample).
    """

    def __init__(self, episode_len: int, obs_dim: int = 1, act_dim: int = 1, *,
                 Nepisodes: int = 10, rew_dim: int = 1, **kwargs: Any) -> None:
        length = _rules.as_count(episode_len, "episode_len")
        episodes = _rules.as_count(Nepisodes, "Nepisodes")
        if length <= 0 or episodes <= 0:
            raise ValueError(f"episode_len and Nepisodes must be > 0; got {episode_len!r}, "
                             f"{Nepisodes!r}")
        env = {"obs": {"shape": obs_dim, "dtype": np.float64},
               "act": {"shape": act_dim, "dtype": np.float64},
               "rew": {"shape": rew_dim, "dtype": np.float64},
               "next_obs": {"shape": obs_dim, "dtype": np.float64},
               "done": {"dtype": np.float64}}
        self._rb = ReplayBuffer(length * episodes, env, **kwargs)

    @property
    def buffer(self) -> ReplayBuffer:
        """The buffer that holds the rows (pickle or attach it to read them elsewhere)."""
        return self._rb

    def add(self, obs: Any, act: Any, rew: Any, next_obs: Any, done: Any) -> Optional[int]:
        """Append one step or a batch of steps; returns the first one's index (None when the
        buffer is full and nothing went in). Steps past the buffer's end are dropped, as in
        cpprb."""
        room = self._rb.get_buffer_size() - self._rb.get_stored_size()
        values = {"obs": obs, "act": act, "rew": rew, "next_obs": next_obs, "done": done}
        count = _rules.rows_of(np.shape(done), (1,))
        if count < 0:
            raise _rules.shape_error("done", (1,), np.shape(done))
        if room <= 0:
            return None
        if count > room:
            values = {name: np.asarray(value)[:room] for name, value in values.items()}
        return self._rb.add(**values)

    def _begins(self) -> np.ndarray:
        """Where each stored episode begins (row indexes, ascending)."""
        done = self._rb.get_all_transitions()["done"].ravel()
        stored = len(done)
        ends = np.flatnonzero(done != 0) + 1
        begins = np.concatenate([[0], ends[ends < stored]]).astype(np.int64)
        return begins

    def get_stored_episode_size(self) -> int:
        """Episodes stored (the last one may still be open)."""
        return 0 if self.get_stored_size() == 0 else len(self._begins())

    def get_episode(self, i: int) -> Dict[str, np.ndarray]:
        """Episode `i`'s rows (every column, ``(length, *shape)``); 0 rows past the last."""
        index = _rules.as_count(i, "i")
        rows = self._rb.get_all_transitions()
        begins = self._begins()
        if not 0 <= index < len(begins) or self.get_stored_size() == 0:
            return {name: column[:0] for name, column in rows.items()}
        stop = begins[index + 1] if index + 1 < len(begins) else len(rows["done"])
        return {name: column[begins[index]:stop] for name, column in rows.items()}

    def delete_episode(self, i: int) -> int:
        """Remove episode `i`, moving the later rows back; returns how many rows it had (0
        when there is no such episode)."""
        index = _rules.as_count(i, "i")
        begins = self._begins()
        stored = self.get_stored_size()
        if not 0 <= index < len(begins) or stored == 0:
            return 0
        stop = begins[index + 1] if index + 1 < len(begins) else stored
        rows = self._rb.get_all_transitions()
        kept = {name: np.concatenate([column[:begins[index]], column[stop:]])
                for name, column in rows.items()}
        self._rb.clear()
        if len(kept["done"]):
            self._rb.add(**kept)  # type: ignore[arg-type]
        return int(stop - begins[index])

    def sample(self, batch_size: int) -> Dict[str, np.ndarray]:
        """Uniform rows with replacement, as :meth:`~cpprb_ray.ReplayBuffer.sample`."""
        return self._rb.sample(batch_size)

    def _encode_sample(self, indexes: Any) -> Dict[str, np.ndarray]:
        """The rows at `indexes`, as :meth:`~cpprb_ray.ReplayBuffer._encode_sample`."""
        return self._rb._encode_sample(indexes)

    def get_all_transitions(self, shuffle: bool = False) -> Dict[str, np.ndarray]:
        """Every stored row, in order (``shuffle``: as the buffer's)."""
        return self._rb.get_all_transitions(shuffle)

    def get_stored_size(self) -> int:
        """Rows stored."""
        return self._rb.get_stored_size()

    def get_next_index(self) -> int:
        """Where the next row goes (the stored size: the rows are never wrapped)."""
        return self._rb.get_stored_size()

    def get_buffer_size(self) -> int:
        """``episode_len * Nepisodes``."""
        return self._rb.get_buffer_size()

    def clear(self) -> None:
        """Forget every row."""
        self._rb.clear()

    def close(self) -> None:
        """Close the buffer that holds the rows (the owner frees it)."""
        self._rb.close()

    def __enter__(self) -> SelectiveReplayBuffer:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()
