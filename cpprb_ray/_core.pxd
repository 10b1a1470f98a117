# cython: language_level=3
# The store's nogil core: a StoreView of raw pointers into a mapped segment (its format is
# _segment.pxd's), the lock with its repair, and the ring's kernels: add, draw and gather,
# update, clear, snapshot, dump and restore. No Python objects, no validation: _store.pyx
# validates, locks (through store_lock) and turns a Status into an exception. The kernels are
# plain functions exported from this module, so the boundary calls them through Cython's
# function table: never inlined, one stable symbol each for the crash-point tests to trace.
#
# Where a buffer's rows lie in its slots is a part, chosen when the view is bound: the ring's
# (view_bind's default: rows fill the slots below the stored size) or another one (_lanes: rows
# anywhere in one writer's lane each). The core reaches what differs through RowsPart's hooks
# and never knows which part it runs.

from libc.stdint cimport int64_t, uint8_t, uint64_t
from libc.string cimport memcpy

from cpprb_ray._limiter cimport Limiter
from cpprb_ray._prefetch cimport prefetch
from cpprb_ray._rules cimport leaf_weight
from cpprb_ray._segment cimport Header, Lane
from cpprb_ray._segtree cimport TreeView, Xoshiro256
from cpprb_ray._sync cimport pthread_mutex_t

ctypedef void (*ViewHook)(StoreView* view) noexcept nogil
ctypedef bint (*RowTest)(const StoreView* view, int64_t slot) noexcept nogil
ctypedef int64_t (*RowCount)(const StoreView* view) noexcept nogil

# How rows lie in the slots, as the kernels that do not write rows need to know it:
#   undo_add    repair: take back the add a dead holder left half done
#   clear_rows  clear (and a repaired clear): every slot's row gone
#   holds_row   whether a slot the tree reached holds a committed row (NULL: the ring's rule,
#               a slot below the stored size)
#   count_rows  committed rows, counted (NULL: the ring's, the stored size after its undo; a
#               part whose rows move outside any add's record counts them, and the repair sets
#               the stored size from it)
cdef struct RowsPart:
    ViewHook undo_add
    ViewHook clear_rows
    RowTest holds_row
    RowCount count_rows

# A laned layout's lane table (count 0 in a ring's view): the lane part's state.
cdef struct LaneTable:
    Lane* records
    int64_t count
    int64_t link_offset      # each record's int32 link pair, after its generation
    # One lane: the most rows it keeps, its oldest evicted first (cpprb's size N; its ring has
    # room for filler slots); 0: no bound but its slots. Per process, from the layout.
    int64_t rows

cdef struct StoreView:
    Header* header
    pthread_mutex_t* mutex
    TreeView tree
    uint8_t* rows
    int64_t stride
    int64_t capacity
    bint prioritized
    int column_count
    const int64_t* columns        # offset of each column's field inside a row record
    const int64_t* row_bytes      # bytes of each column's field
    int lock_errno                # the errno behind ST_LOCK_ERROR
    Limiter* limiter              # the segment's rate limiter record (_segment.LIMITER_AT)
    bint limited                  # it has a limiter (its kind never changes after creation)
    RowsPart part
    LaneTable lanes


cdef void publish(uint64_t* op, uint64_t value) noexcept nogil


# The hot little helpers every kernel module shares, inline in each (defined here, not in
# _core.pyx: a call across modules per field copied cost an add(64) 15 % of its time).

cdef inline void copy_field(uint8_t* dst, const uint8_t* src, int64_t size) noexcept nogil:
    # Small fixed sizes are the common case (scalars, float32[4]); let the compiler inline them.
    if size == 4:
        memcpy(dst, src, 4)
    elif size == 8:
        memcpy(dst, src, 8)
    elif size == 16:
        memcpy(dst, src, 16)
    else:
        memcpy(dst, src, <size_t>size)


cdef inline uint64_t* generation_of(const StoreView* view, int64_t slot) noexcept nogil:
    return <uint64_t*>(view.rows + slot * view.stride)


cdef inline void prefetch_record(const StoreView* view, int64_t slot) noexcept nogil:
    cdef const uint8_t* record = view.rows + slot * view.stride
    cdef int64_t line
    for line in range(0, view.stride, 64):
        prefetch(record + line)


# The largest priority seen so far in one add, and its leaf weight: what a row that comes
# without a priority gets (as it would from adds of one row each, in the batch's order).
cdef struct MaxWeight:
    double priority
    double weight            # (< 0: not computed for this priority yet)


cdef inline void max_weight_start(MaxWeight* seen, const Header* header) noexcept nogil:
    seen.priority = header.max_priority
    seen.weight = -1.0


cdef inline double row_weight(const double* weights, const double* priorities, int64_t row,
                              const Header* header, MaxWeight* seen) noexcept nogil:
    """The leaf weight of an added row: its given weight; or for a row without one (`weights`
    NULL, or NaN there) the weight of the largest priority seen, read under the lock as every
    add reads it, and raised by the priorities given to the add's earlier rows (`seen`: call
    this for every row, skipped ones included, in order)."""
    cdef double weight
    if weights != NULL:
        weight = weights[row]
        if weight == weight:
            if priorities != NULL and priorities[row] > seen.priority:
                seen.priority = priorities[row]
                seen.weight = -1.0
            return weight
    if seen.weight < 0.0:
        seen.weight = leaf_weight(seen.priority, header.eps, header.alpha)
    return seen.weight


cdef void view_bind(StoreView* view, uint8_t* base, const int64_t* columns,
                    const int64_t* row_bytes, int column_count) noexcept nogil

cdef int store_lock(StoreView* view, double timeout_s) noexcept nogil
cdef void store_unlock(StoreView* view) noexcept nogil
cdef void store_repair(StoreView* view) noexcept nogil

cdef int64_t store_add(StoreView* view, const uint8_t** sources, int64_t count,
                       const double* priorities, const double* weights) noexcept nogil
cdef int64_t store_draw(StoreView* view, Xoshiro256* rng, int64_t batch, double beta,
                        double* scratch, int64_t* indexes, float* weights) noexcept nogil
cdef int64_t store_gather(StoreView* view, const int64_t* indexes, int64_t batch,
                          uint64_t* generations, uint8_t** outputs) noexcept nogil
cdef int64_t store_update(StoreView* view, const int64_t* indexes, const double* priorities,
                          const double* weights, const uint64_t* generations,
                          int64_t count) noexcept nogil
cdef void store_clear(StoreView* view) noexcept nogil
cdef bint store_admits(StoreView* view, int side, int64_t rows) noexcept nogil
cdef int64_t store_snapshot(StoreView* view, int64_t room, uint8_t** outputs, int64_t* indexes,
                            double* leaves) noexcept nogil
cdef int64_t store_dump(StoreView* view, Header* header, uint8_t* rows,
                        uint64_t* tail_generations, double* leaves) noexcept nogil
cdef void store_restore(StoreView* view, const uint8_t* rows, int64_t stored,
                        const uint64_t* tail_generations, int64_t tail_count,
                        const double* leaves, uint64_t next_index, double max_priority,
                        uint64_t rows_added, uint64_t limiter_inserts,
                        uint64_t limiter_samples) noexcept nogil
