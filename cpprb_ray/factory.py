"""Storage from an ``env_dict``: cpprb's ``create_buffer`` and ``dict2buffer``.

``create_buffer`` makes a cpprb_ray buffer (shared memory, any process); ``dict2buffer`` makes
cpprb's plain per-process numpy arrays for an ``env_dict`` (what cpprb's own buffers store
their columns in), for code that builds its own storage from the same specs.

Examples
--------
>>> from cpprb_ray import PrioritizedReplayBuffer, create_buffer
>>> rb = create_buffer(16, {"obs": {"shape": 2}}, prioritized=True, alpha=0.5)
>>> type(rb) is PrioritizedReplayBuffer
True
>>> rb.close()
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Sequence, Union

import numpy as np

from cpprb_ray import _compat, _layout
from cpprb_ray.buffer import PrioritizedReplayBuffer, ReplayBuffer

__all__ = ["create_buffer", "dict2buffer"]


def create_buffer(size: int, env_dict: Optional[Mapping[str, Any]] = None, *,
                  prioritized: bool = False, **kwargs: Any) -> ReplayBuffer:
    """A :class:`~cpprb_ray.ReplayBuffer`, or a :class:`~cpprb_ray.PrioritizedReplayBuffer`
    with ``prioritized=True`` (cpprb's function).

    Parameters
    ----------
    size : int
        Capacity in rows.
    env_dict : dict
        The columns, as for the constructors.
    prioritized : bool
        Which class to make.
    **kwargs
        Passed on to the constructor (``alpha``, ``Nstep``, ``next_of``, ``backend``, ...);
        one it does not take is a TypeError, as for the constructor.

    Returns
    -------
    ReplayBuffer or PrioritizedReplayBuffer
        A new buffer, owned by this process.

    Examples
    --------
    >>> from cpprb_ray import create_buffer
    >>> with create_buffer(8, {"obs": {}}, default_dtype="float64") as rb:
    ...     print(type(rb).__name__, rb.env_dict["obs"]["dtype"])
    ReplayBuffer float64
    """
    if not isinstance(prioritized, (bool, np.bool_)):
        raise TypeError(f"prioritized must be a bool; got {type(prioritized).__name__}")
    cls = PrioritizedReplayBuffer if prioritized else ReplayBuffer
    return cls(size, {} if env_dict is None else env_dict, **kwargs)


Names = Union[None, str, Sequence[str]]


def dict2buffer(buffer_size: int, env_dict: Mapping[str, Any], *, stack_compress: Names = None,
                default_dtype: Any = None, mmap_prefix: Optional[str] = None,
                **cpprb_only: Any) -> Dict[str, np.ndarray]:
    """cpprb's per-process column arrays for `env_dict`: ``{name: array of (buffer_size,
    *shape)}``, filled with ones as cpprb's are.

    A ``stack_compress`` column's array is a strided view of ``buffer_size + stack - 1`` planes
    in which row ``i`` is planes ``i .. i + stack - 1`` (consecutive rows share frames, as in
    cpprb); ``mmap_prefix`` puts each column in the file ``{mmap_prefix}_{name}.dat``
    (np.memmap). Unlike cpprb's, it leaves `env_dict` as it was (cpprb adds an ``"add_shape"``
    entry to each spec).

    Parameters
    ----------
    buffer_size : int
        Rows (> 0).
    env_dict : dict
        ``{name: {"shape": ..., "dtype": ...}}``, as for the buffers.
    stack_compress : str or list of str, optional
        Columns whose last axis is a frame stack.
    default_dtype : numpy dtype, optional
        Dtype of the columns that name none (float32).
    mmap_prefix : str, optional
        Back each column by a file instead of memory.

    Returns
    -------
    dict of numpy.ndarray
        Local arrays of this process (not shared: cpprb_ray's buffers are).

    Examples
    --------
    >>> from cpprb_ray import dict2buffer
    >>> arrays = dict2buffer(4, {"a": {"shape": (2, 3)}}, stack_compress="a")
    >>> a = arrays["a"]
    >>> a.shape, a.strides
    ((4, 2, 3), (8, 4, 8))
    >>> a[0, 0, 1] = 7.0          # the plane row 0 stacks second is row 1's first
    >>> float(a[1, 0, 0])
    7.0
    """
    if cpprb_only:
        # cpprb's `shared` and `ctx` make its MP buffers' sharedctypes arrays; cpprb_ray's
        # buffers share one segment instead.
        raise TypeError(f"dict2buffer() does not take {sorted(cpprb_only)}: cpprb_ray's "
                        f"buffers are shared already (MPReplayBuffer)")
    size = _compat.whole_size(buffer_size)
    if not isinstance(size, (int, np.integer)) or size <= 0:
        raise ValueError(f"buffer_size must be a whole number > 0; got {buffer_size!r}")
    env_dict = _compat.with_default_dtype(env_dict, default_dtype)
    columns = _layout.parse_env_dict(env_dict)
    names = [stack_compress] if isinstance(stack_compress, str) else list(stack_compress or ())
    unknown = sorted(set(names) - {c.name for c in columns})
    if unknown:
        raise ValueError(f"stack_compress names {unknown}, which are not env_dict keys")
    arrays: Dict[str, np.ndarray] = {}
    for column in columns:
        shape = (int(size),) + column.shape
        if column.name in names:
            stack = column.shape[-1]
            # (size + stack - 1, stack axis of 1, *plane): row i's stack is planes i..i+stack-1.
            planes = _zeros(mmap_prefix, column.name,
                            (int(size) + stack - 1,) + column.shape[:-1], column.dtype)
            strides = (planes.strides[0],) + planes.strides[1:] + (planes.strides[0],)
            array = np.lib.stride_tricks.as_strided(planes, shape=shape, strides=strides)
        else:
            array = _zeros(mmap_prefix, column.name, shape, column.dtype)
        array[...] = 1
        arrays[column.name] = array
    return arrays


def _zeros(mmap_prefix: Optional[str], name: str, shape: Any, dtype: Any) -> np.ndarray:
    if mmap_prefix:
        return np.memmap(f"{mmap_prefix}_{name}.dat", shape=tuple(shape), dtype=dtype,
                         mode="w+")
    return np.zeros(shape, dtype=dtype)
