# cython: language_level=3
"""The replay store: every operation on a buffer segment as ONE GIL-free call under its lock.

A segment looks like this (offsets in bytes; the layout JSON describes the columns)::

    0     Header (fixed fields below)
    256   robust process-shared mutex (_sync)
    512   layout JSON (utf-8, `layout_length` bytes)
    data_offset, 4096-aligned:
          rows: `capacity` records of `row_stride` bytes: the slot's uint64 generation, then
                one field per column (the layout JSON gives each one's offset in the record)
          tree (sum levels with the shared leaves, then min inner levels; _segtree), 64-aligned

Rows are stored as records, not one array per column: a sampled row is then one cache line
(and one TLB entry) instead of one per column plus one for its generation. Sampling 256 random
rows of a 2**22-row buffer is bound by those misses, so this is what keeps its cost close to
that of a small buffer. The stride is a power of two up to 64 bytes (a record never straddles
two cache lines) and a multiple of 64 above.

Crash safety. Each operation records what it is doing in the header (`op`, and for an add the
slot range it is writing plus the sizes to roll back to) before touching anything, and clears it
last. A holder killed part way leaves the robust mutex in EOWNERDEAD; the next locker rolls the
unfinished add back (its slots are unset in the tree and their generation made odd, so a torn row
can never be sampled or revived), rebuilds the tree from its leaves and marks the mutex
consistent. Rows committed earlier are untouched.

Generations. A slot's generation is even while it holds a committed row and odd while it is being
written or was torn; a commit moves it to the next even number, so a priority update that carries
the generation it sampled is dropped once the slot was overwritten.
"""

cimport cython
from cpython.buffer cimport (PyBUF_ANY_CONTIGUOUS, PyBUF_C_CONTIGUOUS, PyBUF_FORMAT, PyBUF_WRITABLE,
                             PyBuffer_Release, PyObject_GetBuffer)
from libc.float cimport DBL_MAX
from libc.math cimport INFINITY, floor, pow, powf
from libc.stdint cimport int64_t, uint8_t, uint64_t, uintptr_t
from libc.stdlib cimport free, malloc
from posix.types cimport pid_t
from posix.unistd cimport getpid
from libc.string cimport memcpy, memset, strchr

from cpprb_ray._segtree cimport (TreeView, Xoshiro256, is_unset, min_key, rng_seed, rng_uniform,
                                 tree_bind, tree_clear_all, tree_doubles, tree_min, tree_rebuild,
                                 tree_refresh, tree_refresh_range, tree_sample, tree_total,
                                 unset_leaf)
from cpprb_ray._sync cimport (LOCKED_OWNER_DIED, MUTEX_BYTES, mutex_consistent, mutex_init,
                              mutex_lock, mutex_unlock, pthread_mutex_t)

from time import sleep as _sleep

import numpy as np

_ndarray = np.ndarray
_generic = np.generic
_floating = np.floating
_integer = np.integer
_bool = np.bool_

from cpprb_ray._segtree import _seed_from

cdef extern from *:
    """
    #define CPPRB_RAY_MAGIC "CPPRBRAY"
    """
    const char* CPPRB_RAY_MAGIC


cdef extern from *:
    """
    #if defined(__GNUC__) || defined(__clang__)
    #define CPPRB_RAY_PREFETCH(address) __builtin_prefetch((address), 0, 1)
    #else
    #define CPPRB_RAY_PREFETCH(address) ((void)(address))
    #endif
    """
    void prefetch "CPPRB_RAY_PREFETCH"(const void* address) noexcept nogil

cdef extern from *:
    """
    #include <stdint.h>
    /* Publish a change of the in-flight operation marker (header.op). A holder killed between
       two instructions leaves exactly the stores it had issued, and the repair trusts the
       marker: the record of what to undo must be in memory before "op = ADD", and every
       commit store before "op = NONE". Plain stores give no such order: gcc -O3 moved
       "op = ADD" above the record and "op = NONE" above the commit (tests/test_crash_points.py
       finds both). The fences cost nothing on x86 (compiler barriers; its stores stay in
       program order) and are a dmb on ARM. */
    static inline void cpprb_ray_release_fence(void) {
        __atomic_thread_fence(__ATOMIC_RELEASE);
    }
    static inline void cpprb_ray_publish_op(uint64_t* op, uint64_t value) {
        cpprb_ray_release_fence();
        __atomic_store_n(op, value, __ATOMIC_RELAXED);
        cpprb_ray_release_fence();
    }
    """
    void publish_op "cpprb_ray_publish_op"(uint64_t* op, uint64_t value) noexcept nogil
    void release_fence "cpprb_ray_release_fence"() noexcept nogil

cdef enum:
    GATHER_AHEAD = 8
    FUTEX_TID_MASK = 0x3fffffff


cdef struct Header:
    char magic[8]
    uint64_t version
    uint64_t total_size
    uint64_t capacity
    uint64_t prioritized
    double alpha
    double eps
    uint64_t next_index
    uint64_t stored_size
    double max_priority
    uint64_t op                  # OP_* in flight, for repair after a holder's death
    uint64_t pending_start
    uint64_t pending_count
    uint64_t pending_old_next
    uint64_t pending_old_stored
    uint64_t owner_pid
    uint64_t layout_offset
    uint64_t layout_length
    uint64_t data_offset
    uint64_t tree_offset
    uint64_t rows_added          # rows ever committed
    uint64_t repairs             # times a dead holder's work was repaired
    uint64_t created_ns
    uint64_t row_stride
    uint64_t pending_old_rows_added
    double pending_old_max_priority


cdef enum:
    OP_NONE = 0
    OP_ADD = 1
    OP_UPDATE = 2
    OP_CLEAR = 3

cdef enum:
    # Kernel results besides >= 0 counts.
    ERR_EMPTY = -1
    ERR_ALL_ZERO = -2
    ERR_ALL_TORN = -3

cdef enum:
    HEADER_BYTES = 256
    MUTEX_AT = 256
    LAYOUT_AT = 512
    VERSION = 2          # 2: the sum and min trees share their leaves; no rows_offset

HEADER_NBYTES = HEADER_BYTES
MUTEX_OFFSET = MUTEX_AT
LAYOUT_OFFSET = LAYOUT_AT
LAYOUT_VERSION = VERSION
MAGIC = b"CPPRBRAY"

if sizeof(Header) > HEADER_BYTES:  # pragma: no cover
    raise ImportError("Header outgrew its reserved space")

_HEADER_FIELDS = (
    "version", "total_size", "capacity", "prioritized", "alpha", "eps", "next_index",
    "stored_size", "max_priority", "op", "pending_start", "pending_count", "pending_old_next",
    "pending_old_stored", "owner_pid", "layout_offset", "layout_length", "data_offset",
    "tree_offset", "rows_added", "repairs", "created_ns", "row_stride",
    "pending_old_rows_added", "pending_old_max_priority",
)


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
    """read_header(memory) -> dict: the fixed header fields, plus `magic` (bytes)."""
    cdef Py_buffer view
    cdef Header* header = _header_of(memory, &view)
    try:
        fields = {"magic": bytes(header.magic[:8])}
        fields.update({
            "version": header.version, "total_size": header.total_size,
            "capacity": header.capacity, "prioritized": header.prioritized,
            "alpha": header.alpha, "eps": header.eps, "next_index": header.next_index,
            "stored_size": header.stored_size, "max_priority": header.max_priority,
            "op": header.op, "pending_start": header.pending_start,
            "pending_count": header.pending_count, "pending_old_next": header.pending_old_next,
            "pending_old_stored": header.pending_old_stored, "owner_pid": header.owner_pid,
            "layout_offset": header.layout_offset, "layout_length": header.layout_length,
            "data_offset": header.data_offset, "tree_offset": header.tree_offset,
            "rows_added": header.rows_added,
            "repairs": header.repairs, "created_ns": header.created_ns,
            "row_stride": header.row_stride,
            "pending_old_rows_added": header.pending_old_rows_added,
            "pending_old_max_priority": header.pending_old_max_priority,
        })
        return fields
    finally:
        PyBuffer_Release(&view)


def initialize_segment(memory, *, total_size, capacity, prioritized, alpha, eps, owner_pid,
                       layout_json, data_offset, tree_offset, row_stride,
                       created_ns):
    """Lay a new header, mutex, layout and empty tree in zeroed `memory`.

    The magic is written last, so an attacher that sees it finds everything else in place.
    """
    cdef Py_buffer view
    cdef Header* header = _header_of(memory, &view)
    cdef TreeView tree
    cdef char* base = <char*>view.buf
    try:
        if LAYOUT_OFFSET + len(layout_json) > data_offset:
            raise ValueError("layout JSON overlaps the data")
        memoryview(memory)[LAYOUT_OFFSET:LAYOUT_OFFSET + len(layout_json)] = layout_json
        header.version = LAYOUT_VERSION
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
        header.rows_added = 0
        header.repairs = 0
        header.created_ns = created_ns
        status = mutex_init(<pthread_mutex_t*>(base + MUTEX_AT))
        if status:
            raise OSError(status, "pthread_mutex_init failed")
        tree_bind(&tree, <double*>(base + <int64_t>tree_offset), <int64_t>capacity)
        tree_clear_all(&tree)
        release_fence()   # everything above is in memory before the magic says it is
        memcpy(header.magic, CPPRB_RAY_MAGIC, 8)
    finally:
        PyBuffer_Release(&view)


cdef bint _is_format(const Py_buffer* view, const char* codes, Py_ssize_t itemsize=8) noexcept:
    """A 1-D buffer of `itemsize`-byte items whose struct format code (after any byte-order
    mark) is one of `codes`."""
    cdef const char* fmt = view.format
    if view.itemsize != itemsize or view.ndim != 1 or fmt == NULL:
        return False
    if fmt[0] in b"@=<":
        fmt += 1
    return fmt[0] != 0 and fmt[1] == 0 and strchr(codes, fmt[0]) != NULL


cdef int64_t first_out_of_range(const int64_t* values, int64_t count,
                                int64_t limit) noexcept nogil:
    cdef int64_t k
    for k in range(count):
        if values[k] < 0 or values[k] >= limit:
            return k
    return -1


cdef inline double leaf_weight(double priority, double alpha, double eps) noexcept nogil:
    return pow(priority + eps, alpha)


cdef inline void copy_row(uint8_t* dst, const uint8_t* src, int64_t row_bytes) noexcept nogil:
    # Small fixed sizes are the common case (scalars, float32[4]); let the compiler inline them.
    if row_bytes == 4:
        memcpy(dst, src, 4)
    elif row_bytes == 8:
        memcpy(dst, src, 8)
    elif row_bytes == 16:
        memcpy(dst, src, 16)
    else:
        memcpy(dst, src, <size_t>row_bytes)


@cython.final
cdef class ReplayStore:
    """Kernels over one mapped segment. Built by :mod:`cpprb_ray.buffer`, not by users."""

    cdef Py_buffer _buffer
    cdef bint _has_buffer
    cdef object _memory
    cdef uint8_t* base
    cdef Header* header
    cdef pthread_mutex_t* mutex
    cdef TreeView tree
    cdef uint8_t* rows
    cdef int64_t stride
    cdef int64_t capacity
    cdef int column_count
    cdef int64_t* columns         # offset of each column's field inside a row record
    cdef int64_t* row_bytes
    cdef Xoshiro256 rng
    cdef readonly bint prioritized
    cdef pid_t rng_pid            # process the sampler was seeded in
    cdef double max_weight        # largest leaf weight such that the total cannot overflow
    cdef double max_base          # largest p + eps whose weight stays within max_weight
    cdef int active               # threads of this process inside a kernel on this store
    cdef bint closing
    # For the fast add path: what each column accepts without numpy's help.
    cdef list column_dtypes
    cdef list column_shapes
    cdef char* column_kinds
    cdef int64_t* column_itemsizes

    def __cinit__(self):
        self._has_buffer = False
        self.active = 0
        self.closing = False
        self.columns = NULL
        self.row_bytes = NULL
        self.column_kinds = NULL
        self.column_itemsizes = NULL

    def __init__(self, memory, column_offsets, column_row_bytes, seed=None, column_dtypes=None,
                 column_shapes=None):
        cdef int c
        PyObject_GetBuffer(memory, &self._buffer, PyBUF_WRITABLE | PyBUF_ANY_CONTIGUOUS)
        self._has_buffer = True
        self._memory = memory
        self.base = <uint8_t*>self._buffer.buf
        self.header = <Header*>self.base
        self.mutex = <pthread_mutex_t*>(self.base + MUTEX_AT)
        self.capacity = self.header.capacity
        self.prioritized = self.header.prioritized != 0
        self.max_weight = DBL_MAX / (2.0 * self.capacity)
        # (p + eps) ** alpha <= max_weight  <=>  p + eps <= max_weight ** (1 / alpha); inf when
        # no finite base can exceed it. Rounded down a little so pow() rounding cannot slip by.
        self.max_base = (INFINITY if self.header.alpha <= 0.0 else
                         pow(self.max_weight, 1.0 / self.header.alpha) * (1.0 - 1e-12))
        tree_bind(&self.tree, <double*>(self.base + self.header.tree_offset), self.capacity)
        self.rows = self.base + self.header.data_offset
        self.stride = self.header.row_stride
        self.column_count = len(column_offsets)
        self.columns = <int64_t*>malloc(max(1, self.column_count) * sizeof(int64_t))
        self.row_bytes = <int64_t*>malloc(max(1, self.column_count) * sizeof(int64_t))
        if self.columns == NULL or self.row_bytes == NULL:
            raise MemoryError()
        self.column_kinds = <char*>malloc(max(1, self.column_count) * sizeof(char))
        self.column_itemsizes = <int64_t*>malloc(max(1, self.column_count) * sizeof(int64_t))
        if self.column_kinds == NULL or self.column_itemsizes == NULL:
            raise MemoryError()
        self.column_dtypes = list(column_dtypes or [])
        self.column_shapes = [tuple(shape) for shape in (column_shapes or [])]
        for c in range(self.column_count):
            self.columns[c] = column_offsets[c]
            self.row_bytes[c] = column_row_bytes[c]
            if c < len(self.column_dtypes):
                dtype = self.column_dtypes[c]
                native = dtype.isnative and dtype.kind in "biuf"
                self.column_kinds[c] = ord(dtype.kind) if native else 0
                self.column_itemsizes[c] = dtype.itemsize
            else:
                self.column_kinds[c] = 0
                self.column_itemsizes[c] = 0
        rng_seed(&self.rng, _seed_from(seed))
        self.rng_pid = getpid()

    def __dealloc__(self):
        free(self.columns)
        free(self.row_bytes)
        free(self.column_kinds)
        free(self.column_itemsizes)
        if self._has_buffer:
            PyBuffer_Release(&self._buffer)

    def release(self):
        """Drop the buffer export so the mapping can be closed. Later calls raise ValueError.

        Waits for threads of this process that are inside a kernel on this store to leave it:
        unmapping under them would crash them.
        """
        self.closing = True
        while self.active > 0:
            _sleep(0.0002)   # releases the GIL, which they need to leave
        if self._has_buffer:
            PyBuffer_Release(&self._buffer)
            self._has_buffer = False
        self._memory = None
        self.base = NULL

    cdef int _check(self) except -1:
        if not self._has_buffer or self.closing:
            raise ValueError("operation on a closed buffer")
        return 0

    def lock_owner(self):
        """Thread id in the mutex's lock word (0 when free; glibc keeps the holder's tid in the
        first int of a robust mutex). Lets attach refuse a lock held by a thread that does not
        exist -- a corrupt or foreign segment -- instead of waiting for it forever."""
        self._check()
        return (<const int*>self.mutex)[0] & FUTEX_TID_MASK

    def check_priorities(self, priorities, str name="priorities"):
        """Raise ValueError naming `name` unless every float64 priority is finite, >= 0 and small
        enough that its weight (p + eps) ** alpha keeps the tree's total finite."""
        cdef const double[::1] view = priorities
        cdef int64_t bad = -1
        cdef bint overflow = False
        if view.shape[0]:
            with nogil:
                bad = self.weigh(&view[0], NULL, view.shape[0], &overflow)
        if bad >= 0 and overflow:
            raise ValueError(f"{name} must keep (p + eps) ** alpha <= {self.max_weight:.3g} (so "
                             f"the total of {self.capacity} rows stays finite); got {view[bad]} "
                             f"at position {bad}")
        if bad >= 0:
            raise ValueError(f"{name} must be finite and >= 0; got {view[bad]} at position {bad}")

    cdef int64_t weigh(self, const double* priorities, double* weights, int64_t count,
                       bint* overflow) noexcept nogil:
        """Check priorities (finite, >= 0, weight within max_weight) and, when `weights` is
        given, compute their leaf weights; the position of the first bad one, or -1.

        The bound is checked on p + eps against max_weight ** (1 / alpha), precomputed, so
        validating costs no pow(); the weights are computed here, outside the lock."""
        cdef int64_t k
        cdef double base
        for k in range(count):
            base = priorities[k] + self.header.eps
            if not (priorities[k] >= 0.0 and base <= DBL_MAX):
                overflow[0] = False
                return k
            if not base <= self.max_base:
                overflow[0] = True
                return k
            if weights != NULL:
                weights[k] = leaf_weight(priorities[k], self.header.alpha, self.header.eps)
        return -1

    cdef int _enter(self) except -1:
        # Called with the GIL held, like _leave and release(), so a plain counter is enough.
        self._check()
        self.active += 1
        return 0

    cdef void _leave(self) noexcept:
        self.active -= 1

    def seed(self, seed):
        """Reseed this handle's sampler."""
        rng_seed(&self.rng, _seed_from(seed))
        self.rng_pid = getpid()

    # -- header fields, read without the lock (aligned 8-byte loads never tear) -----------------

    @property
    def stored_size(self):
        self._check()
        return self.header.stored_size

    @property
    def next_index(self):
        self._check()
        return self.header.next_index

    @property
    def max_priority(self):
        self._check()
        return self.header.max_priority

    @property
    def rows_added(self):
        self._check()
        return self.header.rows_added

    @property
    def repairs(self):
        self._check()
        return self.header.repairs

    # -- locking and repair ---------------------------------------------------------------------

    cdef int lock(self) noexcept nogil:
        cdef int status = mutex_lock(self.mutex)
        if status == LOCKED_OWNER_DIED:
            self.repair()
            mutex_consistent(self.mutex)
            return 0
        return status

    cdef void unlock(self) noexcept nogil:
        mutex_unlock(self.mutex)

    cdef void repair(self) noexcept nogil:
        """Undo what a holder killed mid-operation left; idempotent (the repairer may die too)."""
        cdef Header* h = self.header
        cdef uint64_t k, slot
        if h.op == OP_ADD:
            for k in range(h.pending_count):
                slot = (h.pending_start + k) % <uint64_t>self.capacity
                self.tree.sums[slot] = unset_leaf()
                self.generation(slot)[0] |= 1
            h.next_index = h.pending_old_next
            h.stored_size = h.pending_old_stored
            h.rows_added = h.pending_old_rows_added
            h.max_priority = h.pending_old_max_priority
        elif h.op == OP_CLEAR:
            self.clear_locked()
        tree_rebuild(&self.tree)
        publish_op(&h.op, OP_NONE)
        h.repairs += 1

    cdef void clear_locked(self) noexcept nogil:
        cdef int64_t slot
        publish_op(&self.header.op, OP_CLEAR)
        cdef uint64_t* generation
        for slot in range(self.capacity):
            generation = self.generation(slot)
            generation[0] = (generation[0] | 1) + 1
        tree_clear_all(&self.tree)
        self.header.next_index = 0
        self.header.stored_size = 0
        self.header.max_priority = 1.0
        publish_op(&self.header.op, OP_NONE)

    # -- add --------------------------------------------------------------------------------------

    cdef int64_t add_locked(self, const uint8_t** sources, int64_t count,
                            const double* priorities) noexcept nogil:
        cdef Header* h = self.header
        cdef int64_t capacity = self.capacity
        cdef int64_t skipped = count - capacity if count > capacity else 0
        cdef int64_t written = count - skipped
        cdef int64_t start = (<int64_t>h.next_index + skipped) % capacity
        cdef int64_t first_part = min(written, capacity - start)
        cdef int64_t k, slot, c, rb
        cdef double weight = 0.0, priority, max_priority = h.max_priority
        cdef uint8_t* row
        cdef uint64_t* generation
        if priorities == NULL:
            weight = leaf_weight(max_priority, h.alpha, h.eps)   # the same for every new row
        # 1. Say what we are about to do, so a repairer can undo it.
        h.pending_start = start
        h.pending_count = written
        h.pending_old_next = h.next_index
        h.pending_old_stored = h.stored_size
        h.pending_old_rows_added = h.rows_added
        h.pending_old_max_priority = h.max_priority
        publish_op(&h.op, OP_ADD)
        # 2. Copy each row into its record, move its generation to the next even number and
        #    its priority into the leaf.
        for k in range(written):
            slot = (start + k) % capacity
            row = self.rows + slot * self.stride
            generation = <uint64_t*>row
            generation[0] = (generation[0] | 1) + 1
            for c in range(self.column_count):
                rb = self.row_bytes[c]
                copy_row(row + self.columns[c], sources[c] + (skipped + k) * rb, rb)
            if self.prioritized:
                if priorities != NULL:
                    weight = leaf_weight(priorities[skipped + k], h.alpha, h.eps)
                # A zero weight is kept out of min() (weights divide by it) like an unset leaf.
                self.tree.sums[slot] = weight if weight > 0.0 else unset_leaf()
        if self.prioritized:
            tree_refresh_range(&self.tree, start, first_part)
            tree_refresh_range(&self.tree, 0, written - first_part)
            if priorities != NULL:
                for k in range(count):
                    if priorities[k] > max_priority:
                        max_priority = priorities[k]
                h.max_priority = max_priority
        # 3. Commit.
        h.stored_size = min(<int64_t>h.stored_size + written, capacity)
        h.next_index = (start + written) % capacity
        h.rows_added += count
        publish_op(&h.op, OP_NONE)
        return start

    def add(self, sources, int64_t count, priorities=None):
        """add(sources, count, priorities) -> int: first slot written.

        `sources` are C-contiguous arrays of exactly `count` rows each, in column order, already
        of the column dtype; `priorities` is None or `count` finite float64 >= 0.
        """
        self._enter()
        try:
            return self._add(sources, count, priorities)
        finally:
            self._leave()

    cdef object _add(self, sources, int64_t count, priorities=None):
        if count <= 0:
            raise ValueError(f"count must be > 0; got {count}")
        if len(sources) != self.column_count:
            raise ValueError(f"expected {self.column_count} columns; got {len(sources)}")
        cdef Py_buffer* views = <Py_buffer*>malloc((self.column_count + 1) * sizeof(Py_buffer))
        cdef const uint8_t** pointers = <const uint8_t**>malloc(
            (self.column_count + 1) * sizeof(uint8_t*))
        cdef Py_buffer priority_view
        cdef bint has_priorities = False
        cdef const double* priority_pointer = NULL
        cdef int acquired = 0
        cdef int c, status
        cdef int64_t first = 0
        if views == NULL or pointers == NULL:
            free(views)
            free(pointers)
            raise MemoryError()
        try:
            for c in range(self.column_count):
                PyObject_GetBuffer(sources[c], &views[c], PyBUF_C_CONTIGUOUS)
                acquired += 1
                if views[c].len != count * self.row_bytes[c]:
                    raise ValueError(
                        f"column {c} holds {views[c].len} bytes; expected {count} rows of "
                        f"{self.row_bytes[c]} bytes")
                pointers[c] = <const uint8_t*>views[c].buf
            if priorities is not None:
                PyObject_GetBuffer(priorities, &priority_view, PyBUF_C_CONTIGUOUS)
                has_priorities = True
                if priority_view.len != count * 8:
                    raise ValueError(f"priorities must hold {count} float64 values")
                priority_pointer = <const double*>priority_view.buf
            with nogil:
                status = self.lock()
                if status == 0:
                    first = self.add_locked(pointers, count, priority_pointer)
                    self.unlock()
            if status:
                raise OSError(-status, "locking the buffer failed")
            return first
        finally:
            for c in range(acquired):
                PyBuffer_Release(&views[c])
            if has_priorities:
                PyBuffer_Release(&priority_view)
            free(views)
            free(pointers)

    cdef int stage_scalar(self, int c, object value, uint8_t* slot) except -1:
        """Write a Python scalar as column c's one-element row; 0 if numpy's rules are needed."""
        cdef char kind = self.column_kinds[c]
        cdef int64_t size = self.column_itemsizes[c]
        cdef type value_type = type(value)
        if isinstance(value, _generic):
            # numpy scalars follow the same rules as the Python scalars of their kind.
            if isinstance(value, _floating):
                value = float(value)
            elif isinstance(value, _bool):
                value = bool(value)
            elif isinstance(value, _integer):
                value = int(value)
            else:
                return 0
            value_type = type(value)
        try:
            if kind == b"f" and (value_type is float or value_type is int or value_type is bool):
                if size == 8:
                    (<double*>slot)[0] = <double>value
                    return 1
                if size == 4:
                    (<float*>slot)[0] = <float><double>value
                    return 1
            elif kind == b"i" and (value_type is int or value_type is bool):
                if size == 8:
                    (<int64_t*>slot)[0] = <int64_t>value
                    return 1
            elif kind == b"b" and value_type is bool:
                slot[0] = 1 if value else 0
                return 1
        except OverflowError:
            return 0
        return 0

    def try_add(self, values):
        """add() without numpy: values already of the column dtype (ndarrays, C-contiguous, of the
        row or batch shape) or Python scalars for one-element columns. Returns the first slot
        written, or None when any value needs the general (validating, casting) path; nothing
        is written then."""
        self._enter()
        try:
            return self._try_add(values)
        finally:
            self._leave()

    cdef object _try_add(self, values):
        cdef int n = self.column_count
        cdef Py_buffer* views = <Py_buffer*>malloc(n * sizeof(Py_buffer))
        cdef const uint8_t** pointers = <const uint8_t**>malloc(n * sizeof(uint8_t*))
        cdef uint8_t* staging = <uint8_t*>malloc(n * 8)
        cdef char* acquired = <char*>malloc(n)
        cdef int c, status
        cdef int64_t count = -1, rows, first = 0
        cdef tuple shape, column_shape
        if views == NULL or pointers == NULL or staging == NULL or acquired == NULL:
            free(views)
            free(pointers)
            free(staging)
            free(acquired)
            raise MemoryError()
        memset(acquired, 0, n)
        try:
            for c in range(n):
                value = values[c]
                if type(value) is _ndarray:
                    if value.dtype is not self.column_dtypes[c]:
                        if value.dtype != self.column_dtypes[c]:
                            return None
                    shape = value.shape
                    column_shape = self.column_shapes[c]
                    if shape == column_shape:
                        rows = 1
                    elif len(shape) == len(column_shape) + 1 and shape[1:] == column_shape:
                        rows = shape[0]
                    elif column_shape == (1,) and len(shape) <= 1:
                        # cpprb lets one-element columns drop their last axis.
                        rows = shape[0] if len(shape) == 1 else 1
                    else:
                        return None
                    try:
                        PyObject_GetBuffer(value, &views[c], PyBUF_C_CONTIGUOUS)
                    except (BufferError, ValueError):  # numpy: "not C-contiguous"
                        return None
                    acquired[c] = 1
                    pointers[c] = <const uint8_t*>views[c].buf
                elif self.row_bytes[c] == self.column_itemsizes[c] and self.stage_scalar(
                        c, value, staging + 8 * c):
                    rows = 1
                    pointers[c] = staging + 8 * c
                else:
                    return None
                if count < 0:
                    count = rows
                elif rows != count:
                    return None
            if count <= 0:
                return None
            with nogil:
                status = self.lock()
                if status == 0:
                    first = self.add_locked(pointers, count, NULL)
                    self.unlock()
            if status:
                raise OSError(-status, "locking the buffer failed")
            return first
        finally:
            for c in range(n):
                if acquired[c]:
                    PyBuffer_Release(&views[c])
            free(views)
            free(pointers)
            free(staging)
            free(acquired)

    # -- sample -----------------------------------------------------------------------------------

    cdef int64_t sample_locked(self, int64_t batch, double beta, double* scratch,
                               int64_t* indexes, float* weights, uint64_t* generations,
                               uint8_t** outputs) noexcept nogil:
        cdef Header* h = self.header
        cdef int64_t k, c, rb, index, stored = h.stored_size, tries
        cdef double lowest, total, inverse_lowest
        cdef uint8_t* dst
        cdef const uint8_t* src
        if stored == 0:
            return ERR_EMPTY
        if self.prioritized:
            total = tree_total(&self.tree)
            if not total > 0.0:
                return ERR_ALL_ZERO
            tree_sample(&self.tree, &self.rng, scratch, indexes, batch)
            # Ask for every sampled record now: their misses then overlap the weights below
            # instead of waiting for the gather. (Asking from inside the walk, as each leaf is
            # found, measured slower: those misses then compete with the walk's own.)
            for k in range(batch):
                self.prefetch_row(indexes[k])
            lowest = tree_min(&self.tree)
            # (N P(i))^-beta / max_j (N P(j))^-beta == (p_i / p_min)^-beta. The weights are
            # float32, so float32 powf (about 1e-7 relative) is exact enough and much cheaper.
            inverse_lowest = 1.0 / lowest
            for k in range(batch):
                weights[k] = 1.0 if beta == 0.0 else powf(
                    <float>(self.tree.sums[indexes[k]] * inverse_lowest), <float>-beta)
        else:
            for k in range(batch):
                # Skip a slot torn by a writer's death (odd generation); bounded retries, then
                # a scan, so a buffer of only torn rows is reported empty instead of looping.
                index = <int64_t>floor(rng_uniform(&self.rng) * stored)
                tries = 0
                while self.generation(index)[0] & 1:
                    tries += 1
                    if tries < 64:
                        index = <int64_t>floor(rng_uniform(&self.rng) * stored)
                    else:
                        index = 0
                        while index < stored and self.generation(index)[0] & 1:
                            index += 1
                        if index == stored:
                            return ERR_ALL_TORN
                        break
                indexes[k] = index
                weights[k] = 1.0
        self.gather_locked(batch, indexes, generations, outputs)
        return batch

    cdef void gather_locked(self, int64_t batch, const int64_t* indexes, uint64_t* generations,
                            uint8_t** outputs) noexcept nogil:
        """Copy the sampled rows out, asking GATHER_AHEAD rows ahead for their record so that
        the cache misses of a big buffer overlap."""
        cdef int64_t k, c, rb
        cdef const uint8_t* row
        for k in range(min(batch, GATHER_AHEAD)):
            self.prefetch_row(indexes[k])
        for k in range(batch):
            if k + GATHER_AHEAD < batch:
                self.prefetch_row(indexes[k + GATHER_AHEAD])
            row = self.rows + indexes[k] * self.stride
            generations[k] = (<const uint64_t*>row)[0]
            for c in range(self.column_count):
                rb = self.row_bytes[c]
                copy_row(outputs[c] + k * rb, row + self.columns[c], rb)

    cdef inline void prefetch_row(self, int64_t index) noexcept nogil:
        cdef const uint8_t* row = self.rows + index * self.stride
        cdef int64_t line
        for line in range(0, self.stride, 64):
            prefetch(row + line)

    cdef inline void prefetch_update(self, int64_t index, bint record) noexcept nogil:
        prefetch(self.tree.sums + index)
        if record:
            prefetch(self.rows + index * self.stride)

    cdef inline uint64_t* generation(self, int64_t slot) noexcept nogil:
        return <uint64_t*>(self.rows + slot * self.stride)

    def sample(self, int64_t batch, double beta, outputs, indexes, weights, generations):
        """Fill the given fresh arrays with a sample of `batch` rows. Raises ValueError if empty."""
        self._enter()
        try:
            return self._sample(batch, beta, outputs, indexes, weights, generations)
        finally:
            self._leave()

    cdef object _sample(self, int64_t batch, double beta, outputs, indexes, weights, generations):
        if getpid() != self.rng_pid:
            # A forked child inherited this handle's sampler state: without a fresh seed it
            # would draw exactly the parent's samples.
            rng_seed(&self.rng, _seed_from(None))
            self.rng_pid = getpid()
        cdef int count = self.column_count + 3
        cdef Py_buffer* views = <Py_buffer*>malloc(count * sizeof(Py_buffer))
        cdef uint8_t** pointers = <uint8_t**>malloc(count * sizeof(uint8_t*))
        cdef double* scratch = <double*>malloc(batch * sizeof(double))
        cdef int acquired = 0
        cdef int c, status
        cdef int64_t result = 0
        arrays = list(outputs) + [indexes, weights, generations]
        if views == NULL or pointers == NULL or scratch == NULL:
            free(views)
            free(pointers)
            free(scratch)
            raise MemoryError()
        try:
            for c in range(count):
                PyObject_GetBuffer(arrays[c], &views[c], PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE)
                acquired += 1
                pointers[c] = <uint8_t*>views[c].buf
            with nogil:
                status = self.lock()
                if status == 0:
                    result = self.sample_locked(
                        batch, beta, scratch, <int64_t*>pointers[count - 3],
                        <float*>pointers[count - 2], <uint64_t*>pointers[count - 1], pointers)
                    self.unlock()
            if status:
                raise OSError(-status, "locking the buffer failed")
            if result == ERR_EMPTY:
                raise ValueError("cannot sample from an empty buffer")
            if result == ERR_ALL_ZERO:
                raise ValueError("cannot sample: every stored row has weight 0 (all priorities "
                                 "are 0 and eps is 0)")
            if result == ERR_ALL_TORN:
                raise ValueError("cannot sample: every stored row was torn by a writer that "
                                 "died mid-add")
        finally:
            for c in range(acquired):
                PyBuffer_Release(&views[c])
            free(views)
            free(pointers)
            free(scratch)

    # -- update -----------------------------------------------------------------------------------

    cdef int64_t update_locked(self, const int64_t* indexes, const double* priorities,
                               const double* weights, const uint64_t* generations,
                               int64_t count) noexcept nogil:
        cdef Header* h = self.header
        cdef int64_t k, index, applied = 0, stored = h.stored_size
        cdef double weight, max_priority = h.max_priority
        cdef uint64_t generation
        # Software pipelining: ask for the leaf lines (and the record, when generations are
        # checked) of the entry GATHER_AHEAD places ahead, so several misses are in flight.
        for k in range(min(count, GATHER_AHEAD)):
            self.prefetch_update(indexes[k], generations != NULL)
        publish_op(&h.op, OP_UPDATE)
        for k in range(count):
            if k + GATHER_AHEAD < count:
                self.prefetch_update(indexes[k + GATHER_AHEAD], generations != NULL)
            index = indexes[k]
            if index >= stored:
                continue          # cleared since validation
            if generations != NULL:
                generation = self.generation(index)[0]
                if generation & 1 or generation != generations[k]:
                    continue      # torn by a dead writer, or overwritten since it was sampled
            elif is_unset(self.tree.sums[index]) and self.generation(index)[0] & 1:
                # A torn slot always has an unset leaf, so only such leaves need the record
                # read (one cache miss each) to tell torn rows from rows of weight 0.
                continue
            weight = weights[k]
            self.tree.sums[index] = weight if weight > 0.0 else unset_leaf()
            if priorities[k] > max_priority:
                max_priority = priorities[k]
            applied += 1
        tree_refresh(&self.tree, indexes, count)
        h.max_priority = max_priority
        publish_op(&h.op, OP_NONE)
        return applied

    def update(self, indexes, priorities, generations=None):
        """Apply 1-D C-contiguous numpy arrays: int64 `indexes`, float64 or float32
        `priorities` and optional uint64 `generations`, all of one length; returns how many
        were applied, or -1 (having done nothing) when the arrays are not of those kinds, for
        the caller to convert them. Indexes must be below the stored size and priorities
        finite and >= 0: checked here in one pass each (IndexError / ValueError, nothing
        applied)."""
        self._enter()
        try:
            return self._update(indexes, priorities, generations)
        finally:
            self._leave()

    cdef object _update(self, indexes, priorities, generations):
        # Raw buffer views: cheaper than typed memoryviews for three small arrays per call, and
        # they let the common case (arrays as sample() returns them, priorities from a float32
        # network) skip every conversion in Python.
        cdef Py_buffer index_buffer, priority_buffer, generation_buffer
        cdef int held = 0
        cdef int64_t count, stored, bad, k, applied = 0
        cdef const int64_t* index_pointer
        cdef const double* priority_pointer
        cdef const float* single_pointer = NULL
        cdef const uint64_t* generation_pointer = NULL
        cdef double* scratch = NULL
        cdef bint overflow = False
        cdef int status = 0
        if type(indexes) is not _ndarray or type(priorities) is not _ndarray or not (
                generations is None or type(generations) is _ndarray):
            return -1
        try:
            try:
                PyObject_GetBuffer(indexes, &index_buffer, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT)
                held = 1
                PyObject_GetBuffer(priorities, &priority_buffer, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT)
                held = 2
                if generations is not None:
                    PyObject_GetBuffer(generations, &generation_buffer,
                                       PyBUF_C_CONTIGUOUS | PyBUF_FORMAT)
                    held = 3
            except (BufferError, ValueError):
                return -1  # not contiguous, or a dtype with no buffer format
            if not (_is_format(&index_buffer, b"lq") and (
                    _is_format(&priority_buffer, b"d")
                    or _is_format(&priority_buffer, b"f", 4))
                    and priority_buffer.shape[0] == index_buffer.shape[0]
                    and (generations is None or (
                        _is_format(&generation_buffer, b"LQ")
                        and generation_buffer.shape[0] == index_buffer.shape[0]))):
                return -1
            count = index_buffer.shape[0]
            if count == 0:
                return 0
            index_pointer = <const int64_t*>index_buffer.buf
            priority_pointer = <const double*>priority_buffer.buf
            if priority_buffer.itemsize == 4:
                single_pointer = <const float*>priority_buffer.buf
            if generations is not None:
                generation_pointer = <const uint64_t*>generation_buffer.buf
            stored = self.header.stored_size
            with nogil:
                bad = first_out_of_range(index_pointer, count, stored)
            if bad >= 0:
                raise IndexError(f"indexes must be in [0, stored size {stored}); got "
                                 f"{index_pointer[bad]} at position {bad}")
            # One allocation: the leaf weights, then (for float32 input) the priorities widened.
            scratch = <double*>malloc(2 * count * sizeof(double))
            if scratch == NULL:
                raise MemoryError()
            with nogil:
                if single_pointer != NULL:
                    for k in range(count):
                        scratch[count + k] = single_pointer[k]
                    priority_pointer = scratch + count
                bad = self.weigh(priority_pointer, scratch, count, &overflow)
            if bad >= 0:
                # Raises the message for position `bad`.
                self.check_priorities(np.asarray(<double[:count]>priority_pointer))
            with nogil:
                status = self.lock()
                if status == 0:
                    applied = self.update_locked(index_pointer, priority_pointer, scratch,
                                                 generation_pointer, count)
                    self.unlock()
        finally:
            free(scratch)
            if held >= 3:
                PyBuffer_Release(&generation_buffer)
            if held >= 2:
                PyBuffer_Release(&priority_buffer)
            if held >= 1:
                PyBuffer_Release(&index_buffer)
        if status:
            raise OSError(-status, "locking the buffer failed")
        return applied

    # -- whole-buffer operations --------------------------------------------------------------

    def clear(self):
        """Forget every row (generations move on, so old samples cannot update new rows)."""
        self._enter()
        try:
            return self._clear()
        finally:
            self._leave()

    cdef object _clear(self):
        cdef int status
        with nogil:
            status = self.lock()
            if status == 0:
                self.clear_locked()
                self.unlock()
        if status:
            raise OSError(-status, "locking the buffer failed")

    def snapshot(self, outputs, indexes, priorities):
        """Copy every committed row in slot order into `outputs` (each sized for the stored size
        read before the call); returns how many rows were copied (torn rows are left out)."""
        self._enter()
        try:
            return self._snapshot(outputs, indexes, priorities)
        finally:
            self._leave()

    cdef object _snapshot(self, outputs, indexes, priorities):
        cdef int count = self.column_count + 2
        cdef Py_buffer* views = <Py_buffer*>malloc(count * sizeof(Py_buffer))
        cdef uint8_t** pointers = <uint8_t**>malloc(count * sizeof(uint8_t*))
        cdef int acquired = 0
        cdef int c, status
        cdef int64_t slot, room, copied = 0, rb
        arrays = list(outputs) + [indexes, priorities]
        if views == NULL or pointers == NULL:
            free(views)
            free(pointers)
            raise MemoryError()
        try:
            for c in range(count):
                PyObject_GetBuffer(arrays[c], &views[c], PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE)
                acquired += 1
                pointers[c] = <uint8_t*>views[c].buf
            room = views[count - 2].len // 8
            with nogil:
                status = self.lock()
                if status == 0:
                    for slot in range(min(room, <int64_t>self.header.stored_size)):
                        if self.generation(slot)[0] & 1:
                            continue
                        for c in range(self.column_count):
                            rb = self.row_bytes[c]
                            copy_row(pointers[c] + copied * rb,
                                     self.rows + slot * self.stride + self.columns[c], rb)
                        (<int64_t*>pointers[count - 2])[copied] = slot
                        (<double*>pointers[count - 1])[copied] = self.tree.sums[slot] + 0.0
                        copied += 1
                    self.unlock()
            if status:
                raise OSError(-status, "locking the buffer failed")
            return copied
        finally:
            for c in range(acquired):
                PyBuffer_Release(&views[c])
            free(views)
            free(pointers)

    def check_tree(self):
        """(sum root, sum of leaves, min root, min of set leaves) read under the lock; for tests."""
        self._enter()
        try:
            return self._check_tree()
        finally:
            self._leave()

    cdef object _check_tree(self):
        cdef int status
        cdef int64_t k
        cdef double root_sum, root_min
        sums = np.empty(self.capacity, dtype=np.float64)
        mins = np.empty(self.capacity, dtype=np.float64)
        cdef double[::1] sum_view = sums
        cdef double[::1] min_view = mins
        with nogil:
            status = self.lock()
            if status == 0:
                # One consistent snapshot: roots and leaves copied under the same lock.
                root_sum = tree_total(&self.tree)
                root_min = tree_min(&self.tree)
                for k in range(self.capacity):
                    sum_view[k] = self.tree.sums[k] + 0.0
                    min_view[k] = min_key(self.tree.sums[k])
                self.unlock()
        if status:
            raise OSError(-status, "locking the buffer failed")
        return root_sum, sums, root_min, mins

    def generations_of(self, indexes):
        """Current generation of each slot (uint64), for tests and diagnostics."""
        self._check()
        gens = np.ndarray((self.capacity,), dtype=np.uint64, buffer=self._memory,
                          offset=self.header.data_offset, strides=(self.stride,))
        return gens[np.asarray(indexes, dtype=np.int64)].copy()
