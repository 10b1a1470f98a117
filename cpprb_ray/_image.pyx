# cython: language_level=3
"""Checkpoint images of a store: its whole state copied out as one consistent snapshot, and a
store's state replaced by such a copy, each through the store's driver under the segment's
lock. The checkpoint file format around them is :mod:`cpprb_ray.checkpoint`'s.

Two image parts: the ring's (:class:`StoreImage`: the stored slots' records, the generations
past them, the stored leaves) and the lanes' (:class:`LaneImage`: a laned buffer's rows lie
anywhere in its slots, so every record, every leaf and the lane table, its owners cleared).
"""

from libc.stdint cimport int64_t, uint8_t, uint64_t
from libc.string cimport memcmp, memcpy

from cpprb_ray._core cimport StoreView, publish, store_dump, store_restore
from cpprb_ray._limiter cimport SIDE_NONE, SIDE_RESET, Limiter
from cpprb_ray._prefetch cimport prefetch
from cpprb_ray._segment cimport HEADER_BYTES, OP_CLEAR, OP_NONE, Header, Lane
from cpprb_ray._segtree cimport tree_clear_all, tree_rebuild
from cpprb_ray._store cimport ReplayStore, limiter_state
from cpprb_ray._sync cimport mutex_contended, mutex_hand_over

import numpy as np

from cpprb_ray._segment import read_header


cdef struct DumpArguments:
    Header* header
    Limiter limiter               # the rate limiter record, copied under the same lock
    uint8_t* rows
    uint64_t* tail_generations
    double* leaves

# A save's copy of the rows in chunks, each under its own hold of the lock (at 2**20 rows of
# 512 bytes, one hold of the whole copy kept every other call waiting 0.6 s), then a last short
# hold that copies again the slots written meanwhile, the leaves and the header.
cdef enum:
    DUMP_CHUNK_BYTES = 4 << 20     # rows copied per hold (about a millisecond)
    DUMP_FINAL_BYTES = 8 << 20     # slots written meanwhile that the last hold copies at most
    DUMP_ATTEMPTS = 4              # starts before one hold copies everything

# After a chunk whose hold kept another call waiting, how long the save yields for that call to
# take the lock (it needs a few microseconds to wake) before it locks for the next chunk.
cdef double DUMP_HAND_OVER_S = 0.001

cdef int64_t DUMP_CHANGED = 1 << 62    # a clear or a repair came between: start again
cdef int64_t DUMP_AGAIN = (1 << 62) + 1  # caught up with writers; another hold finishes

cdef struct DumpProgress:
    uint64_t rows_added           # the header's rows_added when the copy was last up to date
    uint64_t next_index           # and its next_index: the slots written since follow it
    uint64_t insert_base          # the limiter's bases and the repairs then: any change means
    uint64_t sample_base          # a clear or a repair came between
    uint64_t repairs
    int64_t stored                # slots [0, stored) are the rows the chunks copy
    int64_t copied                # of which [0, copied) are copied
    uint8_t* rows                 # the copy: `capacity` records
    bint contended                # another call waited for the last chunk's hold

cdef struct DumpFinish:
    DumpProgress* progress
    Header* header
    Limiter limiter
    uint64_t* tail_generations
    double* leaves
    bint force                    # finish whatever was written meanwhile

cdef struct RestoreArguments:
    const uint8_t* rows
    int64_t stored
    const uint64_t* tail_generations
    int64_t tail_count
    const double* leaves
    uint64_t next_index
    double max_priority
    uint64_t rows_added
    uint64_t limiter_inserts
    uint64_t limiter_samples


cdef int64_t dump_kernel(StoreView* view, void* arguments) noexcept nogil:
    cdef DumpArguments* a = <DumpArguments*>arguments
    a.limiter = view.limiter[0]
    return store_dump(view, a.header, a.rows, a.tail_generations, a.leaves)

cdef int64_t dump_start_kernel(StoreView* view, void* arguments) noexcept nogil:
    cdef DumpProgress* p = <DumpProgress*>arguments
    p.rows_added = view.header.rows_added
    p.next_index = view.header.next_index
    p.insert_base = view.limiter.insert_base
    p.sample_base = view.limiter.sample_base
    p.repairs = view.header.repairs
    p.stored = <int64_t>view.header.stored_size
    p.copied = 0
    return 0

cdef bint dump_changed(StoreView* view, DumpProgress* p) noexcept nogil:
    """Whether the buffer moved since `p` otherwise than by adds that follow its next index: a
    clear (the limiter's bases move), a repair, rows_added that went back or past the
    capacity, a next index or stored size that those adds do not give."""
    cdef Header* h = view.header
    cdef uint64_t delta = h.rows_added - p.rows_added
    cdef uint64_t capacity = <uint64_t>view.capacity
    return (view.limiter.insert_base != p.insert_base
            or view.limiter.sample_base != p.sample_base or h.repairs != p.repairs
            or h.rows_added < p.rows_added or delta >= capacity
            or h.next_index != (p.next_index + delta) % capacity
            or h.stored_size != min(<uint64_t>p.stored + delta, capacity))

cdef inline void hand_over(ReplayStore store, bint contended) noexcept:
    if contended:
        with nogil:
            mutex_hand_over(store.view.mutex, DUMP_HAND_OVER_S)


cdef int64_t dump_chunk_kernel(StoreView* view, void* arguments) noexcept nogil:
    """Copy the next DUMP_CHUNK_BYTES of the rows [copied, stored); returns the slots copied,
    or DUMP_CHANGED."""
    cdef DumpProgress* p = <DumpProgress*>arguments
    cdef int64_t count = min(p.stored - p.copied, max(1, DUMP_CHUNK_BYTES // view.stride))
    if dump_changed(view, p):
        return DUMP_CHANGED
    memcpy(p.rows + p.copied * view.stride, view.rows + p.copied * view.stride,
           <size_t>(count * view.stride))
    p.copied += count
    p.contended = mutex_contended(view.mutex)
    return count

cdef void dump_ring(StoreView* view, uint8_t* rows, uint64_t start, uint64_t count) noexcept nogil:
    """Copy the records of the `count` slots from `start` on, around the ring: what adds wrote
    since a copy whose next index was `start`."""
    cdef uint64_t capacity = <uint64_t>view.capacity
    cdef uint64_t first = min(count, capacity - start)
    memcpy(rows + start * view.stride, view.rows + start * view.stride,
           <size_t>(first * view.stride))
    memcpy(rows, view.rows, <size_t>((count - first) * view.stride))

cdef int64_t dump_finish_kernel(StoreView* view, void* arguments) noexcept nogil:
    """The last hold: the slots written since the copy was up to date, the header, the limiter,
    the tail's generations and the leaves; returns the stored size. When more was written
    than DUMP_FINAL_BYTES (and not `force`), copies that much only, moves the baseline and
    returns DUMP_AGAIN: another hold finishes, with less to copy."""
    cdef DumpFinish* a = <DumpFinish*>arguments
    cdef DumpProgress* p = a.progress
    cdef Header* h = view.header
    cdef uint64_t delta = h.rows_added - p.rows_added
    cdef int64_t stored, slot
    if dump_changed(view, p):
        return DUMP_CHANGED
    dump_ring(view, p.rows, p.next_index, delta)
    if not a.force and delta * <uint64_t>view.stride > DUMP_FINAL_BYTES:
        p.rows_added = h.rows_added
        p.next_index = h.next_index
        p.stored = <int64_t>h.stored_size
        return DUMP_AGAIN
    memcpy(a.header, h, sizeof(Header))
    a.limiter = view.limiter[0]
    stored = <int64_t>h.stored_size
    for slot in range(stored, view.capacity):
        a.tail_generations[slot - stored] = (<uint64_t*>(view.rows + slot * view.stride))[0]
    if view.prioritized:
        memcpy(a.leaves, view.tree.sums, <size_t>stored * sizeof(double))
    return stored

cdef int64_t restore_kernel(StoreView* view, void* arguments) noexcept nogil:
    cdef RestoreArguments* a = <RestoreArguments*>arguments
    store_restore(view, a.rows, a.stored, a.tail_generations, a.tail_count, a.leaves,
                  a.next_index, a.max_priority, a.rows_added, a.limiter_inserts,
                  a.limiter_samples)
    return 0


def dump(ReplayStore store):
    """dump(store) -> (header dict, rows, tail_generations, leaves): the whole state as ONE
    consistent snapshot (a checkpoint's payload), copied without holding the lock long: the
    rows in chunks of 4 MiB, each under its own hold, then in a last short hold the slots
    written meanwhile (adds follow the ring from the next index the copy started at), the
    leaves and the header, so that other processes' calls wait a chunk's copy at most. A clear
    or a repair in between starts it again; after DUMP_ATTEMPTS - 1 starts (writers that
    outpace it), one hold copies everything.

    `rows` (uint8) holds the stored slots' records as they lie in the segment, generation
    first; `tail_generations` (uint64) the generations of the slots past them; `leaves`
    (float64) the stored slots' leaf weights, bit for bit (-0.0: unset), empty when uniform.
    The header dict also says how many times the copy took the lock ("lock_holds").

    Examples
    --------
    >>> from cpprb_ray import PrioritizedReplayBuffer, _image
    >>> with PrioritizedReplayBuffer(4, {"obs": {}}, alpha=1.0, eps=0.0) as rb:
    ...     _ = rb.add(obs=[1.0, 2.0], priorities=[3.0, 0.0])
    ...     header, rows, tail, leaves = _image.dump(rb._store)
    >>> header["stored_size"], rows.nbytes, tail.tolist(), leaves.tolist()
    (2, 32, [0, 0], [3.0, -0.0])
    """
    cdef DumpArguments arguments
    cdef DumpProgress progress
    cdef DumpFinish finish
    cdef uint8_t[::1] rows_view
    cdef uint64_t[::1] tail_view
    cdef double[::1] leaves_view
    cdef int64_t capacity = store.view.capacity, stored = 0, result
    cdef int attempt, catch, holds = 0
    cdef Limiter* limiter = &arguments.limiter
    cdef bint prioritized = store.view.prioritized
    header = bytearray(HEADER_BYTES)
    cdef uint8_t[::1] header_view = header
    store.enter()
    try:
        # Sized for a full buffer: writers may add between now and the lock. Pages that the
        # copy does not reach are never touched, so a sparse buffer costs no more memory.
        rows = np.empty(capacity * store.view.stride, dtype=np.uint8)
        tail = np.empty(capacity, dtype=np.uint64)
        leaves = np.empty(capacity if prioritized else 1, dtype=np.float64)
        # Fault in the pages the copy will (at least) fill before taking the lock, one
        # write per page: the copy under the lock is then a memcpy, not 4 KiB page faults
        # (at 2**20 rows of 64 bytes, 40 ms of lock held became about 15).
        stored = store.view.header.stored_size
        rows[:stored * store.view.stride:4096] = 0
        leaves[:stored if prioritized else 0:512] = 0
        rows_view = rows
        tail_view = tail
        leaves_view = leaves
        progress.rows = &rows_view[0]
        finish.progress = &progress
        finish.header = <Header*>&header_view[0]
        finish.tail_generations = &tail_view[0]
        finish.leaves = &leaves_view[0]
        for attempt in range(DUMP_ATTEMPTS):
            if attempt == DUMP_ATTEMPTS - 1:
                arguments.header = <Header*>&header_view[0]
                arguments.rows = &rows_view[0]
                arguments.tail_generations = &tail_view[0]
                arguments.leaves = &leaves_view[0]
                holds += 1
                stored = store.run(dump_kernel, &arguments, SIDE_NONE, 0, 0.0)
                break
            holds += 1
            store.run(dump_start_kernel, &progress, SIDE_NONE, 0, 0.0)
            result = 0
            while progress.copied < progress.stored:
                holds += 1
                result = store.run(dump_chunk_kernel, &progress, SIDE_NONE, 0, 0.0)
                if result == DUMP_CHANGED:
                    break
                hand_over(store, progress.contended)
            if result == DUMP_CHANGED:
                continue
            for catch in range(8):  # catch up with the writers, then finish what is left
                finish.force = catch == 7
                holds += 1
                result = store.run(dump_finish_kernel, &finish, SIDE_NONE, 0, 0.0)
                if result != DUMP_AGAIN:
                    break
            if result != DUMP_CHANGED:
                stored = result
                limiter = &finish.limiter
                break
        fields = read_header(header)
        # The rate limiter (None without one): parameters and counts of the same moment.
        fields["rate_limiter"] = limiter_state(<Header*>&header_view[0], limiter)
        fields["lock_holds"] = holds       # how many times the copy took the lock
        return (fields, rows[:stored * store.view.stride],
                tail[:capacity - stored], leaves[:stored if prioritized else 0])
    finally:
        store.leave()


def restore(ReplayStore store, rows, tail_generations, leaves, next_index, max_priority, rows_added,
            limiter_inserts=0, limiter_samples=0):
    """Replace the whole state by a dump()'s, in one GIL-free call under the lock; the rate
    limiter's counts (if it has one) become `limiter_inserts` and `limiter_samples`.

    The caller (:mod:`cpprb_ray.checkpoint`) validates the dump against this buffer's
    layout first; here only the sizes are checked, so that no copy leaves its memory.

    Examples
    --------
    >>> from cpprb_ray import ReplayBuffer, _image
    >>> with ReplayBuffer(4, {"obs": {}}) as rb, ReplayBuffer(4, {"obs": {}}) as copy:
    ...     _ = rb.add(obs=[1.0, 2.0, 3.0])
    ...     header, rows, tail, leaves = _image.dump(rb._store)
    ...     _image.restore(copy._store, rows, tail, leaves, header["next_index"],
    ...                         header["max_priority"], header["rows_added"])
    ...     print(copy.get_all_transitions()["obs"].ravel(), copy.get_next_index())
    [1. 2. 3.] 3
    """
    cdef RestoreArguments arguments
    cdef const uint8_t[::1] rows_view = rows
    cdef const uint64_t[::1] tail_view = tail_generations
    cdef const double[::1] leaves_view = leaves
    cdef int64_t capacity = store.view.capacity, stored
    if rows_view.shape[0] % store.view.stride:
        raise ValueError(f"rows must be whole records of {store.view.stride} bytes; got "
                         f"{rows_view.shape[0]} bytes")
    stored = rows_view.shape[0] // store.view.stride
    if stored > capacity or tail_view.shape[0] > capacity - stored:
        raise ValueError(f"{stored} rows and {tail_view.shape[0]} more generations do not "
                         f"fit {capacity} slots")
    if leaves_view.shape[0] != (stored if store.view.prioritized else 0):
        raise ValueError(f"leaves must have one entry per stored row ({stored}) in a "
                         f"prioritized buffer, none in a uniform one; got "
                         f"{leaves_view.shape[0]}")
    if not 0 <= next_index < capacity or (stored < capacity and next_index != stored):
        raise ValueError(f"next_index {next_index} does not fit {stored} stored rows of "
                         f"{capacity}")
    if not (max_priority >= 0.0 and max_priority < float("inf")):
        raise ValueError(f"max_priority must be finite and >= 0; got {max_priority}")
    arguments.rows = &rows_view[0] if stored else NULL
    arguments.stored = stored
    arguments.tail_generations = &tail_view[0] if tail_view.shape[0] else NULL
    arguments.tail_count = tail_view.shape[0]
    arguments.leaves = &leaves_view[0] if leaves_view.shape[0] else NULL
    arguments.next_index = next_index
    arguments.max_priority = max_priority
    arguments.rows_added = rows_added
    arguments.limiter_inserts = limiter_inserts
    arguments.limiter_samples = limiter_samples
    store.enter()
    try:
        # Like a clear, a restore moves the limiter's counts: wake both sides to look.
        store.run(restore_kernel, &arguments, SIDE_RESET, 0, 0.0)
    finally:
        store.leave()


# -- a laned buffer's image ------------------------------------------------------------------------
#
# A laned buffer's rows lie anywhere in its slots (each writer's in its own lane, with filler
# slots between them that hold frames only), so its image is every record, every leaf and the
# lane table. The records are copied in chunks as the ring's are, each under its own hold; then
# a last hold compares each slot's generation and links with the copy's and copies again every
# record that moved meanwhile. Every change of a record moves them for good within one dump: a
# write moves the generation on (it only grows), an eviction kills the link (only a write makes
# it live again), an N-step completion sets the second link (only a write makes it incomplete
# again), a clear or a repair's undo moves or tears the generation. So a record whose three
# fields are as copied is the record the segment holds.

cdef struct LaneDump:
    uint8_t* rows                 # the copy: `capacity` records
    int64_t copied                # records [0, copied) copied
    Header* header
    Limiter limiter
    double* leaves                # `capacity` leaves
    Lane* lanes                   # the lane table, its owners cleared
    int64_t moved                 # records the last holds copied again
    bint force                    # copy again whatever moved, however much
    bint contended                # another call waited for the last chunk's hold


cdef int64_t lane_dump_chunk_kernel(StoreView* view, void* arguments) noexcept nogil:
    """Copy the next DUMP_CHUNK_BYTES of the records; returns the slots copied."""
    cdef LaneDump* a = <LaneDump*>arguments
    cdef int64_t count = min(view.capacity - a.copied, max(1, DUMP_CHUNK_BYTES // view.stride))
    memcpy(a.rows + a.copied * view.stride, view.rows + a.copied * view.stride,
           <size_t>(count * view.stride))
    a.copied += count
    a.contended = mutex_contended(view.mutex)
    return count


cdef int64_t lane_dump_finish_kernel(StoreView* view, void* arguments) noexcept nogil:
    """The last hold: every record whose generation or links moved since it was copied, copied
    again; then the header, the limiter, the leaves and the lane table (its owners cleared: a
    loaded buffer has no writers). When the records that moved come to more than
    DUMP_FINAL_BYTES (and not `force`), copies that much and returns DUMP_AGAIN: another hold
    finishes, with less to copy. Returns the stored size."""
    cdef LaneDump* a = <LaneDump*>arguments
    cdef int64_t slot, stride = view.stride, moved = 0, lane
    cdef size_t marks = <size_t>(view.lanes.link_offset + 8)   # the generation and the links
    cdef uint8_t* copy
    cdef const uint8_t* record
    for slot in range(view.capacity):
        if slot + 8 < view.capacity:
            prefetch(view.rows + (slot + 8) * stride)
            prefetch(a.rows + (slot + 8) * stride)
        record = view.rows + slot * stride
        copy = a.rows + slot * stride
        if memcmp(copy, record, marks) == 0:
            continue
        if not a.force and moved * stride >= DUMP_FINAL_BYTES:
            return DUMP_AGAIN
        memcpy(copy, record, <size_t>stride)
        moved += 1
        a.moved += 1
    memcpy(a.header, view.header, sizeof(Header))
    a.limiter = view.limiter[0]
    memcpy(a.leaves, view.tree.sums, <size_t>view.capacity * sizeof(double))
    memcpy(a.lanes, view.lanes.records, <size_t>view.lanes.count * sizeof(Lane))
    for lane in range(view.lanes.count):
        a.lanes[lane].owner_pid = 0
        a.lanes[lane].owner_start = 0
        a.lanes[lane].owner_token = 0
        a.lanes[lane].owner_pidns = 0
        a.lanes[lane].spare = 0
    return <int64_t>view.header.stored_size


cdef struct LaneRestore:
    const uint8_t* rows           # `capacity` records
    const double* leaves          # `capacity` leaves
    const Lane* lanes             # the lane table
    uint64_t next_index
    double max_priority
    uint64_t rows_added
    uint64_t limiter_inserts
    uint64_t limiter_samples


cdef int64_t lane_restore_kernel(StoreView* view, void* arguments) noexcept nogil:
    """Replace a laned buffer's state by a dump_lanes() image (validated by the caller): every
    record, every leaf, each lane's head, fill and write count, with no owner; the stored size
    is counted again from the records (the lane part's count_rows). Returns the stored size.

    Marked as a clear while it writes, as store_restore is: a loader killed half-way leaves a
    buffer that the next locker's repair empties."""
    cdef LaneRestore* a = <LaneRestore*>arguments
    cdef Header* h = view.header
    cdef int64_t lane
    publish(&h.op, OP_CLEAR)
    memcpy(view.rows, a.rows, <size_t>(view.capacity * view.stride))
    for lane in range(view.lanes.count):
        view.lanes.records[lane].owner_pid = 0
        view.lanes.records[lane].owner_start = 0
        view.lanes.records[lane].owner_token = 0
        view.lanes.records[lane].owner_pidns = 0
        view.lanes.records[lane].head = a.lanes[lane].head
        view.lanes.records[lane].filled = a.lanes[lane].filled
        view.lanes.records[lane].writes = a.lanes[lane].writes
        view.lanes.records[lane].spare = 0
    tree_clear_all(&view.tree)
    memcpy(view.tree.sums, a.leaves, <size_t>view.capacity * sizeof(double))
    tree_rebuild(&view.tree)
    h.next_index = a.next_index
    h.stored_size = <uint64_t>view.part.count_rows(view)
    h.pending_lane = 0
    h.max_priority = a.max_priority
    h.rows_added = a.rows_added
    view.limiter.insert_base = a.rows_added - a.limiter_inserts
    view.limiter.sample_base = h.rows_sampled - a.limiter_samples
    publish(&h.op, OP_NONE)
    return <int64_t>h.stored_size


cdef int check_laned(ReplayStore store) except -1:
    # The lane part binds its table to the view when a handle's parts are chosen
    # (_lanes.lanes_bind); a store without it has no lane table to image.
    if store.view.lanes.count < 1 or store.view.part.count_rows == NULL:
        raise ValueError("this store is not a laned buffer's (or its lane part is not bound)")
    return 0


def dump_lanes(ReplayStore store):
    """dump_lanes(store) -> (header dict, rows, leaves, lanes): a laned buffer's whole state as
    ONE consistent snapshot, copied without holding the lock long: every record in chunks of
    4 MiB, each under its own hold, then in a last hold every record that moved meanwhile (its
    generation or links changed), the leaves, the lane table and the header.

    `rows` (uint8) holds all `capacity` records as they lie in the segment (generation, links,
    fields); `leaves` (float64) every slot's leaf weight, bit for bit (-0.0: unset); `lanes`
    (uint8) the lane table, 64 bytes a lane, with every owner cleared (a loaded buffer has no
    writers: its next writers claim the lanes again). The header dict also says how many times
    the copy took the lock ("lock_holds"), how many records the last holds copied again
    ("recopied") and the rows added since the last clear ("rows_since_clear").

    Examples
    --------
    >>> from cpprb_ray import ReplayBuffer, _image
    >>> with ReplayBuffer(8, {"obs": {}}, lanes=2) as rb:
    ...     _ = rb.add(obs=[1.0, 2.0])
    ...     header, rows, leaves, lanes = _image.dump_lanes(rb._store)
    >>> header["stored_size"], rows.nbytes == 8 * rb._layout.row_stride, lanes.nbytes
    (2, True, 128)
    >>> leaves.tolist()[:3]      # lane 0 holds the two rows (a uniform buffer weighs each 1)
    [1.0, 1.0, -0.0]
    """
    cdef LaneDump progress
    cdef uint8_t[::1] rows_view
    cdef double[::1] leaves_view
    cdef uint8_t[::1] lanes_view
    cdef int64_t result = 0
    cdef int catch, holds = 0
    check_laned(store)
    header = bytearray(HEADER_BYTES)
    cdef uint8_t[::1] header_view = header
    store.enter()
    try:
        rows = np.empty(store.view.capacity * store.view.stride, dtype=np.uint8)
        leaves = np.empty(store.view.capacity, dtype=np.float64)
        lanes = np.zeros(store.view.lanes.count * sizeof(Lane), dtype=np.uint8)
        # Pages faulted in before the lock is taken (see dump()).
        rows[::4096] = 0
        leaves[::512] = 0
        rows_view = rows
        leaves_view = leaves
        lanes_view = lanes
        progress.rows = &rows_view[0]
        progress.copied = 0
        progress.moved = 0
        progress.header = <Header*>&header_view[0]
        progress.leaves = &leaves_view[0]
        progress.lanes = <Lane*>&lanes_view[0]
        while progress.copied < store.view.capacity:
            holds += 1
            store.run(lane_dump_chunk_kernel, &progress, SIDE_NONE, 0, 0.0)
            hand_over(store, progress.contended)
        for catch in range(8):   # catch up with the writers, then finish what is left
            progress.force = catch == 7
            holds += 1
            result = store.run(lane_dump_finish_kernel, &progress, SIDE_NONE, 0, 0.0)
            if result != DUMP_AGAIN:
                break
        fields = read_header(header)
        fields["rate_limiter"] = limiter_state(<Header*>&header_view[0], &progress.limiter)
        fields["lock_holds"] = holds
        fields["recopied"] = progress.moved
        # Rows added since the last clear (what a bounded lane numbers its rows by), limiter
        # or not: the limiter record's base moves at every clear.
        fields["rows_since_clear"] = (fields["rows_added"] - progress.limiter.insert_base) % 2**64
        return fields, rows, leaves, lanes
    finally:
        store.leave()


def restore_lanes(ReplayStore store, rows, leaves, lanes, next_index, max_priority, rows_added,
                  limiter_inserts=0, limiter_samples=0):
    """Replace a laned buffer's whole state by a dump_lanes() image, in one GIL-free call under
    the lock; returns the stored size, counted again from the records. The rate limiter's counts
    (if it has one) become `limiter_inserts` and `limiter_samples`.

    The caller (:mod:`cpprb_ray.checkpoint`) validates the image against this buffer's layout
    first (links, leaves, lane heads); here only the sizes are checked, so that no copy leaves
    its memory.

    Examples
    --------
    >>> from cpprb_ray import ReplayBuffer, _image
    >>> with ReplayBuffer(8, {"obs": {}}, lanes=2) as rb, \\
    ...         ReplayBuffer(8, {"obs": {}}, lanes=2) as copy:
    ...     _ = rb.add(obs=[1.0, 2.0, 3.0])
    ...     header, rows, leaves, lanes = _image.dump_lanes(rb._store)
    ...     print(_image.restore_lanes(copy._store, rows, leaves, lanes, header["next_index"],
    ...                                header["max_priority"], header["rows_added"]))
    ...     print(copy.get_all_transitions()["obs"].ravel())
    3
    [1. 2. 3.]
    """
    cdef LaneRestore arguments
    cdef const uint8_t[::1] rows_view = rows
    cdef const double[::1] leaves_view = leaves
    cdef const uint8_t[::1] lanes_view = lanes
    cdef int64_t capacity
    cdef int64_t lane, size
    cdef const Lane* records
    check_laned(store)
    capacity = store.view.capacity
    if rows_view.shape[0] != capacity * store.view.stride:
        raise ValueError(f"rows must be {capacity} records of {store.view.stride} bytes; got "
                         f"{rows_view.shape[0]} bytes")
    if leaves_view.shape[0] != capacity:
        raise ValueError(f"leaves must have one entry per slot ({capacity}); got "
                         f"{leaves_view.shape[0]}")
    if lanes_view.shape[0] != store.view.lanes.count * <int64_t>sizeof(Lane):
        raise ValueError(f"lanes must be {store.view.lanes.count} records of {sizeof(Lane)} "
                         f"bytes; got {lanes_view.shape[0]} bytes")
    records = <const Lane*>&lanes_view[0]
    for lane in range(store.view.lanes.count):
        size = (lane + 1) * capacity // store.view.lanes.count - lane * capacity // \
            store.view.lanes.count
        if records[lane].head >= <uint64_t>size or records[lane].filled > <uint64_t>size:
            raise ValueError(f"lane {lane}: head {records[lane].head} and fill "
                             f"{records[lane].filled} do not fit its {size} slots")
    if not 0 <= next_index < capacity:
        raise ValueError(f"next_index {next_index} does not fit {capacity} slots")
    if not (max_priority >= 0.0 and max_priority < float("inf")):
        raise ValueError(f"max_priority must be finite and >= 0; got {max_priority}")
    arguments.rows = &rows_view[0]
    arguments.leaves = &leaves_view[0]
    arguments.lanes = records
    arguments.next_index = next_index
    arguments.max_priority = max_priority
    arguments.rows_added = rows_added
    arguments.limiter_inserts = limiter_inserts
    arguments.limiter_samples = limiter_samples
    store.enter()
    try:
        return store.run(lane_restore_kernel, &arguments, SIDE_RESET, 0, 0.0)
    finally:
        store.leave()


class StoreImage:
    """The checkpoint image part of a handle on a segment it sees: :func:`dump` and
    :func:`restore` of its store (a remote handle's store stands in for it with its own).

    Examples
    --------
    >>> from cpprb_ray import ReplayBuffer
    >>> with ReplayBuffer(4, {"obs": {}}) as rb:
    ...     _ = rb.add(obs=1.0)
    ...     print(type(rb._image).__name__, rb._image.dump()[0]["stored_size"])
    StoreImage 1
    """

    def __init__(self, ReplayStore store):
        self.store = store

    def dump(self):
        return dump(self.store)

    def restore(self, *arguments):
        return restore(self.store, *arguments)


class LaneImage:
    """The checkpoint image part of a handle on a laned buffer: :func:`dump_lanes` and
    :func:`restore_lanes` of its store (whose lane part is bound).

    Examples
    --------
    >>> from cpprb_ray import ReplayBuffer
    >>> with ReplayBuffer(8, {"obs": {}}, lanes=2) as rb:
    ...     _ = rb.add(obs=1.0)
    ...     print(type(rb._image).__name__, rb._image.dump()[0]["stored_size"])
    LaneImage 1
    """

    def __init__(self, ReplayStore store):
        self.store = store

    def dump(self):
        return dump_lanes(self.store)

    def restore(self, *arguments):
        return restore_lanes(self.store, *arguments)
