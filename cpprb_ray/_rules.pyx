# cython: language_level=3
"""Validation rules shared by every layer: counts, reals, indexes, priorities, dtypes, shapes.

Each rule is written once, here. A rule has a nogil half that finds the first bad entry of a
raw array (so a large batch is checked in one GIL-free pass) and a Python half that raises the
error, naming the argument, what was expected, the value and its position. Nothing here touches
a buffer: callers check, then change.
"""

from cpython.buffer cimport (PyBUF_C_CONTIGUOUS, PyBUF_FORMAT, PyBuffer_Release,
                             PyObject_GetBuffer)
from libc.float cimport DBL_MAX
from libc.math cimport INFINITY, pow, signbit
from libc.stdint cimport int64_t, uint8_t

from cpprb_ray._convert cimport is_format

import warnings

import numpy as np

_INT64 = np.dtype(np.int64)
# What passes an isinstance check for int or np.integer but is no count or real here: bools, and
# numpy's timedelta64 (an np.signedinteger whose int() is a datetime.timedelta).
NOT_NUMBERS = (bool, np.bool_, np.timedelta64)
_FLOAT64 = np.dtype(np.float64)
_ndarray = np.ndarray


# -- scalars ------------------------------------------------------------------------------------

def _int_objects(array):
    """Whether `array` is numpy's object array of Python ints (ints past uint64 as numpy makes
    them of a list or a scalar); bools are not ints here."""
    return array.dtype == object and all(type(item) is int for item in array.flat)


def _farthest(array):
    """The entry of an object array of Python ints farthest from 0, as a message shows it:
    the one that put the array past every numpy integer."""
    return shown(max(array.flat, key=abs))


# numpy before 1.24 made nested lists of uneven lengths an object array, with this warning;
# later versions raise ValueError.
_RAGGED_WARNING = (np.VisibleDeprecationWarning
                   if np.lib.NumpyVersion(np.__version__) < "1.24.0" else None)


def _as_array(value, str name):
    """np.asarray(value), or ValueError naming `name` for nested lists of uneven lengths
    (numpy's own message names nothing)."""
    try:
        if _RAGGED_WARNING is None:
            return np.asarray(value)
        with warnings.catch_warnings():
            warnings.simplefilter("error", _RAGGED_WARNING)
            return np.asarray(value)
    except (ValueError, _RAGGED_WARNING or ValueError) as error:
        raise ValueError(f"{name} must be a rectangular array of numbers; got {shown(value)} "
                         f"({error})") from None


def shown(value, Py_ssize_t limit=24):
    """`value` as an error message shows it: cut after `limit` characters (10**400 has 401
    digits, and a message that echoes them all hides what it says).

    Examples
    --------
    >>> from cpprb_ray._rules import shown
    >>> shown(2.5), shown(10**30), shown(repr("x" * 50), 8)
    ('2.5', '100000000000000000000000...', "'xxxxxxx...")
    """
    text = str(value)
    return text if len(text) <= limit else text[:limit] + "..."


# Outputs up to this size are not checked against the memory limit: reading it (a few files of
# /proc and /sys, tens of microseconds) costs nothing only beside an allocation this large.
cdef double UNCHECKED_BYTES = 64.0 * 2**20


cpdef int check_memory(double nbytes, str name, object value, str what) except -1:
    """ValueError naming `name` (given as `value`) when `nbytes` of `what` cannot fit in the
    memory this process may use (:func:`cpprb_ray._proc.memory_limit`: the machine's, its
    cgroup's, its rlimits), before anything is allocated: past it the OOM killer ends the
    process (a sample of 2**31 rows did), or numpy's MemoryError names nothing.

    Examples
    --------
    >>> from cpprb_ray._rules import check_memory
    >>> check_memory(2.0**20, "batch_size", 4096, "sample output")
    0
    >>> check_memory(2.0**80, "batch_size", 2**60, "sample output")
    Traceback (most recent call last):
    ...
    ValueError: batch_size 1152921504606846976 needs 1.21e+24 bytes of sample output, more than ...
    """
    if nbytes <= UNCHECKED_BYTES:
        return 0
    from cpprb_ray._proc import memory_limit
    limit = memory_limit()
    if limit is None or nbytes <= limit:
        return 0
    raise ValueError(f"{name} {shown(value)} needs {nbytes:.3g} bytes of {what}, more than the "
                     f"{limit:.3g} bytes this process may use (the least of the machine's "
                     f"memory, its cgroup's limit and its rlimits)")


def as_count(value, str name):
    """`value` as a Python int, or TypeError naming `name` (bools are not counts).

    Examples
    --------
    >>> from cpprb_ray._rules import as_count
    >>> as_count(3, "size")
    3
    >>> as_count(2.0, "size")
    Traceback (most recent call last):
    ...
    TypeError: size must be an int; got float
    """
    if isinstance(value, NOT_NUMBERS) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int; got {type(value).__name__}")
    return int(value)


def as_real(value, str name):
    """`value` as a finite Python float, or TypeError/ValueError naming `name`.

    Examples
    --------
    >>> from cpprb_ray._rules import as_real
    >>> as_real(1, "alpha")
    1.0
    >>> as_real(float("nan"), "alpha")
    Traceback (most recent call last):
    ...
    ValueError: alpha must be finite; got nan
    >>> as_real(10**400, "alpha")
    Traceback (most recent call last):
    ...
    ValueError: alpha must be finite; got 100000000000000000000000...
    """
    if isinstance(value, NOT_NUMBERS) or not isinstance(
            value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a real number; got {type(value).__name__}")
    try:
        result = float(value)
    except OverflowError:   # an int past any float
        raise ValueError(f"{name} must be finite; got {shown(value)}") from None
    if not (result - result == 0.0):
        raise ValueError(f"{name} must be finite; got {result}")
    return result


cpdef double as_timeout(object value, str name="timeout") except? -2.0:
    """Seconds a call may wait as a float, -1.0 for None (and inf): no limit; TypeError or
    ValueError naming `name` for anything but None or a real number >= 0.

    Examples
    --------
    >>> from cpprb_ray._rules import as_timeout
    >>> as_timeout(None), as_timeout(0), as_timeout(2.5), as_timeout(10**400)
    (-1.0, 0.0, 2.5, -1.0)
    >>> as_timeout(-1)
    Traceback (most recent call last):
    ...
    ValueError: timeout must be None or a number of seconds >= 0; got -1
    """
    if value is None:
        return -1.0
    if isinstance(value, NOT_NUMBERS) or not isinstance(
            value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be None or a number of seconds; got "
                        f"{type(value).__name__}")
    try:
        seconds = float(value)
    except OverflowError:   # an int past any float: as long as it takes, or refused
        seconds = INFINITY if value > 0 else -INFINITY
    if not seconds >= 0.0:
        raise ValueError(f"{name} must be None or a number of seconds >= 0; got "
                         f"{shown(value)}")
    return -1.0 if seconds == INFINITY else seconds


# -- priorities ---------------------------------------------------------------------------------

cdef int priority_rule(PriorityRule* rule, double alpha, double eps, int64_t capacity) except -1:
    """Fill `rule` for a buffer of `capacity` slots, or ValueError when even the default priority
    (1.0, what rows get before any priority is given) would make the total overflow."""
    rule.alpha = alpha
    rule.eps = eps
    rule.capacity = capacity
    rule.max_weight = DBL_MAX / (2.0 * capacity)
    # (p + eps) ** alpha <= max_weight  <=>  p + eps <= max_weight ** (1 / alpha); inf when no
    # finite base can exceed it. Rounded down a little so pow() rounding cannot slip by.
    rule.max_base = (INFINITY if alpha <= 0.0 else
                     pow(rule.max_weight, 1.0 / alpha) * (1.0 - 1e-12))
    if not 1.0 + eps <= rule.max_base:
        raise ValueError(f"alpha={alpha} with eps={eps} makes the default priority's weight "
                         f"(1 + eps) ** alpha overflow the total of {capacity} rows; use a "
                         f"smaller alpha or eps")
    return 0


def check_alpha_eps(double alpha, double eps, int64_t capacity):
    """ValueError when alpha and eps make the default priority's weight overflow the total.

    Examples
    --------
    >>> from cpprb_ray._rules import check_alpha_eps
    >>> check_alpha_eps(0.6, 1e-4, 1024)
    >>> check_alpha_eps(1100.0, 1.0, 1024)
    Traceback (most recent call last):
    ...
    ValueError: alpha=1100.0 with eps=1.0 makes the default priority's weight ... overflow ...
    """
    cdef PriorityRule rule
    priority_rule(&rule, alpha, eps, capacity)


def max_leaf_weight(int64_t capacity):
    """The largest leaf weight the priority rule lets into a tree of `capacity` slots (so that
    the total of every slot stays finite); what a checkpoint's leaves are checked against.

    Examples
    --------
    >>> from cpprb_ray._rules import max_leaf_weight
    >>> max_leaf_weight(1) * 2 == float.fromhex("0x1.fffffffffffffp+1023")
    True
    """
    cdef PriorityRule rule
    priority_rule(&rule, 0.0, 0.0, capacity)
    return rule.max_weight


cdef int64_t first_bad_leaf(const double* leaves, const uint8_t* live, int64_t count,
                            int64_t* heaviest_at) noexcept nogil:
    """Position of the first leaf that no kernel leaves, or -1, in one pass: a finite weight
    > 0 or the unset -0.0 where `live` (NULL: everywhere) says a row lies, the unset -0.0
    elsewhere. `heaviest_at` gets the position of the first of the heaviest leaves (-1 if
    none is > 0)."""
    cdef int64_t k, at = -1
    cdef double leaf, top = 0.0
    for k in range(count):
        leaf = leaves[k]
        if leaf == 0.0 and signbit(leaf):
            continue
        if (live != NULL and not live[k]) or not (leaf > 0.0 and leaf <= DBL_MAX):
            return k
        if leaf > top:
            top, at = leaf, k
    heaviest_at[0] = at
    return -1


def leaf_problem(const double[::1] leaves, double heaviest, live=None):
    """None when every leaf of a checkpoint is one a kernel leaves, else (position, what):
    "weight" for the first leaf that is not a finite weight > 0 or unset (-0.0) where a row
    lies (`live`, a bool per leaf; None: every leaf), "unset" for one not unset where none
    lies, "heavy" for the first of the heaviest leaves when it is above `heaviest`. One pass,
    GIL released.

    Examples
    --------
    >>> import numpy as np
    >>> from cpprb_ray._rules import leaf_problem
    >>> leaf_problem(np.array([1.0, -0.0, 2.0]), 4.0) is None
    True
    >>> leaf_problem(np.array([1.0, 0.0, 2.0]), 4.0), leaf_problem(np.array([1.0, 5.0]), 4.0)
    ((1, 'weight'), (1, 'heavy'))
    >>> leaf_problem(np.array([1.0, 2.0]), 4.0, live=np.array([True, False]))
    (1, 'unset')
    """
    cdef const uint8_t[::1] live_view
    cdef const uint8_t* live_at = NULL
    cdef int64_t count = leaves.shape[0], bad, heaviest_at = -1
    if live is not None:
        live_view = np.ascontiguousarray(live, dtype=np.bool_).view(np.uint8)
        if live_view.shape[0] != count:
            raise ValueError(f"live must have one entry per leaf ({count}); got "
                             f"{live_view.shape[0]}")
        if count:
            live_at = &live_view[0]
    with nogil:
        bad = first_bad_leaf(&leaves[0] if count else NULL, live_at, count, &heaviest_at)
    if bad >= 0:
        return bad, ("unset" if live_at != NULL and not live_at[bad] else "weight")
    if heaviest_at >= 0 and leaves[heaviest_at] > heaviest:
        return heaviest_at, "heavy"
    return None


cdef int64_t first_bad_priority(const PriorityRule* rule, const double* priorities,
                                double* weights, int64_t count, bint* overflow) noexcept nogil:
    """Position of the first priority that is not finite and >= 0 or whose weight would let the
    total overflow, or -1; fills `weights` (when not NULL) with (p + eps) ** alpha.

    The bound is checked on p + eps against max_base, precomputed, so checking costs no pow();
    the weights are computed here, outside the buffer's lock."""
    cdef int64_t k
    cdef double base
    for k in range(count):
        base = priorities[k] + rule.eps
        if not (priorities[k] >= 0.0 and base <= DBL_MAX):
            overflow[0] = False
            return k
        if not base <= rule.max_base:
            overflow[0] = True
            return k
        if weights != NULL:
            weights[k] = leaf_weight(priorities[k], rule.eps, rule.alpha)
    return -1


cdef double leaf_weight(double priority, double eps, double alpha) noexcept nogil:
    """(priority + eps) ** alpha: a row's leaf weight, the one formula for rows given a priority
    (first_bad_priority) and rows that get max_priority (the add kernels)."""
    return pow(priority + eps, alpha)


cdef int raise_bad_priority(const PriorityRule* rule, double value, int64_t position,
                            bint overflow, str name) except -1:
    if overflow:
        raise ValueError(f"{name} must keep (p + eps) ** alpha <= {rule.max_weight:.3g} (so "
                         f"the total of {rule.capacity} rows stays finite); got {value} at "
                         f"position {position}")
    raise ValueError(f"{name} must be finite and >= 0; got {value} at position {position}")


def check_priorities(const double[::1] priorities, double alpha, double eps, int64_t capacity,
                     str name="priorities"):
    """ValueError naming `name` unless every priority (a 1-D float64 array) is finite, >= 0 and
    weighs (p + eps) ** alpha little enough that the total of `capacity` rows stays finite: the
    store's rule, for a caller that holds no store (a remote handle checks before it queues).

    Examples
    --------
    >>> import numpy as np
    >>> from cpprb_ray._rules import check_priorities
    >>> check_priorities(np.array([0.0, 2.5]), 0.6, 1e-4, 1024)
    >>> check_priorities(np.array([1.0, -1.0]), 0.6, 1e-4, 1024)
    Traceback (most recent call last):
    ...
    ValueError: priorities must be finite and >= 0; got -1.0 at position 1
    """
    cdef PriorityRule rule
    cdef bint overflow = False
    cdef int64_t bad = -1
    priority_rule(&rule, alpha, eps, capacity)
    if priorities.shape[0]:
        with nogil:
            bad = first_bad_priority(&rule, &priorities[0], NULL, priorities.shape[0],
                                     &overflow)
    if bad >= 0:
        raise_bad_priority(&rule, priorities[bad], bad, overflow, name)


def real_vector(values, Py_ssize_t count, str name, str per="row"):
    """`values` (a scalar or 1-D, of integers or reals) as a C-contiguous float64 array of
    `count` entries (one per `per`), or TypeError/ValueError naming `name`.

    Examples
    --------
    >>> from cpprb_ray._rules import real_vector
    >>> real_vector([1, 2], 2, "priorities")
    array([1., 2.])
    >>> real_vector([1, 2], 3, "priorities")
    Traceback (most recent call last):
    ...
    ValueError: priorities must have 3 entries (one per row); got 2
    """
    array = values if type(values) is np.ndarray else _as_array(values, name)
    if _int_objects(array):
        # Python ints past uint64: their floats (a priority of 2**64 is 1.8e19, as add takes
        # it), or past any float, too large.
        try:
            array = array.astype(_FLOAT64)
        except OverflowError:
            raise ValueError(f"{name} must be finite; got {_farthest(array)}") from None
    if array.dtype.kind not in "iuf":
        raise TypeError(f"{name} must be real numbers; got dtype {array.dtype}")
    if array.ndim > 1:
        raise ValueError(f"{name} must be a scalar or 1-D; got shape {array.shape}")
    array = np.ascontiguousarray(array.reshape(-1), dtype=_FLOAT64)
    if array.shape[0] != count:
        raise ValueError(f"{name} must have {count} entries (one per {per}); got "
                         f"{array.shape[0]}")
    return array


def check_priorities_allowed(bint prioritized):
    """TypeError unless the handle is a prioritized one: priorities given to a uniform buffer
    (its adds, its N-step staging, its remote queue) are refused, never dropped.

    Examples
    --------
    >>> from cpprb_ray._rules import check_priorities_allowed
    >>> check_priorities_allowed(True)
    >>> check_priorities_allowed(False)
    Traceback (most recent call last):
    ...
    TypeError: priorities are only for a PrioritizedReplayBuffer
    """
    if not prioritized:
        raise TypeError("priorities are only for a PrioritizedReplayBuffer")


# -- batches and arrays handed to kernels ---------------------------------------------------------

def check_batch_fits(int64_t batch, int64_t row_bytes, str name="batch_size"):
    """ValueError naming `name` unless `batch` > 0 and a sample of `batch` rows of `row_bytes`
    each (plus its index, weight, generation and a scratch double) has a size that an int64
    can count: past that, the outputs could not be allocated, and sizes computed from them
    would wrap.

    Examples
    --------
    >>> from cpprb_ray._rules import check_batch_fits
    >>> check_batch_fits(256, 64)
    >>> check_batch_fits(2**61, 64)
    Traceback (most recent call last):
    ...
    ValueError: batch_size 2305843009213693952 needs more than 2**63 - 1 bytes of output; ...
    """
    if batch <= 0:
        raise ValueError(f"{name} must be > 0; got {batch}")
    if not batch_fits(batch, row_bytes):
        raise ValueError(f"{name} {batch} needs more than 2**63 - 1 bytes of output; sample "
                         f"fewer rows")


cdef bint export_vector(object value, Py_buffer* view, const char* codes,
                        Py_ssize_t itemsize) except -1:
    """Export `value` into `view` (held) when it is an ndarray with a C-contiguous 1-D buffer
    of one of `codes` and `itemsize`; False (nothing held) otherwise."""
    if type(value) is not _ndarray:
        return False
    try:
        PyObject_GetBuffer(value, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT)
    except (BufferError, ValueError):
        return False
    if view.ndim == 1 and is_format(view, codes, itemsize):
        return True
    PyBuffer_Release(view)
    return False


cdef uint8_t* bytes_of(object array, int64_t nbytes, str what) except NULL:
    """The data of `array`, a C-contiguous ndarray of at least `nbytes` bytes (the caller
    keeps it alive while the pointer is used)."""
    cdef Py_buffer view
    cdef uint8_t* data
    if type(array) is not _ndarray:
        raise ValueError(f"{what} must be a C-contiguous array of {nbytes} bytes; got "
                         f"{type(array).__name__}")
    # The buffer protocol, not array.ctypes (which builds a ctypes object per call: 6 us an add).
    PyObject_GetBuffer(array, &view, PyBUF_C_CONTIGUOUS)
    data = <uint8_t*>view.buf
    if view.len < nbytes or nbytes <= 0:
        PyBuffer_Release(&view)
        raise ValueError(f"{what} must be a C-contiguous array of {nbytes} bytes; got "
                         f"{array.nbytes}")
    PyBuffer_Release(&view)
    return data


# -- indexes ------------------------------------------------------------------------------------

cdef int64_t first_out_of_range(const int64_t* values, int64_t count,
                                int64_t limit) noexcept nogil:
    """Position of the first value outside [0, limit), or -1."""
    cdef int64_t k
    for k in range(count):
        if values[k] < 0 or values[k] >= limit:
            return k
    return -1


def index_vector(indexes, str name, bint whole_floats=False):
    """`indexes` (a scalar or 1-D of integers; with `whole_floats`, also of floats with whole
    values, as cpprb's update_priorities takes them) as a C-contiguous int64 array, or an error
    naming `name`. The range is checked by the caller (against the capacity or the stored size).

    Examples
    --------
    >>> import numpy as np
    >>> from cpprb_ray._rules import index_vector
    >>> index_vector([3, 1], "indexes")
    array([3, 1])
    >>> index_vector(np.arange(3, dtype=np.float16), "indexes", whole_floats=True)
    array([0, 1, 2])
    >>> index_vector([0.5], "indexes", whole_floats=True)
    Traceback (most recent call last):
    ...
    ValueError: indexes must be whole numbers; got 0.5 at position 0
    >>> index_vector([0.0], "indices")
    Traceback (most recent call last):
    ...
    TypeError: indices must be integers; got dtype float64
    """
    array = indexes if type(indexes) is np.ndarray else _as_array(indexes, name)
    if _int_objects(array):     # Python ints past uint64 or below int64: in no buffer's range
        raise IndexError(f"{name} must be below the stored size and >= 0; got "
                         f"{_farthest(array)}")
    if array.dtype.kind == "f" and whole_floats:
        array = _whole_indexes(array, name)
    elif array.dtype.kind not in "iu":
        if not (array.size == 0 and array.dtype.kind == "f"):   # [] is float64 to numpy
            raise TypeError(f"{name} must be integers; got dtype {array.dtype}")
    if array.ndim > 1:
        raise ValueError(f"{name} must be a scalar or 1-D; got shape {array.shape}")
    if array.dtype.kind == "u" and array.size and array.max() > 2**62:
        # Would wrap to a negative int64; report the value as given.
        raise IndexError(f"{name} must be below the stored size; got {array.max()}")
    return np.ascontiguousarray(array.reshape(-1), dtype=_INT64)


def _whole_indexes(array, str name):
    """A float index array as int64 (cpprb takes any numeric dtype, e.g. np.arange(n, dtype=
    np.float32)): every value whole and within int64, else an error naming `name` and the
    first value that is not (never truncated: 2.5 is no index)."""
    whole = np.isfinite(array) & (np.floor(array) == array)
    if array.size and not whole.all():
        position = int(np.flatnonzero(~whole.reshape(-1))[0])
        raise ValueError(f"{name} must be whole numbers; got {array.reshape(-1)[position]} at "
                         f"position {position}")
    # As Python floats: a float16 array compared with 2.0**63 would overflow in numpy's cast.
    low, high = (float(array.min()), float(array.max())) if array.size else (0.0, 0.0)
    if low < -2.0**63 or high >= 2.0**63:
        raise IndexError(f"{name} must be below the stored size and >= 0; got "
                         f"{high if high >= 2.0**63 else low}")
    return array.astype(_INT64)


def raise_out_of_range(str name, value, Py_ssize_t position, str bound):
    raise IndexError(f"{name} must be in [0, {bound}); got {value} at position {position}")


def check_in_range(const int64_t[::1] indexes, int64_t limit, str name, str bound):
    """IndexError naming `name` unless every index is in [0, limit) (`bound` describes limit).

    Examples
    --------
    >>> import numpy as np
    >>> from cpprb_ray._rules import check_in_range
    >>> check_in_range(np.array([0, 4]), 4, "indexes", "stored size 4")
    Traceback (most recent call last):
    ...
    IndexError: indexes must be in [0, stored size 4); got 4 at position 1
    """
    cdef int64_t bad = -1
    if indexes.shape[0]:
        with nogil:
            bad = first_out_of_range(<const int64_t*>&indexes[0], indexes.shape[0], limit)
    if bad >= 0:
        raise_out_of_range(name, indexes[bad], bad, bound)


def generation_vector(generations, Py_ssize_t count):
    """`generations` as `count` C-contiguous uint64 values (non-negative integers).

    Examples
    --------
    >>> from cpprb_ray._rules import generation_vector
    >>> generation_vector([2, 4], 2)
    array([2, 4], dtype=uint64)
    """
    array = (generations if type(generations) is _ndarray
             else _as_array(generations, "generations"))
    if _int_objects(array):
        raise ValueError(f"generations must be in [0, 2**64); got {_farthest(array)}")
    if array.dtype.kind not in "iu" and array.size:
        raise TypeError(f"generations must be unsigned integers; got dtype {array.dtype}")
    if array.ndim > 1 or array.size != count:
        raise ValueError(f"generations must be 1-D with {count} entries (one per index); got "
                         f"shape {array.shape}")
    if array.dtype.kind == "i" and array.size and array.min() < 0:
        position = int(np.argmin(array.reshape(-1)))
        raise ValueError(f"generations must be >= 0; got {array.reshape(-1)[position]} at "
                         f"position {position}")
    return np.ascontiguousarray(array.reshape(-1), dtype=np.uint64)


# -- columns: dtypes and shapes -----------------------------------------------------------------

def _most_dimensions():
    """How many dimensions a numpy array may have (64 in numpy 2, 32 before)."""
    try:
        np.empty((1,) * 64)
        return 64
    except ValueError:
        return 32


# A row's shape may have one dimension less than numpy allows: a batch adds one.
MAX_SHAPE_DIMS = _most_dimensions() - 1
MAX_ROW_BYTES = 1 << 40   # far beyond any real transition; a shape whose product wraps is not


def column_dtype(spec, str name):
    """The numpy dtype of env_dict column `name`: fixed-size, plain (no objects, fields or
    subarrays, whose shape would hide in the dtype)."""
    try:
        dtype = np.dtype(spec)
    except TypeError as error:
        raise TypeError(f"env_dict[{name!r}]['dtype'] is not a numpy dtype: {spec!r}") from error
    if (dtype.hasobject or dtype.itemsize == 0 or dtype.fields is not None
            or dtype.subdtype is not None):
        raise TypeError(f"env_dict[{name!r}]['dtype'] must be a fixed-size plain dtype; got "
                        f"{dtype} (give a subarray's shape as 'shape')")
    return dtype


def column_shape(spec, dtype, str name):
    """The per-row shape of env_dict column `name`: positive ints whose row stays addressable."""
    if isinstance(spec, (int, np.integer)) and not isinstance(spec, NOT_NUMBERS):
        shape = (int(spec),)
    elif isinstance(spec, (tuple, list)) and all(
            isinstance(d, (int, np.integer)) and not isinstance(d, NOT_NUMBERS) for d in spec):
        shape = tuple(int(d) for d in spec)
    else:
        raise TypeError(f"env_dict[{name!r}]['shape'] must be an int or a tuple of ints; got "
                        f"{spec!r}")
    if any(d <= 0 for d in shape):
        raise ValueError(f"env_dict[{name!r}]['shape'] must be positive; got {shown(shape)}")
    if len(shape) > MAX_SHAPE_DIMS:
        raise ValueError(f"env_dict[{name!r}]['shape'] has {len(shape)} dimensions; at most "
                         f"{MAX_SHAPE_DIMS} (a batch of rows adds one, and a numpy array has "
                         f"at most {MAX_SHAPE_DIMS + 1})")
    row_bytes = dtype.itemsize
    for d in shape:   # Python ints: the product cannot wrap as int64 would
        row_bytes *= d
    if row_bytes > MAX_ROW_BYTES:
        raise ValueError(f"env_dict[{name!r}]: shape {shown(shape)} of {dtype} is "
                         f"{shown(row_bytes)} bytes per row; at most {MAX_ROW_BYTES} allowed")
    return shape


def can_cast(source, column):
    """numpy's same_kind casting between plain numeric (or bool) dtypes: what add accepts."""
    return source.kind in "biuf" and bool(np.can_cast(source, column, casting="same_kind"))


class ColumnsError(KeyError, ValueError):
    """An add whose keyword columns are not the buffer's: a KeyError, as cpprb raises for a
    missing column, and a ValueError, as cpprb_ray always raised for both."""

    def __str__(self):
        return ValueError.__str__(self)   # the message, not KeyError's repr of it


def columns_error(expected, given):
    """The error (ColumnsError: a KeyError and a ValueError) for an add whose keyword columns
    are not exactly `expected` (names).

    Examples
    --------
    >>> from cpprb_ray._rules import columns_error
    >>> error = columns_error(("obs", "act"), {"obs": 1, "rew": 2})
    >>> print(error)
    add needs exactly the columns ['act', 'obs']; missing ['act'], unknown ['rew']
    >>> isinstance(error, KeyError) and isinstance(error, ValueError)
    True
    """
    names = set(expected)
    return ColumnsError(f"add needs exactly the columns {sorted(names)}; missing "
                        f"{sorted(names - set(given))}, unknown {sorted(set(given) - names)}")


def cast_error(str name, column, source):
    return TypeError(f"column {name!r} has dtype {column}; cannot cast {source} to it "
                     f"(same_kind casting)")


def column_array(value, column, str name):
    """`value` as an array of `column` (a dtype) by add's casting rule, the one rule of every
    add path. A numpy array or scalar casts as numpy's same_kind casting allows (float64 into
    float32, int64 into int8, as numpy's astype does). A Python int, or a list of them, is
    taken by its value, numpy's rule for Python scalars: into any integer column it fits
    (1 into uint8), and a ValueError naming the column where it does not, never a silent
    wrap (300 into int8 had stored 44, 2**63 into int64 -2**63). Floats into an integer or
    bool column go in when they are whole numbers it holds, as cpprb takes them
    (:func:`cast_whole_floats`; a fraction, NaN or inf is a ValueError). TypeError otherwise.

    Examples
    --------
    >>> import numpy as np
    >>> from cpprb_ray._rules import column_array
    >>> column_array([1, 255], np.dtype(np.uint8), "u")
    array([  1, 255], dtype=uint8)
    >>> column_array(300, np.dtype(np.int8), "s")
    Traceback (most recent call last):
    ...
    ValueError: column 's' has dtype int8; got 300, outside its range [-128, 127]
    >>> column_array(np.array([1.0, 2.0]), np.dtype(np.int64), "a")
    array([1, 2])
    >>> column_array(np.array([1.5]), np.dtype(np.int64), "a")
    Traceback (most recent call last):
    ...
    ValueError: column 'a' has dtype int64; got 1.5 at index (0,), not a whole number ...
    >>> column_array(np.array([1j]), np.dtype(np.float32), "a")
    Traceback (most recent call last):
    ...
    TypeError: column 'a' has dtype float32; cannot cast complex128 to it (same_kind casting)
    """
    python = not isinstance(value, (_ndarray, np.generic))
    array = value if type(value) is _ndarray else _as_array(value, f"column {name!r}")
    if array.dtype == column:
        return array
    if python and column.kind in "iu" and array.dtype.kind == "f":
        # numpy makes [1, 2**63] float64 (no integer dtype holds both): ints all the same.
        objects = np.asarray(value, dtype=object)
        if _int_objects(objects):
            array = objects
    if python and (array.dtype.kind in "iu" or _int_objects(array)):
        if column.kind in "iu":
            info = np.iinfo(column)
            if array.size:
                # As Python ints: numpy 1.x compares a uint64 with an int64 bound as floats,
                # and 2**63 then equals 2**63 - 1.
                low, high = ((min(array.flat), max(array.flat)) if array.dtype == object
                             else (int(array.min()), int(array.max())))
                if low < info.min or high > info.max:
                    raise ValueError(f"column {name!r} has dtype {column}; got "
                                     f"{shown(low if low < info.min else high)}, outside its "
                                     f"range [{info.min}, {info.max}]")
            return array.astype(column)
        if column.kind == "f" and array.dtype == object:
            try:
                return array.astype(_FLOAT64).astype(column)
            except OverflowError:
                raise ValueError(f"column {name!r} has dtype {column}; got "
                                 f"{_farthest(array)}, past any float") from None
    if array.dtype.kind == "f" and column.kind in "iub":
        return cast_whole_floats(array, column, name)
    if not can_cast(array.dtype, column):
        raise cast_error(name, column, array.dtype)
    return array.astype(column)


def cast_whole_floats(array, column, str name):
    """Floats into an integer or bool column, as cpprb takes them (np.zeros(8) into an int64
    column, 1.0 into a bool one): each must be a whole number within the column's range (0 or
    1 for bool); the first that is not (a fraction, NaN, inf, out of range) is a ValueError
    naming the column and its position, where cpprb's astype would truncate it silently.

    Examples
    --------
    >>> import numpy as np
    >>> from cpprb_ray._rules import cast_whole_floats
    >>> cast_whole_floats(np.array([0.0, 3.0]), np.dtype(np.int64), "act")
    array([0, 3])
    >>> cast_whole_floats(np.array([[1.0, 2.5]]), np.dtype(np.int64), "act")
    Traceback (most recent call last):
    ...
    ValueError: column 'act' has dtype int64; got 2.5 at index (0, 1), not a whole number ...
    """
    values = np.asarray(array, dtype=_FLOAT64)
    if column.kind == "b":
        ok = (values == 0.0) | (values == 1.0)
        bound = "0 or 1"
    else:
        info = np.iinfo(column)
        # Both bounds are powers of two, exact as floats: (2**63 - 1) as a float is 2**63.
        with np.errstate(invalid="ignore"):
            ok = ((values == np.floor(values)) & (values >= float(info.min))
                  & (values < float(info.max + 1)))
        bound = f"a whole number within [{info.min}, {info.max}]"
    if not ok.all():
        flat = int(np.argmin(ok.reshape(-1)))
        value = float(values.reshape(-1)[flat])
        where = (f" at index {tuple(int(i) for i in np.unravel_index(flat, values.shape))}"
                 if values.ndim else "")
        raise ValueError(f"column {name!r} has dtype {column}; got {shown(repr(value))}{where}, "
                         f"not {bound} (cpprb would store it truncated)")
    return values.astype(column)


def rows_of(tuple shape, tuple column_shape):
    """Rows in a value of `shape` for a column of per-row `column_shape` (a single row may omit
    the batch axis, and one-element columns their last axis, as in cpprb), or -1."""
    if shape == column_shape or (column_shape == (1,) and shape == ()):
        return 1
    if shape[1:] == column_shape or (column_shape == (1,) and len(shape) == 1):
        return shape[0]
    return -1


def shape_error(str name, tuple column_shape, tuple shape):
    return ValueError(f"column {name!r} must have shape {column_shape} or (batch, "
                      f"*{column_shape}); got {shape}")


def stage_rows(columns, values):
    """One add's `values` (a mapping of exactly the columns' names) as rows of `columns`
    (objects with a name, a per-row shape and a dtype): (C-contiguous arrays of (count, *shape)
    of each column's dtype, in column order; count). The one staging of add input outside the
    store's own C staging (``_columns.ColumnTable``, which applies the same rules): the N-step
    staging, the lane writer and a remote handle's queue stage through it.

    A single row may omit the batch axis; every value goes through :func:`column_array`
    (an exact C-contiguous row, and a Python float for a float column, are taken as they are).

    Examples
    --------
    >>> import numpy as np
    >>> from cpprb_ray._layout import parse_env_dict
    >>> from cpprb_ray._rules import stage_rows
    >>> arrays, count = stage_rows(parse_env_dict({"obs": {"shape": 2}, "done": {}}),
    ...                            {"obs": [1, 2], "done": 0})
    >>> [a.shape for a in arrays], count
    ([(1, 2), (1, 1)], 1)
    >>> stage_rows(parse_env_dict({"obs": {}, "act": {}}), {"obs": [1.0, 2.0], "act": 3.0})
    Traceback (most recent call last):
    ...
    ValueError: ragged batch: column 'act' has 1 rows, 'obs' has 2
    """
    if len(values) != len(columns) or any(c.name not in values for c in columns):
        raise columns_error([c.name for c in columns], values)
    cdef list arrays = []
    cdef Py_ssize_t count = -1, rows
    cdef str first = None
    for column in columns:
        name, shape, dtype = column.name, column.shape, column.dtype
        value = values[name]
        kind = type(value)
        if kind is _ndarray and value.dtype is dtype and value.shape == shape and (
                value.flags.c_contiguous):
            array, rows = value.reshape((1,) + shape), 1     # one row, as it is
        elif kind is float and shape == (1,) and dtype.kind == "f":
            array, rows = np.array(((value,),), dtype=dtype), 1
        else:
            array = column_array(value, dtype, name)
            rows = rows_of(array.shape, shape)
            if rows < 0:
                raise shape_error(name, shape, array.shape)
            array = np.ascontiguousarray(array.reshape((rows,) + shape), dtype=dtype)
        if count < 0:
            count, first = rows, name
        elif rows != count:
            raise ValueError(f"ragged batch: column {name!r} has {rows} rows, {first!r} has "
                             f"{count}")
        arrays.append(array)
    if count == 0:
        raise ValueError("add needs at least one row; got a batch of 0")
    return arrays, count
