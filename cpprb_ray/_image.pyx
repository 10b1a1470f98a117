# cython: language_level=3
"""Checkpoint images of a store: its whole state copied out as one consistent snapshot, and a
store's state replaced by such a copy, each in one GIL-free call under the segment's lock
through the store's driver. The checkpoint file format around them is
:mod:`cpprb_ray.checkpoint`'s.
"""

from libc.stdint cimport int64_t, uint8_t, uint64_t

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

cdef int64_t restore_kernel(StoreView* view, void* arguments) noexcept nogil:
    cdef RestoreArguments* a = <RestoreArguments*>arguments
    store_restore(view, a.rows, a.stored, a.tail_generations, a.tail_count, a.leaves,
                  a.next_index, a.max_priority, a.rows_added, a.limiter_inserts,
                  a.limiter_samples)
    return 0


def dump(ReplayStore store):
    """dump() -> (header dict, rows, tail_generations, leaves): the whole state as ONE
    consistent snapshot, copied under the lock in one GIL-free call (a checkpoint's payload).

    `rows` (uint8) holds the stored slots' records as they lie in the segment, generation
    first; `tail_generations` (uint64) the generations of the slots past them; `leaves`
    (float64) the stored slots' leaf weights, bit for bit (-0.0: unset), empty when uniform.

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
    cdef uint8_t[::1] rows_view
    cdef uint64_t[::1] tail_view
    cdef double[::1] leaves_view
    cdef int64_t capacity = store.view.capacity, stored
    header = bytearray(HEADER_BYTES)
    cdef uint8_t[::1] header_view = header
    store.enter()
    try:
        # Sized for a full buffer: writers may add between now and the lock. Pages that the
        # copy does not reach are never touched, so a sparse buffer costs no more memory.
        rows = np.empty(capacity * store.view.stride, dtype=np.uint8)
        tail = np.empty(capacity, dtype=np.uint64)
        leaves = np.empty(capacity if store.view.prioritized else 1, dtype=np.float64)
        # Fault in the pages the copy will (at least) fill before taking the lock, one
        # write per page: the copy under the lock is then a memcpy, not 4 KiB page faults
        # (at 2**20 rows of 64 bytes, 40 ms of lock held became about 15).
        stored = store.view.header.stored_size
        rows[:stored * store.view.stride:4096] = 0
        leaves[:stored if store.view.prioritized else 0:512] = 0
        rows_view = rows
        tail_view = tail
        leaves_view = leaves
        arguments.header = <Header*>&header_view[0]
        arguments.rows = &rows_view[0]
        arguments.tail_generations = &tail_view[0]
        arguments.leaves = &leaves_view[0]
        stored = store.run(dump_kernel, &arguments, SIDE_NONE, 0, 0.0)
        fields = read_header(header)
        # The rate limiter (None without one): parameters and counts of the same moment.
        fields["rate_limiter"] = limiter_state(<Header*>&header_view[0], &arguments.limiter)
        return (fields, rows[:stored * store.view.stride],
                tail[:capacity - stored], leaves[:stored if store.view.prioritized else 0])
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
