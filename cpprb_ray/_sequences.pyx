# cython: language_level=3
"""Sequences for recurrent learners: the nogil kernels of a sequence buffer (docs/sequences.md).

A sequence buffer is a laned buffer (each lane one writer's stream of steps, in order) whose
sampled unit is a sequence: `length` consecutive steps of one episode of one stream, starting at
step 0, period, 2 * period, ... of its episode. Every step is stored once, in one slot;
overlapping sequences share their steps. A sequence is named by its start (the slot of its first
step): the start's link says whether it is open (SEQ_OPEN: steps still to come, never sampled)
or committed (its count of real steps, 1 to length; the rest is padding), and the start's leaf
in the tree carries its weight; every other leaf stays 0.

Why only the start is ever evicted: a lane is written in ring order, and a sequence's start is
the first of its slots in that order, so the ring overwrites a sequence's start before any other
step of it. Evicting (leaf unset, generation moved on, link dead) the sequence that starts at a
slot about to be written is therefore enough to keep every sampled sequence whole; a late
update_priorities of it is skipped by its generation.

Crash protocol: as _lanes' add: the slots to write and the lane's head are recorded and
published (OP_ADD) before anything is evicted or written; a commit sets the leaf before the
link, so a holder killed in between leaves an open start, which the repair's undo (seq_undo_add)
kills with every sequence that has a step in the torn slots.
"""

from libc.stdint cimport int32_t, int64_t, uint8_t, uint64_t
from libc.string cimport memcpy, memset

from cpprb_ray._core cimport StoreView, generation_of, publish
from cpprb_ray._lanes cimport lane_of, lane_start, refresh_lane_run
from cpprb_ray._rules cimport leaf_weight
from cpprb_ray._segment cimport (LINK_DEAD, OP_ADD, OP_NONE, ST_CORRUPT, ST_LANE_FULL,
                                 ST_LANE_LOST, Header, Lane)
from cpprb_ray._segtree cimport unset_leaf


cdef inline int32_t* link_of(const StoreView* view, int64_t slot) noexcept nogil:
    return <int32_t*>(view.rows + slot * view.stride + view.lanes.link_offset)


cdef bint holds_sequence(const StoreView* view, int64_t slot) noexcept nogil:
    """The part's RowsPart.holds_row: a committed sequence starts at `slot`."""
    return link_of(view, slot)[0] >= 1 and not generation_of(view, slot)[0] & 1


cdef int64_t count_sequences(const StoreView* view) noexcept nogil:
    """The part's RowsPart.count_rows: committed sequences (the stored size)."""
    cdef int64_t slot, live = 0
    for slot in range(view.capacity):
        if holds_sequence(view, slot):
            live += 1
    return live


cdef void kill_start(StoreView* view, int64_t slot) noexcept nogil:
    """The sequence starting at `slot` (open or committed) is gone: never sampled again, and an
    update with the generation it was sampled at is skipped."""
    cdef uint64_t* generation = generation_of(view, slot)
    cdef int32_t* link = link_of(view, slot)
    if link[0] != SEQ_OPEN and link[0] < 1:
        return
    if link[0] >= 1 and not generation[0] & 1 and view.header.stored_size > 0:
        view.header.stored_size -= 1
    view.tree.sums[slot] = unset_leaf()
    link[0] = LINK_DEAD
    if not generation[0] & 1:
        generation[0] += 2


cdef void seq_undo_add(StoreView* view) noexcept nogil:
    """The part's RowsPart.undo_add, store_repair's undo of an add in flight: its slots torn,
    its lane's head where it was; every open sequence of the lane (its writer is dead) and every
    committed one with a step in the torn slots gone."""
    cdef Header* h = view.header
    cdef int64_t lane, first, size, k, slot, count, start, rel, link
    cdef Lane* record
    if not 1 <= h.pending_lane <= <uint64_t>view.lanes.count:
        return
    lane = <int64_t>h.pending_lane - 1
    first = lane_start(view, lane)
    size = lane_start(view, lane + 1) - first
    record = &view.lanes.records[lane]
    count = <int64_t>h.pending_count if h.pending_count <= <uint64_t>size else size
    start = <int64_t>(h.pending_start % <uint64_t>size)
    for k in range(count):
        slot = first + (start + k) % size
        kill_start(view, slot)
        view.tree.sums[slot] = unset_leaf()
        generation_of(view, slot)[0] |= 1
        link_of(view, slot)[0] = LINK_DEAD
    for rel in range(size):
        slot = first + rel
        link = link_of(view, slot)[0]
        # A committed start at `rel` covers [rel, rel + link): it has a torn step when the torn
        # run's first slot lies within that reach.
        if link == SEQ_OPEN or (link >= 1 and count > 0 and (start - rel + size) % size < link):
            kill_start(view, slot)
    record.head = h.pending_old_next % <uint64_t>size
    record.filled = h.pending_old_stored if h.pending_old_stored <= <uint64_t>size else size
    record.writes += 1        # whatever a writer kept of this lane is stale now


cdef void seq_bind(StoreView* view) noexcept nogil:
    """Make a laned `view` a sequence buffer's (its lane table bound already): the part's hooks
    in place of the lanes' (a clear is the lanes' own: every link dead, every head 0)."""
    view.part.undo_add = seq_undo_add
    view.part.holds_row = holds_sequence
    view.part.count_rows = count_sequences


cdef void commit(StoreView* view, SeqStream* s, int64_t j, int64_t valid, double eta,
                 int64_t* committed) noexcept nogil:
    """Make open sequence `j` of stream `s` sampleable with `valid` real steps: its priority
    eta * max + (1 - eta) * mean of its steps' priorities (all given), else the largest seen;
    skipped if it was evicted or cleared since it was opened. Leaf first, then link."""
    cdef Header* h = view.header
    cdef int64_t slot = s.open_slots[j]
    cdef double priority, weight
    if (link_of(view, slot)[0] != SEQ_OPEN
            or generation_of(view, slot)[0] != s.open_generations[j] or valid < 1):
        return
    if s.open_missing[j] == 0:
        priority = eta * s.open_max[j] + (1.0 - eta) * (s.open_sum[j] / valid)
    else:
        priority = h.max_priority
    if priority > h.max_priority:
        h.max_priority = priority
    weight = leaf_weight(priority, h.eps, h.alpha)
    view.tree.sums[slot] = weight if weight > 0.0 else unset_leaf()
    link_of(view, slot)[0] = <int32_t>valid
    if h.stored_size < <uint64_t>view.capacity:
        h.stored_size += 1
    h.rows_added += 1
    committed[0] += 1


cdef void commit_all(StoreView* view, SeqStream* s, double eta, int64_t* committed) noexcept nogil:
    """The episode ended: every open sequence committed with the steps it has."""
    cdef int64_t j
    for j in range(s.open_count):
        commit(view, s, j, s.position - s.open_positions[j], eta, committed)
    s.open_count = 0
    s.position = 0


cdef inline int64_t multiples(int64_t low, int64_t high, int64_t period) noexcept nogil:
    """How many multiples of `period` lie in [low, high) (low >= 0)."""
    if high <= low:
        return 0
    return (high + period - 1) // period - (low + period - 1) // period


cdef int64_t seq_commits(const SeqStream* s, int64_t count, int64_t length, int64_t period,
                         const uint8_t* ends, bint end_after) noexcept nogil:
    """The sequences an add would commit (what a rate limiter must admit first): those whose
    `length` steps it completes, and every open one of an episode it ends. An upper bound:
    a sequence evicted meanwhile is not committed."""
    cdef int64_t total = 0, i, j, position = s.position, low = s.position
    cdef bint first = True
    for i in range(count + 1):
        if i < count:
            position += 1
            if not (ends != NULL and ends[i]) and not (i == count - 1 and end_after):
                continue
        elif not (end_after and count == 0):
            # The add ends inside an episode: sequences reach their length or stay open.
            if first:
                for j in range(s.open_count):
                    total += s.open_positions[j] + length <= position
            total += multiples(low, position - length + 1, period)
            break
        # An episode ends here: every sequence of it still open commits.
        if first:
            total += s.open_count
            first = False
        total += multiples(low, position, period)
        position = 0
        low = 0
        if i == count:
            break
    return total


cdef int64_t seq_add(StoreView* view, SeqAdd* a) noexcept nogil:
    """Write `count` steps of the caller's stream to its lane, opening a sequence at every
    period-th step of an episode and committing each once its `length` steps are written or its
    episode ends; returns the first step's slot (the lane's head when `count` is 0), or
    ST_LANE_LOST (the lane is not the caller's any more), ST_LANE_FULL (more steps than the lane
    holds) or ST_CORRUPT, with nothing written."""
    cdef Header* h = view.header
    cdef Lane* lane = &view.lanes.records[a.lane]
    cdef SeqStream* s = a.stream
    cdef int64_t first = lane_start(view, a.lane)
    cdef int64_t size = lane_start(view, a.lane + 1) - first
    cdef int64_t head, i, j, c, slot, field, reach
    cdef double bound, priority
    cdef uint8_t* record
    cdef uint64_t* generation
    if lane.owner_token != a.token:
        return ST_LANE_LOST
    if lane.head >= <uint64_t>size or lane.filled > <uint64_t>size:
        return ST_CORRUPT
    if a.count > size or a.length > size:
        return ST_LANE_FULL
    if s.writes != lane.writes:
        s.open_count = 0           # the lane was cleared or repaired: its open sequences are gone
    head = <int64_t>lane.head
    a.committed = 0
    # 1. Say what we are about to do, so a repairer can undo it; the largest priority this
    #    add may commit bounds max_priority after a repair (every leaf must be within it).
    bound = h.max_priority
    for j in range(s.open_count):
        if s.open_max[j] > bound:
            bound = s.open_max[j]
    if a.priorities != NULL:
        for i in range(a.count):
            if a.priorities[i] > bound:
                bound = a.priorities[i]
    h.pending_lane = <uint64_t>a.lane + 1
    h.pending_start = <uint64_t>head
    h.pending_count = <uint64_t>a.count
    h.pending_old_next = <uint64_t>head
    h.pending_old_stored = lane.filled
    h.pending_old_rows_added = h.rows_added
    h.pending_old_max_priority = bound
    publish(&h.op, OP_ADD)
    # 2. Each step: evict the sequence its slot starts, write it, open and commit.
    for i in range(a.count):
        slot = first + (head + i) % size
        kill_start(view, slot)
        record = view.rows + slot * view.stride
        generation = <uint64_t*>record
        generation[0] = (generation[0] | 1) + 1
        for c in range(view.column_count):
            field = view.row_bytes[c]
            memcpy(record + view.columns[c], a.sources[c] + i * field, <size_t>field)
        view.tree.sums[slot] = unset_leaf()
        link_of(view, slot)[0] = LINK_DEAD
        if s.position % a.period == 0 and s.open_count < s.open_room:
            j = s.open_count
            s.open_count += 1
            s.open_slots[j] = slot
            s.open_generations[j] = generation[0]
            s.open_positions[j] = s.position
            s.open_max[j] = 0.0
            s.open_sum[j] = 0.0
            s.open_missing[j] = 0
            link_of(view, slot)[0] = SEQ_OPEN
        for j in range(s.open_count):
            if a.priorities != NULL:
                priority = a.priorities[i]
                if priority > s.open_max[j]:
                    s.open_max[j] = priority
                s.open_sum[j] += priority
            else:
                s.open_missing[j] += 1
        s.position += 1
        # The oldest open sequence is first: it is the one that reaches its length.
        while s.open_count and s.position - s.open_positions[0] >= a.length:
            commit(view, s, 0, a.length, a.eta, &a.committed)
            s.open_count -= 1
            for j in range(s.open_count):
                s.open_slots[j] = s.open_slots[j + 1]
                s.open_generations[j] = s.open_generations[j + 1]
                s.open_positions[j] = s.open_positions[j + 1]
                s.open_max[j] = s.open_max[j + 1]
                s.open_sum[j] = s.open_sum[j + 1]
                s.open_missing[j] = s.open_missing[j + 1]
        if a.ends != NULL and a.ends[i]:
            commit_all(view, s, a.eta, &a.committed)
    if a.end_after:
        commit_all(view, s, a.eta, &a.committed)
    # 3. The tree over the slots written and the starts committed (up to length - 1 before).
    reach = a.count + a.length - 1
    if reach >= size:
        refresh_lane_run(view, first, size, 0, size)
    else:
        refresh_lane_run(view, first, size, (head - (a.length - 1) + size) % size, reach)
    # 4. Commit.
    lane.head = <uint64_t>((head + a.count) % size)
    lane.filled = min(lane.filled + <uint64_t>a.count, <uint64_t>size)
    lane.writes += <uint64_t>a.count
    s.writes = lane.writes
    publish(&h.op, OP_NONE)
    return first + head


cdef int64_t seq_gather(StoreView* view, const int64_t* indexes, int64_t batch, int64_t length,
                        uint64_t* generations, uint8_t** outputs, uint8_t* mask) noexcept nogil:
    """Copy the sequences starting at `indexes` out: per store column, `length` steps each
    (zeros past a sequence's real steps), and `mask` (batch x length: 1 on real steps). Returns
    `batch`, or ST_CORRUPT for an index that starts no committed sequence."""
    cdef int64_t k, j, c, slot, valid, lane, first, size, rel, field, step, at
    cdef const uint8_t* record
    for k in range(batch):
        slot = indexes[k]
        if slot < 0 or slot >= view.capacity:
            return ST_CORRUPT
        valid = link_of(view, slot)[0]
        lane = lane_of(view, slot)
        first = lane_start(view, lane)
        size = lane_start(view, lane + 1) - first
        if not 1 <= valid <= length or valid > size:
            return ST_CORRUPT
        rel = slot - first
        generations[k] = generation_of(view, slot)[0]
        at = k * length
        for j in range(valid):
            step = first + (rel + j) % size
            record = view.rows + step * view.stride
            for c in range(view.column_count):
                field = view.row_bytes[c]
                memcpy(outputs[c] + (at + j) * field, record + view.columns[c], <size_t>field)
        if valid < length:
            for c in range(view.column_count):
                field = view.row_bytes[c]
                memset(outputs[c] + (at + valid) * field, 0, <size_t>((length - valid) * field))
        memset(mask + at, 1, <size_t>valid)
        memset(mask + at + valid, 0, <size_t>(length - valid))
    return batch


cdef int64_t seq_live(StoreView* view, int64_t* indexes, int64_t room) noexcept nogil:
    """The starts of committed sequences, in slot order (at most `room`); returns how many."""
    cdef int64_t slot, found = 0
    for slot in range(view.capacity):
        if found == room:
            break
        if holds_sequence(view, slot):
            indexes[found] = slot
            found += 1
    return found
