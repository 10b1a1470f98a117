# cython: language_level=3
# A buffer's columns: where each lives in a row record, and how add()'s values become rows of
# them (as they are when they already are, else converted without numpy where that is a plain
# cast). Used by the store's boundary (_store.pyx); no lock, no segment.

from libc.stdint cimport int64_t, uint8_t

# What one add call holds while it runs: one block, released in one place (close_frame).
cdef struct AddFrame:
    char* block
    Py_buffer* views
    char* held
    const uint8_t** pointers
    double* staged          # one 8-byte slot per column for a scalar
    void** owned            # conversion buffers: one per column, then the priorities' two
    Py_buffer priority_view
    bint priority_held

cdef class ColumnTable:
    cdef readonly int count
    cdef int64_t* offsets         # of each column's field inside a row record
    cdef int64_t* row_bytes
    cdef int64_t* items           # elements per row
    cdef char* codes              # buffer format code of the column dtype (0: not plain)
    cdef int* itemsizes
    cdef uint8_t* accept          # [column * 128 + code]: REFUSE, EXACT or CONVERT
    cdef readonly tuple names
    cdef readonly tuple dtypes
    cdef readonly tuple shapes

    cdef int open_frame(self, AddFrame* frame) except -1
    cdef void close_frame(self, AddFrame* frame) noexcept
    cdef int64_t stage(self, AddFrame* frame, int c, object value) except -2
    cdef int64_t stage_all(self, AddFrame* frame, object values) except -2
    cdef double* stage_priorities(self, AddFrame* frame, object priorities,
                                  int64_t count) except NULL
    cdef int64_t rows_in(self, int c, const Py_buffer* view) except -2
    cdef object numpy_column(self, int c, object value)
    cdef int64_t stage_list(self, AddFrame* frame, int c, list value) except -1
    cdef int stage_scalar(self, AddFrame* frame, int c, object value) except -1
