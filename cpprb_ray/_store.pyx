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
"""

cimport cython
from cpython.buffer cimport (PyBUF_ANY_CONTIGUOUS, PyBUF_C_CONTIGUOUS, PyBUF_FORMAT,
                             PyBUF_WRITABLE, PyBuffer_Release, PyObject_GetBuffer)
from cpython.exc cimport PyErr_CheckSignals
from libc.stdint cimport int64_t, uint8_t, uint64_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy
from posix.types cimport pid_t
from posix.unistd cimport getpid

from cpprb_ray._columns cimport AddFrame, ColumnTable
from cpprb_ray._core cimport (HEADER_BYTES, LAYOUT_AT, MUTEX_AT, OP_NONE, ST_ALL_TORN,
                              ST_ALL_ZERO, ST_CORRUPT, ST_EMPTY, ST_LOCK_ERROR, ST_LOCK_TIMEOUT,
                              ST_NAN_TREE, ST_OK, VERSION, Header, StoreView, store_add,
                              store_clear, store_lock, store_sample, store_snapshot,
                              store_unlock, store_update, view_bind)
from cpprb_ray._rules cimport (PriorityRule, first_bad_priority, first_out_of_range,
                               priority_rule, raise_bad_priority)
from cpprb_ray._segtree cimport (TreeView, Xoshiro256, min_key, rng_seed, tree_bind, tree_clear_all,
                                 tree_doubles, tree_min, tree_total)
from cpprb_ray._sync cimport mutex_holder, mutex_init, pthread_mutex_t

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
MAGIC = b"CPPRBRAY"
cdef double LOCK_SLICE_S = 0.05   # between two slices of a lock wait: signals, deadline
DEFAULT_LOCK_TIMEOUT_S = 60.0

_ndarray = np.ndarray
_empty = np.empty
_INT64 = np.dtype(np.int64)
_FLOAT32 = np.dtype(np.float32)
_UINT64 = np.dtype(np.uint64)
_FLOAT64 = np.dtype(np.float64)


def tree_nbytes(capacity):
    """Bytes of the sum+min tree for `capacity` slots."""
    return 8 * tree_doubles(capacity, NULL)


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
                       layout_json, data_offset, tree_offset, row_stride, created_ns):
    """Lay a new header, mutex, layout and empty tree in zeroed `memory`.

    The magic is written last, so an attacher that sees it finds everything else in place.
    """
    cdef Py_buffer view
    cdef Header* header = _header_of(memory, &view)
    cdef char* base = <char*>view.buf
    cdef TreeView tree
    cdef int status
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
    raise SystemError(f"unknown store status {status}")


# -- kernels behind the driver: one argument struct each ----------------------------------------

ctypedef int64_t (*Kernel)(StoreView* view, void* arguments) noexcept nogil

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

cdef struct TreeArguments:
    double root_sum
    double root_min
    double* sums
    double* mins


cdef int64_t add_kernel(StoreView* view, void* arguments) noexcept nogil:
    cdef AddArguments* a = <AddArguments*>arguments
    return store_add(view, a.sources, a.count, a.priorities, a.weights)

cdef int64_t sample_kernel(StoreView* view, void* arguments) noexcept nogil:
    cdef SampleArguments* a = <SampleArguments*>arguments
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


# What one add call holds while it runs: one block, freed in one place.
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
    cdef pid_t pid                # process whose threads `active` counts, and the rng's seeder
    cdef int active               # threads of this process inside a call on this store
    cdef bint closing
    cdef ColumnTable columns

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
        self.prioritized = header.prioritized != 0
        priority_rule(&self.rule, header.alpha, header.eps, self.view.capacity)
        rng_seed(&self.rng, _seed_from(seed))
        self.pid = getpid()
        self.active = 0
        self.closing = False

    def __dealloc__(self):
        if self._has_buffer:
            PyBuffer_Release(&self._buffer)

    # -- lifetime -----------------------------------------------------------------------------

    def release(self):
        """Drop the buffer export so the mapping can be closed. Later calls raise ValueError.

        Waits for threads of this process that are inside a call on this store to leave it:
        unmapping under them would crash them. (Their waits for the lock are bounded by
        lock_timeout, so this is bounded too.)
        """
        self.closing = True
        if getpid() != self.pid:
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
        if getpid() != self.pid:
            # A forked child: threads the parent had inside a call do not exist here, and the
            # sampler must not draw the parent's samples.
            self.pid = getpid()
            self.active = 0
            rng_seed(&self.rng, _seed_from(None))
        self.active += 1
        return 0

    cdef void leave(self) noexcept:
        self.active -= 1

    cdef int64_t run(self, Kernel kernel, void* arguments) except? -1:
        """THE driver: lock (in slices: signals and the deadline are looked at between two),
        run `kernel` with the GIL released, unlock, raise for a negative Status."""
        cdef int status
        cdef int64_t result = 0
        cdef double deadline = -1.0
        while True:
            with nogil:
                status = store_lock(&self.view, LOCK_SLICE_S)
                if status == ST_OK:
                    result = kernel(&self.view, arguments)
                    store_unlock(&self.view)
            if status != ST_LOCK_TIMEOUT:
                break
            PyErr_CheckSignals()       # Ctrl-C interrupts a wait (KeyboardInterrupt)
            if deadline < 0:
                deadline = time.monotonic() + self.lock_timeout - LOCK_SLICE_S
            elif time.monotonic() >= deadline:
                break
        if status != ST_OK:
            raise_status(status, self)
        if result < 0:
            raise_status(result, self)
        return result

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
    def repairs(self):
        return self.header().repairs

    def counters(self):
        """The header's counters and sizes as a dict (no lock: each is one aligned load)."""
        cdef Header* h = self.header()
        return {"inserts": h.rows_added, "samples": h.rows_sampled, "updates": h.updates,
                "repairs": h.repairs, "lock_waits": h.lock_waits, "stored": h.stored_size,
                "capacity": h.capacity, "next_index": h.next_index,
                "max_priority": h.max_priority}

    def lock_owner(self):
        """Thread id in the lock word (0 when free), so that attach can refuse a lock held by a
        thread that does not exist instead of timing out on it later."""
        self.header()
        return mutex_holder(self.view.mutex)

    # -- priorities -----------------------------------------------------------------------------

    cdef int weigh(self, const double* priorities, double* weights, int64_t count,
                   str name) except -1:
        cdef bint overflow = False
        cdef int64_t bad
        with nogil:
            bad = first_bad_priority(&self.rule, priorities, weights, count, &overflow)
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

    def add(self, values, priorities=None):
        """add(values, priorities=None) -> int: the first slot written.

        `values`: one value per column, in column order: arrays of the row or batch shape of
        any same_kind-castable dtype and any strides, Python or numpy scalars, or lists.
        Converted here (plain numeric dtypes without numpy's help), validated in full before
        anything is written."""
        self.enter()
        try:
            return self._add(values, priorities)
        finally:
            self.leave()

    cdef object _add(self, values, priorities):
        cdef AddFrame frame
        cdef AddArguments arguments
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
            arguments.sources = frame.pointers
            arguments.count = count
            arguments.priorities = priority_pointer
            arguments.weights = weights
            return self.run(add_kernel, &arguments)
        finally:
            self.columns.close_frame(&frame)

    # -- sample -------------------------------------------------------------------------------

    def sample(self, int64_t batch, double beta, out=None):
        """sample(batch, beta, out=None) -> dict: every column (batch, *shape), then "indexes"
        (int64), "weights" (float32) and "generations" (uint64).

        Fresh arrays, or the arrays of `out` (a dict with those keys, each C-contiguous, of
        that dtype and shape), filled in place and returned in a new dict."""
        self.enter()
        try:
            return self._sample(batch, beta, out)
        finally:
            self.leave()

    cdef object _sample(self, int64_t batch, double beta, out):
        cdef int n = self.columns.count
        cdef int count = n + 3, c
        cdef SampleArguments arguments
        cdef Py_buffer* views
        cdef uint8_t** pointers
        cdef int acquired = 0
        cdef dict result = {}
        cdef ColumnTable columns = self.columns
        if batch <= 0:
            raise ValueError(f"batch_size must be > 0; got {batch}")
        if out is None:
            for c in range(n):
                result[columns.names[c]] = _empty((batch,) + <tuple>columns.shapes[c],
                                                  columns.dtypes[c])
            result["indexes"] = _empty(batch, _INT64)
            result["weights"] = _empty(batch, _FLOAT32)
            result["generations"] = _empty(batch, _UINT64)
        else:
            self.check_out(out, batch)
            for c in range(n):
                result[self.columns.names[c]] = out[self.columns.names[c]]
            result["indexes"] = out["indexes"]
            result["weights"] = out["weights"]
            result["generations"] = out["generations"]
        cdef char* memory = <char*>malloc(count * (sizeof(Py_buffer) + sizeof(uint8_t*))
                                          + batch * sizeof(double))
        if memory == NULL:
            raise MemoryError()
        views = <Py_buffer*>memory
        pointers = <uint8_t**>(memory + count * sizeof(Py_buffer))
        try:
            for array in result.values():
                PyObject_GetBuffer(array, &views[acquired], PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE)
                pointers[acquired] = <uint8_t*>views[acquired].buf
                acquired += 1
            arguments.rng = &self.rng
            arguments.batch = batch
            arguments.beta = beta
            arguments.scratch = <double*>(memory + count * (sizeof(Py_buffer)
                                                            + sizeof(uint8_t*)))
            arguments.indexes = <int64_t*>pointers[n]
            arguments.weights = <float*>pointers[n + 1]
            arguments.generations = <uint64_t*>pointers[n + 2]
            arguments.outputs = pointers
            self.run(sample_kernel, &arguments)
            return result
        finally:
            for c in range(acquired):
                PyBuffer_Release(&views[c])
            free(memory)

    cdef int check_out(self, out, int64_t batch) except -1:
        if not isinstance(out, dict):
            raise TypeError(f"out must be a dict of arrays; got {type(out).__name__}")
        cdef ColumnTable columns = self.columns
        expected = [(columns.names[c], (batch,) + <tuple>columns.shapes[c], columns.dtypes[c])
                    for c in range(self.columns.count)]
        expected += [("indexes", (batch,), _INT64), ("weights", (batch,), _FLOAT32),
                     ("generations", (batch,), _UINT64)]
        for name, shape, dtype in expected:
            array = out.get(name)
            if (type(array) is not _ndarray or array.shape != shape or array.dtype != dtype
                    or not array.flags.c_contiguous or not array.flags.writeable):
                got = ("missing" if array is None else
                       f"{type(array).__name__} {getattr(array, 'dtype', '')} "
                       f"{getattr(array, 'shape', '')}")
                raise ValueError(f"out[{name!r}] must be a writable C-contiguous {dtype} array "
                                 f"of shape {shape}; got {got}")
        return 0

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
        # Arrays as sample() returns them take no conversion; anything else is converted by
        # the rules first (their errors name the argument).
        if not (type(indexes) is _ndarray and indexes.dtype is _INT64):
            indexes = _rules.index_vector(indexes, "indexes")
        try:
            PyObject_GetBuffer(indexes, &index_view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT)
            held = 1
        except (BufferError, ValueError):
            indexes = _rules.index_vector(np.ascontiguousarray(indexes), "indexes")
            PyObject_GetBuffer(indexes, &index_view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT)
            held = 1
        try:
            count = index_view.shape[0] if index_view.ndim == 1 else 1
            if not (type(priorities) is _ndarray and priorities.ndim == 1
                    and (priorities.dtype is _FLOAT64 or priorities.dtype is _FLOAT32)
                    and priorities.flags.c_contiguous):
                priorities = _rules.real_vector(priorities, count, "priorities")
            PyObject_GetBuffer(priorities, &priority_view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT)
            held = 2
            if priority_view.shape[0] != count:
                raise ValueError(f"priorities must have {count} entries (one per index); got "
                                 f"{priority_view.shape[0]}")
            if generations is not None:
                if not (type(generations) is _ndarray and generations.dtype is _UINT64
                        and generations.flags.c_contiguous):
                    generations = _rules.generation_vector(generations, count)
                PyObject_GetBuffer(generations, &generation_view,
                                   PyBUF_C_CONTIGUOUS | PyBUF_FORMAT)
                held = 3
                if generation_view.ndim != 1 or generation_view.shape[0] != count:
                    raise ValueError(f"generations must be 1-D with {count} entries (one per "
                                     f"index); got shape {generations.shape}")
            if count == 0:
                return 0
            stored = self.view.header.stored_size
            with nogil:
                bad = first_out_of_range(<const int64_t*>index_view.buf, count, stored)
            if bad >= 0:
                raise IndexError(f"indexes must be in [0, stored size {stored}); got "
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
            self.weigh(arguments.priorities, scratch, count, "priorities")
            arguments.indexes = <const int64_t*>index_view.buf
            arguments.weights = scratch
            arguments.generations = (<const uint64_t*>generation_view.buf if held >= 3
                                     else NULL)
            arguments.count = count
            return self.run(update_kernel, &arguments)
        finally:
            free(scratch)
            if held >= 3:
                PyBuffer_Release(&generation_view)
            if held >= 2:
                PyBuffer_Release(&priority_view)
            PyBuffer_Release(&index_view)

    # -- whole buffer -------------------------------------------------------------------------

    def clear(self):
        """Forget every row (generations move on, so old samples cannot update new rows)."""
        self.enter()
        try:
            self.run(clear_kernel, NULL)
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
            return self.run(snapshot_kernel, &arguments)
        finally:
            for c in range(acquired):
                PyBuffer_Release(&views[c])
            free(views)
            free(pointers)
            self.leave()

    def check_tree(self):
        """(sum root, sum of leaves, min root, min of set leaves) read under the lock; for tests."""
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
            self.run(tree_kernel, &arguments)
            return arguments.root_sum, sums, arguments.root_min, mins
        finally:
            self.leave()

    def generations_of(self, indexes):
        """Current generation of each slot (uint64), for tests and diagnostics."""
        header = self.header()
        generations = np.ndarray((self.view.capacity,), dtype=np.uint64, buffer=self._memory,
                                 offset=header.data_offset, strides=(self.view.stride,))
        return generations[np.asarray(indexes, dtype=np.int64)].copy()
