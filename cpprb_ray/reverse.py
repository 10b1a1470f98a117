"""Reverse Experience Replay (RER): a sampler that walks back from the newest rows.

Rotinov (2019, arXiv:1910.08780): each sample is ``batch_size`` rows ``stride`` apart, ending
at a row one step older than the previous sample's first; once that walk falls ``2 * stride``
behind the newest row, it starts again from the newest. cpprb's ``ReverseReplayBuffer``: the
same arguments and order of rows. The rows are a shared cpprb_ray buffer's (any process may
add); the walk is this handle's own.

Examples
--------
>>> import numpy as np
>>> from cpprb_ray import ReverseReplayBuffer
>>> with ReverseReplayBuffer(20, {"obs": {}}, stride=5) as rb:
...     _ = rb.add(obs=np.arange(20))
...     print(rb.sample(2)["obs"].ravel(), rb.sample(2)["obs"].ravel())
[19. 14.] [18. 13.]
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Mapping, Tuple

import numpy as np

from cpprb_ray import _rules
from cpprb_ray.buffer import ReplayBuffer

__all__ = ["ReverseReplayBuffer"]


class ReverseReplayBuffer(ReplayBuffer):
    """A uniform :class:`~cpprb_ray.ReplayBuffer` whose ``sample`` walks back from the newest
    row (cpprb's ``ReverseReplayBuffer``).

    Parameters
    ----------
    size, env_dict
        As for :class:`~cpprb_ray.ReplayBuffer`.
    stride : int
        Rows between consecutive rows of one sample (> 0; cpprb's default 300).
    **kwargs
        Any other argument of :class:`~cpprb_ray.ReplayBuffer`.

    Notes
    -----
    Indexes are slots, counted as cpprb counts them (``get_next_index``). The walk is kept per
    handle: an attached or unpickled view starts its own, at the newest row.

    Examples
    --------
    >>> from cpprb_ray import ReverseReplayBuffer
    >>> with ReverseReplayBuffer(8, {"obs": {}}, stride=2) as rb:
    ...     _ = rb.add(obs=[0.0, 1.0, 2.0, 3.0])
    ...     print([rb.sample(1)["obs"].item() for _ in range(5)])
    [3.0, 2.0, 1.0, 0.0, 3.0]
    """

    _stride = 300   # (a view made by attach() walks with cpprb's default stride)
    _last = 0

    def __init__(self, size: int, env_dict: Mapping[str, Any], *, stride: int = 300,
                 **kwargs: Any) -> None:
        self._stride = self._check_stride(stride)
        self._last = 0
        super().__init__(size, env_dict, **kwargs)

    @staticmethod
    def _check_stride(stride: Any) -> int:
        value = _rules.as_count(stride, "stride")
        if value <= 0:
            raise ValueError(f"stride must be > 0; got {stride!r}")
        return value

    @property
    def stride(self) -> int:
        """Rows between consecutive rows of one sample."""
        return self._stride

    def sample(self, batch_size: int, **kwargs: Any) -> Dict[str, np.ndarray]:
        """The next ``batch_size`` rows of the walk back: the first one step older than the
        previous sample's first (or the newest, when that fell ``2 * stride`` behind), each
        next ``stride`` rows older (wrapping round the stored rows). ValueError when empty.

        Parameters
        ----------
        batch_size : int
            Rows.
        **kwargs
            Refused (a TypeError), as a ReplayBuffer's sample refuses what it does not take.

        Returns
        -------
        dict of numpy.ndarray
            Every column, as :meth:`~cpprb_ray.ReplayBuffer.get_all_transitions` gives them.
        """
        if kwargs:
            raise TypeError(f"ReverseReplayBuffer.sample() takes batch_size only; got "
                            f"{sorted(kwargs)}")
        batch = self._check_batch(batch_size)
        stored = self.get_stored_size()
        if stored == 0:
            raise ValueError("cannot sample from an empty buffer")
        newest = self.get_next_index()
        ahead = newest + stored if newest <= self._last else newest
        if ahead - self._last >= 2 * self._stride:
            self._last = (newest or stored) - 1
        else:
            self._last = (self._last or stored) - 1
        # The walk, as cpprb's: each index `stride` back from the one before, modulo the rows.
        steps = np.arange(batch, dtype=np.int64) * self._stride
        return self._encode_sample((self._last - steps) % stored)

    def __reduce__(self) -> Tuple[Callable[..., Any], Tuple[Any, ...]]:
        return (_with_stride, (super().__reduce__(), self._stride))


def _with_stride(reduced: Tuple[Callable[..., Any], Tuple[Any, ...]],
                 stride: int) -> ReverseReplayBuffer:
    """Unpickling: the view ReplayBuffer's pickle makes, with its stride and a fresh walk."""
    handle = reduced[0](*reduced[1])
    handle._stride = stride
    handle._last = 0
    return handle
