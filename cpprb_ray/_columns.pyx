# cython: language_level=3
"""A buffer's columns, and the staging of add()'s values into rows of them.

The store's add takes, per column, an array of the row or batch shape of any same_kind-castable
numeric dtype and any strides, a Python or numpy scalar, or a list. Values that already are
C-contiguous rows of the column dtype are used in place; plain numeric casts (float64 into a
float32 column, Python scalars, bools) are done here without numpy; anything else (strided,
byte-swapped, half floats, lists) goes through numpy once, which also says what is wrong with a
value that cannot be a row. Which source dtypes a column accepts, and how, is numpy's own
``can_cast(..., "same_kind")``, asked once per column and dtype when the table is built.
"""

cimport cython
from cpython.dict cimport PyDict_GetItemWithError
from cpython.object cimport PyObject
from cpython.buffer cimport (PyBUF_C_CONTIGUOUS, PyBUF_RECORDS_RO, PyBuffer_IsContiguous,
                             PyBuffer_Release, PyObject_GetBuffer)
from libc.stdint cimport int64_t, uint8_t
from libc.stdlib cimport free, malloc
from libc.string cimport memset

from cpprb_ray._convert cimport convert, format_code, is_format

import numpy as np

from cpprb_ray import _rules

_ndarray = np.ndarray
_generic = np.generic
_floating = np.floating
_integer = np.integer
_timedelta = np.timedelta64     # an np.integer whose int() is a datetime.timedelta
_bool = np.bool_

# Buffer-protocol format codes of the plain numeric dtypes, the ones converted here.
_CODES = b"?bBhHiIlLqQfd"
cdef enum Accept:
    REFUSE = 0
    EXACT = 1
    CONVERT = 2


cdef int put_number(uint8_t* slot, char code, int size, object value) except -1:
    """Write a Python float, int or bool into one element of a column of buffer format `code`
    and item `size`, where that is a plain cast: a float column takes all three, a bool column
    only bools, an int64 column ints and bools. 0 (nothing written) for anything else, and
    for narrower integer columns and ints out of range, which numpy's rules decide."""
    cdef type kind = type(value)
    try:
        if code == b"f" or code == b"d":
            if kind is not float and kind is not int and kind is not bool:
                return 0
            if size == 8:
                (<double*>slot)[0] = <double>value
            else:
                (<float*>slot)[0] = <float><double>value
        elif code == b"?":
            if kind is not bool:
                return 0
            slot[0] = 1 if value else 0
        elif (code == b"l" or code == b"q") and (kind is int or kind is bool):
            (<int64_t*>slot)[0] = <int64_t>value
        else:
            return 0
    except OverflowError:
        return 0
    return 1


@cython.final
cdef class ColumnTable:
    """The columns of a layout (name, dtype, shape, offset and row_bytes of each), as C tables.

    Examples
    --------
    >>> import numpy as np
    >>> from cpprb_ray import _layout
    >>> from cpprb_ray._columns import ColumnTable
    >>> columns = _layout.parse_env_dict({"obs": {"shape": 2}, "act": {"dtype": np.int64}})
    >>> table = ColumnTable(columns)
    >>> table.count, table.names, table.shapes
    (2, ('obs', 'act'), ((2,), (1,)))
    """

    def __cinit__(self):
        self.offsets = NULL
        self.row_bytes = NULL
        self.items = NULL
        self.codes = NULL
        self.itemsizes = NULL
        self.accept = NULL

    def __init__(self, columns):
        cdef int c, n = len(columns)
        self.count = n
        self.offsets = <int64_t*>malloc(max(1, n) * sizeof(int64_t))
        self.row_bytes = <int64_t*>malloc(max(1, n) * sizeof(int64_t))
        self.items = <int64_t*>malloc(max(1, n) * sizeof(int64_t))
        self.codes = <char*>malloc(max(1, n))
        self.itemsizes = <int*>malloc(max(1, n) * sizeof(int))
        self.accept = <uint8_t*>malloc(max(1, n) * 128)
        if (self.offsets == NULL or self.row_bytes == NULL or self.items == NULL
                or self.codes == NULL or self.itemsizes == NULL or self.accept == NULL):
            raise MemoryError()
        memset(self.accept, REFUSE, max(1, n) * 128)
        self.names = tuple(column.name for column in columns)
        self.dtypes = tuple(column.dtype for column in columns)
        self.shapes = tuple(tuple(column.shape) for column in columns)
        for c in range(n):
            column = columns[c]
            self.offsets[c] = column.offset
            self.row_bytes[c] = column.row_bytes
            self.itemsizes[c] = column.dtype.itemsize
            self.items[c] = column.row_bytes // column.dtype.itemsize
            plain = column.dtype.isnative and column.dtype.char in "?bBhHiIlLqQfd"
            self.codes[c] = ord(column.dtype.char) if plain else 0
            if plain:
                for code in _CODES:
                    if np.dtype(chr(code)) == column.dtype:
                        self.accept[c * 128 + code] = EXACT
                    elif np.can_cast(np.dtype(chr(code)), column.dtype, casting="same_kind"):
                        self.accept[c * 128 + code] = CONVERT

    def __dealloc__(self):
        free(self.offsets)
        free(self.row_bytes)
        free(self.items)
        free(self.codes)
        free(self.itemsizes)
        free(self.accept)

    cdef int open_frame(self, AddFrame* frame) except -1:
        cdef int n = self.count
        cdef size_t size = (n * sizeof(Py_buffer) + n * sizeof(uint8_t*) + n * 8
                            + (n + 2) * sizeof(void*) + n)
        frame.block = <char*>malloc(size)
        if frame.block == NULL:
            raise MemoryError()
        memset(frame.block, 0, size)
        frame.views = <Py_buffer*>frame.block
        frame.pointers = <const uint8_t**>(frame.block + n * sizeof(Py_buffer))
        frame.staged = <double*>(<char*>frame.pointers + n * sizeof(uint8_t*))
        frame.owned = <void**>(<char*>frame.staged + n * 8)
        frame.held = <char*>frame.owned + (n + 2) * sizeof(void*)
        frame.priority_held = False
        return 0

    cdef void close_frame(self, AddFrame* frame) noexcept:
        cdef int c
        if frame.block == NULL:
            return
        for c in range(self.count):
            if frame.held[c]:
                PyBuffer_Release(&frame.views[c])
        if frame.priority_held:
            PyBuffer_Release(&frame.priority_view)
        for c in range(self.count + 2):
            free(frame.owned[c])
        free(frame.block)
        frame.block = NULL

    cdef int64_t stage_all(self, AddFrame* frame, object values) except -2:
        """Stage one value per column: `values` a list in column order, or a dict keyed by
        exactly the column names (add()'s keyword arguments, as they come); returns the common
        row count."""
        cdef int c
        cdef int64_t count = -1, rows
        cdef PyObject* item
        cdef bint by_name = type(values) is dict
        if len(values) != self.count:
            if by_name:
                raise _rules.columns_error(self.names, values)
            raise ValueError(f"expected {self.count} columns; got {len(values)}")
        for c in range(self.count):
            if by_name:
                item = PyDict_GetItemWithError(values, self.names[c])
                if item == NULL:
                    raise _rules.columns_error(self.names, values)
                value = <object>item
            else:
                value = values[c]
            rows = self.stage(frame, c, value)
            if count < 0:
                count = rows
            elif rows != count:
                raise ValueError(f"ragged batch: column {self.names[c]!r} has {rows} rows, "
                                 f"{self.names[0]!r} has {count}")
        if count == 0:
            raise ValueError("add needs at least one row; got a batch of 0")
        return count

    cdef int64_t stage(self, AddFrame* frame, int c, object value) except -2:
        """Point frame.pointers[c] at column c's rows as the column dtype, C-contiguous (the
        value itself when it already is; else a conversion it owns); returns the row count."""
        cdef type kind = type(value)
        cdef Py_buffer* view = &frame.views[c]
        cdef char code
        cdef uint8_t accept
        cdef int64_t rows
        cdef uint8_t* converted
        if kind is float or kind is int or kind is bool or isinstance(value, _generic):
            if self.stage_scalar(frame, c, value):
                return 1
            value = self.numpy_column(c, value)
        elif kind is list:
            rows = self.stage_list(frame, c, <list>value)
            if rows:
                return rows
            value = self.numpy_column(c, value)
        elif kind is not _ndarray:
            value = self.numpy_column(c, value)
        PyObject_GetBuffer(value, view, PyBUF_RECORDS_RO)
        frame.held[c] = 1
        code = format_code(view.format)
        accept = self.accept[c * 128 + <uint8_t>code] if code > 0 else REFUSE
        if accept == REFUSE or not PyBuffer_IsContiguous(view, b"C"):
            # Anything unusual (strided, byte-swapped, half floats, not castable): numpy
            # casts it or says why not.
            PyBuffer_Release(view)
            frame.held[c] = 0
            value = self.numpy_column(c, value)
            PyObject_GetBuffer(value, view, PyBUF_RECORDS_RO)
            frame.held[c] = 1
            code = format_code(view.format)
            accept = EXACT
        rows = self.rows_in(c, view)
        if accept == EXACT:
            frame.pointers[c] = <const uint8_t*>view.buf
            return rows
        converted = <uint8_t*>malloc(max(1, rows * self.row_bytes[c]))
        frame.owned[c] = converted
        if converted == NULL:
            raise MemoryError()
        with nogil:
            convert(converted, self.codes[c], self.itemsizes[c], <const uint8_t*>view.buf,
                    code, <int>view.itemsize, rows * self.items[c])
        frame.pointers[c] = converted
        return rows

    cdef int64_t rows_in(self, int c, const Py_buffer* view) except -2:
        cdef tuple shape = self.shapes[c]
        cdef int ndim = len(shape), d
        cdef bint same = view.ndim == ndim
        if same:
            for d in range(ndim):
                if view.shape[d] != <Py_ssize_t>shape[d]:
                    same = False
                    break
            if same:
                return 1
        if view.ndim == ndim + 1:
            same = True
            for d in range(ndim):
                if view.shape[d + 1] != <Py_ssize_t>shape[d]:
                    same = False
                    break
            if same:
                return view.shape[0]
        if shape == (1,):
            if view.ndim == 0:
                return 1
            if view.ndim == 1:
                return view.shape[0]
        actual = tuple([view.shape[d] for d in range(view.ndim)])
        raise _rules.shape_error(self.names[c], shape, actual)

    cdef object numpy_column(self, int c, object value):
        """Column c's value through numpy, cast by add's rule (_rules.column_array) and made
        C-contiguous, or the error that names the column."""
        return np.ascontiguousarray(_rules.column_array(value, self.dtypes[c], self.names[c]))

    cdef int64_t stage_list(self, AddFrame* frame, int c, list value) except -1:
        """Write a flat list of Python numbers (a batch of a scalar column, or one row of a 1-D
        column) as column c's rows, each as stage_scalar writes one number; returns the row
        count, or 0 when numpy's rules are needed (nested lists, numpy scalars, a narrow
        integer column, a kind the column does not take as is, an int too large). numpy's list
        parsing took twice the time of the whole add of a 64-row batch given as three lists."""
        cdef Py_ssize_t length = len(value), k
        cdef char code = self.codes[c]
        cdef int size = self.itemsizes[c]
        cdef tuple shape = self.shapes[c]
        cdef int64_t rows
        cdef uint8_t* out
        if length == 0 or code == 0 or len(shape) != 1:
            return 0
        if self.items[c] == 1:
            rows = length
        elif shape[0] == length:
            rows = 1
        else:
            return 0
        out = <uint8_t*>malloc(length * size)
        if out == NULL:
            raise MemoryError()
        for k in range(length):
            if not put_number(out + k * size, code, size, value[k]):
                free(out)
                return 0
        frame.owned[c] = out
        frame.pointers[c] = out
        return rows

    cdef int stage_scalar(self, AddFrame* frame, int c, object value) except -1:
        """Write a Python or numpy scalar as column c's one-element row; 0 when numpy's rules
        are needed (a multi-element column, or a kind the column does not take as is)."""
        cdef char code = self.codes[c]
        cdef uint8_t* slot = <uint8_t*>&frame.staged[c]
        if self.items[c] != 1 or code == 0:
            return 0
        if isinstance(value, _generic):
            if isinstance(value, _floating):
                if code != b"f" and code != b"d":
                    return 0
                value = float(value)
            elif isinstance(value, _bool):
                value = bool(value)
            elif isinstance(value, _integer):
                if code == b"?" or isinstance(value, _timedelta):
                    return 0
                value = int(value)
            else:
                return 0
        if not put_number(slot, code, self.itemsizes[c], value):
            return 0
        frame.pointers[c] = slot
        return 1

    cdef double* stage_priorities(self, AddFrame* frame, object priorities,
                                  int64_t count) except NULL:
        """Priorities as `count` float64 values: a Python float, a float64 array as is, or
        converted (the rules' real_vector) into memory the frame owns."""
        cdef int n = self.count
        cdef Py_buffer* view = &frame.priority_view
        cdef type kind = type(priorities)
        cdef double* values
        if count == 1 and (kind is float or kind is int):
            values = <double*>malloc(sizeof(double))
            frame.owned[n] = values
            if values == NULL:
                raise MemoryError()
            try:
                values[0] = <double>priorities
            except OverflowError:
                raise ValueError(f"priorities must be finite and >= 0; got "
                                 f"{_rules.shown(priorities)} at position 0") from None
            return values
        cdef int64_t k
        cdef const float* narrow
        if kind is _ndarray:
            PyObject_GetBuffer(priorities, view, PyBUF_RECORDS_RO)
            frame.priority_held = True
            if (PyBuffer_IsContiguous(view, b"C")
                    and (view.ndim == 1 and view.shape[0] == count or
                         view.ndim == 0 and count == 1)):
                if is_format(view, b"d", 8):
                    return <double*>view.buf
                if is_format(view, b"f", 4):
                    # float32, as |TD errors| of a float32 network come: widened here (numpy's
                    # conversion was a fifth of an add of 64 rows with priorities).
                    values = <double*>malloc(count * sizeof(double))
                    frame.owned[n] = values
                    if values == NULL:
                        raise MemoryError()
                    narrow = <const float*>view.buf
                    for k in range(count):
                        values[k] = narrow[k]
                    return values
            PyBuffer_Release(view)
            frame.priority_held = False
        array = _rules.real_vector(priorities, count, "priorities")
        PyObject_GetBuffer(array, view, PyBUF_C_CONTIGUOUS)
        frame.priority_held = True
        return <double*>view.buf
