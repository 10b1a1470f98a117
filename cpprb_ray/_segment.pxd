# cython: language_level=3
# The segment format, in one place: where everything lies in a buffer's one shared-memory segment,
# the fixed header and lane records as C structs, every operation marker and every Status a
# kernel returns. Everything above (the kernels, the store, the layout and orphan readers, the
# checkpoints) reads the format from here; nothing here knows a store.
#
#     0     Header (below; read_header() gives it as a dict)
#     256   robust process-shared mutex (_sync, MUTEX_BYTES reserved)
#     384   rate limiter record (_limiter.pxd's Limiter, LIMITER_BYTES reserved)
#     512   layout JSON (utf-8, `layout_length` bytes; _layout.py)
#     data_offset, 4096-aligned:
#           rows: `capacity` records of `row_stride` bytes: the slot's uint64 generation, then
#                 (laned layouts) the slot's two int32 links, then one field per column
#           tree (sum levels with the shared leaves, then min inner levels; _segtree), 64-aligned
#           lane table (laned layouts): `lanes` Lane records

from libc.stdint cimport int64_t, uint64_t

cdef enum:
    HEADER_BYTES = 256       # the Header below, padded
    MUTEX_AT = 256           # the robust mutex (_sync.MUTEX_BYTES reserved)
    LIMITER_AT = 384         # the rate limiter record (_limiter.pxd)
    LAYOUT_AT = 512          # the layout JSON
    VERSION = 3              # 3: magic as a u64 field, lock-wait statistics; 2: shared leaves

# A laned record's int32 link (_core.link_of): >= 1 a row (its obs stack ends that many slots
# back), else one of these. The int32 after it says where the row's next stack ends: that many
# slots ahead (0: in its own slot), or ROW_INCOMPLETE: an N-step row whose window is still open
# (not sampled, not updated, not counted until it is completed).
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

# Every kernel result: a count or index >= 0, or one of these. The store maps each to one
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
    ST_NO_LANE = -12         # every lane is owned by a live handle


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
    uint64_t owner_pidns          # the owner's pid namespace (a number; 0: unknown)
    uint64_t spare


cdef int64_t header_problem(const Header* header) noexcept nogil
