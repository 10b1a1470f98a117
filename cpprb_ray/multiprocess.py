"""cpprb's ``MPReplayBuffer`` and ``MPPrioritizedReplayBuffer`` names, for code written for them.

Every cpprb_ray buffer is already one that many processes share (its handle pickles by name and
re-attaches in place), so these are the same buffers under cpprb's names and signatures:
``default_dtype`` third for the uniform one, ``alpha`` third for the prioritized one, and
cpprb's ``ctx``, ``logger`` and ``backend`` ("sharedctypes", "SharedMemory") accepted. As in
cpprb, ``MPPrioritizedReplayBuffer.update_priorities`` skips slots written since they were
sampled (``check_for_update`` is on).

Examples
--------
>>> import multiprocessing
>>> from cpprb_ray import MPPrioritizedReplayBuffer
>>> ctx = multiprocessing.get_context("spawn")
>>> with MPPrioritizedReplayBuffer(1e3, {"obs": {}}, 0.6, ctx=ctx, seed=0) as rb:
...     _ = rb.add(obs=[1.0, 2.0])
...     batch = rb.sample(2)
...     _ = rb.add(obs=[3.0] * 1000)               # every slot written since the sample
...     print(rb.update_priorities(batch["indexes"], [5.0, 5.0]))
0
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

from cpprb_ray import _compat
from cpprb_ray.buffer import PrioritizedReplayBuffer, ReplayBuffer

__all__ = ["MPPrioritizedReplayBuffer", "MPReplayBuffer"]


def _check_logger(logger: Any) -> None:
    if logger is not None and not callable(getattr(logger, "warning", None)):
        raise TypeError(f"logger must be None or a logging.Logger; got {type(logger).__name__}")


class MPReplayBuffer(ReplayBuffer):
    """cpprb's ``MPReplayBuffer``: a :class:`~cpprb_ray.ReplayBuffer` under cpprb's signature.

    Parameters
    ----------
    size, env_dict, default_dtype
        As for :class:`~cpprb_ray.ReplayBuffer` (``default_dtype`` may be given third, as in
        cpprb).
    logger : logging.Logger, optional
        Accepted for cpprb's signature and unused (cpprb_ray warns through ``warnings``).
    ctx : multiprocessing context or SyncManager, optional
        Accepted and unused: a handle re-attaches in any process, whatever the start method.
    backend : {"sharedctypes", "SharedMemory", "auto", "shm", "mmap"}
        cpprb's "sharedctypes" is "auto", "SharedMemory" is "shm" (Python >= 3.8).
    **options
        Any other :class:`~cpprb_ray.ReplayBuffer` keyword argument (seed, Nstep, ...).

    Examples
    --------
    >>> from cpprb_ray import MPReplayBuffer
    >>> with MPReplayBuffer(8, {"obs": {}}, "float64", backend="sharedctypes") as rb:
    ...     _ = rb.add(obs=1.0)
    ...     print(rb.env_dict["obs"]["dtype"], rb.get_stored_size())
    float64 1
    """

    def __init__(self, size: Any, env_dict: Mapping[str, Any], default_dtype: Any = None, *,
                 logger: Any = None, ctx: Any = None, backend: str = "auto",
                 **options: Any) -> None:
        _check_logger(logger)
        _compat.check_context(ctx)
        super().__init__(size, env_dict, default_dtype=default_dtype,
                         backend=_compat.mp_backend(backend), **options)


class MPPrioritizedReplayBuffer(PrioritizedReplayBuffer):
    """cpprb's ``MPPrioritizedReplayBuffer``: a :class:`~cpprb_ray.PrioritizedReplayBuffer`
    whose handles check for updates, under cpprb's signature.

    Parameters
    ----------
    size, env_dict, alpha, eps, default_dtype
        As for :class:`~cpprb_ray.PrioritizedReplayBuffer`.
    logger, ctx, backend
        As for :class:`MPReplayBuffer`.
    **options
        Any other :class:`~cpprb_ray.PrioritizedReplayBuffer` keyword argument.

    Notes
    -----
    ``update_priorities(indexes, priorities)`` skips every slot written since this handle
    sampled it, on every handle of this class (attached and unpickled ones too): cpprb's MP
    behaviour. Passing the sample's ``generations`` does the same, for any handle.

    Examples
    --------
    >>> from cpprb_ray import MPPrioritizedReplayBuffer
    >>> with MPPrioritizedReplayBuffer(8, {"obs": {}}, seed=0) as rb:
    ...     _ = rb.add(obs=[1.0, 2.0])
    ...     batch = rb.sample(2)
    ...     print(rb.update_priorities(batch["indexes"], [3.0, 3.0]), rb.get_max_priority())
    2 3.0
    """

    _check_for_update = True

    def __init__(self, size: Any, env_dict: Mapping[str, Any], alpha: float = 0.6, *,
                 eps: float = 1e-4, default_dtype: Any = None, logger: Any = None,
                 ctx: Any = None, backend: str = "auto",
                 check_for_update: Optional[bool] = None, **options: Any) -> None:
        _check_logger(logger)
        _compat.check_context(ctx)
        if check_for_update is not None and not check_for_update:
            raise ValueError("MPPrioritizedReplayBuffer always checks for updates (as cpprb's "
                             "does); use PrioritizedReplayBuffer for a buffer that does not")
        super().__init__(size, env_dict, alpha, eps=eps, default_dtype=default_dtype,
                         backend=_compat.mp_backend(backend), check_for_update=True, **options)
