# cython: language_level=3
"""Checkpoint images of a store: its whole state copied out as one consistent snapshot, and a
store's state replaced by such a copy, each in one GIL-free call under the segment's lock
through the store's driver. The checkpoint file format around them is
:mod:`cpprb_ray.checkpoint`'s.
"""

from libc.stdint cimport int64_t, uint8_t, uint64_t
from libc.string cimport memcpy

from cpprb_ray._core cimport StoreView, store_dump, store_restore
from cpprb_ray._limiter cimport SIDE_NONE, SIDE_RESET, Limiter
from cpprb_ray._segment cimport HEADER_BYTES, Header
from cpprb_ray._store cimport ReplayStore, limiter_state

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
