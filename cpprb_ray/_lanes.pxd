# cython: language_level=3
# Lanes and frames, nogil: a laned buffer's ring is split into contiguous sub-rings (lanes), each
# written by one handle at a time; frame columns (next_of, stack_compress) keep one plane of a
# stack per slot, and a row's stacks are read back from the slots before it in its lane.
# The store validates, locks, and calls these through its driver; lanes_bind makes a view a
# laned buffer's (the lane part's hooks, through which the core's own kernels see its rows).

from libc.stdint cimport int32_t, int64_t, uint8_t, uint64_t

from cpprb_ray._core cimport StoreView
from cpprb_ray._segment cimport Lane

cdef enum:
    MAX_FRAME_COLUMNS = 8
    # Planes per stack (frames.MAX_STACK says the same): lanes_gather keeps a stack's plane
    # pointers in an array on the C stack, 8 KiB at this bound (it was 64, 512 bytes; cpprb
    # takes any stack, e.g. 84 for an obs of shape (4, 84, 84)).
    MAX_STACK = 1024

# One frame column, for one call. A stack is C-contiguous (*plane_shape, stack) as the user
# passes it: its planes interleave at `item_bytes`; the store keeps one plane per slot.
cdef struct FrameColumn:
    int64_t column           # the store's column (its field in a record holds one plane)
    int64_t stack            # planes per stack (1: next_of without stack_compress)
    int64_t plane_bytes
    int64_t item_bytes
    bint has_next            # next_of: the next stack is passed (add) and returned (sample)
    const uint8_t* values    # add: `count` stacks, the row's own (next_of: its obs)
    const uint8_t* nexts     # add: `count` next stacks (has_next)
    uint8_t* cache           # add: the writer's copy of the stack that ends its lane
    uint8_t* out_values      # gather: `batch` stacks
    uint8_t* out_nexts       # gather: `batch` next stacks (has_next)

cdef struct LaneAdd:
    int64_t lane
    uint64_t token           # the writer's: the lane must still be its own
    int64_t count            # transitions
    const uint8_t** sources  # per store column, `count` values back to back (frame columns: unused)
    FrameColumn* frames
    int frame_count
    const double* priorities
    const double* weights
    uint64_t* cache_writes   # in/out: the lane's `writes` when `cache` was taken (0: none)
    int32_t* plan            # scratch: 2 * count int32 (fillers, link) per transition
    bint incomplete          # N-step: the rows wait for lanes_complete (not sampled till then)
    # Rows the rate limiter must admit first (0: no check); N-step: the rows the add will
    # complete (they are counted when completed).
    int64_t admit
    int64_t* out_slots       # each row's slot (NULL: not wanted)
    uint64_t* out_generations  # each row's generation as written (with out_slots)

# N-step rows whose windows closed: each row's n-step columns and where its next stack ends (the
# slot of its window's last step), checked against the generations the writer saw.
cdef struct LaneComplete:
    int64_t count
    const int64_t* slots
    const uint64_t* generations
    const int64_t* last_slots
    const uint64_t* last_generations
    const uint8_t** sources  # per store column, `count` values; NULL: keep what the add wrote
    const double* priorities
    const double* weights

cdef struct LaneClaim:
    uint64_t pid
    uint64_t start
    uint64_t token
    uint64_t pidns
    int64_t dead_count
    const uint64_t* dead     # 4 per entry: lane, and the owner (pid, start, token) seen dead

cdef void lanes_bind(StoreView* view, Lane* records, int64_t count, int64_t link_offset,
                     int64_t rows) noexcept nogil
cdef int64_t lane_start(const StoreView* view, int64_t lane) noexcept nogil
cdef int64_t lane_of(const StoreView* view, int64_t slot) noexcept nogil
cdef void refresh_lane_run(StoreView* view, int64_t first, int64_t size, int64_t start,
                           int64_t count) noexcept nogil
cdef int64_t lanes_claim(StoreView* view, LaneClaim* claim) noexcept nogil
cdef int64_t lanes_release(StoreView* view, int64_t lane, uint64_t token) noexcept nogil
cdef int64_t lanes_add(StoreView* view, LaneAdd* add) noexcept nogil
cdef int64_t lanes_gather(StoreView* view, const int64_t* indexes, int64_t batch,
                          uint64_t* generations, uint8_t** outputs, FrameColumn* frames,
                          int frame_count) noexcept nogil
cdef int64_t lanes_complete(StoreView* view, LaneComplete* complete) noexcept nogil
cdef int64_t lanes_live(StoreView* view, int64_t* indexes, int64_t room) noexcept nogil
