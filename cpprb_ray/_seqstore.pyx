# cython: language_level=3
"""The sequence part of a store (docs/sequences.md), driven through the store's one driver.
Kernels in :mod:`cpprb_ray._sequences`; :mod:`cpprb_ray.sequences` holds a SequenceStore for a
sequence buffer's writers and sampler.

A sequence buffer is a laned buffer: its lane table and the lanes' claim and release are the
lane part's (a LaneStore over the same store); what is stored in a lane's slots (steps) and what
a draw returns (sequences of `length` steps, padded, with a mask) are this part's.
"""

cimport cython
from libc.stdint cimport int64_t, uint8_t, uint64_t
from libc.stdlib cimport free, malloc

from cpprb_ray._core cimport StoreView, store_draw
from cpprb_ray._limiter cimport SIDE_INSERT, SIDE_NONE, SIDE_SAMPLE
from cpprb_ray._outputs cimport OutputCall, SampleOutputs
from cpprb_ray._rules cimport as_timeout, bytes_of
from cpprb_ray._sequences cimport (SEQ_OPEN, SeqAdd, SeqStream, seq_add, seq_bind,
                                   seq_commits, seq_gather, seq_live)
from cpprb_ray._segtree cimport Xoshiro256
from cpprb_ray._store cimport ReplayStore

import numpy as np

from cpprb_ray import _rules

MAX_LENGTH = 1 << 30    # steps per sequence (a link is an int32)
OPEN_LINK = SEQ_OPEN    # a start's link while its sequence is open (checkpoints check links)


cdef enum:
    SEQ_DRAW = 0              # SeqSample: draw `batch` sequences, then gather them
    SEQ_ALL = 1               # gather every committed sequence (up to `batch`)

cdef struct SeqSample:
    Xoshiro256* rng
    int64_t batch
    int64_t length
    double beta
    double* scratch
    int64_t* indexes
    float* weights            # NULL: a sampler without importance weights
    uint64_t* generations
    uint8_t** outputs         # per store column
    uint8_t* mask
    int mode


cdef int64_t seq_add_kernel(StoreView* view, void* arguments) noexcept nogil:
    return seq_add(view, <SeqAdd*>arguments)

cdef int64_t seq_sample_kernel(StoreView* view, void* arguments) noexcept nogil:
    cdef SeqSample* a = <SeqSample*>arguments
    cdef int64_t result
    if a.mode == SEQ_ALL:
        a.batch = seq_live(view, a.indexes, a.batch)
    else:
        result = store_draw(view, a.rng, a.batch, a.beta, a.scratch, a.indexes,
                            a.weights)
        if result < 0:
            return result
    result = seq_gather(view, a.indexes, a.batch, a.length, a.generations, a.outputs, a.mask)
    if result >= 0 and a.mode == SEQ_DRAW:
        view.header.rows_sampled += <uint64_t>a.batch
    return result


@cython.final
@cython.auto_pickle(False)
cdef class Stream:
    """One writer's stream (its episode's position and its open sequences), kept between its
    adds; the kernels read and update it under the lock."""

    cdef SeqStream state
    cdef char* block

    def __cinit__(self, int64_t room):
        if room < 1:
            raise ValueError(f"room must be >= 1; got {room}")
        self.block = <char*>malloc(room * 6 * 8)
        if self.block == NULL:
            raise MemoryError()
        self.state.open_room = room
        self.state.open_slots = <int64_t*>self.block
        self.state.open_generations = <uint64_t*>(self.block + room * 8)
        self.state.open_positions = <int64_t*>(self.block + room * 16)
        self.state.open_max = <double*>(self.block + room * 24)
        self.state.open_sum = <double*>(self.block + room * 32)
        self.state.open_missing = <int64_t*>(self.block + room * 40)
        self.reset()

    def __dealloc__(self):
        free(self.block)

    def reset(self):
        """A new stream: its next step is the first of an episode, nothing open."""
        self.state.position = 0
        self.state.writes = 0
        self.state.open_count = 0

    @property
    def position(self):
        """Steps of the current episode written."""
        return self.state.position

    @property
    def open(self):
        """Sequences started and not committed yet (as this writer last saw them)."""
        return self.state.open_count


@cython.final
@cython.auto_pickle(False)
cdef class SequenceStore:
    """The sequence part of `lanes.store`: adds a writer's steps to its lane, samples sequences
    of `length` steps (padding zeros, a mask), lists every committed sequence."""

    cdef readonly object lanes      # the LaneStore: the lane table, claims and releases
    cdef readonly ReplayStore store
    cdef readonly int64_t length
    cdef readonly int64_t period
    cdef readonly double eta
    cdef readonly bint limited
    cdef SampleOutputs outputs      # the columns, mask, then indexes, [weights,] generations
    cdef int64_t row_bytes          # bytes one sampled sequence takes in its outputs
    cdef int mask_at

    def __init__(self, lanes, int64_t length, int64_t period, double eta, public):
        """Make the laned store of `lanes` a sequence buffer's: sequences of `length` steps
        starting every `period` steps of an episode, a first priority mixed with `eta`;
        `public`: the store's columns as (name, shape, dtype), in store order."""
        cdef ReplayStore store = lanes.store
        cdef int64_t lane_slots = store.view.capacity // store.view.lanes.count
        if not 1 <= length <= min(lane_slots, MAX_LENGTH):
            raise ValueError(f"sequence length {length} must be >= 1 and at most a lane's "
                             f"{lane_slots} slots")
        if not 1 <= period <= length:
            raise ValueError(f"sequence period {period} must be in [1, length {length}]")
        if not 0.0 <= eta <= 1.0:
            raise ValueError(f"sequence eta {eta} must be in [0, 1]")
        if len(public) != store.columns.count:
            raise ValueError("a sequence buffer's columns are its store's")
        self.lanes = lanes
        self.store = store
        self.length = length
        self.period = period
        self.eta = eta
        self.limited = store.view.limited
        names = [name for name, _, _ in public] + ["mask"]
        self.mask_at = len(public)
        self.outputs = SampleOutputs(
            names, [(length,) + tuple(shape) for _, shape, _ in public] + [(length,)],
            [dtype for _, _, dtype in public] + [np.dtype(np.bool_)], weights=store.prioritized)
        self.row_bytes = length * (sum(int(np.prod(shape, dtype=np.int64)) * np.dtype(
            dtype).itemsize for _, shape, dtype in public) + 1) + store.view.stride
        with nogil:
            seq_bind(&store.view)

    def new_stream(self):
        """A writer's stream for this buffer (room for every sequence it may hold open)."""
        return Stream(-(-self.length // self.period) + 1)

    def add(self, int64_t lane, uint64_t token, int64_t count, list values, priorities, ends,
            bint end_after, Stream stream, timeout=None):
        """Add `count` steps (0: only end the episode, with `end_after`) of `stream` to `lane`
        (which the handle with `token` owns); returns the first step's slot.

        `values`: per store column, `count` values as a C-contiguous array of its dtype.
        `priorities`: None or `count` float64 (one per step, checked here). `ends`: None or
        `count` uint8 (1: the episode ends after that step). A rate limiter admits the
        sequences the add commits, as one insert of that many, waiting up to `timeout`."""
        cdef ReplayStore store = self.store
        cdef double seconds = as_timeout(timeout)
        cdef SeqAdd arguments
        cdef int n = store.columns.count, c
        cdef const double[::1] given
        cdef const uint8_t** sources = NULL
        cdef double* weights = NULL
        cdef int64_t commits = 0
        store.enter()
        try:
            if not 0 <= lane < store.view.lanes.count:
                raise ValueError(f"lane must be one of the buffer's lanes; got {lane}")
            if count < 0 or len(values) != n:
                raise ValueError("add needs one value per column")
            if count == 0 and not end_after:
                return -1
            sources = <const uint8_t**>malloc((n if n else 1) * sizeof(uint8_t*))
            if sources == NULL:
                raise MemoryError()
            for c in range(n):
                sources[c] = NULL
                if count:
                    sources[c] = bytes_of(values[c], count * store.columns.row_bytes[c],
                                          f"column {store.columns.names[c]!r}")
            arguments.priorities = NULL
            if priorities is not None:
                _rules.check_priorities_allowed(store.prioritized)
                given = priorities
                if given.shape[0] != count:
                    raise ValueError(f"priorities must have {count} entries (one per step); "
                                     f"got {given.shape[0]}")
                if count:
                    weights = <double*>malloc(count * sizeof(double))
                    if weights == NULL:
                        raise MemoryError()
                    store.weigh(&given[0], weights, count, "priorities")
                    arguments.priorities = &given[0]
            arguments.ends = NULL
            if ends is not None:
                arguments.ends = bytes_of(ends, count, "ends")
            arguments.lane = lane
            arguments.token = token
            arguments.count = count
            arguments.length = self.length
            arguments.period = self.period
            arguments.eta = self.eta
            arguments.sources = sources
            arguments.end_after = end_after
            arguments.stream = &stream.state
            arguments.committed = 0
            if self.limited:
                with nogil:
                    commits = seq_commits(&stream.state, count, self.length, self.period,
                                          arguments.ends, end_after)
            return store.run(seq_add_kernel, &arguments,
                             SIDE_INSERT if commits else SIDE_NONE, commits, seconds)
        finally:
            free(sources)
            free(weights)
            store.leave()

    def sample(self, int64_t batch, double beta, out=None, timeout=None):
        """sample(batch, beta, out=None, timeout=None) -> dict: `batch` sequences drawn by their
        weights: per column (batch, length, *shape), "mask" (batch, length) bool, "indexes",
        ["weights",] "generations" (batch,), filled into fresh arrays, kept spares or `out`."""
        cdef ReplayStore store = self.store
        cdef double seconds = as_timeout(timeout)
        store.enter()
        try:
            return self._sample(batch, beta, out, seconds, SEQ_DRAW, NULL)
        finally:
            store.leave()

    def all_rows(self, int64_t room, bint with_slots=False):
        """Every committed sequence (at most `room`), by start slot: a dict of the columns and
        "mask"; with `with_slots`, (that dict, their starts)."""
        cdef ReplayStore store = self.store
        cdef int64_t found = 0
        store.enter()
        try:
            rows = self.outputs.fresh(max(room, 1))
            if room > 0:
                self._sample(room, 0.0, rows, 0.0, SEQ_ALL, &found)
            columns = {name: rows[name][:found]
                       for name in self.outputs.names[:self.outputs.index_at]}
            return (columns, rows["indexes"][:found]) if with_slots else columns
        finally:
            store.leave()

    cdef object _sample(self, int64_t batch, double beta, out, double timeout, int mode,
                        int64_t* found):
        cdef ReplayStore store = self.store
        cdef SampleOutputs outputs = self.outputs
        cdef SeqSample arguments
        cdef OutputCall call
        call.block = NULL
        try:
            arrays = outputs.begin(&call, batch, self.row_bytes, out, 0)
            arguments.rng = &store.rng
            arguments.batch = batch
            arguments.length = self.length
            arguments.beta = beta
            arguments.scratch = call.scratch
            arguments.indexes = <int64_t*>call.pointers[outputs.index_at]
            arguments.weights = (<float*>call.pointers[outputs.weights_at]
                                 if outputs.weights_at >= 0 else NULL)
            arguments.generations = <uint64_t*>call.pointers[outputs.generations_at]
            arguments.outputs = call.pointers     # the store's columns come first, in order
            arguments.mask = call.pointers[self.mask_at]
            arguments.mode = mode
            if mode == SEQ_ALL:
                store.run(seq_sample_kernel, &arguments, SIDE_NONE, 0, 0.0)
            else:
                store.run(seq_sample_kernel, &arguments, SIDE_SAMPLE, batch, timeout)
            if found != NULL:
                found[0] = arguments.batch
            return outputs.finish(&call, arrays, batch)
        finally:
            outputs.end(&call)
