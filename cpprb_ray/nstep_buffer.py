"""cpprb's standalone ``NstepBuffer``: n-step transitions of one stream, computed locally.

``add`` stages steps and returns the n-step transitions that are due, as a dict of arrays (the
rows to store wherever you like), or None; ``on_episode_end`` returns the rest. Rows come out
when cpprb's do (a step's row once n - 1 later steps were added, the rest at
``on_episode_end``), and hold what ``ReplayBuffer(..., Nstep=...)`` stores: the same staging
(:class:`cpprb_ray.nstep.NstepStaging`) computes them, so the ends of episodes are right where
cpprb's are not (docs/nstep.md): a window that reaches a terminal step has ``done=1`` and stops
there, and its next columns are the episode's last.

Examples
--------
>>> from cpprb_ray import NstepBuffer
>>> nb = NstepBuffer({"rew": {}, "done": {}}, {"size": 2, "rew": "rew", "gamma": 0.5})
>>> nb.add(rew=1.0, done=0.0) is None
True
>>> nb.add(rew=[2.0, 4.0], done=[0.0, 1.0])["rew"].ravel().tolist()
[2.0, 4.0]
>>> nb.on_episode_end()["rew"].ravel().tolist()
[4.0]
"""

from __future__ import annotations

from collections import deque
from typing import Any, Deque, Dict, List, Mapping, Optional

import numpy as np

from cpprb_ray import _compat, _layout, frames, nstep

__all__ = ["NstepBuffer"]


class _Rows:
    """The sink the staging commits into: finished rows kept in step order, copied (the
    staging hands over views of its own arrays)."""

    closed = False

    def __init__(self) -> None:
        self.batches: Deque[Dict[str, np.ndarray]] = deque()
        self.count = 0

    def _commit_rows(self, rows: Mapping[str, np.ndarray], priorities: Any,
                     timeout: Optional[float] = None) -> int:
        batch = {name: np.array(array, copy=True) for name, array in rows.items()}
        self.batches.append(batch)
        self.count += len(batch[nstep.DONE])
        return 0

    def take(self, count: int) -> List[Dict[str, np.ndarray]]:
        """The oldest `count` rows, as batches (the last one split if need be)."""
        taken = []
        while count > 0:
            batch = self.batches[0]
            rows = len(batch[nstep.DONE])
            if rows <= count:
                taken.append(self.batches.popleft())
            else:
                taken.append({name: array[:count] for name, array in batch.items()})
                self.batches[0] = {name: array[count:] for name, array in batch.items()}
                rows = count
            count -= rows
            self.count -= rows
        return taken


class NstepBuffer:
    """Local n-step staging that hands back finished transitions (cpprb's ``NstepBuffer``).

    Not shared and not stored: for storing, give a buffer ``Nstep=`` instead (its rows go into
    shared memory as they finish). This class is for code that stores the rows itself.

    Parameters
    ----------
    env_dict : dict
        The columns of a step, as for the buffers; it must have a ``"done"`` column.
    Nstep : dict
        ``{"size": n, "gamma": g (0.99), "rew": key(s) (optional), "next": key(s)
        (optional)}``, as for ``ReplayBuffer(..., Nstep=)``.
    stack_compress : str or list of str, optional
        Accepted as cpprb accepts it: stacks are kept whole (cpprb does so too).
    default_dtype : numpy dtype, optional
        Dtype of the columns that name none (float32).
    next_of : str or list of str, optional
        Adds ``next_<name>`` (same shape and dtype) to the columns, as cpprb does.
    discounts : bool
        Also return ``"discounts"`` (float32, g**m for a window of m steps): the bootstrap
        factor of each row, which a window shortened by :meth:`on_episode_end` needs (cpprb
        returns none).

    Examples
    --------
    >>> from cpprb_ray import NstepBuffer
    >>> nb = NstepBuffer({"obs": {}, "rew": {}, "next_obs": {}, "done": {}},
    ...                  {"size": 3, "gamma": 0.5, "rew": "rew", "next": "next_obs"},
    ...                  discounts=True)
    >>> rows = nb.add(obs=[0, 1, 2, 3], rew=[1, 1, 1, 1], next_obs=[1, 2, 3, 4],
    ...               done=[0, 0, 0, 1])
    >>> rows["obs"].ravel().tolist(), rows["rew"].ravel().tolist()   # all but the last n - 1
    ([0.0, 1.0], [1.75, 1.75])
    >>> rest = nb.on_episode_end()
    >>> rest["rew"].ravel().tolist(), rest["done"].ravel().tolist()
    ([1.5, 1.0], [1.0, 1.0])
    >>> rest["next_obs"].ravel().tolist(), rest["discounts"].ravel().tolist()
    ([4.0, 4.0], [0.25, 0.5])
    """

    def __init__(self, env_dict: Optional[Mapping[str, Any]] = None,
                 Nstep: Optional[Mapping[str, Any]] = None, *,
                 stack_compress: frames.Names = None, default_dtype: Any = None,
                 next_of: frames.Names = None, discounts: bool = False) -> None:
        if Nstep is None:
            raise TypeError("NstepBuffer needs Nstep={'size': n, ...}")
        if not isinstance(discounts, (bool, np.bool_)):
            raise TypeError(f"discounts must be a bool; got {type(discounts).__name__}")
        env_dict = _compat.with_default_dtype({} if env_dict is None else env_dict,
                                              default_dtype)
        columns = frames.with_next_columns(_layout.parse_env_dict(env_dict), next_of)
        frames._names(stack_compress, "stack_compress", [c.name for c in columns])  # checked only
        columns, config = nstep.plan_columns(columns, Nstep)
        assert config is not None
        self._config = config
        self._names = [c.name for c in columns if c.name != nstep.DISCOUNTS]
        self._shapes = {c.name: (c.shape, c.dtype) for c in columns}
        self._discounts = bool(discounts)
        self._staging = nstep.NstepStaging(config, columns, prioritized=False)
        self._rows = _Rows()

    def add(self, **steps: Any) -> Optional[Dict[str, np.ndarray]]:
        """Stage one step or a batch of consecutive steps (every column, as for a buffer's add).

        Returns
        -------
        dict or None
            The transitions now due (every column, ``(rows, *shape)``), oldest first: a step's
            row is due once n - 1 later steps were added (as in cpprb); None when none is.
        """
        self._staging.add(self._rows, steps)
        due = self._rows.count + self._staging.staged - (self._config.size - 1)
        if due <= 0:
            return None
        return self._joined(self._rows.take(min(due, self._rows.count)))

    def on_episode_end(self) -> Dict[str, np.ndarray]:
        """End the episode (truncated, unless its last step had ``done``): every staged step's
        transition, its window cut at the episode's end; 0 rows when nothing was staged."""
        self._staging.flush(self._rows)
        return self._joined(self._rows.take(self._rows.count))

    def clear(self) -> None:
        """Drop every staged step and every transition not handed back yet."""
        self._staging.clear()
        self._rows = _Rows()

    def get_Nstep_size(self) -> int:
        """The window n.

        Examples
        --------
        >>> from cpprb_ray import NstepBuffer
        >>> NstepBuffer({"done": {}}, {"size": 4}).get_Nstep_size()
        4
        """
        return self._config.size

    def _joined(self, batches: List[Dict[str, np.ndarray]]) -> Dict[str, np.ndarray]:
        names = self._names + ([nstep.DISCOUNTS] if self._discounts else [])
        if not batches:
            return {name: np.empty((0,) + self._shapes[name][0], dtype=self._shapes[name][1])
                    for name in names}
        return {name: np.concatenate([batch[name] for batch in batches]) for name in names}
