# cython: language_level=3
"""The store's nogil core: add, sample, update, clear, snapshot and repair on raw pointers.

Nothing here validates user input or touches a Python object; :mod:`cpprb_ray._store` does both
before it calls in. What the core does check is the segment itself: every header field a kernel
or the repair indexes with is bounded by the capacity first (``header_problem``), every sampled
index by the stored size, and every loop by the capacity, so a corrupt or hostile segment gives
a Status (ST_CORRUPT, ST_NAN_TREE), never a wild access or an endless loop.

Crash protocol (docs/design.md): an operation records what it is about to do in the header
(``op``, and for an add the slots it writes and the values to roll back to), then writes, then
commits and clears ``op``. Every change of ``op`` goes through ``publish_op`` (fences), because a
holder killed between two instructions leaves exactly the stores it had issued, in program order.
"""

from libc.math cimport INFINITY, floor, isfinite, powf
from libc.stdint cimport int64_t, uint8_t, uint64_t
from libc.string cimport memcpy

from cpprb_ray._limiter cimport LIMITER_NONE, Limiter, limiter_admits
from cpprb_ray._prefetch cimport prefetch
from cpprb_ray._segment cimport (LIMITER_AT, MUTEX_AT, OP_ADD, OP_CLEAR, OP_NONE, OP_UPDATE,
                                 ST_ALL_TORN, ST_ALL_ZERO, ST_CORRUPT, ST_EMPTY, ST_LOCK_ERROR,
                                 ST_LOCK_TIMEOUT, ST_NAN_TREE, ST_OK, Header, header_problem)
from cpprb_ray._segtree cimport (Xoshiro256, is_unset, rng_uniform, tree_bind,
                                 tree_clear_all, tree_consistent, tree_min, tree_rebuild,
                                 tree_refresh, tree_refresh_range, tree_sample, tree_total,
                                 unset_leaf)
from cpprb_ray._sync cimport (LOCK_CORRUPT, LOCK_TIMED_OUT, LOCKED_OWNER_DIED,
                              mutex_consistent, mutex_timedlock, mutex_trylock, mutex_unlock,
                              pthread_mutex_t)

cdef extern from *:
    """
    #include <stdint.h>
    /* Publish a change of the in-flight operation marker (header.op). The record of what to undo
       must be in memory before "op = ADD", and every commit store before "op = NONE": gcc -O3
       moved both across plain stores (tests/test_crash_points.py finds it). The fences are
       compiler barriers on x86 (its stores stay in program order) and a dmb on ARM. */
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
    GATHER_AHEAD = 8      # records asked for ahead of their use, so that misses overlap


cdef void publish(uint64_t* op, uint64_t value) noexcept nogil:
    """publish_op for the modules that write what a repair reads (_lanes)."""
    publish_op(op, value)


# -- the ring's part: rows fill the slots below the stored size, in order ----------------------

cdef void ring_undo_add(StoreView* view) noexcept nogil:
    """store_repair's undo of a ring add in flight: its slots torn (generation odd, leaf unset)
    and the ring's position and size as they were. The pending fields are bounded by the
    capacity first: a flipped one must not write outside the rows or loop for 2**62 slots."""
    cdef Header* h = view.header
    cdef uint64_t capacity = <uint64_t>view.capacity
    cdef uint64_t k, slot, count
    count = h.pending_count if h.pending_count <= capacity else capacity
    for k in range(count):
        slot = (h.pending_start % capacity + k) % capacity
        view.tree.sums[slot] = unset_leaf()
        generation_of(view, <int64_t>slot)[0] |= 1
    h.next_index = h.pending_old_next % capacity
    h.stored_size = (h.pending_old_stored if h.pending_old_stored <= capacity else capacity)


cdef void ring_clear_rows(StoreView* view) noexcept nogil:
    """store_clear's part: the generation of every slot that can hold a row moves on."""
    cdef uint64_t stored = view.header.stored_size
    cdef uint64_t slot
    cdef uint64_t* generation
    # The repair calls this before the header is checked: a stored size past the capacity
    # (no writer leaves one) must not walk records that do not exist. Only slots ever written
    # can hold a row: a slot past the stored size was never written since the last clear (the
    # ring fills from 0), so it is neither read nor touched. (An empty buffer's clear used to
    # walk every record of the whole segment.)
    if stored > <uint64_t>view.capacity:
        stored = <uint64_t>view.capacity
    for slot in range(stored):
        generation = generation_of(view, <int64_t>slot)
        generation[0] = (generation[0] | 1) + 1


cdef void view_bind(StoreView* view, uint8_t* base, const int64_t* columns,
                    const int64_t* row_bytes, int column_count) noexcept nogil:
    """Point `view` at a segment whose header and layout were validated (_layout.read), with
    the ring's part; another part (_lanes.lanes_bind) replaces it before the first call."""
    cdef Header* header = <Header*>base
    view.header = header
    view.mutex = <pthread_mutex_t*>(base + MUTEX_AT)
    view.capacity = <int64_t>header.capacity
    view.prioritized = header.prioritized != 0
    view.stride = <int64_t>header.row_stride
    view.rows = base + header.data_offset
    tree_bind(&view.tree, <double*>(base + header.tree_offset), view.capacity)
    view.columns = columns
    view.row_bytes = row_bytes
    view.column_count = column_count
    view.lock_errno = 0
    view.limiter = <Limiter*>(base + LIMITER_AT)
    view.limited = view.limiter.kind != LIMITER_NONE
    view.part.undo_add = ring_undo_add
    view.part.clear_rows = ring_clear_rows
    view.part.holds_row = NULL
    view.part.count_rows = NULL
    view.lanes.records = NULL
    view.lanes.count = 0
    view.lanes.link_offset = -1


# -- locking and repair -------------------------------------------------------------------------

cdef int store_lock(StoreView* view, double timeout_s) noexcept nogil:
    """Take the lock within `timeout_s`, repairing first when its previous holder died.

    ST_OK with the lock held; else a Status and the lock is not held: ST_LOCK_TIMEOUT,
    ST_LOCK_ERROR (errno in view.lock_errno) or ST_CORRUPT (a header no writer leaves)."""
    cdef bint waited = False
    cdef int status = mutex_trylock(view.mutex)   # uncontended: one atomic, no clock read
    if status == LOCK_TIMED_OUT:
        waited = True
        status = mutex_timedlock(view.mutex, timeout_s)
    if status == LOCK_TIMED_OUT:
        return ST_LOCK_TIMEOUT
    if status == LOCK_CORRUPT:
        return ST_CORRUPT
    if status < 0:
        view.lock_errno = -status
        return ST_LOCK_ERROR
    if status == LOCKED_OWNER_DIED:
        store_repair(view)
        status = mutex_consistent(view.mutex)
        if status:
            view.lock_errno = status
            mutex_unlock(view.mutex)
            return ST_LOCK_ERROR
    # The fields are checked against the capacity attach validated and the kernels index with,
    # not against the header's own capacity field, which a stray write can change too.
    if header_problem(view.header) or view.header.capacity != <uint64_t>view.capacity:
        mutex_unlock(view.mutex)
        return ST_CORRUPT
    if waited:
        view.header.lock_waits += 1
    return ST_OK


cdef void store_unlock(StoreView* view) noexcept nogil:
    # Unlocking a mutex we hold cannot fail (EPERM only for one we do not hold).
    mutex_unlock(view.mutex)


cdef void store_repair(StoreView* view) noexcept nogil:
    """Undo what a holder killed mid-operation left; idempotent (the repairer may die too)."""
    cdef Header* h = view.header
    if h.op == OP_ADD:
        view.part.undo_add(view)
        h.rows_added = h.pending_old_rows_added
        h.max_priority = (h.pending_old_max_priority
                          if isfinite(h.pending_old_max_priority)
                          and h.pending_old_max_priority >= 0.0 else 1.0)
    elif h.op == OP_UPDATE:
        # Leaves it wrote stay: max_priority covers the largest priority it may have written.
        if isfinite(h.pending_old_max_priority) and h.pending_old_max_priority > h.max_priority:
            h.max_priority = h.pending_old_max_priority
    elif h.op == OP_CLEAR:
        store_clear(view)
    if view.part.count_rows != NULL:
        # Rows that moved outside any add's record (a part's evictions): count them again.
        h.pending_lane = 0
        h.stored_size = <uint64_t>view.part.count_rows(view)
    # Every node, padding included: a corrupt padding node would otherwise steer searches
    # past the last slot.
    tree_rebuild(&view.tree)
    publish_op(&h.op, OP_NONE)
    h.repairs += 1


cdef extern from *:
    """
    #if defined(__SSE2__)
    #include <emmintrin.h>
    #endif
    /* max(start, v[0..n)) as `v[k] > m` keeps it: a NaN value is passed over, a NaN start
       stays. With SSE2, maxpd(x, m) is exactly (x > m ? x : m), two values a step. */
    static CYTHON_INLINE double cpprb_ray_largest(const double* v, int64_t n, double start) {
        int64_t k = 0;
        double m = start;
    #if defined(__SSE2__)
        __m128d a = _mm_set1_pd(start), b = a, c = a, d = a;
        double pair[2];
        for (; k + 8 <= n; k += 8) {
            a = _mm_max_pd(_mm_loadu_pd(v + k), a);
            b = _mm_max_pd(_mm_loadu_pd(v + k + 2), b);
            c = _mm_max_pd(_mm_loadu_pd(v + k + 4), c);
            d = _mm_max_pd(_mm_loadu_pd(v + k + 6), d);
        }
        a = _mm_max_pd(_mm_max_pd(b, a), _mm_max_pd(d, c));
        _mm_storeu_pd(pair, a);
        m = pair[1] > pair[0] ? pair[1] : pair[0];
    #endif
        for (; k < n; k++)
            m = v[k] > m ? v[k] : m;
        return m;
    }
    """
    double largest "cpprb_ray_largest"(const double* values, int64_t count,
                                       double start) noexcept nogil


# -- add ----------------------------------------------------------------------------------------

cdef int64_t store_add(StoreView* view, const uint8_t** sources, int64_t count,
                       const double* priorities, const double* weights) noexcept nogil:
    """Write `count` rows (each column's `sources` holds them back to back); returns the first
    slot written. `weights` are the rows' leaf weights and `priorities` their raw priorities
    (NULL: none given; a NaN in both: that row's not given): a row without one gets the weight
    of the largest priority seen, its earlier rows' included (row_weight)."""
    cdef Header* h = view.header
    cdef int64_t capacity = view.capacity
    cdef int64_t skipped = count - capacity if count > capacity else 0
    cdef int64_t written = count - skipped
    cdef int64_t start = (<int64_t>h.next_index + skipped) % capacity
    cdef int64_t first_part = min(written, capacity - start)
    cdef int64_t k, slot, c, size
    cdef double weight, max_priority = h.max_priority
    cdef MaxWeight seen
    cdef uint8_t* record
    cdef uint8_t* rows
    cdef uint64_t* generation
    cdef int64_t stride
    cdef int column_count
    cdef const int64_t* offsets
    cdef const int64_t* row_bytes
    cdef double* sums
    cdef bint prioritized
    max_weight_start(&seen, h)
    for k in range(skipped):    # rows a full ring never writes still raise what the rest see
        row_weight(weights, priorities, k, h, &seen)
    # 1. Say what we are about to do, so a repairer can undo it.
    h.pending_start = start
    h.pending_count = written
    h.pending_old_next = h.next_index
    h.pending_old_stored = h.stored_size
    h.pending_old_rows_added = h.rows_added
    h.pending_old_max_priority = h.max_priority
    publish_op(&h.op, OP_ADD)
    # 2. Copy each row into its record, move its generation to the next even number and its
    #    weight into the leaf.
    #    (The view's fields in locals: a row's stores could otherwise be those fields to the
    #    compiler, which builds extensions without strict aliasing, and reload them.)
    rows = view.rows
    stride = view.stride
    column_count = view.column_count
    offsets = view.columns
    row_bytes = view.row_bytes
    sums = view.tree.sums
    prioritized = view.prioritized
    for k in range(written):
        slot = (start + k) % capacity
        record = rows + slot * stride
        generation = <uint64_t*>record
        generation[0] = (generation[0] | 1) + 1
        for c in range(column_count):
            size = row_bytes[c]
            copy_field(record + offsets[c], sources[c] + (skipped + k) * size, size)
        if prioritized:
            weight = row_weight(weights, priorities, skipped + k, h, &seen)
            # A zero weight is kept out of min() (weights divide by it) like an unset leaf.
            sums[slot] = weight if weight > 0.0 else unset_leaf()
    if prioritized:
        tree_refresh_range(&view.tree, start, first_part)
        tree_refresh_range(&view.tree, 0, written - first_part)
        if priorities != NULL:
            h.max_priority = largest(priorities, count, max_priority)
    # 3. Commit.
    h.stored_size = min(<int64_t>h.stored_size + written, capacity)
    h.next_index = (start + written) % capacity
    h.rows_added += count
    publish_op(&h.op, OP_NONE)
    return start


# -- sample -------------------------------------------------------------------------------------

cdef bint any_committed(StoreView* view, int64_t stored) noexcept nogil:
    cdef int64_t slot
    if view.part.count_rows != NULL:
        return view.part.count_rows(view) > 0
    for slot in range(stored):
        if not generation_of(view, slot)[0] & 1:
            return True
    return False


cdef float WEIGHT_FLOOR = 1.401298464324817e-45     # float32's least positive (subnormal) value


cdef int64_t store_draw(StoreView* view, Xoshiro256* rng, int64_t batch, double beta,
                        double* scratch, int64_t* indexes, float* weights) noexcept nogil:
    """Draw `batch` slots (proportional when prioritized, else uniform over committed rows)
    with their importance weights (`weights` NULL: none wanted); returns `batch` or a Status.
    `scratch` holds `batch` doubles. A part whose rows lie anywhere always has a tree (a
    uniform one weighs every row 1)."""
    cdef Header* h = view.header
    cdef int64_t k, index, stored = h.stored_size, tries
    cdef RowTest holds_row = view.part.holds_row
    cdef double total, lowest, heaviest, inverse_lowest, leaf
    if stored == 0:
        return ST_EMPTY
    if view.prioritized:
        total = tree_total(&view.tree)
        if not isfinite(total):
            return ST_NAN_TREE
        # A root, or a min path, that no writer leaves (a NaN, an infinity, a negative or a
        # value no leaf has, written into a node): reported, never turned into weights.
        if not tree_consistent(&view.tree):
            return ST_CORRUPT
        if not total > 0.0:
            return ST_ALL_ZERO if any_committed(view, stored) else ST_ALL_TORN
        # A positive total has a least positive leaf, and no writer leaves one lighter than
        # a priority of 0 weighs, eps ** alpha (leaf_weight: a consistent tree over a leaf of
        # 1e-300 made every other weight underflow to 0).
        lowest = tree_min(&view.tree)
        if not (lowest > 0.0 and lowest < INFINITY
                and lowest >= leaf_weight(0.0, h.eps, h.alpha) * (1.0 - 1e-12)):
            return ST_CORRUPT
        # Nor one heavier than the largest priority seen weighs (every write of a leaf raises
        # max_priority to its priority first; a consistent tree over a leaf of 1e300 made the
        # others' weights underflow to 0).
        heaviest = leaf_weight(h.max_priority, h.eps, h.alpha) * (1.0 + 1e-12)
        if tree_sample(&view.tree, rng, scratch, indexes, batch):
            return ST_CORRUPT       # a padding node that is not 0, or a node not its children's sum
        for k in range(batch):
            # The tree only reaches set leaves of committed rows; anything else is a corrupt
            # node, and must not become an address.
            if holds_row == NULL:
                if indexes[k] < 0 or indexes[k] >= stored:
                    return ST_CORRUPT
            elif (indexes[k] < 0 or indexes[k] >= view.capacity
                  or not holds_row(view, indexes[k])):
                return ST_CORRUPT
            # Every leaf a walk reaches is a weight of at least the min: (leaf / min)^-beta
            # is then in (0, 1], never NaN, infinite or the inverse of a negative.
            leaf = view.tree.sums[indexes[k]]
            if not (leaf >= lowest and leaf <= heaviest):
                return ST_CORRUPT
        # Ask for every sampled record now: their misses then overlap the weights below
        # instead of waiting for the gather. (Asking from inside the walk, as each leaf is
        # found, measured slower: those misses then compete with the walk's own.)
        for k in range(batch):
            prefetch_record(view, indexes[k])
        if weights == NULL:
            return batch
        # (N P(i))^-beta / max_j (N P(j))^-beta == (p_i / p_min)^-beta. The weights are
        # float32, so float32 powf (about 1e-7 relative) is exact enough and much cheaper.
        # A ratio of leaves too wide for float32 (a priority of 1e-153 beside one of 1 with
        # eps=0, as a user may give) would make a weight of 0, which no importance weight is:
        # it is given as float32's least positive value instead, so weights stay in (0, 1].
        inverse_lowest = 1.0 / lowest
        for k in range(batch):
            weights[k] = 1.0 if beta == 0.0 else max(WEIGHT_FLOOR, powf(
                <float>(view.tree.sums[indexes[k]] * inverse_lowest), <float>-beta))
    else:
        for k in range(batch):
            # Skip a slot torn by a writer's death (odd generation); bounded retries, then
            # a scan, so a buffer of only torn rows is reported instead of looping.
            index = <int64_t>floor(rng_uniform(rng) * stored)
            tries = 0
            while generation_of(view, index)[0] & 1:
                tries += 1
                if tries < 64:
                    index = <int64_t>floor(rng_uniform(rng) * stored)
                else:
                    index = 0
                    while index < stored and generation_of(view, index)[0] & 1:
                        index += 1
                    if index == stored:
                        return ST_ALL_TORN
                    break
            indexes[k] = index
            if weights != NULL:
                weights[k] = 1.0
    return batch


cdef int64_t store_gather(StoreView* view, const int64_t* indexes, int64_t batch,
                          uint64_t* generations, uint8_t** outputs) noexcept nogil:
    """Copy the records of `indexes` (drawn under the same lock) out, column by column, with
    their generations: the ring's gather; returns `batch`."""
    cdef int64_t k, c, size
    cdef const uint8_t* record
    for k in range(min(batch, GATHER_AHEAD)):
        prefetch_record(view, indexes[k])
    for k in range(batch):
        if k + GATHER_AHEAD < batch:
            prefetch_record(view, indexes[k + GATHER_AHEAD])
        record = view.rows + indexes[k] * view.stride
        generations[k] = (<const uint64_t*>record)[0]
        for c in range(view.column_count):
            size = view.row_bytes[c]
            copy_field(outputs[c] + k * size, record + view.columns[c], size)
    return batch


# -- update -------------------------------------------------------------------------------------

cdef inline void prefetch_update(const double* sums, const uint8_t* rows, int64_t stride,
                                 int64_t index, bint record) noexcept nogil:
    prefetch(sums + index)
    if record:
        prefetch(rows + index * stride)


cdef inline bint update_entry(StoreView* view, RowTest holds_row, double* sums,
                              const uint8_t* rows, int64_t stride, int64_t bound,
                              const int64_t* indexes, const double* weights,
                              const uint64_t* generations, int64_t k,
                              int64_t count) noexcept nogil:
    """Entry `k` of an update: its leaf written, or False where it is skipped (see
    store_update); the one place the skip rules are written. `sums`, `rows` and `stride` are
    the view's, passed in locals: a leaf's store could otherwise be the view's own fields to
    the compiler (extensions build without strict aliasing), which would reload them every
    entry."""
    cdef int64_t index
    cdef uint64_t generation
    cdef double weight
    if k + GATHER_AHEAD < count:
        prefetch_update(sums, rows, stride, indexes[k + GATHER_AHEAD], generations != NULL)
    index = indexes[k]
    if <uint64_t>index >= <uint64_t>bound:
        return False          # cleared since validation (a negative index too)
    if holds_row != NULL and not holds_row(view, index):
        return False          # a part's slot without a committed row (frames only, evicted, open)
    if generations != NULL:
        generation = (<const uint64_t*>(rows + index * stride))[0]
        if generation & 1 or generation != generations[k]:
            return False      # torn by a dead writer, or overwritten since it was sampled
    elif is_unset(sums[index]) and (<const uint64_t*>(rows + index * stride))[0] & 1:
        # A torn slot always has an unset leaf, so only such leaves need the record
        # read (one cache miss each) to tell torn rows from rows of weight 0.
        return False
    weight = weights[k]
    sums[index] = weight if weight > 0.0 else unset_leaf()
    return True


cdef inline int64_t update_run(StoreView* view, RowTest holds_row, int64_t bound,
                               const int64_t* indexes, const double* weights,
                               const uint64_t* generations, int64_t count) noexcept nogil:
    """Entries 0.. of an update, each written by update_entry, up to the first to be skipped:
    returns its position (count: none). store_update passes holds_row as the literal NULL for
    a part without a row test, and this passes generations as one where there are none: once
    inlined, each loop is update_entry specialised by the compiler, the tests of those that
    are NULL gone: the ring's update is as fast as when its loops were written out by hand (a
    second copy of the skip rules)."""
    cdef double* sums = view.tree.sums
    cdef const uint8_t* rows = view.rows
    cdef int64_t stride = view.stride
    cdef int64_t k = 0
    if generations == NULL:
        while k < count and update_entry(view, holds_row, sums, rows, stride, bound, indexes,
                                         weights, NULL, k, count):
            k += 1
    else:
        while k < count and update_entry(view, holds_row, sums, rows, stride, bound, indexes,
                                         weights, generations, k, count):
            k += 1
    return k


cdef int64_t store_update(StoreView* view, const int64_t* indexes, const double* priorities,
                          const double* weights, const uint64_t* generations,
                          int64_t count) noexcept nogil:
    """Set the leaves of `indexes` to `weights`; returns how many were applied. Entries for
    slots past the stored size (cleared since), torn, or (with `generations`) overwritten since
    they were sampled are skipped."""
    cdef Header* h = view.header
    cdef int64_t k, applied
    cdef RowTest holds_row = view.part.holds_row
    cdef int64_t bound = view.capacity if holds_row != NULL else <int64_t>h.stored_size
    cdef double* sums = view.tree.sums
    cdef const uint8_t* rows = view.rows
    cdef int64_t stride = view.stride
    cdef double max_priority
    # For a repair after this holder's death: the largest priority it may have written. (Its
    # leaves stay as written; max_priority must cover them, or a sample reports them as
    # heavier than any priority seen.) Computed in a local and stored once, before the op is
    # published: a kill before the publish leaves OP_NONE, which a repair does not read it for.
    cdef double all_max = largest(priorities, count, h.max_priority)
    # Software pipelining: ask for the leaf lines (and the record, when generations are
    # checked) of the entry GATHER_AHEAD places ahead, so several misses are in flight.
    for k in range(min(count, GATHER_AHEAD)):
        prefetch_update(sums, rows, stride, indexes[k], generations != NULL)
    h.pending_old_max_priority = all_max
    publish_op(&h.op, OP_UPDATE)
    # While every entry applies (the usual case), the new max_priority is all_max: no
    # per-entry compare. From the first skipped entry on, the entries applied are counted and
    # their priorities compared one by one.
    if holds_row == NULL:
        k = update_run(view, NULL, bound, indexes, weights, generations, count)  # see update_run
    else:
        k = update_run(view, holds_row, bound, indexes, weights, generations, count)
    applied = k
    if k == count:
        max_priority = all_max
    else:
        max_priority = largest(priorities, k, h.max_priority)   # the entries before k
        for k in range(k + 1, count):
            if update_entry(view, holds_row, sums, rows, stride, bound, indexes, weights,
                            generations, k, count):
                applied += 1
                if priorities[k] > max_priority:
                    max_priority = priorities[k]
    tree_refresh(&view.tree, indexes, count)
    h.max_priority = max_priority
    h.updates += applied
    publish_op(&h.op, OP_NONE)
    # The refresh recomputed the ancestors of the leaves written from their children: a corrupt
    # node beside them (a NaN, -inf, a negative) has reached the root. Reported, not left for
    # the next sample's weights (one -inf and one update made every weight inf).
    if view.prioritized and not tree_consistent(&view.tree):
        return ST_CORRUPT
    return applied


# -- whole buffer -------------------------------------------------------------------------------

cdef void store_clear(StoreView* view) noexcept nogil:
    """Forget every row; generations move on, so old samples cannot update new rows."""
    publish_op(&view.header.op, OP_CLEAR)
    view.part.clear_rows(view)
    tree_clear_all(&view.tree)
    view.header.next_index = 0
    view.header.stored_size = 0
    view.header.max_priority = 1.0
    # The limiter counts from here (Reverb resets its limiter with the table). Before OP_NONE:
    # a repaired clear is redone whole, and sets the same bases again.
    view.limiter.insert_base = view.header.rows_added
    view.limiter.sample_base = view.header.rows_sampled
    publish_op(&view.header.op, OP_NONE)


cdef bint store_admits(StoreView* view, int side, int64_t rows) noexcept nogil:
    """Under the lock: whether the rate limiter lets an add or a sample of `rows` rows go now
    (always, without a limiter). Its counts derive from the header (see _limiter.pxd)."""
    cdef Header* h = view.header
    cdef Limiter* limiter = view.limiter
    if not view.limited:
        return True
    return limiter_admits(limiter, side, <double>(h.rows_added - limiter.insert_base),
                          <double>(h.rows_sampled - limiter.sample_base), h.stored_size,
                          h.capacity, rows)


cdef int64_t store_snapshot(StoreView* view, int64_t room, uint8_t** outputs, int64_t* indexes,
                            double* leaves) noexcept nogil:
    """Copy up to `room` committed rows in slot order, with their slots and leaves; returns how
    many (torn rows are left out)."""
    cdef int64_t slot, copied = 0, c, size
    cdef int64_t stored = view.header.stored_size
    for slot in range(min(room, stored)):
        if generation_of(view, slot)[0] & 1:
            continue
        for c in range(view.column_count):
            size = view.row_bytes[c]
            copy_field(outputs[c] + copied * size,
                       view.rows + slot * view.stride + view.columns[c], size)
        indexes[copied] = slot
        leaves[copied] = view.tree.sums[slot] + 0.0
        copied += 1
    return copied


# -- checkpoints --------------------------------------------------------------------------------

cdef int64_t store_dump(StoreView* view, Header* header, uint8_t* rows,
                        uint64_t* tail_generations, double* leaves) noexcept nogil:
    """Copy the buffer's whole state, as one consistent snapshot (the caller holds the lock):
    the header, the records of the stored slots (generations included, so a torn slot stays
    torn), the generations of the slots past them and, when prioritized, the stored slots'
    leaves bit for bit (-0.0 stays unset). The inner nodes are not copied: they are a function
    of the leaves (tree_rebuild makes them again, bit-identical). `rows` holds `capacity`
    records, `tail_generations` and `leaves` `capacity` entries. Returns the stored size."""
    cdef int64_t stored = view.header.stored_size, slot
    memcpy(header, view.header, sizeof(Header))
    memcpy(rows, view.rows, <size_t>(stored * view.stride))
    for slot in range(stored, view.capacity):
        tail_generations[slot - stored] = generation_of(view, slot)[0]
    if view.prioritized:
        memcpy(leaves, view.tree.sums, <size_t>stored * sizeof(double))
    return stored


cdef void store_restore(StoreView* view, const uint8_t* rows, int64_t stored,
                        const uint64_t* tail_generations, int64_t tail_count,
                        const double* leaves, uint64_t next_index, double max_priority,
                        uint64_t rows_added, uint64_t limiter_inserts,
                        uint64_t limiter_samples) noexcept nogil:
    """Replace the buffer's state by a dump's (validated by the caller: stored and tail_count
    within the capacity, next_index below it, leaves finite or unset, torn slots unset). The
    rate limiter's counts become `limiter_inserts` and `limiter_samples` (their bases are set
    so; unsigned differences, so a base "below zero" wraps and still gives them).

    Marked as a clear while it writes: a loader killed half-way leaves a buffer that the next
    locker's repair empties, never a mix of the old and the restored state."""
    cdef Header* h = view.header
    cdef int64_t k
    publish_op(&h.op, OP_CLEAR)
    if rows != <const uint8_t*>view.rows:   # a load reads them into the segment itself
        memcpy(view.rows, rows, <size_t>(stored * view.stride))
    for k in range(tail_count):
        generation_of(view, stored + k)[0] = tail_generations[k]
    tree_clear_all(&view.tree)
    if view.prioritized:
        memcpy(view.tree.sums, leaves, <size_t>stored * sizeof(double))
        tree_rebuild(&view.tree)
    h.next_index = next_index
    h.stored_size = <uint64_t>stored
    h.max_priority = max_priority
    h.rows_added = rows_added
    view.limiter.insert_base = rows_added - limiter_inserts
    view.limiter.sample_base = h.rows_sampled - limiter_samples
    publish_op(&h.op, OP_NONE)
