# cython: language_level=3
"""The lane part of a store: lanes and frame columns (docs/frames.md), driven through the
store's one driver. Kernels in :mod:`cpprb_ray._lanes`; :mod:`cpprb_ray.frames` holds a
LaneStore for a laned buffer's writers and sampler.

A laned buffer's ring is split into lanes, one writing handle each; its rows lie anywhere in
the slots, each slot's links telling whether it holds one (the lane part's hooks in the store's
view, which the store's own kernels, update and clear among them, reach without knowing lanes).
"""

cimport cython
from libc.stdint cimport int32_t, int64_t, uint8_t, uint64_t
from libc.stdlib cimport free, malloc

from cpprb_ray._core cimport StoreView, store_draw
from cpprb_ray._lanes cimport (MAX_FRAME_COLUMNS, MAX_STACK, FrameColumn, LaneAdd, LaneClaim,
                               LaneComplete, lane_start, lanes_add, lanes_bind, lanes_claim,
                               lanes_complete, lanes_gather, lanes_live, lanes_release)
from cpprb_ray._limiter cimport SIDE_INSERT, SIDE_NONE, SIDE_SAMPLE
from cpprb_ray._outputs cimport OutputCall, SampleOutputs
from cpprb_ray._rules cimport as_timeout, bytes_of
from cpprb_ray._segment cimport HEADER_BYTES, Lane
from cpprb_ray._segtree cimport Xoshiro256
from cpprb_ray._store cimport ReplayStore

import numpy as np

from cpprb_ray import _rules

_ndarray = np.ndarray
_INT64 = np.dtype(np.int64)
_UINT64 = np.dtype(np.uint64)


cdef enum:
    LANE_DRAW = 0             # LaneSample: draw `batch` rows, then gather them
    LANE_ALL = 1              # gather every live row (up to `batch`)

cdef struct LaneSample:
    Xoshiro256* rng
    int64_t batch
    double beta
    double* scratch
    int64_t* indexes
    float* weights            # NULL: a sampler without importance weights
    uint64_t* generations
    uint8_t** outputs         # per store column (a frame column's is unused)
    FrameColumn* frames
    int frame_count
    int mode


cdef int64_t lane_add_kernel(StoreView* view, void* arguments) noexcept nogil:
    return lanes_add(view, <LaneAdd*>arguments)

cdef int64_t lane_sample_kernel(StoreView* view, void* arguments) noexcept nogil:
    cdef LaneSample* a = <LaneSample*>arguments
    cdef int64_t result
    if a.mode == LANE_ALL:
        a.batch = lanes_live(view, a.indexes, a.batch)
    else:
        result = store_draw(view, a.rng, a.batch, a.beta, a.scratch, a.indexes, a.weights)
        if result < 0:
            return result
    result = lanes_gather(view, a.indexes, a.batch, a.generations, a.outputs, a.frames,
                          a.frame_count)
    if result >= 0 and a.mode == LANE_DRAW:
        view.header.rows_sampled += <uint64_t>a.batch
    return result

cdef int64_t lane_complete_kernel(StoreView* view, void* arguments) noexcept nogil:
    # Admitted and counted in one locked call, as a plain add's rows are (the driver admits
    # the `count` rows it declares): an N-step add's lane write only waited until these rows
    # could go (add_lanes' `admit`).
    return lanes_complete(view, <LaneComplete*>arguments)

cdef int64_t lane_claim_kernel(StoreView* view, void* arguments) noexcept nogil:
    return lanes_claim(view, <LaneClaim*>arguments)

cdef int64_t lane_release_kernel(StoreView* view, void* arguments) noexcept nogil:
    cdef uint64_t* a = <uint64_t*>arguments
    return lanes_release(view, <int64_t>a[0], a[1])


@cython.final
@cython.auto_pickle(False)
cdef class LaneStore:
    """The lane part of `store`: claims and releases lanes, adds a writer's transitions to its
    lane, completes N-step rows, samples rows with their stacks rebuilt."""

    cdef readonly ReplayStore store
    cdef FrameColumn frame_specs[MAX_FRAME_COLUMNS]   # the frame columns
    cdef int frame_count
    cdef SampleOutputs outputs      # the public columns, then indexes, [weights,] generations
    cdef int64_t row_bytes          # bytes one sampled row takes (public columns and record)
    cdef int64_t[::1] column_outputs   # per store column: its output (-1: a frame column)
    cdef int64_t[::1] frame_outputs    # per frame column: the outputs of its values and nexts

    def __init__(self, ReplayStore store, int64_t offset, int64_t count, frames, public,
                 int64_t rows=0):
        """Make `store` a laned buffer's: the lane table (`count` lanes at byte `offset`) and
        the frame columns of its layout, validated by the caller; the bounds are checked here
        again, before any kernel could index with them.

        `frames`: per frame column (store column, stack, plane bytes, item bytes, the public
        column of its values, that of its next values or -1). `public`: the columns add takes
        and sample returns, (name, shape, dtype), in order; a store column that is not a frame
        column is the public column of its name. `rows` (one lane only): the most rows it
        keeps, its oldest evicted first (0: as many as its slots hold)."""
        cdef int c
        self.store = store
        if not 1 <= count <= store.view.capacity or offset < HEADER_BYTES or offset % 8 or (
                offset + count * <int64_t>sizeof(Lane) > store._buffer.len):
            raise ValueError(f"lane table ({count} lanes at {offset}) lies outside the segment")
        if not 0 <= rows <= store.view.capacity or (rows and count != 1):
            raise ValueError(f"a row bound of {rows} for {count} lanes of {store.view.capacity} "
                             f"slots")
        if len(frames) > MAX_FRAME_COLUMNS:
            raise ValueError(f"at most {MAX_FRAME_COLUMNS} frame columns; got {len(frames)}")
        names = [name for name, _, _ in public]
        self.outputs = SampleOutputs(names, [shape for _, shape, _ in public],
                                     [dtype for _, _, dtype in public], weights=store.prioritized)
        self.row_bytes = sum(int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
                             for _, shape, dtype in public) + store.view.stride
        self.frame_outputs = np.full(2 * MAX_FRAME_COLUMNS, -1, dtype=np.int64)
        self.column_outputs = np.full(store.columns.count, -1, dtype=np.int64)
        framed = set()
        for c, (column, stack, plane_bytes, item_bytes, values, nexts) in enumerate(frames):
            if not (0 <= column < store.columns.count and 1 <= stack <= MAX_STACK
                    and item_bytes >= 1 and plane_bytes == store.columns.row_bytes[column]
                    and plane_bytes % item_bytes == 0 and 0 <= values < len(public)
                    and -1 <= nexts < len(public)):
                raise ValueError(f"frame column {column} does not fit the layout")
            self.frame_specs[c].column = column
            self.frame_specs[c].stack = stack
            self.frame_specs[c].plane_bytes = plane_bytes
            self.frame_specs[c].item_bytes = item_bytes
            self.frame_specs[c].has_next = nexts >= 0
            self.frame_outputs[2 * c] = values
            self.frame_outputs[2 * c + 1] = nexts
            framed.add(column)
        self.frame_count = len(frames)
        for c in range(store.columns.count):
            if c not in framed:
                self.column_outputs[c] = names.index(store.columns.names[c])
        # The links lie right after each record's generation (_layout).
        lanes_bind(&store.view, <Lane*>(<uint8_t*>store._buffer.buf + offset), count, 8, rows)

    def lane_owners(self):
        """(lanes, 4) uint64: each lane's owner pid (0: free), its start time, its handle's
        token and its pid namespace, read without the lock (each field one aligned load)."""
        cdef ReplayStore store = self.store
        store.header()
        owners = np.empty((store.view.lanes.count, 4), dtype=np.uint64)
        cdef uint64_t[:, ::1] table = owners
        cdef int64_t lane
        for lane in range(store.view.lanes.count):
            table[lane, 0] = store.view.lanes.records[lane].owner_pid
            table[lane, 1] = store.view.lanes.records[lane].owner_start
            table[lane, 2] = store.view.lanes.records[lane].owner_token
            table[lane, 3] = store.view.lanes.records[lane].owner_pidns
        return owners

    def lane_next_slots(self):
        """(lanes,) int64: the slot each lane writes next (its first slot plus its head), read
        without the lock (each head one aligned load)."""
        cdef ReplayStore store = self.store
        store.header()
        slots = np.empty(store.view.lanes.count, dtype=np.int64)
        cdef int64_t[::1] table = slots
        cdef int64_t lane, first, size
        for lane in range(store.view.lanes.count):
            first = lane_start(&store.view, lane)
            size = lane_start(&store.view, lane + 1) - first
            # A damaged head (the lock's repair checks it) still names a slot of the lane.
            table[lane] = first + <int64_t>(store.view.lanes.records[lane].head % <uint64_t>size)
        return slots

    def claim_lane(self, uint64_t pid, uint64_t start, uint64_t token, uint64_t pidns, dead):
        """A free lane, or one of `dead` ((lanes, 4) uint64: lane, pid, start, token of owners
        seen dead) whose owner did not change since; LaneError when there is none."""
        cdef ReplayStore store = self.store
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
        store.enter()
        try:
            return store.run(lane_claim_kernel, &claim, SIDE_NONE, 0, 0.0)
        finally:
            store.leave()

    def release_lane(self, uint64_t lane, uint64_t token):
        """Free `lane` if the handle with `token` still owns it (its rows stay)."""
        cdef ReplayStore store = self.store
        cdef uint64_t arguments[2]
        arguments[0] = lane
        arguments[1] = token
        store.enter()
        try:
            store.run(lane_release_kernel, arguments, SIDE_NONE, 0, 0.0)
        finally:
            store.leave()

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
        cdef ReplayStore store = self.store
        cdef double seconds = as_timeout(timeout)
        cdef LaneAdd arguments
        cdef FrameColumn frames[MAX_FRAME_COLUMNS]
        cdef int n = store.columns.count, c
        cdef int64_t stack_bytes
        cdef const double[::1] given
        cdef const uint8_t** sources = NULL
        cdef double* weights = NULL
        cdef int32_t* plan = NULL
        store.enter()
        try:
            if not 0 <= lane < store.view.lanes.count:
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
                sources[c] = bytes_of(values[c], count * store.columns.row_bytes[c],
                                      f"column {store.columns.names[c]!r}")
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
                    raise ValueError(f"column {store.columns.names[c]!r} has no value")
            arguments.priorities = NULL
            arguments.weights = NULL
            if priorities is not None:
                _rules.check_priorities_allowed(store.prioritized)
                given = priorities
                if given.shape[0] != count:
                    raise ValueError(f"priorities must have {count} entries; got "
                                     f"{given.shape[0]}")
                weights = <double*>malloc(count * sizeof(double))
                if weights == NULL:
                    raise MemoryError()
                store.weigh(&given[0], weights, count, "priorities")
                arguments.priorities = &given[0]
                arguments.weights = weights
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
            return store.run(lane_add_kernel, &arguments,
                             SIDE_INSERT if admit else SIDE_NONE, admit, seconds)
        finally:
            free(sources)
            free(plan)
            free(weights)
            store.leave()

    def sample(self, int64_t batch, double beta, out=None, timeout=None):
        """sample(batch, beta, out=None, timeout=None) -> dict: as ReplayStore.sample, over the
        buffer's public columns (frame stacks rebuilt from their planes, next_of's next
        columns read from the slots after), filled into fresh arrays, kept spares or `out`."""
        cdef ReplayStore store = self.store
        cdef double seconds = as_timeout(timeout)
        store.enter()
        try:
            return self._sample(batch, beta, out, seconds, LANE_DRAW, NULL)
        finally:
            store.leave()

    def all_rows(self, int64_t room, bint with_slots=False):
        """Every live row (at most `room`), in slot order: a dict of the public columns; with
        `with_slots`, (that dict, the rows' slots)."""
        cdef ReplayStore store = self.store
        cdef int64_t found = 0
        store.enter()
        try:
            # Fresh arrays passed as out: never a kept spare set, which a later sample refills.
            rows = self.outputs.fresh(max(room, 1))
            if room > 0:
                self._sample(room, 0.0, rows, 0.0, LANE_ALL, &found)
            columns = {name: rows[name][:found]
                       for name in self.outputs.names[:self.outputs.index_at]}
            return (columns, rows["indexes"][:found]) if with_slots else columns
        finally:
            store.leave()

    cdef object _sample(self, int64_t batch, double beta, out, double timeout, int mode,
                        int64_t* found):
        cdef ReplayStore store = self.store
        cdef SampleOutputs outputs = self.outputs
        cdef int n = store.columns.count, c, k
        cdef LaneSample arguments
        cdef FrameColumn frames[MAX_FRAME_COLUMNS]
        cdef OutputCall call
        # The store's columns get pointers of their own, after the outputs' (a frame column's
        # is its stack output's: the kernel writes stacks through `frames`).
        cdef uint8_t** pointers
        call.block = NULL
        try:
            arrays = outputs.begin(&call, batch, self.row_bytes, out, n)
            pointers = call.pointers + outputs.count
            for c in range(n):
                k = self.column_outputs[c]
                pointers[c] = call.pointers[k] if k >= 0 else NULL
            for c in range(self.frame_count):
                frames[c] = self.frame_specs[c]
                frames[c].out_values = call.pointers[self.frame_outputs[2 * c]]
                k = self.frame_outputs[2 * c + 1]
                frames[c].out_nexts = call.pointers[k] if k >= 0 else NULL
            arguments.rng = &store.rng
            arguments.batch = batch
            arguments.beta = beta
            arguments.scratch = call.scratch
            arguments.indexes = <int64_t*>call.pointers[outputs.index_at]
            arguments.weights = (<float*>call.pointers[outputs.weights_at]
                                 if outputs.weights_at >= 0 else NULL)
            arguments.generations = <uint64_t*>call.pointers[outputs.generations_at]
            arguments.outputs = pointers
            arguments.frames = frames
            arguments.frame_count = self.frame_count
            arguments.mode = mode
            if mode == LANE_ALL:
                store.run(lane_sample_kernel, &arguments, SIDE_NONE, 0, 0.0)
            else:
                store.run(lane_sample_kernel, &arguments, SIDE_SAMPLE, batch, timeout)
            if found != NULL:
                found[0] = arguments.batch
            return outputs.finish(&call, arrays, batch)
        finally:
            outputs.end(&call)

    def complete_lanes(self, slots, generations, last_slots, last_generations, list values,
                       priorities=None, timeout=None, weights=None):
        """Complete N-step rows add_lanes(incomplete=True) wrote: `values` per store column
        (`count` values as a C-contiguous array of its dtype, or None to keep what the add
        wrote); each row's next stack ends at its `last_slots` entry. All arrays C-contiguous
        (int64 slots, uint64 generations). Returns how many rows were completed (the others
        were overwritten, cleared or torn since). With a rate limiter the `count` rows go as
        one add: held back up to `timeout` (TimeoutError, nothing completed)."""
        cdef ReplayStore store = self.store
        cdef double seconds = as_timeout(timeout)
        cdef LaneComplete arguments
        cdef int n = store.columns.count, c
        cdef int64_t count = len(slots)
        cdef const uint8_t** sources = NULL
        cdef const double[::1] given, weighed
        store.enter()
        try:
            if len(values) != n:
                raise ValueError("complete_lanes needs one value per column")
            if count == 0:
                return 0
            for array, dtype in ((slots, _INT64), (generations, _UINT64),
                                 (last_slots, _INT64), (last_generations, _UINT64)):
                if type(array) is not _ndarray or array.dtype != dtype or array.shape != (count,):
                    raise ValueError(f"complete_lanes: expected {count} {dtype}")
            for array in (slots, last_slots):
                # The kernel refreshes the tree over every slot it is given.
                if not ((array >= 0).all() and (array < store.view.capacity).all()):
                    raise IndexError(f"slots must be in [0, capacity {store.view.capacity})")
            sources = <const uint8_t**>malloc(n * sizeof(uint8_t*))
            if sources == NULL:
                raise MemoryError()
            for c in range(n):
                sources[c] = NULL
                if values[c] is not None:
                    sources[c] = bytes_of(values[c], count * store.columns.row_bytes[c],
                                          f"column {store.columns.names[c]!r}")
            arguments.priorities = NULL
            arguments.weights = NULL
            if priorities is not None:
                # The N-step staging's: checked and weighed when the steps were added
                # (ReplayStore.weights_of), a NaN in both for a step that came without one.
                given = priorities
                weighed = weights
                if given.shape[0] != count or weighed.shape[0] != count:
                    raise ValueError(f"priorities and their weights must have {count} entries")
                arguments.priorities = &given[0]
                arguments.weights = &weighed[0]
            arguments.count = count
            arguments.slots = <const int64_t*>bytes_of(slots, count * 8, "slots")
            arguments.generations = <const uint64_t*>bytes_of(generations, count * 8,
                                                              "generations")
            arguments.last_slots = <const int64_t*>bytes_of(last_slots, count * 8, "last_slots")
            arguments.last_generations = <const uint64_t*>bytes_of(last_generations, count * 8,
                                                                   "last_generations")
            arguments.sources = sources
            return store.run(lane_complete_kernel, &arguments, SIDE_INSERT, count, seconds)
        finally:
            free(sources)
            store.leave()
