# cython: language_level=3
"""The store's boundary: one cdef class that owns a mapped segment's lifetime and turns Python
input into one call of a nogil kernel (:mod:`cpprb_ray._core`) under the segment's lock.

A segment looks like this (offsets in bytes; the layout JSON describes the columns)::

    0     Header (_core.pxd; read_header() gives it as a dict)
    256   robust process-shared mutex (_sync)
    512   layout JSON (utf-8, `layout_length` bytes)
    data_offset, 4096-aligned:
          rows: `capacity` records of `row_stride` bytes: the slot's uint64 generation, then
                one field per column (the layout JSON gives each one's offset in the record)
          tree (sum levels with the shared leaves, then min inner levels; _segtree), 64-aligned

Every operation goes through one driver (``ReplayStore.run``): the views a kernel needs are
taken, the lock is taken (in slices, so that a stopped or vanished holder gives TimeoutError and
Ctrl-C interrupts the wait), the kernel runs with the GIL released, the lock is let go, and a
negative Status becomes an exception in one place (``raise_status``). Input is validated and
converted before the GIL is released, by the rules of :mod:`cpprb_ray._rules`.

The rate limiter (384: _limiter.Limiter) is part of that one critical section: the add and
sample kernels ask it first and return ST_RATE_LIMITED without touching anything when it holds
them back. The driver then marks the call's gate (a futex word in the limiter record), unlocks,
sleeps on the gate for one slice at most, and tries again; every committed add or sample
advances the other side's gate under the lock and, when somebody marked it, wakes it after
unlocking (docs/rate_limiting.md).
"""

cimport cython
from cpython.buffer cimport (PyBUF_ANY_CONTIGUOUS, PyBUF_C_CONTIGUOUS, PyBUF_FORMAT,
                             PyBUF_WRITABLE, PyBuffer_Release, PyObject_GetBuffer)
from cpython.bytes cimport PyBytes_AS_STRING
from cpython.exc cimport PyErr_CheckSignals
from cpython.object cimport PyObject
from libc.math cimport isnan
from libc.stdint cimport INT64_MAX, int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy, strcmp

from cpprb_ray._columns cimport AddFrame, ColumnTable
from cpprb_ray._convert cimport is_format
from cpprb_ray._core cimport (HEADER_BYTES, LAYOUT_AT, MUTEX_AT, OP_NONE, ST_ALL_TORN,
                              ST_ALL_ZERO, ST_CORRUPT, ST_EMPTY, ST_LANE_FULL, ST_LANE_LOST,
                              ST_LOCK_ERROR, ST_LOCK_TIMEOUT, ST_NAN_TREE, ST_OK,
                              ST_RATE_LIMITED, VERSION, Header, Lane, StoreView, store_add,
                              store_admits, store_clear, store_draw, store_dump, store_lock,
                              store_restore, store_sample, store_snapshot, store_unlock,
                              store_update, view_bind, lane_start)
from cpprb_ray._lanes cimport (MAX_FRAME_COLUMNS, MAX_STACK, ST_NO_LANE, FrameColumn, LaneAdd,
                               LaneClaim, LaneComplete, lanes_add, lanes_claim, lanes_complete,
                               lanes_gather, lanes_live, lanes_release)
from cpprb_ray._limiter cimport (LIMITER_AT, LIMITER_MIN_SIZE, LIMITER_NONE,
                                 LIMITER_SAMPLE_TO_INSERT_RATIO, SIDE_INSERT, SIDE_RESET,
                                 SIDE_SAMPLE, Limiter, gate_advance, gate_arm, limiter_admits,
                                 limiter_gate, limiter_never_admits)
from cpprb_ray._rules cimport (PriorityRule, as_timeout, check_memory, first_bad_priority,
                               first_out_of_range, priority_rule, raise_bad_priority)
from cpprb_ray._segtree cimport (TreeView, Xoshiro256, min_key, rng_seed, tree_bind, tree_clear_all,
                                 tree_doubles, tree_min, tree_prefetch_leaves, tree_total)
from cpprb_ray._sync cimport (gate_wait, gate_wake, monotonic_seconds, mutex_holder, mutex_init,
                              pthread_mutex_t)

import math
import os
import time

import numpy as np

from cpprb_ray import _rules
from cpprb_ray._segtree import _seed_from

cdef extern from *:
    """
    static inline void cpprb_ray_store_fence(void) { __atomic_thread_fence(__ATOMIC_RELEASE); }
    """
    void release_fence "cpprb_ray_store_fence"() noexcept nogil

HEADER_NBYTES = HEADER_BYTES
MUTEX_OFFSET = MUTEX_AT
LAYOUT_OFFSET = LAYOUT_AT
LAYOUT_VERSION = VERSION
LIMITER_OFFSET = LIMITER_AT
LIMITER_KINDS = {LIMITER_MIN_SIZE: "MinSize",
                 LIMITER_SAMPLE_TO_INSERT_RATIO: "SampleToInsertRatio"}
MAGIC = b"CPPRBRAY"
cdef double LOCK_SLICE_S = 0.05   # between two slices of a lock or rate wait: signals, deadline
DEFAULT_LOCK_TIMEOUT_S = 60.0

_ndarray = np.ndarray
_empty = np.empty
_INT64 = np.dtype(np.int64)
_FLOAT32 = np.dtype(np.float32)
_UINT64 = np.dtype(np.uint64)
_FLOAT64 = np.dtype(np.float64)


cdef extern from *:
    """
    #define cpprb_ray_refcount(o) Py_REFCNT(o)
    """
    Py_ssize_t refcount "cpprb_ray_refcount"(PyObject* obj)
    PyObject* list_item "PyList_GET_ITEM"(list items, Py_ssize_t index)   # borrowed

# sample() keeps the arrays of its last SPARE_SETS fresh results and refills a set once nothing
# but this store refers to any of its arrays: `batch = rb.sample(...)` in a loop drops the
# previous batch only after the call returns, so the one before it is free by then. Creating 8
# arrays was about a fifth of a sample(256), and more of a cold one.
cdef int SPARE_SETS = 2


def _format_of(dtype):
    """The buffer format numpy gives an array of `dtype` (bytes), or None if it has none."""
    try:
        return memoryview(np.empty(0, dtype)).format.encode()
    except (TypeError, ValueError):
        return None


cdef bint export_vector(object value, Py_buffer* view, const char* codes,
                        Py_ssize_t itemsize) except -1:
    """Export `value` into `view` (held) when it is an ndarray with a C-contiguous 1-D buffer
    of one of `codes` and `itemsize`; False (nothing held) otherwise."""
    if type(value) is not _ndarray:
        return False
    try:
        PyObject_GetBuffer(value, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT)
    except (BufferError, ValueError):
        return False
    if view.ndim == 1 and is_format(view, codes, itemsize):
        return True
    PyBuffer_Release(view)
    return False


def tree_nbytes(capacity):
    """Bytes of the sum+min tree for `capacity` slots."""
    return 8 * tree_doubles(capacity, NULL)


cdef uint8_t* bytes_of(object array, int64_t nbytes, str what) except NULL:
    """The data of `array`, a C-contiguous ndarray of at least `nbytes` bytes (the caller
    keeps it alive while the pointer is used)."""
    cdef Py_buffer view
    cdef uint8_t* data
    if type(array) is not _ndarray:
        raise ValueError(f"{what} must be a C-contiguous array of {nbytes} bytes; got "
                         f"{type(array).__name__}")
    # The buffer protocol, not array.ctypes (which builds a ctypes object per call: 6 us an add).
    PyObject_GetBuffer(array, &view, PyBUF_C_CONTIGUOUS)
    data = <uint8_t*>view.buf
    if view.len < nbytes or nbytes <= 0:
        PyBuffer_Release(&view)
        raise ValueError(f"{what} must be a C-contiguous array of {nbytes} bytes; got "
                         f"{array.nbytes}")
    PyBuffer_Release(&view)
    return data


cdef Header* _header_of(object memory, Py_buffer* view) except NULL:
    PyObject_GetBuffer(memory, view, PyBUF_ANY_CONTIGUOUS)
    if view.len < HEADER_BYTES:
        PyBuffer_Release(view)
        raise ValueError(f"segment is {view.len} bytes, smaller than a header")
    return <Header*>view.buf


def read_header(memory):
    """read_header(memory) -> dict: every Header field (_core.pxd) in layout order; `magic` as
    the 8 bytes it should spell, b"CPPRBRAY".

    Examples
    --------
    >>> from cpprb_ray import ReplayBuffer, _store
    >>> with ReplayBuffer(4, {"obs": {}}) as rb:
    ...     header = _store.read_header(rb._segment.memory)
    >>> header["magic"], header["capacity"], list(header)[:3]
    (b'CPPRBRAY', 4, ['magic', 'version', 'total_size'])
    """
    cdef Py_buffer view
    cdef Header* header = _header_of(memory, &view)
    try:
        fields = <dict>header[0]        # Cython turns the struct into a dict, in field order
        fields["magic"] = (<char*>header)[:8]
        return fields
    finally:
        PyBuffer_Release(&view)


# Field names in layout order, after the magic (each field is 8 bytes): what tests that write a
# header by hand index with.
_HEADER_FIELDS = tuple(read_header(bytearray(HEADER_BYTES)))[1:]
if 8 * (len(_HEADER_FIELDS) + 1) != sizeof(Header):  # pragma: no cover - a field not 8 bytes
    raise ImportError("every Header field must be 8 bytes")


def initialize_segment(memory, *, total_size, capacity, prioritized, alpha, eps, owner_pid,
                       layout_json, data_offset, tree_offset, row_stride, created_ns,
                       limiter=None):
    """Lay a new header, mutex, limiter record, layout and empty tree in zeroed `memory`.

    `limiter`: None, or (kind, samples_per_insert, min_size_to_sample, min_diff, max_diff) as
    :mod:`cpprb_ray.rate_limiters` validated them. The magic is written last, so an attacher
    that sees it finds everything else in place.
    """
    cdef Py_buffer view
    cdef Header* header = _header_of(memory, &view)
    cdef char* base = <char*>view.buf
    cdef TreeView tree
    cdef int status
    cdef Limiter* record
    try:
        if LAYOUT_OFFSET + len(layout_json) > data_offset:
            raise ValueError("layout JSON overlaps the data")
        memoryview(memory)[LAYOUT_OFFSET:LAYOUT_OFFSET + len(layout_json)] = layout_json
        header.version = VERSION
        header.total_size = total_size
        header.capacity = capacity
        header.prioritized = 1 if prioritized else 0
        header.alpha = alpha
        header.eps = eps
        header.next_index = 0
        header.stored_size = 0
        header.max_priority = 1.0
        header.op = OP_NONE
        header.owner_pid = owner_pid
        header.layout_offset = LAYOUT_OFFSET
        header.layout_length = len(layout_json)
        header.data_offset = data_offset
        header.tree_offset = tree_offset
        header.row_stride = row_stride
        header.created_ns = created_ns
        if limiter is not None:
            record = <Limiter*>(base + LIMITER_AT)
            (record.kind, record.samples_per_insert, record.min_size_to_sample,
             record.min_diff, record.max_diff) = limiter
        status = mutex_init(<pthread_mutex_t*>(base + MUTEX_AT))
        if status:
            raise OSError(status, "pthread_mutex_init failed")
        tree_bind(&tree, <double*>(base + <int64_t>tree_offset), <int64_t>capacity)
        tree_clear_all(&tree)
        release_fence()   # everything above is in memory before the magic says it is
        memcpy(&header.magic, <const char*>MAGIC, 8)
    finally:
        PyBuffer_Release(&view)


# -- statuses -> exceptions: the one place ------------------------------------------------------

class NeverAdmitted(ValueError):
    """An add or a sample of more rows than any state of the rate limiter lets go at once
    (waiting would be forever). A ValueError; its own class so that the N-step staging can say
    which rows an add completes."""


class LaneError(RuntimeError):
    """An add found no lane for its handle: every lane is owned by a live handle (more
    concurrent writers than lanes), or its own lane was taken over (its process was judged
    dead). Nothing was added. (cpprb_ray.LaneError.)"""


cdef int raise_status(int64_t status, ReplayStore store) except -1:
    if status == ST_EMPTY:
        raise ValueError("cannot sample from an empty buffer")
    if status == ST_ALL_ZERO:
        raise ValueError("cannot sample: every stored row has weight 0 (all priorities are 0 "
                         "and eps is 0)")
    if status == ST_ALL_TORN:
        raise ValueError("cannot sample: every stored row was torn by a writer that died "
                         "mid-add")
    if status == ST_NAN_TREE:
        raise ValueError(f"the buffer's priority tree total is {tree_total(&store.view.tree)}, "
                         f"not a finite number: the segment is corrupt")
    if status == ST_CORRUPT:
        raise ValueError("the buffer's segment is corrupt: a header field or tree node is out "
                         "of range (no writer leaves it so)")
    if status == ST_LOCK_TIMEOUT:
        raise TimeoutError(f"the buffer's lock was not released within {store.lock_timeout:g} "
                           f"s (held by thread {mutex_holder(store.view.mutex)}: a process "
                           f"stopped while holding it, or a corrupt lock word)")
    if status == ST_LOCK_ERROR:
        raise OSError(store.view.lock_errno, "locking the buffer failed")
    if status == ST_NO_LANE:
        raise LaneError(f"every one of the buffer's {store.view.lane_count} lanes is owned by "
                        f"a live handle: more handles add concurrently than it has lanes; "
                        f"make the buffer with more lanes (lanes=), or close a writer")
    if status == ST_LANE_LOST:
        raise LaneError("this handle's lane was taken by another handle (this process was "
                        "judged dead); nothing was added")
    if status == ST_LANE_FULL:
        raise ValueError("the transitions of this add need more slots than a lane has (each "
                         "transition that does not continue the last one's frames needs up to "
                         "2 * stack slots); add fewer at a time")
    raise SystemError(f"unknown store status {status}")


# -- kernels behind the driver: one argument struct each ----------------------------------------

ctypedef int64_t (*Kernel)(StoreView* view, void* arguments) noexcept nogil

# A call on one side of the rate limiter, as the driver carries it through its waits.
cdef struct RateCall:
    int side                  # SIDE_INSERT (add), SIDE_SAMPLE (sample), SIDE_RESET (clear)
    int64_t rows              # rows it adds or samples
    double timeout            # seconds it may be held back; < 0: no limit
    double started            # monotonic time the limiter first held it back; < 0: not yet
    double waited             # seconds it was held back, once it went through or gave up
    double nap                # the next sleep on its gate (one slice, or what is left)
    uint32_t seen             # the gate's value when it decided to sleep
    bint sleeping             # it is to sleep on its gate and try again

cdef enum:
    # update(): leaf lines asked for per chunk of weights computed. update(256) at 2**20,
    # interleaved with cpprb's: 14.4 us without; 12.5 us in chunks of 8; 12.8 us asking for
    # all 256 before the weights; 13.4 to 14.1 us asking for their parents' lines too.
    WARM_CHUNK = 8

cdef enum:
    WAKE_INSERTERS = 1
    WAKE_SAMPLERS = 2

cdef struct AddArguments:
    const uint8_t** sources
    int64_t count
    const double* priorities
    const double* weights

cdef struct SampleArguments:
    Xoshiro256* rng
    int64_t batch
    double beta
    double* scratch
    int64_t* indexes
    float* weights
    uint64_t* generations
    uint8_t** outputs

cdef struct UpdateArguments:
    const int64_t* indexes
    const double* priorities
    const double* weights
    const uint64_t* generations
    int64_t count

cdef struct SnapshotArguments:
    int64_t room
    uint8_t** outputs
    int64_t* indexes
    double* leaves

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

cdef struct TreeArguments:
    double root_sum
    double root_min
    double* sums
    double* mins


cdef int64_t add_kernel(StoreView* view, void* arguments) noexcept nogil:
    # Admission and the add are one critical section: nothing can come between them.
    cdef AddArguments* a = <AddArguments*>arguments
    if view.limited and not store_admits(view, SIDE_INSERT, a.count):
        return ST_RATE_LIMITED
    return store_add(view, a.sources, a.count, a.priorities, a.weights)

cdef int64_t sample_kernel(StoreView* view, void* arguments) noexcept nogil:
    cdef SampleArguments* a = <SampleArguments*>arguments
    if view.limited and not store_admits(view, SIDE_SAMPLE, a.batch):
        return ST_RATE_LIMITED
    return store_sample(view, a.rng, a.batch, a.beta, a.scratch, a.indexes, a.weights,
                        a.generations, a.outputs)

cdef int64_t update_kernel(StoreView* view, void* arguments) noexcept nogil:
    cdef UpdateArguments* a = <UpdateArguments*>arguments
    return store_update(view, a.indexes, a.priorities, a.weights, a.generations, a.count)

cdef int64_t clear_kernel(StoreView* view, void* arguments) noexcept nogil:
    store_clear(view)
    return 0

cdef int64_t snapshot_kernel(StoreView* view, void* arguments) noexcept nogil:
    cdef SnapshotArguments* a = <SnapshotArguments*>arguments
    return store_snapshot(view, a.room, a.outputs, a.indexes, a.leaves)

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

cdef int64_t tree_kernel(StoreView* view, void* arguments) noexcept nogil:
    # One consistent snapshot: roots and leaves copied under the same lock.
    cdef TreeArguments* a = <TreeArguments*>arguments
    cdef int64_t k
    a.root_sum = tree_total(&view.tree)
    a.root_min = tree_min(&view.tree)
    for k in range(view.capacity):
        a.sums[k] = view.tree.sums[k] + 0.0
        a.mins[k] = min_key(view.tree.sums[k])
    return 0


cdef enum:
    LANE_DRAW = 0             # LaneSample: draw `batch` rows, then gather them
    LANE_ALL = 1              # gather every live row (up to `batch`)

cdef struct LaneSample:
    SampleArguments draw      # outputs: per store column (a frame column's is unused)
    FrameColumn* frames
    int frame_count
    int mode


cdef int64_t lane_add_kernel(StoreView* view, void* arguments) noexcept nogil:
    cdef LaneAdd* a = <LaneAdd*>arguments
    if view.limited and a.admit > 0 and not store_admits(view, SIDE_INSERT, a.admit):
        return ST_RATE_LIMITED
    return lanes_add(view, a)

cdef int64_t lane_sample_kernel(StoreView* view, void* arguments) noexcept nogil:
    cdef LaneSample* a = <LaneSample*>arguments
    cdef SampleArguments* d = &a.draw
    cdef int64_t result
    if a.mode == LANE_ALL:
        d.batch = lanes_live(view, d.indexes, d.batch)
    else:
        if view.limited and not store_admits(view, SIDE_SAMPLE, d.batch):
            return ST_RATE_LIMITED
        result = store_draw(view, d.rng, d.batch, d.beta, d.scratch, d.indexes, d.weights)
        if result < 0:
            return result
    result = lanes_gather(view, d.indexes, d.batch, d.generations, d.outputs, a.frames,
                          a.frame_count)
    if result >= 0 and a.mode == LANE_DRAW:
        view.header.rows_sampled += <uint64_t>d.batch
    return result

cdef int64_t lane_complete_kernel(StoreView* view, void* arguments) noexcept nogil:
    # Admitted and counted in one locked call, as a plain add's rows are: an N-step add's
    # lane write only waited until these rows could go (add_lanes' `admit`).
    cdef LaneComplete* a = <LaneComplete*>arguments
    if view.limited and not store_admits(view, SIDE_INSERT, a.count):
        return ST_RATE_LIMITED
    return lanes_complete(view, a)

cdef int64_t lane_claim_kernel(StoreView* view, void* arguments) noexcept nogil:
    return lanes_claim(view, <LaneClaim*>arguments)

cdef int64_t lane_release_kernel(StoreView* view, void* arguments) noexcept nogil:
    cdef uint64_t* a = <uint64_t*>arguments
    return lanes_release(view, <int64_t>a[0], a[1])


cdef void rate_start(RateCall* rate, int side, int64_t rows, double timeout) noexcept:
    rate.side = side
    rate.rows = rows
    rate.timeout = timeout
    rate.started = -1.0
    rate.waited = 0.0
    rate.sleeping = False


cdef int rate_settle(StoreView* view, RateCall* rate, int64_t result) noexcept nogil:
    """Under the lock, after the kernel ran: decide whether `rate`'s call sleeps and tries again
    (marking its gate), gave up, or went through (counting its wait, advancing the other
    side's gate). Returns the WAKE_* gates to wake once the lock is let go."""
    cdef Limiter* limiter = view.limiter
    cdef double now
    cdef int wake = 0
    rate.sleeping = False
    if result == ST_RATE_LIMITED:
        now = monotonic_seconds()
        if rate.started < 0:
            rate.started = now
        rate.waited = now - rate.started
        if rate.timeout >= 0 and rate.waited >= rate.timeout:
            rate_count_wait(limiter, rate, True)
            return 0
        rate.seen = gate_arm(limiter_gate(limiter, rate.side))
        rate.nap = LOCK_SLICE_S
        if rate.timeout >= 0 and rate.timeout - rate.waited < rate.nap:
            rate.nap = rate.timeout - rate.waited
        rate.sleeping = True
        return 0
    if result < 0:
        return 0
    if rate.started >= 0:
        rate.waited = monotonic_seconds() - rate.started
        rate_count_wait(limiter, rate, False)
    # Progress lets the other side through: adds open the samplers' gate, samples the
    # inserters', a clear both.
    if rate.side != SIDE_SAMPLE and gate_advance(&limiter.sample_gate):
        wake |= WAKE_SAMPLERS
    if rate.side != SIDE_INSERT and gate_advance(&limiter.insert_gate):
        wake |= WAKE_INSERTERS
    return wake


cdef void rate_count_wait(Limiter* limiter, RateCall* rate, bint gave_up) noexcept nogil:
    """Statistics of a call that was held back (under the lock)."""
    cdef uint64_t nanoseconds = <uint64_t>(rate.waited * 1e9)
    if rate.side == SIDE_INSERT:
        limiter.insert_blocks += 1
        limiter.insert_wait_ns += nanoseconds
        limiter.insert_timeouts += gave_up
    else:
        limiter.sample_blocks += 1
        limiter.sample_wait_ns += nanoseconds
        limiter.sample_timeouts += gave_up


cdef void rate_after_unlock(Limiter* limiter, RateCall* rate, int wake) noexcept nogil:
    """Outside the lock: wake the gates that `rate_settle` said, or sleep on ours. The sleep
    returns at once if the gate moved since it was marked (no wake-up is lost), else on a
    wake-up, a signal or the end of the nap."""
    if wake & WAKE_SAMPLERS:
        gate_wake(&limiter.sample_gate)
    if wake & WAKE_INSERTERS:
        gate_wake(&limiter.insert_gate)
    if rate.sleeping:
        gate_wait(limiter_gate(limiter, rate.side), rate.seen, rate.nap)


cdef dict limiter_state(const Header* h, const Limiter* limiter):
    """The limiter's parameters, counts and statistics (lock-free loads; None without one)."""
    if limiter.kind == LIMITER_NONE:
        return None
    # The base first: it only moves at a clear, to the count it is taken from, so the
    # difference read after it is never negative.
    cdef uint64_t insert_base = limiter.insert_base
    cdef uint64_t sample_base = limiter.sample_base
    cdef uint64_t inserts = h.rows_added - insert_base
    cdef uint64_t samples = h.rows_sampled - sample_base
    cdef uint64_t stored = h.stored_size
    return {
        "kind": LIMITER_KINDS.get(limiter.kind, f"unknown ({limiter.kind})"),
        "samples_per_insert": limiter.samples_per_insert,
        "min_size_to_sample": limiter.min_size_to_sample,
        "min_diff": limiter.min_diff, "max_diff": limiter.max_diff,
        "inserts": inserts, "samples": samples,
        "diff": <double>inserts * limiter.samples_per_insert - <double>samples,
        "can_insert": limiter_admits(limiter, SIDE_INSERT, <double>inserts, <double>samples,
                                     stored, h.capacity, 1),
        "can_sample": limiter_admits(limiter, SIDE_SAMPLE, <double>inserts, <double>samples,
                                     stored, h.capacity, 1),
        "insert_blocks": limiter.insert_blocks, "sample_blocks": limiter.sample_blocks,
        "insert_wait_s": limiter.insert_wait_ns * 1e-9,
        "sample_wait_s": limiter.sample_wait_ns * 1e-9,
        "insert_timeouts": limiter.insert_timeouts, "sample_timeouts": limiter.sample_timeouts,
    }


def describe_limiter(state):
    """'SampleToInsertRatio(samples_per_insert=..., ...)' from a limiter_state dict."""
    return (f"{state['kind']}(samples_per_insert={state['samples_per_insert']:g}, "
            f"min_size_to_sample={state['min_size_to_sample']}, min_diff={state['min_diff']:g}, "
            f"max_diff={state['max_diff']:g})")


# What one add call holds while it runs: one block, freed in one place.
# Forks of this process so far, as this process sees them: a forked child finds it one higher
# than its handles remember. (getpid() would tell the same, but it is a system call -- about
# 0.3 µs here, a tenth of an add -- and every call into the store asks.)
cdef unsigned long fork_generation = 0


def tree_problems(tree):
    """What is wrong with a tree as ``ReplayStore.check_tree()`` read it, as sentences; [] when
    the root sum is the sum of the leaves (to 1e-9) and the root min the least set leaf (inf
    when none is set). The one check the tests, the fuzzer and the soak share.

    Examples
    --------
    >>> import numpy as np
    >>> from cpprb_ray._store import tree_problems
    >>> tree_problems((3.0, np.array([1.0, 2.0]), 1.0, np.array([1.0, 2.0])))
    []
    >>> tree_problems((3.5, np.array([1.0, 2.0]), 2.0, np.array([1.0, np.inf])))
    ['root sum 3.5 != sum of the leaves 3.0', 'root min 2.0 != least leaf 1.0']
    """
    root_sum, leaf_sums, root_min, leaf_mins = tree
    problems = []
    exact = math.fsum(leaf_sums)
    if not math.isclose(root_sum, exact, rel_tol=1e-9, abs_tol=0.0):
        problems.append(f"root sum {root_sum!r} != sum of the leaves {exact!r}")
    finite = leaf_mins[leaf_mins != np.inf]
    least = float(finite.min()) if finite.size else math.inf
    if root_min != least:
        problems.append(f"root min {root_min!r} != least leaf {least!r}")
    return problems


def _count_fork():
    global fork_generation
    fork_generation += 1


os.register_at_fork(after_in_child=_count_fork)


@cython.final
cdef class ReplayStore:
    """One mapped segment's kernels behind one driver. Built by :mod:`cpprb_ray.buffer`."""

    cdef Py_buffer _buffer
    cdef bint _has_buffer
    cdef object _memory
    cdef StoreView view
    cdef PriorityRule rule
    cdef Xoshiro256 rng
    cdef readonly bint prioritized
    cdef readonly double lock_timeout
    cdef unsigned long forks_seen   # fork_generation when `active` and the rng were last valid
    cdef int active               # threads of this process inside a call on this store
    cdef bint closing
    cdef ColumnTable columns
    cdef FrameColumn frame_specs[MAX_FRAME_COLUMNS]   # bind_lanes: the frame columns
    cdef int frame_count
    # sample()'s outputs: their keys, shapes and buffer formats, in order; the last SPARE_SETS
    # sets of fresh arrays it returned, refilled once nothing else refers to them (see spares).
    cdef tuple output_names
    cdef dict output_template     # every output key, to copy: a sample's result dict
    cdef list output_shapes
    cdef list output_formats
    cdef list output_dtypes
    cdef list spares
    cdef int64_t spare_batch

    def __cinit__(self):
        self._has_buffer = False

    def __init__(self, memory, columns, seed=None, lock_timeout=DEFAULT_LOCK_TIMEOUT_S):
        """`columns`: the layout's Column objects (name, dtype, shape, offset, row_bytes)."""
        cdef Header* header
        self.lock_timeout = _rules.as_real(lock_timeout, "lock_timeout")
        if not self.lock_timeout > 0:
            raise ValueError(f"lock_timeout must be > 0; got {lock_timeout}")
        PyObject_GetBuffer(memory, &self._buffer, PyBUF_WRITABLE | PyBUF_ANY_CONTIGUOUS)
        self._has_buffer = True
        self._memory = memory
        self.columns = ColumnTable(columns)
        view_bind(&self.view, <uint8_t*>self._buffer.buf, self.columns.offsets,
                  self.columns.row_bytes, self.columns.count)
        header = self.view.header
        self.check_limiter()
        self.prioritized = header.prioritized != 0
        priority_rule(&self.rule, header.alpha, header.eps, self.view.capacity)
        rng_seed(&self.rng, _seed_from(seed))
        self.forks_seen = fork_generation
        self.active = 0
        self.closing = False
        self.frame_count = 0
        names = self.columns.names
        self.output_names = names + ("indexes", "weights", "generations")
        self.output_template = dict.fromkeys(self.output_names)
        self.output_shapes = [tuple(shape) for shape in self.columns.shapes] + [(), (), ()]
        self.output_dtypes = list(self.columns.dtypes) + [_INT64, _FLOAT32, _UINT64]
        self.output_formats = [_format_of(dtype) for dtype in self.output_dtypes]
        self.spares = []
        self.spare_batch = 0

    def __dealloc__(self):
        if self._has_buffer:
            PyBuffer_Release(&self._buffer)

    cdef int check_limiter(self) except -1:
        """Refuse a limiter record that no constructor writes (its parameters steer waits)."""
        cdef Limiter* limiter = self.view.limiter
        cdef str problem = None
        if limiter.kind == LIMITER_NONE:
            return 0
        if limiter.kind not in LIMITER_KINDS:
            problem = f"kind {limiter.kind}"
        elif not limiter.samples_per_insert > 0 or isnan(limiter.min_diff) or isnan(
                limiter.max_diff) or not limiter.max_diff >= limiter.min_diff:
            problem = (f"samples_per_insert {limiter.samples_per_insert}, min_diff "
                       f"{limiter.min_diff}, max_diff {limiter.max_diff}")
        elif not 1 <= limiter.min_size_to_sample <= <uint64_t>self.view.capacity:
            problem = f"min_size_to_sample {limiter.min_size_to_sample}"
        if problem is None:
            return 0
        PyBuffer_Release(&self._buffer)
        self._has_buffer = False
        raise ValueError(f"the buffer's segment is corrupt: its rate limiter record has "
                         f"{problem}, which no constructor writes")

    # -- lifetime -----------------------------------------------------------------------------

    def release(self):
        """Drop the buffer export so the mapping can be closed. Later calls raise ValueError.

        Waits for threads of this process that are inside a call on this store to leave it:
        unmapping under them would crash them. (Their waits for the lock are bounded by
        lock_timeout, and a wait for the rate limiter ends within one slice once this is
        closing, so this is bounded too.)
        """
        self.closing = True
        if self.forks_seen != fork_generation:
            self.active = 0     # a forked child: the threads counted are the parent's
        while self.active > 0:
            time.sleep(0.0002)   # releases the GIL, which they need to leave
        if self._has_buffer:
            PyBuffer_Release(&self._buffer)
            self._has_buffer = False
        self._memory = None

    cdef int enter(self) except -1:
        # With the GIL held, like leave() and release(), so a plain counter is enough.
        if not self._has_buffer or self.closing:
            raise ValueError("operation on a closed buffer")
        if self.forks_seen != fork_generation:
            # A forked child: threads the parent had inside a call do not exist here, and the
            # sampler must not draw the parent's samples.
            self.forks_seen = fork_generation
            self.active = 0
            rng_seed(&self.rng, _seed_from(None))
        self.active += 1
        return 0

    cdef void leave(self) noexcept:
        self.active -= 1

    cdef int64_t run(self, Kernel kernel, void* arguments, RateCall* rate) except? -1:
        """THE driver: lock (in slices: signals and the deadline are looked at between two),
        run `kernel` with the GIL released, unlock, raise for a negative Status.

        `rate` (NULL for calls outside the limiter): while the kernel says ST_RATE_LIMITED,
        sleep on the call's gate (one slice at most, woken by the other side's progress) and
        run it again, until it goes through or its timeout has passed (TimeoutError); after a
        call that went through, wake whoever waits for its progress."""
        cdef int status, wake = 0
        cdef int64_t result = 0
        cdef double deadline = -1.0
        cdef bint limited = rate != NULL and self.view.limited
        while True:
            with nogil:
                status = store_lock(&self.view, LOCK_SLICE_S)
                if status == ST_OK:
                    result = kernel(&self.view, arguments)
                    if limited:
                        wake = rate_settle(&self.view, rate, result)
                    store_unlock(&self.view)
                    if limited:
                        rate_after_unlock(self.view.limiter, rate, wake)
            if status == ST_LOCK_TIMEOUT:
                PyErr_CheckSignals()       # Ctrl-C interrupts a wait (KeyboardInterrupt)
                if deadline < 0:
                    deadline = time.monotonic() + self.lock_timeout - LOCK_SLICE_S
                elif time.monotonic() >= deadline:
                    break
                continue
            if status == ST_OK and limited and rate.sleeping:
                deadline = -1.0            # the lock came: its next wait has its own deadline
                PyErr_CheckSignals()
                if self.closing:
                    raise ValueError("the buffer was closed while this call waited for its "
                                     "rate limiter")
                continue
            break
        if status != ST_OK:
            raise_status(status, self)
        if result == ST_RATE_LIMITED:
            self.raise_rate_limited(rate)
        if result < 0:
            raise_status(result, self)
        return result

    cdef int raise_rate_limited(self, RateCall* rate) except -1:
        state = limiter_state(self.view.header, self.view.limiter)
        if rate.side == SIDE_INSERT:
            what = f"add of {rate.rows} row{'s' if rate.rows != 1 else ''}"
            rule = ("it lets an add of k rows go when the stored size after it is <= "
                    "min_size_to_sample, or (inserts + k) * samples_per_insert - samples <= "
                    "max_diff")
            undone = "nothing was added"
        else:
            what = f"sample of {rate.rows} row{'s' if rate.rows != 1 else ''}"
            rule = ("it lets a sample of k rows go when the stored size is >= "
                    "min_size_to_sample and inserts * samples_per_insert - samples - k >= "
                    "min_diff")
            undone = "nothing was sampled"
        raise TimeoutError(
            f"{what} held back by the rate limiter for {rate.waited:.3g} s (timeout="
            f"{rate.timeout:g}): {describe_limiter(state)}; {rule}; now inserts="
            f"{state['inserts']}, samples={state['samples']}, diff={state['diff']:g}, "
            f"stored={self.view.header.stored_size}; {undone}")

    cdef int check_admissible(self, int side, int64_t rows, str name) except -1:
        """ValueError when no state of the limiter ever admits `rows` rows at once (waiting
        would be forever); nothing is checked without a limiter."""
        if not self.view.limited or not limiter_never_admits(
                self.view.limiter, side, self.view.capacity, rows):
            return 0
        state = limiter_state(self.view.header, self.view.limiter)
        if side == SIDE_SAMPLE:
            raise NeverAdmitted(
                f"{name} {rows} can never be sampled at once under {describe_limiter(state)}: "
                f"a sample of k rows needs inserts * samples_per_insert - samples - k >= "
                f"min_diff, and that diff never exceeds max(max_diff, min_size_to_sample * "
                f"samples_per_insert); sample fewer rows or widen the error_buffer")
        raise NeverAdmitted(
            f"an add of {rows} rows can never be admitted at once under "
            f"{describe_limiter(state)}: past min_size_to_sample it needs (inserts + k) * "
            f"samples_per_insert - samples <= max_diff, and the diff never falls below "
            f"min(0, min_diff); add fewer rows at a time or widen the error_buffer")

    # -- header fields, read without the lock (aligned 8-byte loads never tear) -----------------

    cdef Header* header(self) except NULL:
        if not self._has_buffer or self.closing:
            raise ValueError("operation on a closed buffer")
        return self.view.header

    # Both bound what callers allocate and index with, so a value no writer leaves is reported
    # as corruption here (len() of 2**63 rows was an OverflowError, get_all_transitions a
    # MemoryError).
    @property
    def stored_size(self):
        cdef Header* h = self.header()
        if h.stored_size > <uint64_t>self.view.capacity:
            raise_status(ST_CORRUPT, self)
        return h.stored_size

    @property
    def next_index(self):
        cdef Header* h = self.header()
        if h.next_index >= <uint64_t>self.view.capacity:
            raise_status(ST_CORRUPT, self)
        return h.next_index

    @property
    def max_priority(self):
        return self.header().max_priority

    @property
    def rows_added(self):
        return self.header().rows_added

    @property
    def rows_since_clear(self):
        """Rows added since the last clear (the limiter's base is set at every clear)."""
        return self.header().rows_added - self.view.limiter.insert_base

    @property
    def repairs(self):
        return self.header().repairs

    def hot_regions(self):
        """[(offset, bytes)] of the parts of the segment that every sample reads at random
        places, the most read first: the tree (each walk reads one line per level), then the
        rows. What a handle asks 2 MiB pages for (_memory.prefer_huge_pages)."""
        cdef Header* h = self.header()
        return [(<int64_t>h.tree_offset, tree_nbytes(self.view.capacity)),
                (<int64_t>h.data_offset, self.view.capacity * self.view.stride)]

    def counters(self):
        """The header's counters and sizes and the rate limiter's state, as a dict.

        One snapshot, copied under the lock (the rate limiter's inserts, samples and diff of
        one moment: read one by one, a diff outside the limiter's window was seen). Should the
        lock not come within one slice (50 ms: a stopped or slow holder), each field is read
        without it, one aligned 8-byte load each, exact on its own, two of them possibly a call
        apart; "snapshot" says which. "rate_limiter" is None without a limiter. "lock_holder"
        is the thread id in the lock word (0 when free)."""
        cdef Header copy
        cdef Limiter limiter_copy
        cdef Header* h = self.header()
        cdef Limiter* limiter = self.view.limiter
        cdef int status = ST_LOCK_TIMEOUT
        cdef uint64_t holder = mutex_holder(self.view.mutex)
        self.enter()
        try:
            with nogil:
                status = store_lock(&self.view, LOCK_SLICE_S)
                if status == ST_OK:
                    memcpy(&copy, self.view.header, sizeof(Header))
                    limiter_copy = self.view.limiter[0]
                    store_unlock(&self.view)
        finally:
            self.leave()
        if status == ST_OK:
            h, limiter = &copy, &limiter_copy
        return {"inserts": h.rows_added, "samples": h.rows_sampled, "updates": h.updates,
                "repairs": h.repairs, "lock_waits": h.lock_waits, "stored": h.stored_size,
                "capacity": h.capacity, "next_index": h.next_index,
                "max_priority": h.max_priority, "lock_holder": holder,
                "snapshot": status == ST_OK, "rate_limiter": limiter_state(h, limiter)}

    def limiter_record(self):
        """(kind name, samples_per_insert, min_size_to_sample, min_diff, max_diff) of the
        segment's rate limiter, or None: what a view rebuilds its limiter object from."""
        self.header()
        cdef Limiter* limiter = self.view.limiter
        if limiter.kind == LIMITER_NONE:
            return None
        return (LIMITER_KINDS[limiter.kind], limiter.samples_per_insert,
                limiter.min_size_to_sample, limiter.min_diff, limiter.max_diff)

    def lock_owner(self):
        """Thread id in the lock word (0 when free), so that attach can refuse a lock held by a
        thread that does not exist instead of timing out on it later."""
        self.header()
        return mutex_holder(self.view.mutex)

    # -- priorities -----------------------------------------------------------------------------

    cdef int weigh(self, const double* priorities, double* weights, int64_t count,
                   str name, const int64_t* update_indexes=NULL) except -1:
        cdef bint overflow = False
        cdef int64_t bad = -1, start, size
        with nogil:
            if update_indexes == NULL:
                bad = first_bad_priority(&self.rule, priorities, weights, count, &overflow)
            else:
                # An update's leaves (indexes already checked) are asked for chunk by chunk as
                # their weights are computed: the misses overlap the pow() calls.
                start = 0
                while start < count and bad < 0:
                    size = min(WARM_CHUNK, count - start)
                    tree_prefetch_leaves(&self.view.tree, update_indexes + start, size)
                    bad = first_bad_priority(&self.rule, priorities + start, weights + start,
                                             size, &overflow)
                    if bad >= 0:
                        bad += start
                    start += size
        if bad >= 0:
            raise_bad_priority(&self.rule, priorities[bad], bad, overflow, name)
        return 0

    def check_priorities(self, priorities, str name="priorities"):
        """Raise ValueError naming `name` unless every priority (a 1-D float64 array) is
        finite, >= 0 and small enough that its weight keeps the tree's total finite."""
        cdef const double[::1] values = priorities
        self.enter()
        try:
            if values.shape[0]:
                self.weigh(&values[0], NULL, values.shape[0], name)
        finally:
            self.leave()

    # -- add ----------------------------------------------------------------------------------

    def add(self, values, priorities=None, timeout=None):
        """add(values, priorities=None, timeout=None) -> int: the first slot written.

        `values`: one value per column, as a list in column order or as a dict keyed by
        exactly the column names (the handle passes add()'s keyword arguments as they come):
        arrays of the row or batch shape of
        any same_kind-castable dtype and any strides, Python or numpy scalars, or lists.
        Converted here (plain numeric dtypes without numpy's help), validated in full before
        anything is written. `timeout`: seconds the rate limiter may hold the add back (None:
        no limit; 0: never wait), then TimeoutError with nothing added."""
        cdef double seconds = as_timeout(timeout)
        self.enter()
        try:
            return self._add(values, priorities, seconds)
        finally:
            self.leave()

    cdef object _add(self, values, priorities, double timeout):
        cdef AddFrame frame
        cdef AddArguments arguments
        cdef RateCall rate
        cdef int64_t count
        cdef double* priority_pointer = NULL
        cdef double* weights = NULL
        cdef int n = self.columns.count
        frame.block = NULL
        try:
            self.columns.open_frame(&frame)
            count = self.columns.stage_all(&frame, values)
            if priorities is not None:
                if not self.prioritized:
                    raise TypeError("priorities are only for a PrioritizedReplayBuffer")
                priority_pointer = self.columns.stage_priorities(&frame, priorities, count)
                weights = <double*>malloc(count * sizeof(double))
                frame.owned[n + 1] = weights
                if weights == NULL:
                    raise MemoryError()
                self.weigh(priority_pointer, weights, count, "priorities")
            self.check_admissible(SIDE_INSERT, count, "add")
            arguments.sources = frame.pointers
            arguments.count = count
            arguments.priorities = priority_pointer
            arguments.weights = weights
            rate_start(&rate, SIDE_INSERT, count, timeout)
            return self.run(add_kernel, &arguments, &rate)
        finally:
            self.columns.close_frame(&frame)

    # -- sample -------------------------------------------------------------------------------

    def sample(self, int64_t batch, double beta, out=None, timeout=None):
        """sample(batch, beta, out=None, timeout=None) -> dict: every column (batch, *shape),
        then "indexes" (int64), "weights" (float32) and "generations" (uint64).

        Fresh arrays, or the arrays of `out` (a dict with those keys, each C-contiguous, of
        that dtype and shape), filled in place and returned in a new dict. `timeout` as for
        add()."""
        cdef double seconds = as_timeout(timeout)
        self.enter()
        try:
            return self._sample(batch, beta, out, seconds)
        finally:
            self.leave()

    cdef object _sample(self, int64_t batch, double beta, out, double timeout):
        cdef int n = self.columns.count
        cdef int count = n + 3, c
        cdef SampleArguments arguments
        cdef RateCall rate
        cdef Py_buffer* views
        cdef uint8_t** pointers
        cdef int acquired = 0
        cdef list arrays = None
        cdef dict result
        cdef bint fresh = False
        if batch <= 0:
            raise ValueError(f"batch_size must be > 0; got {batch}")
        # Each output row takes at most a record's bytes plus the index, weight, generation and
        # the kernel's scratch double: past that, numpy could not allocate the outputs, and the
        # scratch's size below would wrap.
        if batch > INT64_MAX // (self.view.stride + 28):
            raise ValueError(f"batch_size {batch} needs more than 2**63 - 1 bytes of output; "
                             f"sample fewer rows")
        if out is None:
            check_memory(<double>batch * (self.view.stride + 28), "batch_size", batch,
                         "sample output")
        self.check_admissible(SIDE_SAMPLE, batch, "batch_size")
        if out is not None:
            arrays = self.out_arrays(out, batch)
        cdef char* memory = <char*>malloc(count * (sizeof(Py_buffer) + sizeof(uint8_t*))
                                          + batch * sizeof(double))
        if memory == NULL:
            raise MemoryError(f"batch_size {batch}: no memory for the sample's scratch")
        views = <Py_buffer*>memory
        pointers = <uint8_t**>(memory + count * sizeof(Py_buffer))
        try:
            if out is None:
                arrays = self.spare_outputs(batch)
                if arrays is not None:
                    acquired = self.acquire_spares(arrays, views, batch)
                if acquired == 0:
                    arrays = [_empty((batch,) + <tuple>self.output_shapes[c],
                                     self.output_dtypes[c]) for c in range(count)]
                    fresh = True
            if acquired == 0:
                for array in arrays:
                    PyObject_GetBuffer(array, &views[acquired],
                                       PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE)
                    acquired += 1
            for c in range(count):
                pointers[c] = <uint8_t*>views[c].buf
            arguments.rng = &self.rng
            arguments.batch = batch
            arguments.beta = beta
            arguments.scratch = <double*>(memory + count * (sizeof(Py_buffer)
                                                            + sizeof(uint8_t*)))
            arguments.indexes = <int64_t*>pointers[n]
            arguments.weights = <float*>pointers[n + 1]
            arguments.generations = <uint64_t*>pointers[n + 2]
            arguments.outputs = pointers
            rate_start(&rate, SIDE_SAMPLE, batch, timeout)
            self.run(sample_kernel, &arguments, &rate)
            if fresh:
                self.keep_spares(arrays, batch)
            # A copy of a dict with these keys, then filled: dict(zip(...)) took 12 us more
            # in a cold call (zip, and two resizes), the copy 2 us.
            result = self.output_template.copy()
            for c in range(count):
                result[<str>self.output_names[c]] = arrays[c]
            return result
        finally:
            for c in range(acquired):
                PyBuffer_Release(&views[c])
            free(memory)

    cdef list spare_outputs(self, int64_t batch):
        """A kept set of sample outputs for `batch` rows that only this store refers to, or
        None. (With the GIL held and no Python code run between this check and the buffer
        exports that follow, no other thread can take a reference in between.)"""
        cdef list arrays
        cdef int c
        if batch != self.spare_batch:
            return None
        for arrays in self.spares:
            for c in range(len(arrays)):
                if refcount(list_item(arrays, c)) != 1:    # anyone's but the set's
                    break
            else:
                return arrays
        return None

    cdef int acquire_spares(self, list arrays, Py_buffer* views, int64_t batch) except -1:
        """Export every array of a kept set into `views` and return how many; 0 (nothing held,
        the set dropped) when one of them was changed in place while it was the user's: made
        read-only, given another shape, dtype or strides."""
        cdef int c, d, acquired = 0
        cdef tuple shape
        cdef bytes expected
        cdef bint intact = True
        try:
            for c in range(len(arrays)):
                try:
                    PyObject_GetBuffer(arrays[c], &views[c],
                                       PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE | PyBUF_FORMAT)
                except (BufferError, ValueError):
                    intact = False
                    break
                acquired += 1
                shape = self.output_shapes[c]
                expected = self.output_formats[c]
                if (expected is None or views[c].ndim != 1 + len(shape)
                        or views[c].shape[0] != batch
                        or strcmp(views[c].format, PyBytes_AS_STRING(expected)) != 0):
                    intact = False
                    break
                for d in range(len(shape)):
                    if views[c].shape[d + 1] != <Py_ssize_t>shape[d]:
                        intact = False
                if not intact:
                    break
        except BaseException:       # (MemoryError): nothing stays exported
            for c in range(acquired):
                PyBuffer_Release(&views[c])
            raise
        if intact:
            return acquired
        for c in range(acquired):
            PyBuffer_Release(&views[c])
        self.spares = [kept for kept in self.spares if kept is not arrays]
        return 0

    cdef void keep_spares(self, list arrays, int64_t batch):
        if batch != self.spare_batch:
            self.spares = []
            self.spare_batch = batch
        self.spares.append(arrays)
        if len(self.spares) > SPARE_SETS:
            del self.spares[0]

    cdef list out_arrays(self, out, int64_t batch):
        """The arrays of `out` in output order, or the error naming the first one that is not
        a writable C-contiguous array of its output's dtype and shape."""
        if not isinstance(out, dict):
            raise TypeError(f"out must be a dict of arrays; got {type(out).__name__}")
        cdef list arrays = []
        cdef int c
        for c in range(len(self.output_names)):
            name = self.output_names[c]
            shape = (batch,) + <tuple>self.output_shapes[c]
            dtype = self.output_dtypes[c]
            array = out.get(name)
            if (type(array) is not _ndarray or array.shape != shape or array.dtype != dtype
                    or not array.flags.c_contiguous or not array.flags.writeable):
                got = ("missing" if array is None else
                       f"{type(array).__name__} {getattr(array, 'dtype', '')} "
                       f"{getattr(array, 'shape', '')}")
                raise ValueError(f"out[{name!r}] must be a writable C-contiguous {dtype} array "
                                 f"of shape {shape}; got {got}")
            arrays.append(array)
        return arrays

    # -- update -------------------------------------------------------------------------------

    def update(self, indexes, priorities, generations=None):
        """update(indexes, priorities, generations=None) -> int: how many were applied.

        Any integer indexes below the stored size, priorities finite, >= 0 and within the
        rule's bound (checked in full, nothing applied otherwise); arrays as sample() returns
        them (int64, uint64) with float64 or float32 priorities go in without a copy."""
        self.enter()
        try:
            return self._update(indexes, priorities, generations)
        finally:
            self.leave()

    cdef object _update(self, indexes, priorities, generations):
        cdef Py_buffer index_view, priority_view, generation_view
        cdef int held = 0
        cdef int64_t count, stored, bad, k
        cdef const float* single = NULL
        cdef double* scratch = NULL
        cdef UpdateArguments arguments
        # Arrays as sample() returns them (and float32 or float64 priorities) are used as they
        # are, recognised through the buffer protocol alone: numpy attributes (dtype, ndim,
        # flags) were eight lookups, a cold learner's update paid for each. Anything else is
        # converted by the rules first (their errors name the argument).
        if not export_vector(indexes, &index_view, b"lq", 8):
            indexes = _rules.index_vector(indexes, "indexes", True)   # cpprb's float indexes
            PyObject_GetBuffer(indexes, &index_view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT)
        held = 1
        try:
            count = index_view.shape[0]
            if not (export_vector(priorities, &priority_view, b"d", 8)
                    or export_vector(priorities, &priority_view, b"f", 4)):
                priorities = _rules.real_vector(priorities, count, "priorities")
                PyObject_GetBuffer(priorities, &priority_view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT)
            held = 2
            if priority_view.shape[0] != count:
                raise ValueError(f"priorities must have {count} entries (one per index); got "
                                 f"{priority_view.shape[0]}")
            if generations is not None:
                if not export_vector(generations, &generation_view, b"LQ", 8):
                    generations = _rules.generation_vector(generations, count)
                    PyObject_GetBuffer(generations, &generation_view,
                                       PyBUF_C_CONTIGUOUS | PyBUF_FORMAT)
                held = 3
                if generation_view.ndim != 1 or generation_view.shape[0] != count:
                    raise ValueError(f"generations must be 1-D with {count} entries (one per "
                                     f"index); got shape {generations.shape}")
            if count == 0:
                return 0
            # Read without the lock; bounded by the capacity too, because the kernel refreshes
            # the tree over every index it is given (a header rewritten by a hostile process
            # between this check and the lock must not put one past the tree).
            stored = min(<int64_t>self.view.header.stored_size, self.view.capacity)
            if self.view.lanes != NULL:
                stored = self.view.capacity   # a laned buffer's rows lie anywhere
            with nogil:
                bad = first_out_of_range(<const int64_t*>index_view.buf, count, stored)
            if bad >= 0:
                bound = "capacity" if self.view.lanes != NULL else "stored size"
                raise IndexError(f"indexes must be in [0, {bound} {stored}); got "
                                 f"{(<const int64_t*>index_view.buf)[bad]} at position {bad}")
            # One allocation: the leaf weights, then (for float32 input) the priorities widened.
            scratch = <double*>malloc(2 * count * sizeof(double))
            if scratch == NULL:
                raise MemoryError()
            arguments.priorities = <const double*>priority_view.buf
            if priority_view.itemsize == 4:
                single = <const float*>priority_view.buf
                with nogil:
                    for k in range(count):
                        scratch[count + k] = single[k]
                arguments.priorities = scratch + count
            self.weigh(arguments.priorities, scratch, count, "priorities",
                       <const int64_t*>index_view.buf)
            arguments.indexes = <const int64_t*>index_view.buf
            arguments.weights = scratch
            arguments.generations = (<const uint64_t*>generation_view.buf if held >= 3
                                     else NULL)
            arguments.count = count
            return self.run(update_kernel, &arguments, NULL)
        finally:
            free(scratch)
            if held >= 3:
                PyBuffer_Release(&generation_view)
            if held >= 2:
                PyBuffer_Release(&priority_view)
            PyBuffer_Release(&index_view)

    # -- whole buffer -------------------------------------------------------------------------

    def clear(self):
        """Forget every row (generations move on, so old samples cannot update new rows); the
        rate limiter counts again from zero, and both of its sides are woken."""
        cdef RateCall rate
        rate_start(&rate, SIDE_RESET, 0, 0.0)
        self.enter()
        try:
            self.run(clear_kernel, NULL, &rate)
        finally:
            self.leave()

    def snapshot(self, outputs, indexes, leaves):
        """Copy every committed row in slot order into `outputs` (each sized for the stored size
        read before the call); returns how many rows were copied (torn rows are left out)."""
        cdef int n = self.columns.count, c, acquired = 0
        cdef SnapshotArguments arguments
        cdef Py_buffer* views = <Py_buffer*>malloc((n + 2) * sizeof(Py_buffer))
        cdef uint8_t** pointers = <uint8_t**>malloc((n + 2) * sizeof(uint8_t*))
        arrays = list(outputs) + [indexes, leaves]
        self.enter()
        try:
            if views == NULL or pointers == NULL:
                raise MemoryError()
            for c in range(n + 2):
                PyObject_GetBuffer(arrays[c], &views[c], PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE)
                acquired += 1
                pointers[c] = <uint8_t*>views[c].buf
            arguments.room = views[n].len // 8
            arguments.outputs = pointers
            arguments.indexes = <int64_t*>pointers[n]
            arguments.leaves = <double*>pointers[n + 1]
            return self.run(snapshot_kernel, &arguments, NULL)
        finally:
            for c in range(acquired):
                PyBuffer_Release(&views[c])
            free(views)
            free(pointers)
            self.leave()

    def dump(self):
        """dump() -> (header dict, rows, tail_generations, leaves): the whole state as ONE
        consistent snapshot (a checkpoint's payload), copied without holding the lock long:
        the rows in chunks of 4 MiB, each under its own hold, then in a last short hold the
        slots written meanwhile (adds follow the ring from the next index the copy started
        at), the leaves and the header, so that other processes' calls wait a chunk's copy at
        most. A clear or a repair in between starts it again; after DUMP_ATTEMPTS - 1 starts
        (writers that outpace it), one hold copies everything.

        `rows` (uint8) holds the stored slots' records as they lie in the segment, generation
        first; `tail_generations` (uint64) the generations of the slots past them; `leaves`
        (float64) the stored slots' leaf weights, bit for bit (-0.0: unset), empty when uniform.

        Examples
        --------
        >>> from cpprb_ray import PrioritizedReplayBuffer
        >>> with PrioritizedReplayBuffer(4, {"obs": {}}, alpha=1.0, eps=0.0) as rb:
        ...     _ = rb.add(obs=[1.0, 2.0], priorities=[3.0, 0.0])
        ...     header, rows, tail, leaves = rb._store.dump()
        >>> header["stored_size"], rows.nbytes, tail.tolist(), leaves.tolist()
        (2, 32, [0, 0], [3.0, -0.0])
        """
        cdef DumpArguments arguments
        cdef DumpProgress progress
        cdef DumpFinish finish
        cdef uint8_t[::1] rows_view
        cdef uint64_t[::1] tail_view
        cdef double[::1] leaves_view
        cdef int64_t capacity = self.view.capacity, stored = 0, result
        cdef int attempt, catch, holds = 0
        cdef Limiter* limiter = &arguments.limiter
        header = bytearray(HEADER_BYTES)
        cdef uint8_t[::1] header_view = header
        self.enter()
        try:
            # Sized for a full buffer: writers may add between now and the lock. Pages that the
            # copy does not reach are never touched, so a sparse buffer costs no more memory.
            rows = np.empty(capacity * self.view.stride, dtype=np.uint8)
            tail = np.empty(capacity, dtype=np.uint64)
            leaves = np.empty(capacity if self.prioritized else 1, dtype=np.float64)
            # Fault in the pages the copy will (at least) fill before taking the lock, one
            # write per page: the copy under the lock is then a memcpy, not 4 KiB page faults
            # (at 2**20 rows of 64 bytes, 40 ms of lock held became about 15).
            stored = self.view.header.stored_size
            rows[:stored * self.view.stride:4096] = 0
            leaves[:stored if self.prioritized else 0:512] = 0
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
                    stored = self.run(dump_kernel, &arguments, NULL)
                    break
                holds += 1
                self.run(dump_start_kernel, &progress, NULL)
                result = 0
                while progress.copied < progress.stored:
                    holds += 1
                    result = self.run(dump_chunk_kernel, &progress, NULL)
                    if result == DUMP_CHANGED:
                        break
                if result == DUMP_CHANGED:
                    continue
                for catch in range(8):  # catch up with the writers, then finish what is left
                    finish.force = catch == 7
                    holds += 1
                    result = self.run(dump_finish_kernel, &finish, NULL)
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
            return (fields, rows[:stored * self.view.stride],
                    tail[:capacity - stored], leaves[:stored if self.prioritized else 0])
        finally:
            self.leave()

    def restore(self, rows, tail_generations, leaves, next_index, max_priority, rows_added,
                limiter_inserts=0, limiter_samples=0):
        """Replace the whole state by a dump()'s, in one GIL-free call under the lock; the rate
        limiter's counts (if it has one) become `limiter_inserts` and `limiter_samples`.

        The caller (:mod:`cpprb_ray.checkpoint`) validates the dump against this buffer's
        layout first; here only the sizes are checked, so that no copy leaves its memory.

        Examples
        --------
        >>> from cpprb_ray import ReplayBuffer
        >>> with ReplayBuffer(4, {"obs": {}}) as rb, ReplayBuffer(4, {"obs": {}}) as copy:
        ...     _ = rb.add(obs=[1.0, 2.0, 3.0])
        ...     header, rows, tail, leaves = rb._store.dump()
        ...     copy._store.restore(rows, tail, leaves, header["next_index"],
        ...                         header["max_priority"], header["rows_added"])
        ...     print(copy.get_all_transitions()["obs"].ravel(), copy.get_next_index())
        [1. 2. 3.] 3
        """
        cdef RestoreArguments arguments
        cdef RateCall rate
        cdef const uint8_t[::1] rows_view = rows
        cdef const uint64_t[::1] tail_view = tail_generations
        cdef const double[::1] leaves_view = leaves
        cdef int64_t capacity = self.view.capacity, stored
        if rows_view.shape[0] % self.view.stride:
            raise ValueError(f"rows must be whole records of {self.view.stride} bytes; got "
                             f"{rows_view.shape[0]} bytes")
        stored = rows_view.shape[0] // self.view.stride
        if stored > capacity or tail_view.shape[0] > capacity - stored:
            raise ValueError(f"{stored} rows and {tail_view.shape[0]} more generations do not "
                             f"fit {capacity} slots")
        if leaves_view.shape[0] != (stored if self.prioritized else 0):
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
        self.enter()
        try:
            # Like a clear, a restore moves the limiter's counts: wake both sides to look.
            rate_start(&rate, SIDE_RESET, 0, 0.0)
            self.run(restore_kernel, &arguments, &rate)
        finally:
            self.leave()

    def check_tree(self):
        """(root sum, leaf sums, root min, leaf mins) read under the lock; for tree_problems."""
        cdef TreeArguments arguments
        cdef double[::1] sums_view, mins_view
        self.enter()
        try:
            sums = np.empty(self.view.capacity, dtype=np.float64)
            mins = np.empty(self.view.capacity, dtype=np.float64)
            sums_view = sums
            mins_view = mins
            arguments.sums = &sums_view[0]
            arguments.mins = &mins_view[0]
            self.run(tree_kernel, &arguments, NULL)
            return arguments.root_sum, sums, arguments.root_min, mins
        finally:
            self.leave()

    def generations_of(self, indexes):
        """Current generation of each slot (uint64), for tests and diagnostics."""
        header = self.header()
        generations = np.ndarray((self.view.capacity,), dtype=np.uint64, buffer=self._memory,
                                 offset=header.data_offset, strides=(self.view.stride,))
        return generations[np.asarray(indexes, dtype=np.int64)].copy()

    # -- lanes and frames (cpprb_ray.frames drives these; kernels in _lanes) ------------------

    def bind_lanes(self, int64_t offset, int64_t count, frames=(), int64_t rows=0):
        """Bind the lane table (`count` lanes at byte `offset`) and the frame columns: a laned
        layout's, validated by the caller; its bounds are checked here again, before any kernel
        could index with them. `frames`: (store column, stack, plane bytes, item bytes,
        has_next) per frame column. `rows` (one lane only): the most rows it keeps, its oldest
        evicted first (0: as many as its slots hold)."""
        cdef int c
        if not 1 <= count <= self.view.capacity or offset < HEADER_BYTES or offset % 8 or (
                offset + count * <int64_t>sizeof(Lane) > self._buffer.len):
            raise ValueError(f"lane table ({count} lanes at {offset}) lies outside the segment")
        if not 0 <= rows <= self.view.capacity or (rows and count != 1):
            raise ValueError(f"a row bound of {rows} for {count} lanes of {self.view.capacity} "
                             f"slots")
        if len(frames) > MAX_FRAME_COLUMNS:
            raise ValueError(f"at most {MAX_FRAME_COLUMNS} frame columns; got {len(frames)}")
        for c, (column, stack, plane_bytes, item_bytes, has_next) in enumerate(frames):
            if not (0 <= column < self.columns.count and 1 <= stack <= MAX_STACK
                    and item_bytes >= 1 and plane_bytes == self.columns.row_bytes[column]
                    and plane_bytes % item_bytes == 0):
                raise ValueError(f"frame column {column} does not fit the layout")
            self.frame_specs[c].column = column
            self.frame_specs[c].stack = stack
            self.frame_specs[c].plane_bytes = plane_bytes
            self.frame_specs[c].item_bytes = item_bytes
            self.frame_specs[c].has_next = has_next
        self.frame_count = len(frames)
        self.view.lanes = <Lane*>(<uint8_t*>self._buffer.buf + offset)
        self.view.lane_count = count
        self.view.link_offset = 8    # right after each record's generation (_layout)
        self.view.lane_rows = rows

    def lane_owners(self):
        """(lanes, 4) uint64: each lane's owner pid (0: free), its start time, its handle's
        token and its pid namespace, read without the lock (each field one aligned load)."""
        self.header()
        owners = np.empty((self.view.lane_count, 4), dtype=np.uint64)
        cdef uint64_t[:, ::1] table = owners
        cdef int64_t lane
        for lane in range(self.view.lane_count):
            table[lane, 0] = self.view.lanes[lane].owner_pid
            table[lane, 1] = self.view.lanes[lane].owner_start
            table[lane, 2] = self.view.lanes[lane].owner_token
            table[lane, 3] = self.view.lanes[lane].spare0
        return owners

    def generation_at(self, int64_t slot):
        """The current generation of one slot (read without the lock: one aligned load; the
        record's first field), what generations_of gives for many."""
        self.header()
        if not 0 <= slot < self.view.capacity:
            raise IndexError(f"slot must be in [0, capacity {self.view.capacity}); got {slot}")
        return (<const uint64_t*>(self.view.rows + slot * self.view.stride))[0]

    def lane_next_slots(self):
        """(lanes,) int64: the slot each lane writes next (its first slot plus its head), read
        without the lock (each head one aligned load)."""
        self.header()
        if self.view.lanes == NULL:
            raise ValueError("lane_next_slots needs a laned buffer")
        slots = np.empty(self.view.lane_count, dtype=np.int64)
        cdef int64_t[::1] table = slots
        cdef int64_t lane, first, size
        for lane in range(self.view.lane_count):
            first = lane_start(&self.view, lane)
            size = lane_start(&self.view, lane + 1) - first
            # A damaged head (the lock's repair checks it) still names a slot of the lane.
            table[lane] = first + <int64_t>(self.view.lanes[lane].head % <uint64_t>size)
        return slots

    def claim_lane(self, uint64_t pid, uint64_t start, uint64_t token, uint64_t pidns, dead):
        """A free lane, or one of `dead` ((lanes, 4) uint64: lane, pid, start, token of owners
        seen dead) whose owner did not change since; LaneError when there is none."""
        cdef LaneClaim claim
        cdef const uint64_t[:, ::1] entries = dead
        if entries.shape[1] != 4:
            raise ValueError("dead must be (n, 4) uint64")
        claim.pid = pid
        claim.start = start
        claim.token = token
        claim.pidns = pidns
        claim.dead_count = entries.shape[0]
        claim.dead = &entries[0, 0] if entries.shape[0] else NULL
        self.enter()
        try:
            return self.run(lane_claim_kernel, &claim, NULL)
        finally:
            self.leave()

    def release_lane(self, uint64_t lane, uint64_t token):
        """Free `lane` if the handle with `token` still owns it (its rows stay)."""
        cdef uint64_t arguments[2]
        arguments[0] = lane
        arguments[1] = token
        self.enter()
        try:
            self.run(lane_release_kernel, arguments, NULL)
        finally:
            self.leave()

    def add_lanes(self, int64_t lane, uint64_t token, int64_t count, list values, list stacks,
                  priorities, uint64_t[::1] cache_writes, timeout=None, bint incomplete=False,
                  out_slots=None, out_generations=None, int64_t admit=-1):
        """Add `count` transitions to `lane` (which the handle with `token` owns); returns the
        first slot written.

        `values`: per store column, `count` values as a C-contiguous array of its dtype (None
        for a frame column); `stacks`: per frame column (values, nexts or None, cache), each
        C-contiguous: `count` stacks, `count` next stacks, and the writer's one cached stack.
        `priorities`: None or `count` float64. `cache_writes`: the writer's cache key (in/out).
        `incomplete`: N-step rows that complete_lanes finishes later; `out_slots` (int64) and
        `out_generations` (uint64), `count` each: where each row went, as written. `admit`:
        how many rows the rate limiter must let go before anything is written (-1: `count`;
        with `incomplete`, the rows the N-step add will complete, which complete_lanes admits
        and counts again: this wait only keeps a held-back add from writing its steps).
        """
        cdef double seconds = as_timeout(timeout)
        cdef LaneAdd arguments
        cdef FrameColumn frames[MAX_FRAME_COLUMNS]
        cdef RateCall rate
        cdef int n = self.columns.count, c
        cdef int64_t stack_bytes
        cdef const double[::1] given
        cdef const uint8_t** sources = NULL
        cdef double* weights = NULL
        cdef int32_t* plan = NULL
        self.enter()
        try:
            if self.view.lanes == NULL or not 0 <= lane < self.view.lane_count:
                raise ValueError(f"lane must be one of the buffer's lanes; got {lane}")
            if count < 1 or len(values) != n or len(stacks) != self.frame_count:
                raise ValueError("add_lanes needs one value per column and one stack entry per "
                                 "frame column")
            if admit < 0:
                admit = count
            elif not incomplete and admit != count:
                raise ValueError(f"admit must be {count} (every row) for complete rows; got "
                                 f"{admit}")
            sources = <const uint8_t**>malloc(n * sizeof(uint8_t*))
            plan = <int32_t*>malloc(2 * count * sizeof(int32_t))
            if sources == NULL or plan == NULL:
                raise MemoryError()
            for c in range(n):
                sources[c] = NULL
                if values[c] is None:
                    continue
                sources[c] = bytes_of(values[c], count * self.columns.row_bytes[c],
                                      f"column {self.columns.names[c]!r}")
            for c in range(self.frame_count):
                frames[c] = self.frame_specs[c]
                stack_bytes = frames[c].stack * frames[c].plane_bytes
                if values[frames[c].column] is not None:
                    raise ValueError("a frame column's value goes in `stacks`")
                frames[c].values = bytes_of(stacks[c][0], count * stack_bytes, "stacks")
                frames[c].nexts = NULL
                if frames[c].has_next:
                    frames[c].nexts = bytes_of(stacks[c][1], count * stack_bytes, "next stacks")
                if not stacks[c][2].flags.writeable:
                    raise ValueError("a frame column's cache must be writable")
                frames[c].cache = bytes_of(stacks[c][2], stack_bytes, "cache")
                sources[frames[c].column] = frames[c].values   # only marks it as given
            for c in range(n):
                if sources[c] == NULL:
                    raise ValueError(f"column {self.columns.names[c]!r} has no value")
            arguments.priorities = NULL
            arguments.weights = NULL
            if priorities is not None:
                if not self.prioritized:
                    raise TypeError("priorities are only for a PrioritizedReplayBuffer")
                given = priorities
                if given.shape[0] != count:
                    raise ValueError(f"priorities must have {count} entries; got "
                                     f"{given.shape[0]}")
                weights = <double*>malloc(count * sizeof(double))
                if weights == NULL:
                    raise MemoryError()
                self.weigh(&given[0], weights, count, "priorities")
                arguments.priorities = &given[0]
                arguments.weights = weights
            if admit:
                self.check_admissible(SIDE_INSERT, admit, "add")
            arguments.admit = admit
            arguments.lane = lane
            arguments.token = token
            arguments.count = count
            arguments.sources = sources
            arguments.frames = frames
            arguments.frame_count = self.frame_count
            arguments.cache_writes = &cache_writes[0]
            arguments.plan = plan
            arguments.incomplete = incomplete
            arguments.out_slots = NULL
            arguments.out_generations = NULL
            if out_slots is not None:
                arguments.out_slots = <int64_t*>bytes_of(out_slots, count * 8, "out_slots")
                arguments.out_generations = <uint64_t*>bytes_of(out_generations, count * 8,
                                                                "out_generations")
                if out_slots.dtype != _INT64 or out_generations.dtype != _UINT64:
                    raise ValueError("out_slots must be int64 and out_generations uint64")
            rate_start(&rate, SIDE_INSERT, admit, seconds)
            return self.run(lane_add_kernel, &arguments, &rate if admit else NULL)
        finally:
            free(sources)
            free(plan)
            free(weights)
            self.leave()

    def sample_lanes(self, int64_t batch, double beta, list outputs, list stacks, indexes,
                     weights, generations, timeout=None, bint every_row=False):
        """Draw `batch` rows (every_row: take every live row, up to `batch`) into the given
        arrays: `outputs` per store column (None for a frame column), `stacks` per frame column
        (values, nexts or None); returns how many rows were written."""
        cdef double seconds = as_timeout(timeout)
        cdef LaneSample arguments
        cdef FrameColumn frames[MAX_FRAME_COLUMNS]
        cdef RateCall rate
        cdef int n = self.columns.count, c
        cdef int64_t stack_bytes
        cdef int64_t[::1] index_view = indexes
        cdef float[::1] weight_view = weights
        cdef uint64_t[::1] generation_view = generations
        cdef uint8_t** pointers = NULL
        cdef double* scratch = NULL
        self.enter()
        try:
            if self.view.lanes == NULL:
                raise ValueError("sample_lanes needs a laned buffer")
            if batch < 1 or len(outputs) != n or len(stacks) != self.frame_count or (
                    index_view.shape[0] < batch or weight_view.shape[0] < batch
                    or generation_view.shape[0] < batch):
                raise ValueError("sample_lanes needs one output per column and room for batch")
            if not every_row:
                self.check_admissible(SIDE_SAMPLE, batch, "batch_size")
            pointers = <uint8_t**>malloc(n * sizeof(uint8_t*))
            scratch = <double*>malloc(batch * sizeof(double))
            if pointers == NULL or scratch == NULL:
                raise MemoryError()
            for c in range(n):
                pointers[c] = NULL
                if outputs[c] is None:
                    continue
                if not outputs[c].flags.writeable:
                    raise ValueError(f"output {self.columns.names[c]!r} must be writable")
                pointers[c] = bytes_of(outputs[c], batch * self.columns.row_bytes[c],
                                       f"output {self.columns.names[c]!r}")
            for c in range(self.frame_count):
                frames[c] = self.frame_specs[c]
                stack_bytes = frames[c].stack * frames[c].plane_bytes
                for array in stacks[c]:
                    if array is not None and not array.flags.writeable:
                        raise ValueError("frame outputs must be writable")
                frames[c].out_values = bytes_of(stacks[c][0], batch * stack_bytes, "stack output")
                frames[c].out_nexts = NULL
                if frames[c].has_next:
                    frames[c].out_nexts = bytes_of(stacks[c][1], batch * stack_bytes,
                                                   "next stack output")
                pointers[frames[c].column] = frames[c].out_values   # only marks it as given
            for c in range(n):
                if pointers[c] == NULL:
                    raise ValueError(f"output {self.columns.names[c]!r} is missing")
            arguments.draw.rng = &self.rng
            arguments.draw.batch = batch
            arguments.draw.beta = beta
            arguments.draw.scratch = scratch
            arguments.draw.indexes = &index_view[0]
            arguments.draw.weights = &weight_view[0]
            arguments.draw.generations = &generation_view[0]
            arguments.draw.outputs = pointers
            arguments.frames = frames
            arguments.frame_count = self.frame_count
            arguments.mode = LANE_ALL if every_row else LANE_DRAW
            if every_row:
                self.run(lane_sample_kernel, &arguments, NULL)
            else:
                rate_start(&rate, SIDE_SAMPLE, batch, seconds)
                self.run(lane_sample_kernel, &arguments, &rate)
            return arguments.draw.batch
        finally:
            free(pointers)
            free(scratch)
            self.leave()

    def complete_lanes(self, slots, generations, last_slots, last_generations, list values,
                       priorities=None, timeout=None):
        """Complete N-step rows add_lanes(incomplete=True) wrote: `values` per store column
        (`count` values as a C-contiguous array of its dtype, or None to keep what the add
        wrote); each row's next stack ends at its `last_slots` entry. All arrays C-contiguous
        (int64 slots, uint64 generations). Returns how many rows were completed (the others
        were overwritten, cleared or torn since). With a rate limiter the `count` rows go as
        one add: held back up to `timeout` (TimeoutError, nothing completed)."""
        cdef double seconds = as_timeout(timeout)
        cdef RateCall rate
        cdef LaneComplete arguments
        cdef int n = self.columns.count, c
        cdef int64_t count = len(slots)
        cdef const uint8_t** sources = NULL
        cdef double* weights = NULL
        cdef const double[::1] given
        self.enter()
        try:
            if self.view.lanes == NULL or len(values) != n:
                raise ValueError("complete_lanes needs a laned buffer and one value per column")
            if count == 0:
                return 0
            for array, dtype in ((slots, _INT64), (generations, _UINT64),
                                 (last_slots, _INT64), (last_generations, _UINT64)):
                if type(array) is not _ndarray or array.dtype != dtype or array.shape != (count,):
                    raise ValueError(f"complete_lanes: expected {count} {dtype}")
            for array in (slots, last_slots):
                # The kernel refreshes the tree over every slot it is given.
                if not ((array >= 0).all() and (array < self.view.capacity).all()):
                    raise IndexError(f"slots must be in [0, capacity {self.view.capacity})")
            sources = <const uint8_t**>malloc(n * sizeof(uint8_t*))
            if sources == NULL:
                raise MemoryError()
            for c in range(n):
                sources[c] = NULL
                if values[c] is not None:
                    sources[c] = bytes_of(values[c], count * self.columns.row_bytes[c],
                                          f"column {self.columns.names[c]!r}")
            arguments.priorities = NULL
            arguments.weights = NULL
            if priorities is not None:
                given = priorities
                if given.shape[0] != count:
                    raise ValueError(f"priorities must have {count} entries")
                weights = <double*>malloc(count * sizeof(double))
                if weights == NULL:
                    raise MemoryError()
                self.weigh(&given[0], weights, count, "priorities")
                arguments.priorities = &given[0]
                arguments.weights = weights
            arguments.count = count
            arguments.slots = <const int64_t*>bytes_of(slots, count * 8, "slots")
            arguments.generations = <const uint64_t*>bytes_of(generations, count * 8,
                                                              "generations")
            arguments.last_slots = <const int64_t*>bytes_of(last_slots, count * 8, "last_slots")
            arguments.last_generations = <const uint64_t*>bytes_of(last_generations, count * 8,
                                                                   "last_generations")
            arguments.sources = sources
            self.check_admissible(SIDE_INSERT, count, "add")
            rate_start(&rate, SIDE_INSERT, count, seconds)
            return self.run(lane_complete_kernel, &arguments, &rate)
        finally:
            free(sources)
            free(weights)
            self.leave()
