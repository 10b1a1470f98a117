# cython: language_level=3
# The store's nogil core: the segment header (described here, once), a StoreView of raw pointers
# into a mapped segment, and the kernels that add, sample, update, clear and repair through it.
# No Python objects, no validation: _store.pyx validates, locks (through store_lock) and turns a
# Status into an exception. The kernels are plain functions exported from this module, so the
# boundary calls them through Cython's function table: never inlined, one stable symbol each
# for the crash-point tests to trace.

from libc.stdint cimport int32_t, int64_t, uint8_t, uint64_t

from cpprb_ray._limiter cimport Limiter
from cpprb_ray._segtree cimport TreeView, Xoshiro256
from cpprb_ray._sync cimport pthread_mutex_t

cdef enum:
    HEADER_BYTES = 256       # the Header below, padded
    MUTEX_AT = 256           # the robust mutex (_sync.MUTEX_BYTES reserved)
    # (384: the rate limiter record, _limiter.pxd's LIMITER_AT and LIMITER_BYTES)
    LAYOUT_AT = 512          # the layout JSON
    VERSION = 3              # 3: magic as a u64 field, lock-wait statistics; 2: shared leaves

# A laned record's int32 link (StoreView.link_offset): >= 1 a row (its obs stack ends that many
# slots back), else one of these. The int32 after it says where the row's next stack ends: that
# many slots ahead (0: in its own slot), or ROW_INCOMPLETE: an N-step row whose window is still
# open (not sampled, not updated, not counted until it is completed).
cdef enum:
    LINK_NONE = 0            # never written since the segment was made
    LINK_FILLER = -1         # holds only frames (of a stack that starts a stream anew)
    LINK_DEAD = -2           # its row was evicted, torn or cleared
    ROW_INCOMPLETE = -1      # (the second int32)

# In-flight operation marker (Header.op), for the repair after a holder's death.
cdef enum:
    OP_NONE = 0
    OP_ADD = 1
    OP_UPDATE = 2
    OP_CLEAR = 3

# Every kernel result: a count or index >= 0, or one of these. The boundary maps each to one
# exception in one place (_store.raise_status).
cdef enum Status:
    ST_OK = 0
    ST_EMPTY = -1            # sample from an empty buffer
    ST_ALL_ZERO = -2         # every stored row has weight 0 (priority 0 with eps 0)
    ST_ALL_TORN = -3         # every stored row was torn by a writer that died mid-add
    ST_CORRUPT = -4          # a header field or the tree is outside what any writer leaves
    ST_NAN_TREE = -5         # the tree's total is NaN or inf (a corrupt segment)
    ST_LOCK_TIMEOUT = -6     # the lock was not released in time
    ST_INTERRUPTED = -7      # a signal handler raised while waiting for the lock
    ST_LOCK_ERROR = -8       # pthread returned an errno (kept in StoreView.lock_errno)
    ST_RATE_LIMITED = -9     # the rate limiter holds the add or sample back (nothing done)
    ST_LANE_LOST = -10       # the add's lane is no longer this handle's (nothing done)
    ST_LANE_FULL = -11       # an add's transitions need more slots than its lane has


# Every field is 8 bytes and the order is the layout on disk: read_header() converts this struct
# to a dict, and the tests derive field offsets from that dict's order.
cdef struct Header:
    uint64_t magic                # b"CPPRBRAY", written last at creation
    uint64_t version
    uint64_t total_size
    uint64_t capacity
    uint64_t prioritized
    double alpha
    double eps
    uint64_t next_index
    uint64_t stored_size
    double max_priority
    uint64_t op                   # OP_* in flight
    uint64_t pending_start
    uint64_t pending_count
    uint64_t pending_old_next
    uint64_t pending_old_stored
    uint64_t owner_pid
    uint64_t layout_offset
    uint64_t layout_length
    uint64_t data_offset
    uint64_t tree_offset
    uint64_t rows_added           # rows ever committed
    uint64_t repairs              # times a dead holder's work was repaired
    uint64_t created_ns
    uint64_t row_stride
    uint64_t pending_old_rows_added
    double pending_old_max_priority
    uint64_t rows_sampled         # rows ever returned by sample
    uint64_t updates              # priorities ever applied by update
    uint64_t lock_waits           # lock acquisitions that had to wait (statistics)
    uint64_t pending_lane         # lane + 1 of the add in flight (0: the whole ring)


# A lane (a contiguous sub-ring that one writing handle owns; _lanes.pyx) as it lies in the
# segment's lane table, 64 bytes each. Its slots are [lane_start(i), lane_start(i + 1)).
cdef struct Lane:
    uint64_t owner_pid            # 0: free
    uint64_t owner_start          # the owner process's start time (pid reuse)
    uint64_t owner_token          # the owning handle's random token (two handles, one process)
    uint64_t head                 # next slot to write, relative to the lane's first
    uint64_t filled               # slots written since the last clear (at most the lane's size)
    uint64_t writes               # slots ever written: what a writer's cached stacks are keyed by
    uint64_t spare0
    uint64_t spare1


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
    Limiter* limiter              # the segment's rate limiter record (LIMITER_AT)
    bint limited                  # it has a limiter (its kind never changes after creation)
    Lane* lanes                   # the lane table (NULL: one ring, no lanes)
    int64_t lane_count
    int64_t link_offset           # with lanes: each record's int32 link (see _lanes.pyx)
    # One lane: the most rows it keeps, its oldest evicted first (cpprb's size N; its ring has
    # room for filler slots); 0: no bound but its slots.
    int64_t lane_rows


cdef int64_t lane_start(const StoreView* view, int64_t lane) noexcept nogil
cdef int64_t lane_of(const StoreView* view, int64_t slot) noexcept nogil
cdef int32_t* link_of(StoreView* view, int64_t slot) noexcept nogil
cdef int32_t* ahead_of(StoreView* view, int64_t slot) noexcept nogil
cdef bint is_live_row(StoreView* view, int64_t slot) noexcept nogil
cdef void publish(uint64_t* op, uint64_t value) noexcept nogil


cdef void view_bind(StoreView* view, uint8_t* base, const int64_t* columns,
                    const int64_t* row_bytes, int column_count) noexcept nogil
cdef int64_t header_problem(const Header* header) noexcept nogil

cdef int store_lock(StoreView* view, double timeout_s) noexcept nogil
cdef void store_unlock(StoreView* view) noexcept nogil
cdef void store_repair(StoreView* view) noexcept nogil

cdef int64_t store_add(StoreView* view, const uint8_t** sources, int64_t count,
                       const double* priorities, const double* weights) noexcept nogil
cdef int64_t store_sample(StoreView* view, Xoshiro256* rng, int64_t batch, double beta,
                          double* scratch, int64_t* indexes, float* weights,
                          uint64_t* generations, uint8_t** outputs) noexcept nogil
cdef int64_t store_draw(StoreView* view, Xoshiro256* rng, int64_t batch, double beta,
                        double* scratch, int64_t* indexes, float* weights) noexcept nogil
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
