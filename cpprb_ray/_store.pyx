# cython: language_level=3
"""The store's boundary: ReplayStore owns a mapped segment's lifetime and runs every kernel
through ONE driver, under the segment's lock.

The segment's format is :mod:`cpprb_ray._segment`'s. Every operation goes through the driver
(``ReplayStore.run``): the call declares its side of the rate limiter and its rows; the lock is
taken (in slices, so that a stopped or vanished holder gives TimeoutError and Ctrl-C interrupts
the wait); the limiter admits the call or holds it back; the kernel runs with the GIL released;
the lock is let go; and a negative Status becomes an exception in one place
(``raise_status``). Input is validated and converted before the GIL is released, by the rules of
:mod:`cpprb_ray._rules`.

The rate limiter (_limiter.Limiter, in the segment) is part of that one critical section: a call
it holds back changes nothing. The driver then marks the call's gate (a futex word in the
limiter record), unlocks, sleeps on the gate for one slice at most, and tries again; every
committed add or sample advances the other side's gate under the lock and, when somebody marked
it, wakes it after unlocking (docs/rate_limiting.md).

The store itself holds the ring's operations (add, sample, update, clear, snapshot). Other parts
drive their own kernels through the same driver: the lane part (:mod:`cpprb_ray._lanestore`)
and checkpoint images (:mod:`cpprb_ray._image`).
"""

cimport cython
from cpython.buffer cimport (PyBUF_ANY_CONTIGUOUS, PyBUF_C_CONTIGUOUS, PyBUF_FORMAT,
                             PyBUF_WRITABLE, PyBuffer_Release, PyObject_GetBuffer)
from cpython.exc cimport PyErr_CheckSignals
from cpython.pythread cimport PyThread_get_thread_ident
from libc.math cimport isnan
from libc.stdint cimport int64_t, uint8_t, uint64_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy

from cpprb_ray._columns cimport AddFrame, ColumnTable
from cpprb_ray._core cimport (StoreView, store_add, store_admits, store_clear, store_draw,
                              store_gather, store_lock, store_snapshot, store_unlock,
                              store_update, view_bind)
from cpprb_ray._limiter cimport (GATE_WAITING, LIMITER_MIN_SIZE, LIMITER_NONE,
                                 LIMITER_SAMPLE_TO_INSERT_RATIO,
                                 SIDE_INSERT, SIDE_NONE, SIDE_RESET, SIDE_SAMPLE, Limiter,
                                 gate_advance, gate_arm, limiter_admits, limiter_gate,
                                 limiter_never_admits)
from cpprb_ray._outputs cimport OutputCall, SampleOutputs
from cpprb_ray._rules cimport (as_timeout, export_vector, first_bad_priority, first_out_of_range,
                               priority_rule, raise_bad_priority)
from cpprb_ray._segment cimport (ST_ALL_TORN, ST_ALL_ZERO, ST_CORRUPT, ST_EMPTY, ST_LANE_FULL,
                                 ST_LANE_LOST, ST_LOCK_ERROR, ST_LOCK_TIMEOUT, ST_NAN_TREE,
                                 ST_NO_LANE, ST_OK, ST_RATE_LIMITED, Header)
from cpprb_ray._segtree cimport (Xoshiro256, min_key, rng_seed, tree_min, tree_prefetch_leaves,
                                 tree_total)
from cpprb_ray._sync cimport SpinCounter, gate_wait, gate_wake, monotonic_seconds, mutex_holder

import math
import os
import time

import numpy as np

from cpprb_ray import _rules
from cpprb_ray._segtree import _seed_from
from cpprb_ray._sync import SpinExpired

include "_admission.pxi"

LIMITER_KINDS = {LIMITER_MIN_SIZE: "MinSize",
                 LIMITER_SAMPLE_TO_INSERT_RATIO: "SampleToInsertRatio"}
cdef double LOCK_SLICE_S = 0.05   # between two slices of a lock or rate wait: signals, deadline
DEFAULT_LOCK_TIMEOUT_S = 60.0


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
        raise LaneError(f"every one of the buffer's {store.view.lanes.count} lanes is owned by "
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


# -- the ring's kernels behind the driver: one argument struct each -----------------------------

cdef enum:
    # update(): leaf lines asked for per chunk of weights computed. update(256) at 2**20,
    # interleaved with cpprb's: 14.4 us without; 12.5 us in chunks of 8; 12.8 us asking for
    # all 256 before the weights; 13.4 to 14.1 us asking for their parents' lines too.
    WARM_CHUNK = 8

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
    float* weights               # NULL: a sampler without importance weights
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
    cdef int64_t result = store_draw(view, a.rng, a.batch, a.beta, a.scratch, a.indexes,
                                     a.weights)
    if result < 0:
        return result
    result = store_gather(view, a.indexes, a.batch, a.generations, a.outputs)
    view.header.rows_sampled += <uint64_t>a.batch
    return result

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


cdef int64_t first_bad_weight(const double* weights, int64_t count,
                              double max_weight) noexcept nogil:
    """Position of the first weight that is neither NaN (a row without a priority) nor in
    [0, max_weight], or -1."""
    cdef int64_t k
    for k in range(count):
        if weights[k] == weights[k] and not 0.0 <= weights[k] <= max_weight:
            return k
    return -1


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
    """One mapped segment's kernels behind one driver. Built by :mod:`cpprb_ray.buffer`.

    `prioritized`: whether the handle is a prioritized one (its adds may carry priorities and
    its samples weigh rows; a uniform handle's samples have no "weights"); whether the segment
    keeps a tree is its header's (a laned uniform buffer samples through one)."""

    def __cinit__(self):
        self._has_buffer = False
        self.interrupted = set()
        self.holds = {}

    def __init__(self, memory, columns, seed=None, lock_timeout=DEFAULT_LOCK_TIMEOUT_S, *,
                 prioritized=None):
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
        check_limiter(self)
        self.prioritized = header.prioritized != 0 if prioritized is None else bool(prioritized)
        priority_rule(&self.rule, header.alpha, header.eps, self.view.capacity)
        rng_seed(&self.rng, _seed_from(seed))
        self.forks_seen = fork_generation
        self.active = 0
        self.closing = False
        self.outputs = SampleOutputs(self.columns.names, self.columns.shapes,
                                     self.columns.dtypes, weights=self.prioritized)

    def __dealloc__(self):
        if self._has_buffer:
            PyBuffer_Release(&self._buffer)

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
            # sampler must not draw the parent's samples; nor are its threads' holds and
            # interrupts (hold_calls, interrupt_waits) of threads here, whose idents the
            # child's threads may be given.
            self.forks_seen = fork_generation
            self.active = 0
            self.holds.clear()
            self.interrupted.clear()
            rng_seed(&self.rng, _seed_from(None))
        self.active += 1
        return 0

    cdef void leave(self) noexcept:
        self.active -= 1

    cdef int64_t run(self, Kernel kernel, void* arguments, int side, int64_t rows,
                     double timeout) except? -1:
        """THE driver: lock (in slices: signals and the deadline are looked at between two),
        admit, run `kernel` with the GIL released, unlock, raise for a negative Status.

        Every call declares its `side` of the rate limiter (SIDE_NONE: none; SIDE_INSERT with
        the `rows` it adds; SIDE_SAMPLE with the rows it samples; SIDE_RESET: a clear) and how
        long it may be held back (`timeout`, < 0: no limit). With a limiter, a call of more rows
        than any state of it admits is refused at once (NeverAdmitted); a call it holds back
        sleeps on its gate (one slice at most, woken by the other side's progress) and is tried
        again, until it goes through or its timeout has passed (TimeoutError); after a call
        that went through, whoever waits for its progress is woken."""
        cdef int status, wake = 0
        cdef int64_t result = 0
        cdef double deadline = -1.0
        cdef RateCall rate
        cdef bint limited = side != SIDE_NONE and self.view.limited
        cdef SpinCounter hold = None
        cdef bint holding = False, held = True
        if limited:
            if rows > 0 and side != SIDE_RESET:
                check_admissible(self, side, rows)
            rate_start(&rate, side, rows, timeout)
        if self.holds:
            hold = self.holds.get(PyThread_get_thread_ident())
            holding = hold is not None
        while True:
            with nogil:
                if holding:
                    # Spun in the same stretch without the GIL as the kernel: the call starts
                    # the moment the count comes, whoever holds the GIL then.
                    held = hold.pass_armed()
                    holding = False
                status = store_lock(&self.view, LOCK_SLICE_S) if held else ST_OK
                if status == ST_OK and held:
                    if limited and not rate_admits(&self.view, &rate):
                        result = ST_RATE_LIMITED
                    else:
                        result = kernel(&self.view, arguments)
                    if limited:
                        wake = rate_settle(&self.view, &rate, result)
                    store_unlock(&self.view)
                    if limited:
                        rate_after_unlock(self.view.limiter, &rate, wake)
            if not held:
                raise SpinExpired("the count this thread's calls wait for (hold_calls) did not "
                                  "come within its spin, or was stopped: nothing was done")
            if status == ST_LOCK_TIMEOUT:
                PyErr_CheckSignals()       # Ctrl-C interrupts a wait (KeyboardInterrupt)
                self.check_interrupted()
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
                self.check_interrupted()
                continue
            break
        if status != ST_OK:
            raise_status(status, self)
        if result == ST_RATE_LIMITED:
            raise_rate_limited(self, &rate)
        if result < 0:
            raise_status(result, self)
        return result

    def interrupt_waits(self, thread_id):
        """End the waits (for the lock or the rate limiter) of the thread `thread_id`
        (``threading.get_ident()``) on this store within one slice, with InterruptedError, and
        every wait it begins until :meth:`resume_waits`: how a thread sampling ahead of a
        learner (cpprb_ray.prefetch) is stopped while the limiter holds it back, where Ctrl-C
        cannot reach it. Its call leaves nothing done (the limiter counts no wait for it)."""
        self.interrupted.add(int(thread_id))

    def hold_calls(self, thread_id, SpinCounter counter):
        """Make each call of the thread `thread_id` on this store, while `counter` has a wait
        armed (``counter.arm(target, seconds)``), first spin for that count without the GIL,
        in the same stretch as its kernel, then go on; where the spin runs out (or the counter
        is stopped) the call does nothing and raises SpinExpired. How a prefetch thread starts
        its sample the moment the learner gives a set back (cpprb_ray.prefetch): a thread that
        needed the GIL between the two would wait for the learner to let it go."""
        self.holds[int(thread_id)] = counter

    @property
    def held_threads(self):
        """The thread idents whose calls hold_calls holds (a forked child's first call forgets
        its parent's)."""
        return tuple(self.holds)

    def release_calls(self, thread_id):
        """Undo :meth:`hold_calls` for `thread_id`."""
        self.holds.pop(int(thread_id), None)

    def resume_waits(self, thread_id):
        """Undo :meth:`interrupt_waits` for `thread_id` (a thread id may be reused)."""
        self.interrupted.discard(int(thread_id))

    cdef int check_interrupted(self) except -1:
        # Between two slices of a wait, with the GIL: a set's emptiness costs nothing.
        if self.interrupted and PyThread_get_thread_ident() in self.interrupted:
            raise InterruptedError("this thread's wait on the buffer was interrupted "
                                   "(interrupt_waits): nothing was done")
        return 0

    # -- header fields, read without the lock (aligned 8-byte loads never tear) -----------------

    @property
    def closed(self):
        """Whether release() was called (or is under way): every call then refuses."""
        return not self._has_buffer or self.closing

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
        state = limiter_state(h, limiter)
        if state is not None:
            # A call of that side went to sleep on its gate and no progress has cleared the
            # mark since (held back now, or it gave up since): what `top` shows as waiting.
            state["insert_waiting"] = (limiter.insert_gate & GATE_WAITING) != 0
            state["sample_waiting"] = (limiter.sample_gate & GATE_WAITING) != 0
        return {"inserts": h.rows_added, "samples": h.rows_sampled, "updates": h.updates,
                "repairs": h.repairs, "lock_waits": h.lock_waits, "stored": h.stored_size,
                "capacity": h.capacity, "next_index": h.next_index,
                "max_priority": h.max_priority, "lock_holder": holder,
                "snapshot": status == ST_OK, "rate_limiter": state}

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

    cdef int64_t index_bound(self) noexcept:
        """What an update's indexes must be below: the stored size, read without the lock and
        bounded by the capacity (a header rewritten by a hostile process between this check
        and the lock must not put one past the tree); the capacity itself where a part's rows
        lie anywhere (its kernels skip slots without a row)."""
        if self.view.part.holds_row != NULL:
            return self.view.capacity
        return min(<int64_t>self.view.header.stored_size, self.view.capacity)

    @property
    def index_bound_name(self):
        """How an index error names the bound ("stored size" or "capacity")."""
        return "capacity" if self.view.part.holds_row != NULL else "stored size"

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

    def weights_of(self, priorities, str name="priorities", bint missing=False):
        """The leaf weights (float64) of `priorities` (a 1-D float64 array), or ValueError
        naming `name` unless every priority is finite, >= 0 and small enough that its weight
        keeps the tree's total finite: the one check and weighing of priorities that a writer
        keeps before it adds them (N-step staging, a remote handle's batch), handed back to
        :meth:`add` with them. `missing`: a NaN is a row without a priority (its weight NaN
        too), not an error."""
        cdef const double[::1] values = priorities
        weights = np.empty(values.shape[0], dtype=np.float64)
        cdef double[::1] out = weights
        self.enter()
        try:
            if missing:
                given = ~np.isnan(priorities)
                if not given.all():
                    weights[~given] = np.nan
                    if given.any():
                        weights[given] = self.weights_of(
                            np.ascontiguousarray(priorities[given]), name)
                    return weights
            if values.shape[0]:
                self.weigh(&values[0], &out[0], values.shape[0], name)
            return weights
        finally:
            self.leave()

    # -- add ----------------------------------------------------------------------------------

    def add(self, values, priorities=None, timeout=None, weights=None):
        """add(values, priorities=None, timeout=None, weights=None) -> int: the first slot
        written.

        `values`: one value per column, as a list in column order or as a dict keyed by
        exactly the column names (the handle passes add()'s keyword arguments as they come):
        arrays of the row or batch shape of any same_kind-castable dtype and any strides,
        Python or numpy scalars, or lists. Converted here (plain numeric dtypes without
        numpy's help), validated in full before anything is written. `priorities`: one per
        row (a prioritized store only). `weights`: with `priorities`, their leaf weights as
        :meth:`weights_of` gave them (float64), so that a writer that checked them once does
        not have them weighed again; a NaN in both is a row without a priority, which takes
        the largest priority seen, read under the lock as every add reads it. `timeout`:
        seconds the rate limiter may hold the add back (None: no limit; 0: never wait), then
        TimeoutError with nothing added."""
        cdef double seconds = as_timeout(timeout)
        self.enter()
        try:
            return self._add(values, priorities, seconds, weights)
        finally:
            self.leave()

    cdef object _add(self, values, priorities, double timeout, weighed=None):
        cdef AddFrame frame
        cdef AddArguments arguments
        cdef int64_t count, bad
        cdef double* priority_pointer = NULL
        cdef double* weights = NULL
        cdef Py_buffer weighed_view
        cdef bint weighed_held = False
        cdef int n = self.columns.count
        frame.block = NULL
        try:
            self.columns.open_frame(&frame)
            count = self.columns.stage_all(&frame, values)
            if priorities is not None:
                _rules.check_priorities_allowed(self.prioritized)
                priority_pointer = self.columns.stage_priorities(&frame, priorities, count)
                if weighed is None:
                    weights = <double*>malloc(count * sizeof(double))
                    frame.owned[n + 1] = weights
                    if weights == NULL:
                        raise MemoryError()
                    self.weigh(priority_pointer, weights, count, "priorities")
                else:
                    weighed_held = export_vector(weighed, &weighed_view, b"d", 8)
                    if not weighed_held or weighed_view.shape[0] != count:
                        raise ValueError(f"weights must be {count} float64 (weights_of's)")
                    weights = <double*>weighed_view.buf
                    with nogil:
                        bad = first_bad_weight(weights, count, self.rule.max_weight)
                    if bad >= 0:
                        raise ValueError(f"weights[{bad}] = {weights[bad]} is no leaf weight "
                                         f"that weights_of gives")
            elif weighed is not None:
                raise ValueError("weights go with their priorities")
            arguments.sources = frame.pointers
            arguments.count = count
            arguments.priorities = priority_pointer
            arguments.weights = weights
            return self.run(add_kernel, &arguments, SIDE_INSERT, count, timeout)
        finally:
            if weighed_held:
                PyBuffer_Release(&weighed_view)
            self.columns.close_frame(&frame)

    # -- sample -------------------------------------------------------------------------------

    def sample(self, int64_t batch, double beta, out=None, timeout=None):
        """sample(batch, beta, out=None, timeout=None) -> dict: every column (batch, *shape),
        then "indexes" (int64), "weights" (float32; a prioritized store's only) and
        "generations" (uint64).

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
        cdef SampleOutputs outputs = self.outputs
        cdef SampleArguments arguments
        cdef OutputCall call
        call.block = NULL
        try:
            arrays = outputs.begin(&call, batch, self.view.stride, out, 0)
            arguments.rng = &self.rng
            arguments.batch = batch
            arguments.beta = beta
            arguments.scratch = call.scratch
            arguments.indexes = <int64_t*>call.pointers[outputs.index_at]
            arguments.weights = (<float*>call.pointers[outputs.weights_at]
                                 if outputs.weights_at >= 0 else NULL)
            arguments.generations = <uint64_t*>call.pointers[outputs.generations_at]
            arguments.outputs = call.pointers
            self.run(sample_kernel, &arguments, SIDE_SAMPLE, batch, timeout)
            return outputs.finish(&call, arrays, batch)
        finally:
            outputs.end(&call)

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
            stored = self.index_bound()
            with nogil:
                bad = first_out_of_range(<const int64_t*>index_view.buf, count, stored)
            if bad >= 0:
                raise IndexError(f"indexes must be in [0, {self.index_bound_name} {stored}); got "
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
            return self.run(update_kernel, &arguments, SIDE_NONE, 0, 0.0)
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
        self.enter()
        try:
            self.run(clear_kernel, NULL, SIDE_RESET, 0, 0.0)
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
            return self.run(snapshot_kernel, &arguments, SIDE_NONE, 0, 0.0)
        finally:
            for c in range(acquired):
                PyBuffer_Release(&views[c])
            free(views)
            free(pointers)
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
            self.run(tree_kernel, &arguments, SIDE_NONE, 0, 0.0)
            return arguments.root_sum, sums, arguments.root_min, mins
        finally:
            self.leave()

    def generations_of(self, indexes):
        """Current generation of each slot (uint64), for tests and diagnostics."""
        header = self.header()
        generations = np.ndarray((self.view.capacity,), dtype=np.uint64, buffer=self._memory,
                                 offset=header.data_offset, strides=(self.view.stride,))
        return generations[np.asarray(indexes, dtype=np.int64)].copy()

    def generation_at(self, int64_t slot):
        """The current generation of one slot (read without the lock: one aligned load; the
        record's first field), what generations_of gives for many."""
        self.header()
        if not 0 <= slot < self.view.capacity:
            raise IndexError(f"slot must be in [0, capacity {self.view.capacity}); got {slot}")
        return (<const uint64_t*>(self.view.rows + slot * self.view.stride))[0]
