"""Large Batch Experience Replay (LaBER): selectors over a sampled large batch.

LaBER (Lahire et al., 2021, arXiv:2110.01528) samples a batch ``m`` times larger than the
learner's from the replay buffer (uniformly, or by stored priorities), computes fresh surrogate
priorities for it (typically |TD| under the current network), then draws the learner's batch
from the large one in proportion to those priorities, with importance weights. The selectors
here do the second step; they hold no rows and no shared state, so any process may use its own
(with any cpprb_ray buffer, shared or not). cpprb's ``LaBERmean``, ``LaBERlazy`` and
``LaBERmax``, with the same arguments, attributes and results.

Examples
--------
>>> import numpy as np
>>> from cpprb_ray import LaBERmean, ReplayBuffer
>>> with ReplayBuffer(64, {"obs": {}}, seed=0) as rb:
...     _ = rb.add(obs=np.arange(64.0))
...     large = rb.sample(4 * 8)                       # m * batch_size rows
...     surrogate = np.abs(large["obs"].ravel() - 30)  # e.g. |TD| of each row
...     batch = LaBERmean(8, 4, seed=1)(priorities=surrogate, obs=large["obs"])
>>> batch["obs"].shape, batch["weights"].shape, batch["indexes"].shape
((8, 1), (8,), (8,))
"""

from __future__ import annotations

from typing import Any, Dict, Optional

import numpy as np

from cpprb_ray import _rules

__all__ = ["LaBERlazy", "LaBERmax", "LaBERmean"]


class _LaBER:
    """The selection shared by the three variants; they differ in how weights are normalized.

    Parameters
    ----------
    batch_size : int
        The learner's batch size (> 0).
    m : int
        How many times larger the large batch is (> 0): :meth:`__call__` takes
        ``batch_size * m`` priorities.
    eps : float
        Added to every surrogate priority (>= 0), so that a zero priority can still be drawn.
    seed : int, optional
        Seed of this selector's random generator (default: fresh entropy, as cpprb).
    """

    def __init__(self, batch_size: int, m: int = 4, *, eps: float = 1e-6,
                 seed: Optional[int] = None) -> None:
        size = _rules.as_count(batch_size, "batch_size")
        if size <= 0:
            raise ValueError(f"batch_size must be > 0; got {batch_size!r}")
        factor = _rules.as_count(m, "m")
        if factor <= 0:
            raise ValueError(f"m must be > 0; got {m!r}")
        eps = _rules.as_real(eps, "eps")
        if eps < 0:
            raise ValueError(f"eps must be >= 0; got {eps!r}")
        self.rng = np.random.default_rng(seed)
        self.batch_size = int(size)
        self.eps = float(eps)
        self.idx = np.arange(self.batch_size * int(factor))

    def __call__(self, *, priorities: Any, **batch: Any) -> Dict[str, np.ndarray]:
        """Draw ``batch_size`` rows of the large batch in proportion to ``priorities + eps``.

        Parameters
        ----------
        priorities : array_like of float
            One surrogate priority (finite, >= 0) per row of the large batch:
            ``batch_size * m`` of them.
        **batch : array_like
            The large batch's columns (each with ``batch_size * m`` rows); the selected rows of
            each are returned under the same key.

        Returns
        -------
        dict
            The selected rows of every column given, ``"indexes"`` (int64: positions in the
            large batch, e.g. to pick the large batch's own ``"indexes"`` for
            ``update_priorities``) and ``"weights"`` (float64, the variant's importance
            weights).

        Raises
        ------
        ValueError
            When ``priorities`` is not ``batch_size * m`` finite numbers >= 0 with a positive
            sum, or a column has another number of rows; nothing is drawn.
        """
        weights = np.asarray(priorities, dtype=np.float64)
        if weights.shape != self.idx.shape:
            raise ValueError(f"priorities must hold batch_size * m = {self.idx.shape[0]} "
                             f"values; got shape {weights.shape}")
        if not np.isfinite(weights).all() or (weights < 0).any():
            raise ValueError("priorities must be finite and >= 0")
        weights = weights + self.eps
        total = weights.sum()
        if not total > 0:
            raise ValueError("priorities (+ eps) must have a positive sum; give eps > 0 or a "
                             "positive priority")
        columns = {}
        for name, value in batch.items():
            array = np.asarray(value)
            if array.ndim == 0 or array.shape[0] != self.idx.shape[0]:
                raise ValueError(f"{name} must have batch_size * m = {self.idx.shape[0]} rows; "
                                 f"got shape {array.shape}")
            columns[name] = array
        probabilities = weights / total
        chosen = self.rng.choice(self.idx, self.batch_size, p=probabilities)
        result = {name: array[chosen] for name, array in columns.items()}
        result["weights"] = self._normalize_weight(probabilities, chosen)
        result["indexes"] = chosen
        return result

    def _normalize_weight(self, p: np.ndarray, chosen: np.ndarray) -> np.ndarray:
        raise NotImplementedError


class LaBERmean(_LaBER):
    """LaBER-mean: weights ``mean(p) / p[i]`` over the large batch (the paper's choice).

    Uniform priorities give weights 1.

    Parameters
    ----------
    batch_size, m, eps, seed
        As for every LaBER selector: the learner's batch size, the large batch's factor
        (``batch_size * m`` rows), the priority floor and the generator's seed.

    Examples
    --------
    >>> from cpprb_ray import LaBERmean
    >>> laber = LaBERmean(2, 2, eps=0)
    >>> laber(priorities=[1, 1, 1, 1])["weights"].tolist()
    [1.0, 1.0]
    >>> sample = laber(priorities=[1, 0, 0, 0])
    >>> sample["indexes"].tolist(), sample["weights"].tolist()
    ([0, 0], [0.25, 0.25])
    """

    def _normalize_weight(self, p: np.ndarray, chosen: np.ndarray) -> np.ndarray:
        return p.mean() / p[chosen]


class LaBERlazy(_LaBER):
    """LaBER-lazy: weights ``1 / p[i]``, not normalized.

    Parameters
    ----------
    batch_size, m, eps, seed
        As for :class:`LaBERmean`.

    Examples
    --------
    >>> from cpprb_ray import LaBERlazy
    >>> LaBERlazy(2, 2)(priorities=[1, 1, 1, 1])["weights"].tolist()
    [4.0, 4.0]
    """

    def _normalize_weight(self, p: np.ndarray, chosen: np.ndarray) -> np.ndarray:
        return 1.0 / p[chosen]


class LaBERmax(_LaBER):
    """LaBER-max: weights ``1 / p[i]`` divided by their largest in the selected batch.

    Parameters
    ----------
    batch_size, m, eps, seed
        As for :class:`LaBERmean`.

    Examples
    --------
    >>> from cpprb_ray import LaBERmax
    >>> float(LaBERmax(2, 2, seed=0)(priorities=[3, 1, 1, 1])["weights"].max())
    1.0
    """

    def _normalize_weight(self, p: np.ndarray, chosen: np.ndarray) -> np.ndarray:
        inverse = 1.0 / p[chosen]
        return inverse / inverse.max()
