# cython: language_level=3
"""Lanes and frames: the nogil kernels of a laned buffer (docs/frames.md).

A laned buffer's ring is split into lanes, contiguous sub-rings under the one tree; a handle
that adds claims a lane and is its only writer until it closes or dies. So consecutive slots of
a lane hold one writer's stream, in order, and a frame column (next_of, stack_compress) needs
only one plane of a stack per slot: a row's stack is the planes of the slots before it.

Every slot has an int32 link right after its generation (link_of): a row's link is how
many slots back its obs stack ends (>= 1), a slot that only holds frames is LINK_FILLER. An add
compares each transition with what its lane already holds (the writer's cached copy of the
stack that ends the lane, keyed by the lane's write count, so a clear or a repair in between
makes it stale) and writes filler slots with the frames that are not there yet: a reset, a new
episode, anything that does not continue the stream. So every row comes back exactly as added.
Writing a slot first evicts every row that reads it (its own, and rows up to 2 * stack slots
ahead whose stacks reach back to it), so the ring moving on never hands out wrong frames.

Crash protocol: as _core's add: the slots to write and the lane's head are recorded and
published (OP_ADD, Header.pending_lane) before anything is evicted or written; _core's
store_repair (through this part's hook, lanes_undo_add) tears the recorded slots and puts the
head back.

The lanes are a part of the store (_core.RowsPart): ``lanes_bind`` gives a view the lane table
and the hooks through which the core's own kernels (repair, draw, update, clear) learn where a
laned buffer's rows are, without knowing lanes.
"""

from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.string cimport memcmp, memcpy, memset

from cpprb_ray._core cimport (MaxWeight, StoreView, generation_of, max_weight_start, publish,
                              row_weight)
from cpprb_ray._segment cimport (LINK_DEAD, LINK_FILLER, OP_ADD, OP_NONE, OP_UPDATE,
                                 ROW_INCOMPLETE, ST_CORRUPT, ST_LANE_FULL, ST_LANE_LOST, ST_NO_LANE,
                                 Header, Lane)
from cpprb_ray._prefetch cimport prefetch
from cpprb_ray._segtree cimport tree_refresh, tree_refresh_range, unset_leaf

cdef extern from *:
    """
    #if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    #define CPPRB_RAY_LITTLE_ENDIAN 1
    #else
    #define CPPRB_RAY_LITTLE_ENDIAN 0
    #endif
    /* The uint8 x 4 stack (Atari's), with restrict pointers so that gcc vectorizes the
       interleave (without them it must assume the planes and the stack overlap). */
    #if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__GLIBC__)
    /* AVX2 where the CPU has it (picked when the module loads), SSE2 elsewhere: wheels must
       run on any x86_64 (ifuncs: glibc only). Measured: a sample(32) of Atari stacks about
       15 % faster. */
    #define CPPRB_RAY_CLONES __attribute__((target_clones("avx2", "default")))
    #else
    #define CPPRB_RAY_CLONES
    #endif
    CPPRB_RAY_CLONES
    static void cpprb_ray_interleave4(uint8_t* __restrict out, const uint8_t* __restrict a,
                                      const uint8_t* __restrict b, const uint8_t* __restrict c,
                                      const uint8_t* __restrict d, int64_t pixels) {
        for (int64_t p = 0; p < pixels; p++) {
            out[4 * p] = a[p]; out[4 * p + 1] = b[p]; out[4 * p + 2] = c[p]; out[4 * p + 3] = d[p];
        }
    }
    CPPRB_RAY_CLONES
    static void cpprb_ray_extract4(uint8_t* __restrict plane, const uint8_t* __restrict stack,
                                   int64_t j, int64_t pixels) {
        for (int64_t p = 0; p < pixels; p++) plane[p] = stack[4 * p + j];
    }
    """
    bint LITTLE_ENDIAN "CPPRB_RAY_LITTLE_ENDIAN"
    void interleave4 "cpprb_ray_interleave4"(uint8_t* out, const uint8_t* a, const uint8_t* b,
                                             const uint8_t* c, const uint8_t* d,
                                             int64_t pixels) noexcept nogil
    void extract4 "cpprb_ray_extract4"(uint8_t* plane, const uint8_t* stack, int64_t j,
                                       int64_t pixels) noexcept nogil

# -- slots of lanes ----------------------------------------------------------------------------

cdef int64_t lane_start(const StoreView* view, int64_t lane) noexcept nogil:
    """First slot of `lane` (the lane count: the capacity). Lanes differ in size by one at most."""
    return lane * view.capacity // view.lanes.count


cdef int64_t lane_of(const StoreView* view, int64_t slot) noexcept nogil:
    # The largest i with i * capacity // lanes <= slot.
    return ((slot + 1) * view.lanes.count - 1) // view.capacity


cdef int32_t* link_of(const StoreView* view, int64_t slot) noexcept nogil:
    """A laned record's link: >= 1 a live row (its obs stack ends that many slots back), else
    a slot that holds only frames, was never written, or whose row is gone (_segment.pxd)."""
    return <int32_t*>(view.rows + slot * view.stride + view.lanes.link_offset)


cdef int32_t* ahead_of(const StoreView* view, int64_t slot) noexcept nogil:
    """A laned row's second int32: how many slots ahead its next stack ends (>= 0), or
    ROW_INCOMPLETE."""
    return <int32_t*>(view.rows + slot * view.stride + view.lanes.link_offset + 4)


cdef bint is_live_row(const StoreView* view, int64_t slot) noexcept nogil:
    """A complete, committed row (what sample may return and update may weigh): the lane part's
    RowsPart.holds_row."""
    return (link_of(view, slot)[0] >= 1 and ahead_of(view, slot)[0] >= 0
            and not generation_of(view, slot)[0] & 1)


cdef int64_t count_live_rows(const StoreView* view) noexcept nogil:
    """The lane part's RowsPart.count_rows: evictions move a laned buffer's stored size outside
    any add's record, so a repair counts its rows again."""
    cdef int64_t slot, live = 0
    for slot in range(view.capacity):
        if is_live_row(view, slot):
            live += 1
    return live


cdef void lanes_undo_add(StoreView* view) noexcept nogil:
    """The lane part's RowsPart.undo_add, store_repair's undo of a laned add in flight: its
    slots torn (generation odd, leaf unset, link dead) and its lane's head where it was; rows
    it had evicted stay evicted (their slots were about to be overwritten)."""
    cdef Header* h = view.header
    cdef int64_t lane, first, size, k, slot, count
    cdef Lane* record
    if not 1 <= h.pending_lane <= <uint64_t>view.lanes.count:
        return
    lane = <int64_t>h.pending_lane - 1
    first = lane_start(view, lane)
    size = lane_start(view, lane + 1) - first
    record = &view.lanes.records[lane]
    count = <int64_t>h.pending_count if h.pending_count <= <uint64_t>size else size
    for k in range(count):
        slot = first + (<int64_t>(h.pending_start % <uint64_t>size) + k) % size
        view.tree.sums[slot] = unset_leaf()
        generation_of(view, slot)[0] |= 1
        link_of(view, slot)[0] = LINK_DEAD
    record.head = h.pending_old_next % <uint64_t>size
    record.filled = h.pending_old_stored if h.pending_old_stored <= <uint64_t>size else size
    record.writes += 1        # whatever a writer cached of this lane is stale now


cdef void lanes_clear_rows(StoreView* view) noexcept nogil:
    """The lane part's RowsPart.clear_rows: a laned buffer's rows lie anywhere, so every slot's
    generation moves on and its link dies; owners keep their lanes, but what their writers
    cached of them is stale now."""
    cdef int64_t slot, lane
    cdef uint64_t* generation
    for slot in range(view.capacity):
        generation = generation_of(view, slot)
        generation[0] = (generation[0] | 1) + 1
        link_of(view, slot)[0] = LINK_DEAD
    for lane in range(view.lanes.count):
        view.lanes.records[lane].head = 0
        view.lanes.records[lane].filled = 0
        view.lanes.records[lane].writes += 1


cdef void lanes_bind(StoreView* view, Lane* records, int64_t count, int64_t link_offset,
                     int64_t rows) noexcept nogil:
    """Make `view` a laned buffer's: its lane table (`rows`: one lane's bound, 0 none), and the
    lane part's hooks in place of the ring's (the caller checked that the table lies inside the
    segment and the bound)."""
    view.lanes.records = records
    view.lanes.count = count
    view.lanes.link_offset = link_offset
    view.lanes.rows = rows
    view.part.undo_add = lanes_undo_add
    view.part.clear_rows = lanes_clear_rows
    view.part.holds_row = is_live_row
    view.part.count_rows = count_live_rows


# -- planes and stacks --------------------------------------------------------------------------

cdef void extract_plane(uint8_t* plane, const uint8_t* stack, const FrameColumn* f,
                        int64_t j) noexcept nogil:
    """plane[p] = stack[p, j] for every pixel p."""
    cdef int64_t p, item = f.item_bytes, stack_size = f.stack
    cdef int64_t pixels = f.plane_bytes // item
    if stack_size == 1:
        memcpy(plane, stack, <size_t>f.plane_bytes)
    elif item == 1 and stack_size == 4:
        extract4(plane, stack, j, pixels)
    elif item == 1:
        for p in range(pixels):
            plane[p] = stack[stack_size * p + j]
    else:
        for p in range(pixels):
            memcpy(plane + p * item, stack + (stack_size * p + j) * item, <size_t>item)


cdef void interleave(uint8_t* stack, const uint8_t** planes, const FrameColumn* f) noexcept nogil:
    """stack[p, j] = planes[j][p]: a stack out of the planes of its slots."""
    cdef int64_t p, j, item = f.item_bytes, stack_size = f.stack
    cdef int64_t pixels = f.plane_bytes // item
    cdef const uint8_t* source
    if stack_size == 1:
        memcpy(stack, planes[0], <size_t>f.plane_bytes)
    elif item == 1 and stack_size == 4:
        interleave4(stack, planes[0], planes[1], planes[2], planes[3], pixels)
    elif item == 1:
        for j in range(stack_size):
            source = planes[j]
            for p in range(pixels):
                stack[stack_size * p + j] = source[p]
    else:
        for p in range(pixels):
            for j in range(stack_size):
                memcpy(stack + (stack_size * p + j) * item, planes[j] + p * item, <size_t>item)


cdef bint shifted_equal(const uint8_t* newer, const uint8_t* older,
                        const FrameColumn* f) noexcept nogil:
    """newer[..., :-1] == older[..., 1:]: `newer` is `older` moved on by one frame."""
    cdef int64_t p, item = f.item_bytes, stack_size = f.stack
    cdef int64_t pixels = f.plane_bytes // item
    cdef int64_t keep = (stack_size - 1) * item, pixel_bytes = stack_size * item
    cdef uint32_t a, b, differ = 0
    if stack_size == 1:
        return True
    if item == 1 and stack_size == 4 and LITTLE_ENDIAN:
        # No early exit: the whole frame in one branch-free (vectorized) pass.
        for p in range(pixels):
            memcpy(&a, newer + 4 * p, 4)
            memcpy(&b, older + 4 * p, 4)
            differ |= (a & 0xFFFFFF) ^ (b >> 8)
        return differ == 0
    for p in range(pixels):
        if memcmp(newer + p * pixel_bytes, older + p * pixel_bytes + item, <size_t>keep):
            return False
    return True


# -- lanes --------------------------------------------------------------------------------------

cdef int64_t lanes_claim(StoreView* view, LaneClaim* claim) noexcept nogil:
    """Give the claimer a free lane, or one whose owner it saw dead and that nobody took since
    (the owner fields are compared, so two claimers cannot both take it); ST_NO_LANE."""
    cdef int64_t lane, entry
    cdef Lane* record = NULL
    for lane in range(view.lanes.count):
        if view.lanes.records[lane].owner_pid == 0:
            record = &view.lanes.records[lane]
            break
    if record == NULL:
        for entry in range(claim.dead_count):
            lane = <int64_t>claim.dead[4 * entry]
            if not 0 <= lane < view.lanes.count:
                continue
            if (view.lanes.records[lane].owner_pid == claim.dead[4 * entry + 1]
                    and view.lanes.records[lane].owner_start == claim.dead[4 * entry + 2]
                    and view.lanes.records[lane].owner_token == claim.dead[4 * entry + 3]):
                record = &view.lanes.records[lane]
                break
    if record == NULL:
        return ST_NO_LANE
    record.owner_pid = claim.pid
    record.owner_start = claim.start
    record.owner_token = claim.token
    record.owner_pidns = claim.pidns
    return lane


cdef int64_t lanes_release(StoreView* view, int64_t lane, uint64_t token) noexcept nogil:
    """Free `lane` if `token`'s handle still owns it; its rows stay."""
    cdef Lane* record
    if not 0 <= lane < view.lanes.count:
        return ST_CORRUPT
    record = &view.lanes.records[lane]
    if record.owner_token == token:
        record.owner_pid = 0
        record.owner_start = 0
        record.owner_token = 0
        record.owner_pidns = 0
    return 0


cdef inline void evict(StoreView* view, int64_t slot) noexcept nogil:
    cdef uint64_t* generation = generation_of(view, slot)
    cdef bint counted = is_live_row(view, slot)
    link_of(view, slot)[0] = LINK_DEAD
    view.tree.sums[slot] = unset_leaf()
    if not generation[0] & 1:
        generation[0] += 2      # an update with the generation it was sampled at skips it
    if counted and view.header.stored_size > 0:
        view.header.stored_size -= 1


cdef void refresh_lane_run(StoreView* view, int64_t first, int64_t size, int64_t start,
                           int64_t count) noexcept nogil:
    """Refresh the tree over `count` slots of a lane (its first slot `first`, `size` slots)
    from `start` on (relative to its first), wrapping round its end."""
    if start + count <= size:
        tree_refresh_range(&view.tree, first + start, count)
    else:
        tree_refresh_range(&view.tree, first + start, size - start)
        tree_refresh_range(&view.tree, first, start + count - size)


cdef void evict_oldest(StoreView* view, int64_t lane, int64_t start,
                       int64_t excess) noexcept nogil:
    """Evict `lane`'s `excess` oldest rows, walking its ring from `start` (relative to its first
    slot: the oldest) on, and refresh the tree over the slots walked: a lane bounded to N rows
    (view.lanes.rows, cpprb's size) keeps the newest N whatever slots their frames take. Their
    planes stay: later rows' stacks may still read them, until those slots are written."""
    cdef int64_t first = lane_start(view, lane)
    cdef int64_t size = lane_start(view, lane + 1) - first
    cdef int64_t k = 0, slot
    start %= size
    while excess > 0 and k < size:
        slot = first + (start + k) % size
        if is_live_row(view, slot):
            evict(view, slot)
            excess -= 1
        k += 1
    refresh_lane_run(view, first, size, start, k)


cdef void write_frames(StoreView* view, uint8_t* record, int64_t delta, int64_t back,
                       int64_t row, const LaneAdd* a) noexcept nogil:
    """The planes of the slot `delta` slots before transition `row`'s own (delta 0): of its
    next stack where that reaches, else of its obs stack (which ends `back` slots before its
    own), else zeros (a filler slot that this column's stacks do not reach)."""
    cdef int c
    cdef int64_t stack_size, stack_bytes
    cdef const FrameColumn* f
    cdef uint8_t* plane
    for c in range(a.frame_count):
        f = &a.frames[c]
        plane = record + view.columns[f.column]
        stack_size = f.stack
        stack_bytes = stack_size * f.plane_bytes
        if f.has_next:
            if delta <= stack_size - 1:
                extract_plane(plane, f.nexts + row * stack_bytes, f, stack_size - 1 - delta)
            elif back <= delta <= back + stack_size - 1:
                extract_plane(plane, f.values + row * stack_bytes, f,
                              stack_size - 1 - (delta - back))
            else:
                memset(plane, 0, <size_t>f.plane_bytes)
        elif delta <= stack_size - 1:
            extract_plane(plane, f.values + row * stack_bytes, f, stack_size - 1 - delta)
        else:
            memset(plane, 0, <size_t>f.plane_bytes)


cdef int64_t lanes_add(StoreView* view, LaneAdd* a) noexcept nogil:
    """Add `count` transitions to the caller's lane; returns the first transition's slot, or
    ST_LANE_LOST (the lane is not the caller's any more) or ST_LANE_FULL (they need more slots
    than the lane has), with nothing written."""
    cdef Header* h = view.header
    cdef Lane* lane = &view.lanes.records[a.lane]
    cdef int64_t first = lane_start(view, a.lane)
    cdef int64_t size = lane_start(view, a.lane + 1) - first
    cdef int64_t stack_max = 1, row, c, total = 0, fillers, back, k, delta, slot, reach
    cdef int64_t head, stack_bytes, distance, link, column, field
    cdef uint64_t frame_mask = 0
    cdef bint match, shift
    cdef const uint8_t* previous
    cdef const uint8_t* value
    cdef const FrameColumn* f
    cdef uint8_t* record
    cdef uint64_t* generation
    cdef double weight, max_priority = h.max_priority
    cdef MaxWeight seen
    cdef bint cached
    if lane.owner_token != a.token:
        return ST_LANE_LOST
    if lane.head >= <uint64_t>size or lane.filled > <uint64_t>size:
        return ST_CORRUPT
    head = <int64_t>lane.head
    cached = a.cache_writes[0] != 0 and a.cache_writes[0] == lane.writes
    for c in range(a.frame_count):
        stack_max = max(stack_max, a.frames[c].stack)
        frame_mask |= (<uint64_t>1) << a.frames[c].column
    # 1. Plan: how many filler slots each transition needs, and where its obs stack ends.
    for row in range(a.count):
        fillers = 0
        back = 1
        if a.frame_count:
            match = True
            shift = True
            for c in range(a.frame_count):
                f = &a.frames[c]
                stack_bytes = f.stack * f.plane_bytes
                value = f.values + row * stack_bytes
                if row == 0:
                    previous = f.cache if cached else NULL
                else:
                    previous = (f.nexts if f.has_next else f.values) + (row - 1) * stack_bytes
                if previous == NULL:
                    match = False
                elif f.has_next:
                    if memcmp(value, previous, <size_t>stack_bytes):
                        match = False
                elif not shifted_equal(value, previous, f):
                    match = False
                if f.has_next and not shifted_equal(f.nexts + row * stack_bytes, value, f):
                    shift = False
            fillers = (0 if match else stack_max) + (0 if shift else stack_max - 1)
            back = 1 if shift else stack_max
        a.plan[2 * row] = <int32_t>fillers
        a.plan[2 * row + 1] = <int32_t>back
        total += fillers + 1
    if total > size:
        return ST_LANE_FULL
    # 2. Say what we are about to do, so a repairer can undo it.
    h.pending_lane = <uint64_t>a.lane + 1
    h.pending_start = <uint64_t>head
    h.pending_count = <uint64_t>total
    h.pending_old_next = <uint64_t>head
    h.pending_old_stored = lane.filled
    h.pending_old_rows_added = h.rows_added
    h.pending_old_max_priority = h.max_priority
    publish(&h.op, OP_ADD)
    # 3. Evict every row that reads a slot about to be written: rows in those slots, and rows
    #    just past them whose stacks reach back into them (a row reaches back its link plus
    #    stack - 1 slots).
    reach = min(total + 2 * stack_max, size)
    for k in range(reach):
        if lane.filled < <uint64_t>size and <uint64_t>((head + k) % size) >= lane.filled:
            # Not written since the lane was made or cleared: no row. Not even read: on the
            # first lap a read would fault the page in read-only, and the write a moment
            # later would fault it again.
            continue
        slot = first + (head + k) % size
        link = link_of(view, slot)[0]
        if link < 1:
            continue
        if k >= total:
            distance = k - (total - 1)
            if not a.frame_count or distance > link + stack_max - 1:
                continue
        evict(view, slot)
    # A lane bounded to N rows: the oldest rows past the slots written make room for these.
    if view.lanes.rows > 0 and not a.incomplete and (
            <int64_t>h.stored_size + a.count > view.lanes.rows):
        evict_oldest(view, a.lane, head + total,
                     <int64_t>h.stored_size + a.count - view.lanes.rows)
    # 4. Write: each transition's fillers, then its own slot.
    max_weight_start(&seen, h)
    k = 0
    for row in range(a.count):
        fillers = a.plan[2 * row]
        back = a.plan[2 * row + 1]
        for delta in range(fillers, -1, -1):
            slot = first + (head + k) % size
            record = view.rows + slot * view.stride
            generation = <uint64_t*>record
            generation[0] = (generation[0] | 1) + 1
            for column in range(view.column_count):
                if frame_mask >> column & 1:
                    continue
                field = view.row_bytes[column]
                if delta == 0:
                    memcpy(record + view.columns[column], a.sources[column] + row * field,
                           <size_t>field)
                else:
                    memset(record + view.columns[column], 0, <size_t>field)
            write_frames(view, record, delta, back, row, a)
            ahead_of(view, slot)[0] = ROW_INCOMPLETE if a.incomplete and delta == 0 else 0
            if delta == 0:
                link_of(view, slot)[0] = <int32_t>back
                weight = row_weight(a.weights, a.priorities, row, h, &seen)
                view.tree.sums[slot] = (weight if weight > 0.0 and not a.incomplete
                                        else unset_leaf())
                if a.out_slots != NULL:
                    a.out_slots[row] = slot
                    a.out_generations[row] = generation[0]
            else:
                link_of(view, slot)[0] = LINK_FILLER
                view.tree.sums[slot] = unset_leaf()
            k += 1
    # 5. Commit.
    refresh_lane_run(view, first, size, head, reach)
    if a.priorities != NULL:
        for row in range(a.count):
            if a.priorities[row] > max_priority:
                max_priority = a.priorities[row]
        h.max_priority = max_priority
    for c in range(a.frame_count):
        f = &a.frames[c]
        stack_bytes = f.stack * f.plane_bytes
        memcpy(f.cache, (f.nexts if f.has_next else f.values) + (a.count - 1) * stack_bytes,
               <size_t>stack_bytes)
    lane.head = <uint64_t>((head + total) % size)
    lane.filled = min(lane.filled + <uint64_t>total, <uint64_t>size)
    lane.writes += <uint64_t>total
    a.cache_writes[0] = lane.writes
    if not a.incomplete:
        h.stored_size = min(h.stored_size + <uint64_t>a.count, <uint64_t>view.capacity)
        h.rows_added += <uint64_t>a.count
    publish(&h.op, OP_NONE)
    return first + (head + a.plan[0]) % size


cdef int64_t lanes_complete(StoreView* view, LaneComplete* a) noexcept nogil:
    """Complete N-step rows: their n-step columns, where their next stacks end, their leaves.
    A row (or its window's last step) that is not what the writer saw (overwritten, torn,
    cleared, already complete) is skipped. Returns how many were completed.

    Columns, then the second link, then the leaf: a holder killed in between leaves a row that
    is incomplete (never sampled) or complete and exact; the repair rebuilds the tree."""
    cdef Header* h = view.header
    cdef int64_t k, slot, last, lane, first, size, column, field, ahead, done = 0
    cdef double weight, max_priority = h.max_priority
    cdef MaxWeight seen
    cdef uint8_t* record
    max_weight_start(&seen, h)
    publish(&h.op, OP_UPDATE)
    for k in range(a.count):
        slot = a.slots[k]
        last = a.last_slots[k]
        if not (0 <= slot < view.capacity and 0 <= last < view.capacity):
            continue
        lane = lane_of(view, slot)
        if lane_of(view, last) != lane:
            continue
        if (generation_of(view, slot)[0] != a.generations[k] or link_of(view, slot)[0] < 1
                or ahead_of(view, slot)[0] != ROW_INCOMPLETE
                or generation_of(view, last)[0] != a.last_generations[k]
                or link_of(view, last)[0] < 1):
            continue
        first = lane_start(view, lane)
        size = lane_start(view, lane + 1) - first
        ahead = (last - slot + size) % size
        if ahead > size // 2:
            continue
        record = view.rows + slot * view.stride
        for column in range(view.column_count):
            if a.sources[column] != NULL:
                field = view.row_bytes[column]
                memcpy(record + view.columns[column], a.sources[column] + k * field,
                       <size_t>field)
        ahead_of(view, slot)[0] = <int32_t>ahead
        weight = row_weight(a.weights, a.priorities, k, h, &seen)
        if a.priorities != NULL and a.priorities[k] > max_priority:
            max_priority = a.priorities[k]     # (a NaN, a row without one, is never larger)
        view.tree.sums[slot] = weight if weight > 0.0 else unset_leaf()
        done += 1
    tree_refresh(&view.tree, a.slots, a.count)   # (bounded: slots outside were skipped above)
    h.max_priority = max_priority
    h.stored_size = min(h.stored_size + <uint64_t>done, <uint64_t>view.capacity)
    h.rows_added += <uint64_t>done
    if view.lanes.rows > 0 and <int64_t>h.stored_size > view.lanes.rows:
        # A bounded lane (one): the rows just completed are its newest; the oldest make room.
        evict_oldest(view, 0, <int64_t>view.lanes.records[0].head,
                     <int64_t>h.stored_size - view.lanes.rows)
    publish(&h.op, OP_NONE)
    return done


cdef void prefetch_stacks(StoreView* view, int64_t slot, FrameColumn* frames,
                          int frame_count, int64_t stack_max) noexcept nogil:
    """Ask for every line of the planes a row's stacks read (a sampled row's planes are a few
    random 7 KB blocks: a row ahead, their misses overlap the copy of the row before)."""
    cdef int64_t link, ahead, lane, first, size, rel, start, stop, j, line, c
    cdef const uint8_t* plane
    if slot < 0 or slot >= view.capacity:
        return
    link = link_of(view, slot)[0]
    ahead = ahead_of(view, slot)[0]
    lane = lane_of(view, slot)
    first = lane_start(view, lane)
    size = lane_start(view, lane + 1) - first
    if link < 1 or link > stack_max or not 0 <= ahead <= size // 2:
        return
    rel = slot - first
    for c in range(frame_count):
        # The planes from the obs stack's first to the next stack's last (one run of slots).
        if frames[c].has_next:
            start = rel - link - frames[c].stack + 1
            stop = rel + ahead
        else:
            start = rel - frames[c].stack + 1
            stop = rel
        for j in range(start, stop + 1):
            plane = (view.rows + (first + (j + 2 * size) % size) * view.stride
                     + view.columns[frames[c].column])
            for line in range(0, frames[c].plane_bytes, 64):
                prefetch(plane + line)


cdef int64_t lanes_gather(StoreView* view, const int64_t* indexes, int64_t batch,
                          uint64_t* generations, uint8_t** outputs, FrameColumn* frames,
                          int frame_count) noexcept nogil:
    """Copy rows `indexes` out: plain columns into `outputs` (by store column), stacks into
    each frame column's out_values / out_nexts. Returns `batch`, or ST_CORRUPT for an index
    that is not a live row or a link no add writes."""
    cdef const uint8_t* planes[MAX_STACK]
    cdef int64_t k, slot, link, ahead, lane, first, size, rel, j, c, column, field, stack_size
    cdef int64_t stack_max = 1, stack_bytes
    cdef uint64_t frame_mask = 0
    cdef const uint8_t* record
    cdef FrameColumn* f
    for c in range(frame_count):
        stack_max = max(stack_max, frames[c].stack)
        frame_mask |= (<uint64_t>1) << frames[c].column
    if batch and frame_count:
        prefetch_stacks(view, indexes[0], frames, frame_count, stack_max)
    for k in range(batch):
        slot = indexes[k]
        if slot < 0 or slot >= view.capacity:
            return ST_CORRUPT
        if k + 1 < batch and frame_count:
            prefetch_stacks(view, indexes[k + 1], frames, frame_count, stack_max)
        link = link_of(view, slot)[0]
        ahead = ahead_of(view, slot)[0]
        if link < 1 or link > stack_max:
            return ST_CORRUPT
        lane = lane_of(view, slot)
        first = lane_start(view, lane)
        size = lane_start(view, lane + 1) - first
        if not 0 <= ahead <= size // 2:
            return ST_CORRUPT
        rel = slot - first
        record = view.rows + slot * view.stride
        generations[k] = (<const uint64_t*>record)[0]
        for column in range(view.column_count):
            if frame_mask >> column & 1:
                continue
            field = view.row_bytes[column]
            memcpy(outputs[column] + k * field, record + view.columns[column], <size_t>field)
        for c in range(frame_count):
            f = &frames[c]
            stack_size = f.stack
            stack_bytes = stack_size * f.plane_bytes
            if f.has_next:
                for j in range(stack_size):   # the next stack ends `ahead` slots on
                    planes[j] = (view.rows
                                 + (first + (rel + ahead - (stack_size - 1 - j) + size) % size)
                                 * view.stride + view.columns[f.column])
                interleave(f.out_nexts + k * stack_bytes, planes, f)
                for j in range(stack_size):   # the obs stack ends `link` slots back
                    planes[j] = (view.rows
                                 + (first + (rel - link - (stack_size - 1 - j) + 2 * size) % size)
                                 * view.stride + view.columns[f.column])
            else:
                for j in range(stack_size):   # a stack of its own: it ends in the row's slot
                    planes[j] = (view.rows + (first + (rel - (stack_size - 1 - j) + size) % size)
                                 * view.stride + view.columns[f.column])
            interleave(f.out_values + k * stack_bytes, planes, f)
    return batch


cdef int64_t lanes_live(StoreView* view, int64_t* indexes, int64_t room) noexcept nogil:
    """The slots of live rows, in slot order (at most `room`); returns how many."""
    cdef int64_t slot, found = 0
    for slot in range(view.capacity):
        if found == room:
            break
        if is_live_row(view, slot):
            indexes[found] = slot
            found += 1
    return found
