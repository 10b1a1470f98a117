# cython: language_level=3
# The validation rules, in one place: counts, indexes, priorities, dtypes and shapes. The tree
# (_segtree), the store (_store) and the handles (buffer.py) all check through these, before any
# nogil code runs; the nogil halves below find the first bad entry, the Python halves say what is
# wrong with it.

from libc.stdint cimport INT64_MAX, int64_t, uint8_t

# The bytes a sample's outputs take per row besides its columns: its index, weight, generation
# and a scratch double.
cdef enum:
    SAMPLE_ROW_EXTRA_BYTES = 28


cdef inline bint batch_fits(int64_t batch, int64_t row_bytes) noexcept nogil:
    """What check_batch_fits requires: batch > 0, and its outputs' size countable in an int64.
    Inline, so that a sample tests it without a call (check_batch_fits says what is wrong)."""
    return 0 < batch <= INT64_MAX // (row_bytes + SAMPLE_ROW_EXTRA_BYTES)

cdef struct PriorityRule:
    double alpha
    double eps
    double max_weight     # largest leaf weight such that the total of every slot stays finite
    double max_base       # largest p + eps whose weight (p + eps) ** alpha is within max_weight
    int64_t capacity

cpdef double as_timeout(object value, str name=*) except? -2.0
cpdef int check_memory(double nbytes, str name, object value, str what) except -1
cdef int priority_rule(PriorityRule* rule, double alpha, double eps, int64_t capacity) except -1
cdef int64_t first_bad_priority(const PriorityRule* rule, const double* priorities,
                                double* weights, int64_t count, bint* overflow) noexcept nogil
cdef double leaf_weight(double priority, double eps, double alpha) noexcept nogil
cdef int raise_bad_priority(const PriorityRule* rule, double value, int64_t position,
                            bint overflow, str name) except -1
cdef int64_t first_out_of_range(const int64_t* values, int64_t count,
                                int64_t limit) noexcept nogil
cdef bint export_vector(object value, Py_buffer* view, const char* codes,
                        Py_ssize_t itemsize) except -1
cdef uint8_t* bytes_of(object array, int64_t nbytes, str what) except NULL
