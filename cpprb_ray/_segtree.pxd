# cython: language_level=3
# The sum/min tree as plain C: a struct of pointers into memory that somebody else owns, and
# `noexcept nogil` kernels over it. _store.pyx cimports these to sample, update and gather under
# one lock in one GIL-free call.

from libc.math cimport INFINITY, copysign, signbit
from libc.stdint cimport int64_t, uint64_t

# 8 float64 children fill one 64-byte cache line: a search reads one line per level.
cdef enum:
    FANOUT_BITS = 3
    FANOUT = 8
    MAX_LEVELS = 24

cdef struct TreeView:
    double* sums            # sum levels, leaves first; the leaves are the min tree's too
    double* mins            # min levels 1.. (mins + offsets[level]); level 0 is not stored
    int64_t capacity
    int depth               # levels above the leaves; the root is level `depth`
    int64_t counts[MAX_LEVELS]   # live nodes per level
    int64_t offsets[MAX_LEVELS]  # offset (in doubles) of each level inside `sums` and `mins`
    int64_t level_doubles   # doubles of the sum levels (the min levels follow them)

# The sum and min trees share their leaves (one write and one cache line per leaf instead of
# two). A leaf is a weight >= +0.0, or -0.0 for "unset": -0.0 adds nothing to a sum, and the
# min levels read it as +inf, so an unset leaf does not count in min().
cdef inline double unset_leaf() noexcept nogil:
    return copysign(0.0, -1.0)


cdef inline bint is_unset(double leaf) noexcept nogil:
    return signbit(leaf)


cdef inline double min_key(double leaf) noexcept nogil:
    """What a leaf counts as in the min tree."""
    return INFINITY if signbit(leaf) else leaf


cdef struct Xoshiro256:
    uint64_t s[4]

cdef int64_t tree_doubles(int64_t capacity, TreeView* view) noexcept nogil
cdef void tree_bind(TreeView* view, double* memory, int64_t capacity) noexcept nogil
cdef void tree_clear_all(TreeView* view) noexcept nogil
cdef void tree_set(TreeView* view, const int64_t* indices, const double* values,
                   int64_t count) noexcept nogil
cdef void tree_unset(TreeView* view, const int64_t* indices, int64_t count) noexcept nogil
cdef void tree_refresh(TreeView* view, const int64_t* indices, int64_t count) noexcept nogil
cdef void tree_prefetch_leaves(const TreeView* view, const int64_t* indices,
                               int64_t count) noexcept nogil
cdef void tree_refresh_range(TreeView* view, int64_t start, int64_t count) noexcept nogil
cdef void tree_rebuild(TreeView* view) noexcept nogil
cdef double tree_total(const TreeView* view) noexcept nogil
cdef double tree_min(const TreeView* view) noexcept nogil
cdef bint tree_consistent(const TreeView* view) noexcept nogil
cdef int64_t tree_search(const TreeView* view, double* masses, int64_t* out,
                         int64_t count) noexcept nogil
cdef int64_t tree_sample(const TreeView* view, Xoshiro256* rng, double* scratch, int64_t* out,
                         int64_t count) noexcept nogil

cdef void rng_seed(Xoshiro256* rng, uint64_t seed) noexcept nogil
cdef uint64_t rng_next(Xoshiro256* rng) noexcept nogil
cdef double rng_uniform(Xoshiro256* rng) noexcept nogil

cdef class Random:
    cdef Xoshiro256 state

cdef class SegmentTree:
    cdef TreeView view
    cdef object _owner            # the object whose buffer we borrowed
    cdef Py_buffer _buffer
    cdef bint _has_buffer
    cdef int _check_open(self) except -1
