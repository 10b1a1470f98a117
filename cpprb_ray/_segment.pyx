# cython: language_level=3
"""The segment format: offsets, magic, the header as a dict, and a new segment laid out.

Where everything lies is described once, in ``_segment.pxd``; this module gives it to Python
(the layout reader, the orphan tools, the checkpoints and the tests read headers through it,
without a store) and lays out a new segment. It imports the tree and the mutex only to
initialize them, and no store.

Examples
--------
>>> from cpprb_ray import _segment
>>> _segment.MAGIC, _segment.HEADER_NBYTES, _segment.LAYOUT_OFFSET
(b'CPPRBRAY', 256, 512)
>>> _segment.HEADER_FIELDS[:3]
('version', 'total_size', 'capacity')
"""

from cpython.buffer cimport PyBUF_ANY_CONTIGUOUS, PyBuffer_Release, PyObject_GetBuffer
from libc.math cimport isfinite
from libc.stdint cimport int64_t, uint64_t
from libc.string cimport memcpy

from cpprb_ray._limiter cimport LIMITER_BYTES, Limiter
from cpprb_ray._segtree cimport TreeView, tree_bind, tree_clear_all, tree_doubles
from cpprb_ray._sync cimport mutex_init, pthread_mutex_t

cdef extern from *:
    """
    static inline void cpprb_ray_segment_fence(void) { __atomic_thread_fence(__ATOMIC_RELEASE); }
    """
    void release_fence "cpprb_ray_segment_fence"() noexcept nogil

# Each record must fit the space the format reserves for it: an array of negative size fails the
# C compile, so this is checked when the extension is built, not when it is imported.
cdef enum:
    HEADER_SPARE_BYTES = HEADER_BYTES - sizeof(Header)
    LIMITER_SPARE_BYTES = LIMITER_BYTES - sizeof(Limiter)
    LIMITER_GAP_BYTES = LAYOUT_AT - (LIMITER_AT + LIMITER_BYTES)
    LANE_RECORD_BYTES = 64 - sizeof(Lane)
cdef char header_fits_its_space[HEADER_SPARE_BYTES + 1]
cdef char limiter_fits_its_space[LIMITER_SPARE_BYTES + 1]
cdef char limiter_ends_before_the_layout[LIMITER_GAP_BYTES + 1]
cdef char lane_record_is_64_bytes[LANE_RECORD_BYTES + 1]

MAGIC = b"CPPRBRAY"
HEADER_NBYTES = HEADER_BYTES
MUTEX_OFFSET = MUTEX_AT
LIMITER_OFFSET = LIMITER_AT
LAYOUT_OFFSET = LAYOUT_AT
LAYOUT_VERSION = VERSION
LANE_NBYTES = sizeof(Lane)


cdef int64_t header_problem(const Header* header) noexcept nogil:
    """0, or 1 + the index of the first field that no writer ever leaves: the kernels index
    rows and leaves with these, so they are checked under the lock before every operation."""
    cdef uint64_t capacity = header.capacity
    if header.next_index >= capacity:
        return 1
    if header.stored_size > capacity:
        return 2
    if not (isfinite(header.max_priority) and header.max_priority >= 0.0):
        return 3
    if header.op > OP_CLEAR:
        return 4
    return 0


def tree_nbytes(capacity):
    """Bytes of the sum+min tree for `capacity` slots.

    Examples
    --------
    >>> from cpprb_ray._segment import tree_nbytes
    >>> tree_nbytes(2**20) / (8 * 2**20)   # the leaves, and 1/7 of them per inner tree
    1.28...
    """
    return 8 * tree_doubles(capacity, NULL)


cdef Header* _header_of(object memory, Py_buffer* view) except NULL:
    PyObject_GetBuffer(memory, view, PyBUF_ANY_CONTIGUOUS)
    if view.len < HEADER_BYTES:
        PyBuffer_Release(view)
        raise ValueError(f"segment is {view.len} bytes, smaller than a header")
    return <Header*>view.buf


def read_header(memory):
    """read_header(memory) -> dict: every Header field (_segment.pxd) in layout order; `magic`
    as the 8 bytes it should spell, b"CPPRBRAY".

    Examples
    --------
    >>> from cpprb_ray import ReplayBuffer, _segment
    >>> with ReplayBuffer(4, {"obs": {}}) as rb:
    ...     header = _segment.read_header(rb._segment.memory)
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
HEADER_FIELDS = tuple(read_header(bytearray(HEADER_BYTES)))[1:]
if 8 * (len(HEADER_FIELDS) + 1) != sizeof(Header):  # pragma: no cover - a field not 8 bytes
    raise ImportError("every Header field must be 8 bytes")


def initialize_segment(memory, *, total_size, capacity, prioritized, alpha, eps, owner_pid,
                       layout_json, data_offset, tree_offset, row_stride, created_ns,
                       limiter=None):
    """Lay a new header, mutex, limiter record, layout and empty tree in zeroed `memory`.

    `limiter`: None, or (kind, samples_per_insert, min_size_to_sample, min_diff, max_diff) as
    :mod:`cpprb_ray.rate_limiters` validated them. The magic is written last, so an attacher
    that sees it finds everything else in place.

    Examples
    --------
    >>> from cpprb_ray import _segment
    >>> memory = bytearray(4096)
    >>> _segment.initialize_segment(memory, total_size=4096, capacity=4, prioritized=True,
    ...     alpha=0.6, eps=1e-4, owner_pid=1, layout_json=b"{}", data_offset=1024,
    ...     tree_offset=2048, row_stride=16, created_ns=0)
    >>> header = _segment.read_header(memory)
    >>> header["magic"], header["capacity"], header["max_priority"], header["layout_length"]
    (b'CPPRBRAY', 4, 1.0, 2)
    """
    cdef Py_buffer view
    cdef Header* header = _header_of(memory, &view)
    cdef char* base = <char*>view.buf
    cdef TreeView tree
    cdef int status
    cdef Limiter* record
    try:
        if LAYOUT_AT + len(layout_json) > data_offset:
            raise ValueError("layout JSON overlaps the data")
        memoryview(memory)[LAYOUT_AT:LAYOUT_AT + len(layout_json)] = layout_json
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
        header.layout_offset = LAYOUT_AT
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
