# cython: language_level=3
# What a sample fills: its output arrays (columns, then indexes, weights and generations), as
# fresh arrays, as the caller's out= (checked here, the one check), or as one of the store's
# kept sets that nobody else refers to any more. Used by every sampler (the ring's store and the
# lane part), so that each checks out= and keeps spares the same way.

from libc.stdint cimport int64_t, uint8_t

# One sample's hold on its output arrays, from begin() to end(): their buffers exported (views),
# a pointer to each (and `extra` more for the caller), and `batch` doubles of kernel scratch, all
# in one block freed by end().
cdef struct OutputCall:
    char* block
    Py_buffer* views
    int acquired
    bint fresh               # new arrays: kept as spares once the sample went through
    uint8_t** pointers       # count + extra
    double* scratch          # batch doubles


cdef class SampleOutputs:
    cdef readonly tuple names       # in order: the columns, "indexes", ["weights",] "generations"
    cdef readonly int count
    cdef readonly int index_at      # where "indexes", "weights" (-1: none) and "generations" are
    cdef readonly int weights_at
    cdef readonly int generations_at
    cdef dict template              # every output key, to copy: a sample's result dict
    cdef list shapes                # per output: the row shape (a tuple)
    cdef list formats               # per output: numpy's buffer format (bytes) or None
    cdef list dtypes
    cdef list spares                # the last SPARE_SETS sets of fresh arrays handed out
    cdef int64_t spare_batch

    cdef list begin(self, OutputCall* call, int64_t batch, int64_t row_bytes, object out,
                    int extra)
    cdef dict finish(self, OutputCall* call, list arrays, int64_t batch)
    cdef void end(self, OutputCall* call) noexcept
    cdef list arrays_for(self, int64_t batch, object out, Py_buffer* views, int* acquired,
                         bint* fresh)
    cdef dict result_of(self, list arrays)
    cdef void keep(self, list arrays, int64_t batch)
    cpdef list out_arrays(self, object out, int64_t batch)
    cdef list spare_set(self, int64_t batch)
    cdef int acquire_spares(self, list arrays, Py_buffer* views, int64_t batch) except -1
