"""Rate limiters: Reverb's ``MinSize`` and ``SampleToInsertRatio``, kept in the buffer's segment.

Pass one as ``rate_limiter=`` to a buffer's constructor. Its parameters and counts then live in
the segment, so every process and every view of the buffer is held to the same limiter, and
each add or sample is admitted (or held back) under the segment's lock, as one step with the
operation itself. A held-back ``add(..., timeout=)`` or ``sample(..., timeout=)`` sleeps with the
GIL released until the other side's progress lets it through (docs/rate_limiting.md).

The semantics are Reverb's (``reverb/rate_limiters.py``, ``rate_limiter.cc``), with rows as the
unit: an add of k rows counts k inserts and a sample of k rows k samples, each admitted whole.
With ``inserts`` and ``samples`` counted since the buffer was created or last cleared, and
``diff = inserts * samples_per_insert - samples``:

* a sample of k rows may go when the stored size is >= ``min_size_to_sample`` and
  ``diff - k >= min_diff``;
* an add of k rows may go when the stored size after it is <= ``min_size_to_sample`` (the
  buffer is still filling), or else when ``diff + k * samples_per_insert <= max_diff``.

This module only describes and validates limiters; the checks themselves run in the store's
kernels (``cpprb_ray/_limiter.pxd``).
"""

from __future__ import annotations

import numbers
import sys
import warnings
from typing import Any, Optional, Tuple, Union

from cpprb_ray import _rules

__all__ = ["MinSize", "RateLimiter", "SampleToInsertRatio"]

# MinSize's window, as Reverb sets it: no ratio is kept.
_UNBOUNDED = sys.float_info.max

# The kind numbers the segment records (cpprb_ray/_limiter.pxd, LimiterKind).
_KINDS = {"MinSize": 1, "SampleToInsertRatio": 2}
# The largest min_size_to_sample: no buffer holds more rows (the segment keeps it as 64 bits).
_MAX_SIZE = 2**63 - 1


def _real(value: Any, name: str, expected: str = "a real number") -> float:
    if isinstance(value, _rules.NOT_NUMBERS) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be {expected}; got {type(value).__name__}")
    try:
        result = float(value)
    except OverflowError:   # an int or a Fraction beyond any float
        raise ValueError(f"{name} must be a real number within the float range; got "
                         f"{type(value).__name__} {_rules.shown(value)}") from None
    if result != result:
        raise ValueError(f"{name} must not be NaN")
    return result


def _min_size(value: Any) -> int:
    if isinstance(value, _rules.NOT_NUMBERS) or not isinstance(value, numbers.Integral):
        raise TypeError(f"min_size_to_sample must be an int; got {type(value).__name__}")
    size = int(value)
    if not 1 <= size <= _MAX_SIZE:
        raise ValueError(f"min_size_to_sample must be a positive integer <= 2**63 - 1; got "
                         f"{_rules.shown(size)}")
    return size


class RateLimiter:
    """What the buffers' ``rate_limiter=`` takes: a limiter's parameters, checked.

    Use :class:`MinSize` or :class:`SampleToInsertRatio`; this base class holds what both are
    in the segment: ``samples_per_insert``, ``min_size_to_sample`` and the window
    ``[min_diff, max_diff]`` that ``inserts * samples_per_insert - samples`` is kept in.

    Examples
    --------
    >>> from cpprb_ray import MinSize, RateLimiter
    >>> isinstance(MinSize(10), RateLimiter)
    True
    """

    kind = ""

    def __init__(self, samples_per_insert: float, min_size_to_sample: int, min_diff: float,
                 max_diff: float) -> None:
        self.samples_per_insert = samples_per_insert
        self.min_size_to_sample = min_size_to_sample
        self.min_diff = min_diff
        self.max_diff = max_diff

    def check_capacity(self, capacity: int) -> None:
        """ValueError when a buffer of `capacity` rows could never let a sample through (its
        stored size never reaches ``min_size_to_sample``).

        Examples
        --------
        >>> from cpprb_ray import MinSize
        >>> MinSize(100).check_capacity(64)
        Traceback (most recent call last):
        ...
        ValueError: rate_limiter: min_size_to_sample (100) is larger than the buffer's size \
(64): the buffer could never hold enough rows to sample
        """
        if self.min_size_to_sample > capacity:
            raise ValueError(f"rate_limiter: min_size_to_sample ({self.min_size_to_sample}) is "
                             f"larger than the buffer's size ({capacity}): the buffer could "
                             f"never hold enough rows to sample")

    def record(self) -> Tuple[int, float, int, float, float]:
        """(kind number, samples_per_insert, min_size_to_sample, min_diff, max_diff): what the
        segment keeps.

        Examples
        --------
        >>> from cpprb_ray import SampleToInsertRatio
        >>> SampleToInsertRatio(4, 100, 50).record()
        (2, 4.0, 100, 350.0, 450.0)
        """
        return (_KINDS[self.kind], self.samples_per_insert, self.min_size_to_sample,
                self.min_diff, self.max_diff)

    def __eq__(self, other: object) -> bool:
        return (type(other) is type(self) and isinstance(other, RateLimiter)
                and self.record() == other.record())

    def __hash__(self) -> int:
        return hash(self.record())


class MinSize(RateLimiter):
    """Hold samples back until the buffer holds `min_size_to_sample` rows; never hold inserts.

    Reverb's ``MinSize``: a :class:`SampleToInsertRatio` with samples_per_insert 1 and a window
    of +-``sys.float_info.max``.

    Parameters
    ----------
    min_size_to_sample : int
        Rows the buffer must hold before a sample may go (>= 1, and at most the buffer's size).

    Examples
    --------
    >>> import numpy as np
    >>> from cpprb_ray import MinSize, ReplayBuffer
    >>> with ReplayBuffer(100, {"obs": {}}, rate_limiter=MinSize(3)) as rb:
    ...     _ = rb.add(obs=[1.0, 2.0])
    ...     try:
    ...         rb.sample(1, timeout=0)
    ...     except TimeoutError:
    ...         print("held back at", rb.get_stored_size(), "rows")
    ...     _ = rb.add(obs=3.0)
    ...     print(rb.sample(2, timeout=0)["obs"].shape)
    held back at 2 rows
    (2, 1)
    """

    kind = "MinSize"

    def __init__(self, min_size_to_sample: int) -> None:
        super().__init__(1.0, _min_size(min_size_to_sample), -_UNBOUNDED, _UNBOUNDED)

    def __repr__(self) -> str:
        return f"MinSize({self.min_size_to_sample})"


class SampleToInsertRatio(RateLimiter):
    """Keep rows sampled per row inserted near `samples_per_insert` (Reverb's limiter).

    Below `min_size_to_sample` stored rows, inserts are free and samples wait (as
    :class:`MinSize`). From there on, ``diff = inserts * samples_per_insert - samples`` is kept in
    ``[min_diff, max_diff]``: a sample of k rows waits while ``diff - k < min_diff``, an add of k
    rows while ``diff + k * samples_per_insert > max_diff``.

    Parameters
    ----------
    samples_per_insert : float
        Rows sampled per row inserted, > 0: how many times the learner samples each row on
        average over its life in the buffer.
    min_size_to_sample : int
        Stored rows before the first sample (>= 1, and at most the buffer's size).
    error_buffer : float or (float, float)
        The slack. A number e gives the window ``min_size_to_sample * samples_per_insert +- e``
        (the diff the buffer has when it reaches the minimum size, +-e); a pair is
        ``(min_diff, max_diff)`` as is. As in Reverb, the window must be at least
        ``2 * max(1, samples_per_insert)`` wide. With batches it must also hold a whole batch
        of either side: a sample of k rows and an add of j rows can both wait forever when
        ``max_diff - min_diff < k + j * samples_per_insert`` (docs/rate_limiting.md).

    Raises
    ------
    ValueError
        For a window narrower than ``2 * max(1, samples_per_insert)``, a min_diff above
        ``samples_per_insert * min_size_to_sample`` (sampling could never start), a
        `min_size_to_sample` < 1 or a `samples_per_insert` <= 0 (and, at the buffer's
        constructor, a `min_size_to_sample` larger than the buffer).

    Warns
    -----
    RuntimeWarning
        When ``max_diff < samples_per_insert * min_size_to_sample``: once the minimum size is
        reached, adds wait for samples, so a process that adds and then samples in turn
        blocks itself.

    Examples
    --------
    >>> import numpy as np
    >>> from cpprb_ray import PrioritizedReplayBuffer, SampleToInsertRatio
    >>> limiter = SampleToInsertRatio(samples_per_insert=2.0, min_size_to_sample=4,
    ...                               error_buffer=4.0)
    >>> limiter
    SampleToInsertRatio(samples_per_insert=2.0, min_size_to_sample=4, error_buffer=(4.0, 12.0))
    >>> with PrioritizedReplayBuffer(64, {"obs": {}}, rate_limiter=limiter) as rb:
    ...     _ = rb.add(obs=np.arange(6.0))          # diff = 6 * 2 - 0 = 12 = max_diff
    ...     try:
    ...         rb.add(obs=7.0, timeout=0)          # 14 > 12: held back
    ...     except TimeoutError:
    ...         print("add held back")
    ...     _ = rb.sample(8, timeout=0)            # diff 12 - 8 = 4 >= min_diff
    ...     print(rb.stats()["rate_limiter"]["diff"])
    add held back
    4.0
    """

    kind = "SampleToInsertRatio"

    def __init__(self, samples_per_insert: float, min_size_to_sample: int,
                 error_buffer: Union[float, Tuple[float, float]]) -> None:
        ratio = _real(samples_per_insert, "samples_per_insert")
        if not 0.0 < ratio < float("inf"):
            raise ValueError(f"samples_per_insert must be finite and > 0; got {ratio}")
        least = _min_size(min_size_to_sample)
        if isinstance(error_buffer, (tuple, list)):
            if len(error_buffer) != 2:
                raise ValueError(f"error_buffer must be a number or a (min_diff, max_diff) "
                                 f"pair; got {len(error_buffer)} values")
            min_diff = _real(error_buffer[0], "error_buffer[0] (min_diff)")
            max_diff = _real(error_buffer[1], "error_buffer[1] (max_diff)")
        else:
            slack = _real(error_buffer, "error_buffer", "a number or a (min_diff, max_diff) pair")
            offset = ratio * least
            min_diff, max_diff = offset - slack, offset + slack
        if not max_diff - min_diff >= 2.0 * max(1.0, ratio):
            raise ValueError(f"error_buffer gives the window [{min_diff:g}, {max_diff:g}], "
                             f"{max_diff - min_diff:g} wide; it must be >= 2 * max(1.0, "
                             f"samples_per_insert) = {2.0 * max(1.0, ratio):g}, as smaller "
                             f"windows could block samples and/or inserts for good")
        if min_diff > ratio * least:
            raise ValueError(f"error_buffer's min_diff ({min_diff:g}) is above "
                             f"samples_per_insert * min_size_to_sample ({ratio * least:g}): "
                             f"samples would be held back for good once min_size_to_sample "
                             f"rows are in")
        if max_diff < ratio * least:
            warnings.warn(f"SampleToInsertRatio: max_diff ({max_diff:g}) is below "
                          f"samples_per_insert * min_size_to_sample ({ratio * least:g}): once "
                          f"min_size_to_sample rows are in, adds wait for samples, so a process "
                          f"that adds and samples in turn blocks itself", RuntimeWarning,
                          stacklevel=2)
        super().__init__(ratio, least, min_diff, max_diff)

    @property
    def error_buffer(self) -> Tuple[float, float]:
        """``(min_diff, max_diff)``, the window the diff is kept in.

        Examples
        --------
        >>> from cpprb_ray import SampleToInsertRatio
        >>> SampleToInsertRatio(1.0, 10, 5).error_buffer
        (5.0, 15.0)
        """
        return (self.min_diff, self.max_diff)

    def __repr__(self) -> str:
        return (f"SampleToInsertRatio(samples_per_insert={self.samples_per_insert!r}, "
                f"min_size_to_sample={self.min_size_to_sample}, "
                f"error_buffer=({self.min_diff!r}, {self.max_diff!r}))")


def from_record(record: Optional[Tuple[str, float, int, float, float]]) -> Optional[RateLimiter]:
    """The limiter object a segment's record describes (for views), or None.

    Examples
    --------
    >>> from cpprb_ray.rate_limiters import from_record
    >>> from_record(("SampleToInsertRatio", 2.0, 10, 15.0, 25.0))
    SampleToInsertRatio(samples_per_insert=2.0, min_size_to_sample=10, error_buffer=(15.0, 25.0))
    >>> from_record(("MinSize", 1.0, 5, -1.0, 1.0))
    MinSize(5)
    """
    if record is None:
        return None
    kind, ratio, least, min_diff, max_diff = record
    if kind == "MinSize":
        return MinSize(least)
    limiter = SampleToInsertRatio.__new__(SampleToInsertRatio)
    RateLimiter.__init__(limiter, ratio, least, min_diff, max_diff)
    return limiter


def check_rate_limiter(limiter: Any, capacity: int) -> Optional[RateLimiter]:
    """The buffer constructor's check of ``rate_limiter=``: None, or a :class:`RateLimiter`
    whose minimum size fits `capacity`.

    Examples
    --------
    >>> from cpprb_ray.rate_limiters import check_rate_limiter
    >>> check_rate_limiter(None, 10) is None
    True
    >>> check_rate_limiter(5, 10)
    Traceback (most recent call last):
    ...
    TypeError: rate_limiter must be None, cpprb_ray.MinSize(...) or \
cpprb_ray.SampleToInsertRatio(...); got int
    """
    if limiter is None:
        return None
    if not isinstance(limiter, (MinSize, SampleToInsertRatio)):
        raise TypeError(f"rate_limiter must be None, cpprb_ray.MinSize(...) or "
                        f"cpprb_ray.SampleToInsertRatio(...); got {type(limiter).__name__}")
    limiter.check_capacity(capacity)
    return limiter
