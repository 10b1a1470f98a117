# cython: language_level=3
"""A sample's output arrays: fresh, kept spares, or the caller's ``out=`` (the one check of it).

Examples
--------
>>> import numpy as np
>>> from cpprb_ray._outputs import SampleOutputs
>>> outputs = SampleOutputs(["obs"], [(2,)], [np.dtype(np.float32)], weights=False)
>>> outputs.names
('obs', 'indexes', 'generations')
>>> sorted(outputs.fresh(3)), outputs.fresh(3)["obs"].shape
(['generations', 'indexes', 'obs'], (3, 2))
>>> outputs.out_arrays({"obs": np.zeros((3, 2))}, 3)
Traceback (most recent call last):
...
ValueError: out['obs'] must be a writable C-contiguous float32 array of shape (3, 2); got ...
"""

cimport cython
from cpython.buffer cimport (PyBUF_C_CONTIGUOUS, PyBUF_FORMAT, PyBUF_WRITABLE, PyBuffer_Release,
                             PyObject_GetBuffer)
from cpython.bytes cimport PyBytes_AS_STRING
from cpython.object cimport PyObject
from libc.stdlib cimport free, malloc
from libc.string cimport strcmp

from cpprb_ray._rules cimport SAMPLE_ROW_EXTRA_BYTES, batch_fits, check_memory

import numpy as np

from cpprb_ray import _rules

_ndarray = np.ndarray
_empty = np.empty
_INT64 = np.dtype(np.int64)
_FLOAT32 = np.dtype(np.float32)
_UINT64 = np.dtype(np.uint64)

cdef extern from *:
    """
    #define cpprb_ray_refcount(o) Py_REFCNT(o)
    """
    Py_ssize_t refcount "cpprb_ray_refcount"(PyObject* obj)
    PyObject* list_item "PyList_GET_ITEM"(list items, Py_ssize_t index)   # borrowed

# A sample keeps the arrays of its last SPARE_SETS fresh results and refills a set once nothing
# but the sampler refers to any of its arrays: `batch = rb.sample(...)` in a loop drops the
# previous batch only after the call returns, so the one before it is free by then. Creating 8
# arrays was about a fifth of a sample(256), and more of a cold one.
cdef int SPARE_SETS = 2


def _format_of(dtype):
    """The buffer format numpy gives an array of `dtype` (bytes), or None if it has none."""
    try:
        return memoryview(np.empty(0, dtype)).format.encode()
    except (TypeError, ValueError):
        return None


@cython.final
@cython.auto_pickle(False)
cdef class SampleOutputs:
    """The outputs of a sampler: `names`, `shapes` and `dtypes` of its columns, then "indexes"
    (int64), "weights" (float32; with `weights`) and "generations" (uint64)."""

    def __init__(self, names, shapes, dtypes, *, bint weights=True):
        columns = tuple(names)
        extra = ("indexes", "weights", "generations") if weights else ("indexes", "generations")
        self.names = columns + extra
        self.count = len(self.names)
        self.index_at = len(columns)
        self.weights_at = len(columns) + 1 if weights else -1
        self.generations_at = self.count - 1
        self.template = dict.fromkeys(self.names)
        self.shapes = [tuple(shape) for shape in shapes] + [()] * len(extra)
        self.dtypes = [np.dtype(dtype) for dtype in dtypes] + (
            [_INT64, _FLOAT32, _UINT64] if weights else [_INT64, _UINT64])
        self.formats = [_format_of(dtype) for dtype in self.dtypes]
        self.spares = []
        self.spare_batch = 0

    cdef list begin(self, OutputCall* call, int64_t batch, int64_t row_bytes, object out,
                    int extra):
        """Start a sample of `batch` rows (each `row_bytes` of outputs at most): the arrays it
        fills (`out`'s, a kept set or new ones), exported into `call`, with their pointers and
        the kernel's scratch. end() releases them whatever happens after."""
        cdef int c
        call.block = NULL
        call.acquired = 0
        # The rules' checks, called as C: a Python-level call of each was a tenth of the
        # Python work of a sample(256). check_batch_fits says what is wrong when its test fails.
        if not batch_fits(batch, row_bytes):
            _rules.check_batch_fits(batch, row_bytes, "batch_size")
        if out is None:   # new arrays: they must fit in what this process may use
            check_memory(<double>batch * (row_bytes + SAMPLE_ROW_EXTRA_BYTES), "batch_size",
                         batch, "sample output")
        call.block = <char*>malloc(self.count * sizeof(Py_buffer)
                                   + (self.count + extra) * sizeof(uint8_t*)
                                   + batch * sizeof(double))
        if call.block == NULL:
            raise MemoryError(f"batch_size {batch}: no memory for the sample's scratch")
        call.views = <Py_buffer*>call.block
        call.pointers = <uint8_t**>(call.block + self.count * sizeof(Py_buffer))
        call.scratch = <double*>(call.block + self.count * sizeof(Py_buffer)
                                 + (self.count + extra) * sizeof(uint8_t*))
        arrays = self.arrays_for(batch, out, call.views, &call.acquired, &call.fresh)
        for c in range(self.count):
            call.pointers[c] = <uint8_t*>call.views[c].buf
        return arrays

    cdef dict finish(self, OutputCall* call, list arrays, int64_t batch):
        """The sample went through: its result dict (new arrays kept as spares)."""
        if call.fresh:
            self.keep(arrays, batch)
        return self.result_of(arrays)

    cdef void end(self, OutputCall* call) noexcept:
        cdef int c
        for c in range(call.acquired):
            PyBuffer_Release(&call.views[c])
        call.acquired = 0
        free(call.block)
        call.block = NULL

    def fresh(self, int64_t batch):
        """A dict of new, empty arrays for `batch` rows."""
        return self.result_of([_empty((batch,) + <tuple>self.shapes[c], self.dtypes[c])
                               for c in range(self.count)])

    cdef list arrays_for(self, int64_t batch, object out, Py_buffer* views, int* acquired,
                         bint* fresh):
        """The arrays a sample of `batch` rows fills, each exported (writable, C-contiguous)
        into `views` (`acquired` of them; the caller releases them): `out`'s (checked), a kept
        spare set, or new ones (`fresh`: then keep() them once the sample went through)."""
        cdef list arrays
        cdef int c
        fresh[0] = False
        acquired[0] = 0
        if out is not None:
            arrays = self.out_arrays(out, batch)
        else:
            arrays = self.spare_set(batch)
            if arrays is not None:
                acquired[0] = self.acquire_spares(arrays, views, batch)
            if acquired[0]:
                return arrays
            arrays = [_empty((batch,) + <tuple>self.shapes[c], self.dtypes[c])
                      for c in range(self.count)]
            fresh[0] = True
        for array in arrays:
            PyObject_GetBuffer(array, &views[acquired[0]], PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE)
            acquired[0] += 1
        return arrays

    cdef dict result_of(self, list arrays):
        # A copy of a dict with these keys, then filled: dict(zip(...)) took 12 us more in a
        # cold call (zip, and two resizes), the copy 2 us.
        cdef dict result = self.template.copy()
        cdef int c
        for c in range(self.count):
            result[<str>self.names[c]] = arrays[c]
        return result

    cdef list spare_set(self, int64_t batch):
        """A kept set of outputs for `batch` rows that only this object refers to, or None.
        (With the GIL held and no Python code run between this check and the buffer exports
        that follow, no other thread can take a reference in between.)"""
        cdef list arrays
        cdef int c
        if batch != self.spare_batch:
            return None
        for arrays in self.spares:
            for c in range(len(arrays)):
                if refcount(list_item(arrays, c)) != 1:    # anyone's but the set's
                    break
            else:
                return arrays
        return None

    cdef int acquire_spares(self, list arrays, Py_buffer* views, int64_t batch) except -1:
        """Export every array of a kept set into `views` and return how many; 0 (nothing held,
        the set dropped) when one of them was changed in place while it was the user's: made
        read-only, given another shape, dtype or strides."""
        cdef int c, d, acquired = 0
        cdef tuple shape
        cdef bytes expected
        cdef bint intact = True
        try:
            for c in range(len(arrays)):
                try:
                    PyObject_GetBuffer(arrays[c], &views[c],
                                       PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE | PyBUF_FORMAT)
                except (BufferError, ValueError):
                    intact = False
                    break
                acquired += 1
                shape = self.shapes[c]
                expected = self.formats[c]
                if (expected is None or views[c].ndim != 1 + len(shape)
                        or views[c].shape[0] != batch
                        or strcmp(views[c].format, PyBytes_AS_STRING(expected)) != 0):
                    intact = False
                    break
                for d in range(len(shape)):
                    if views[c].shape[d + 1] != <Py_ssize_t>shape[d]:
                        intact = False
                if not intact:
                    break
        except BaseException:       # (MemoryError): nothing stays exported
            for c in range(acquired):
                PyBuffer_Release(&views[c])
            raise
        if intact:
            return acquired
        for c in range(acquired):
            PyBuffer_Release(&views[c])
        self.spares = [kept for kept in self.spares if kept is not arrays]
        return 0

    cdef void keep(self, list arrays, int64_t batch):
        if batch != self.spare_batch:
            self.spares = []
            self.spare_batch = batch
        self.spares.append(arrays)
        if len(self.spares) > SPARE_SETS:
            del self.spares[0]

    cpdef list out_arrays(self, object out, int64_t batch):
        """The arrays of `out` in output order, or the error naming the first one that is not
        a writable C-contiguous array of its output's dtype and shape. Keys that are not
        outputs are ignored (an earlier result of another sampler may carry more)."""
        if not isinstance(out, dict):
            raise TypeError(f"out must be a dict of arrays; got {type(out).__name__}")
        cdef list arrays = []
        cdef int c
        for c in range(self.count):
            name = self.names[c]
            shape = (batch,) + <tuple>self.shapes[c]
            dtype = self.dtypes[c]
            array = (<dict>out).get(name)
            if (type(array) is not _ndarray or array.shape != shape or array.dtype != dtype
                    or not array.flags.c_contiguous or not array.flags.writeable):
                got = ("missing" if array is None else
                       f"{type(array).__name__} {getattr(array, 'dtype', '')} "
                       f"{getattr(array, 'shape', '')}")
                raise ValueError(f"out[{name!r}] must be a writable C-contiguous {dtype} array "
                                 f"of shape {shape}; got {got}")
            arrays.append(array)
        return arrays
