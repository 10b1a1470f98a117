# cython: language_level=3
"""Sum and min segment trees over memory they are given.

The trees own no memory: they are laid into any writable buffer (a bytearray, a numpy array,
``SharedMemory.buf``, an mmap), so every process that maps the same segment sees the very same
tree. Each node has 8 children, so one node's children fill one 64-byte cache line and a search
over 2**20 leaves touches 7 lines instead of the 20 a binary tree touches. Parents are always
recomputed from their children (never updated by deltas), so sums do not drift.

All kernels are ``noexcept nogil`` functions on raw pointers; the ``def`` methods validate their
arguments with numpy, then release the GIL for the whole batch.
"""

from cpython.buffer cimport (PyBUF_ANY_CONTIGUOUS, PyBUF_WRITABLE, PyBuffer_Release,
                             PyObject_GetBuffer)
from libc.float cimport DBL_MAX
from libc.math cimport INFINITY
from libc.stdint cimport int64_t, uint64_t, uintptr_t
from libc.string cimport memset

from cpprb_ray._prefetch cimport prefetch, prefetch_write

import os

import numpy as np

from cpprb_ray import _rules

cdef enum:
    PREFETCH_AHEAD = 16
    DEDUPE_NODES = 4096       # levels this narrow are marked in a bitmap on the stack

# ---------------------------------------------------------------------------------------------
# Layout


cdef inline int64_t round_up(int64_t value, int64_t multiple) noexcept nogil:
    return (value + multiple - 1) // multiple * multiple


cdef int64_t tree_doubles(int64_t capacity, TreeView* view) noexcept nogil:
    """Doubles the tree needs (sum levels, then min levels above the shared leaves); fills
    view's level table when view is not NULL."""
    cdef int64_t count = capacity
    cdef int64_t total = 0
    cdef int level = 0
    while True:
        if view != NULL:
            view.counts[level] = count
            view.offsets[level] = total
        # Every level is padded to whole cache lines; padding holds an unset leaf, 0 (sums) or
        # +inf (mins).
        total += round_up(count, FANOUT)
        if count == 1:
            break
        count = (count + FANOUT - 1) >> FANOUT_BITS
        level += 1
    if view != NULL:
        view.depth = level
        view.level_doubles = total
        view.capacity = capacity
    return 2 * total - round_up(capacity, FANOUT)


cdef void tree_bind(TreeView* view, double* memory, int64_t capacity) noexcept nogil:
    tree_doubles(capacity, view)
    view.sums = memory
    # Min level L (>= 1) lives at mins + offsets[L], right after the sum levels; the pointer
    # itself is never read at level 0, which has no min copy.
    view.mins = memory + view.level_doubles
    if view.depth >= 1:
        view.mins -= view.offsets[1]


# ---------------------------------------------------------------------------------------------
# Kernels


cdef void tree_clear_all(TreeView* view) noexcept nogil:
    cdef int64_t i
    cdef int64_t leaves = round_up(view.capacity, FANOUT)
    for i in range(leaves):
        view.sums[i] = unset_leaf()
    memset(view.sums + leaves, 0, <size_t>(view.level_doubles - leaves) * sizeof(double))
    for i in range(leaves, view.level_doubles):
        view.mins[i] = INFINITY


cdef inline double smaller(double a, double b) noexcept nogil:
    return a if a < b else b


cdef inline void recompute_node(TreeView* view, int level, int64_t node) noexcept nogil:
    """Recompute node `node` of `level` (>= 1) from its 8 children, in a fixed order."""
    cdef int64_t first = view.offsets[level - 1] + (node << FANOUT_BITS)
    cdef const double* s = view.sums + first
    cdef const double* m
    # The same expression as the last prefix sum in prefix_sums(), so that prefix equals the node
    # bit for bit and a mass >= the node always takes the "past the end" branch (last positive
    # child) instead of stopping early through rounding.
    cdef double total = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]))
    # Pairwise too: three dependent minimums instead of seven.
    cdef double low
    if level == 1:   # the children are the shared leaves
        low = smaller(smaller(smaller(min_key(s[0]), min_key(s[1])),
                              smaller(min_key(s[2]), min_key(s[3]))),
                      smaller(smaller(min_key(s[4]), min_key(s[5])),
                              smaller(min_key(s[6]), min_key(s[7]))))
    else:
        m = view.mins + first
        low = smaller(smaller(smaller(m[0], m[1]), smaller(m[2], m[3])),
                      smaller(smaller(m[4], m[5]), smaller(m[6], m[7])))
    view.sums[view.offsets[level] + node] = total
    view.mins[view.offsets[level] + node] = low


cdef inline void prefetch_parent(TreeView* view, int level, int64_t node) noexcept nogil:
    prefetch_write(view.sums + view.offsets[level] + node)
    prefetch_write(view.mins + view.offsets[level] + node)


cdef extern from *:
    """
    #if defined(__GNUC__) || defined(__clang__)
    #define CPPRB_RAY_LOWEST_BIT(word) __builtin_ctzll(word)
    #else
    static int CPPRB_RAY_LOWEST_BIT(unsigned long long word) {
        int bit = 0;
        while (!(word & 1)) { word >>= 1; bit++; }
        return bit;
    }
    #endif
    """
    # The index of the lowest set bit of a word that is not 0.
    int lowest_bit "CPPRB_RAY_LOWEST_BIT"(uint64_t word) noexcept nogil


cdef inline uint64_t nonzero_bytes(uint64_t word) noexcept nogil:
    """Bit j set where byte j of `word` is not 0: of 64 marked nodes, their 8 parents."""
    word |= word >> 4
    word |= word >> 2
    word |= word >> 1
    return ((word & 0x0101010101010101ULL) * 0x0102040810204080ULL) >> 56


cdef void tree_refresh(TreeView* view, const int64_t* indices, int64_t count) noexcept nogil:
    """Recompute the ancestors of the given leaves, level by level over the whole batch.

    A node is final once all its children are, so each level is recomputed only after the one
    below it, and each node once. On the wide lower levels (out of cache, and repeats are
    rare) the batch is walked in its order, a run of equal neighbours skipped, and the parent
    lines are asked for PREFETCH_AHEAD nodes ahead. The narrow upper levels (at most
    DEDUPE_NODES nodes), where a random batch puts many indexes under the same node, are marked
    in a bitmap on the stack and recomputed in node order, one visit per marked node; the next
    level's bitmap is this one's with a bit per byte. (Walking the whole batch on each of those
    levels, as the wide ones do, took half of the refresh of an update(256) at 2**20: 1024
    steps for about 200 nodes.)
    """
    cdef int64_t k, node, previous, words, word_index
    cdef int level = 1
    cdef int shift
    cdef uint64_t word
    cdef uint64_t marked[64]      # DEDUPE_NODES bits: the nodes of a narrow level to recompute
    while level <= view.depth and view.counts[level] > DEDUPE_NODES:
        shift = FANOUT_BITS * level
        # Out of cache: ask for the parent lines PREFETCH_AHEAD nodes ahead (their children
        # were written just before, on the level below, and are cached).
        for k in range(min(count, PREFETCH_AHEAD)):
            prefetch_parent(view, level, indices[k] >> shift)
        previous = -1
        for k in range(count):
            if k + PREFETCH_AHEAD < count:
                prefetch_parent(view, level, indices[k + PREFETCH_AHEAD] >> shift)
            node = indices[k] >> shift
            if node != previous:
                recompute_node(view, level, node)
                previous = node
        level += 1
    if level > view.depth:
        return
    shift = FANOUT_BITS * level
    words = (view.counts[level] + 63) >> 6
    memset(marked, 0, <size_t>words * sizeof(uint64_t))
    for k in range(count):
        node = indices[k] >> shift
        marked[node >> 6] |= (<uint64_t>1) << (node & 63)
    while True:
        for word_index in range(words):
            word = marked[word_index]
            while word:
                recompute_node(view, level, (word_index << 6) + lowest_bit(word))
                word &= word - 1
        if level == view.depth:
            return
        # The parents' bitmap, in place: parent word j gathers child words 8j .. 8j + 7, all
        # read before it is written (j <= 8j).
        for word_index in range((words + 7) >> 3):
            word = 0
            for k in range(word_index << 3, min((word_index << 3) + 8, words)):
                word |= nonzero_bytes(marked[k]) << ((k & 7) << 3)
            marked[word_index] = word
        words = (words + 7) >> 3
        level += 1


cdef void tree_prefetch_leaves(const TreeView* view, const int64_t* indices,
                               int64_t count) noexcept nogil:
    """Ask for the leaf lines of `indices`, about to be written. An update asks while it
    computes the new weights, so that these misses overlap the arithmetic instead of stalling
    its loop under the lock (its parents' lines are asked for by tree_refresh)."""
    cdef int64_t k
    for k in range(count):
        prefetch_write(view.sums + indices[k])


cdef void tree_refresh_range(TreeView* view, int64_t start, int64_t count) noexcept nogil:
    """Recompute the ancestors of leaves [start, start + count)."""
    cdef int64_t node
    cdef int level
    if count <= 0:
        return
    for level in range(1, view.depth + 1):
        for node in range(start >> (FANOUT_BITS * level),
                          ((start + count - 1) >> (FANOUT_BITS * level)) + 1):
            recompute_node(view, level, node)


cdef void tree_set(TreeView* view, const int64_t* indices, const double* values,
                   int64_t count) noexcept nogil:
    """Write leaves in order (so duplicates resolve last-wins), then recompute their ancestors.
    A value of -0.0 is stored as 0.0: it is a weight of zero, not an unset leaf."""
    cdef int64_t k
    for k in range(count):
        view.sums[indices[k]] = values[k] + 0.0
    tree_refresh(view, indices, count)


cdef void tree_unset(TreeView* view, const int64_t* indices, int64_t count) noexcept nogil:
    """Unset leaves (out of both sums and min), then recompute their ancestors."""
    cdef int64_t k
    for k in range(count):
        view.sums[indices[k]] = unset_leaf()
    tree_refresh(view, indices, count)


cdef void tree_rebuild(TreeView* view) noexcept nogil:
    """Recompute every inner node from the leaves, and rewrite every padding entry too: the
    repair calls this on memory a dead process or a corrupt segment left, and a stray value in
    a padding node would steer searches past the last slot."""
    cdef int level
    cdef int64_t node
    for node in range(view.capacity, round_up(view.capacity, FANOUT)):
        view.sums[node] = unset_leaf()
    for level in range(1, view.depth + 1):
        for node in range(view.counts[level]):
            recompute_node(view, level, node)
        for node in range(view.counts[level], round_up(view.counts[level], FANOUT)):
            view.sums[view.offsets[level] + node] = 0.0
            view.mins[view.offsets[level] + node] = INFINITY


cdef double tree_total(const TreeView* view) noexcept nogil:
    return view.sums[view.offsets[view.depth]] + 0.0   # an empty tree's -0.0 reads as 0.0


cdef double tree_min(const TreeView* view) noexcept nogil:
    if view.depth == 0:
        return min_key(view.sums[0])   # capacity 1: the root is the leaf
    return view.mins[view.offsets[view.depth]]


cdef inline void prefix_sums(const double* c, double* p) noexcept nogil:
    """p[i] = c[0] + ... + c[i-1] for i in 0..8, as a parallel prefix (3 dependent additions
    instead of 8). Each prefix adds a non-negative term to an earlier one, so the prefixes never
    decrease, and a zero child leaves its prefix equal to its left neighbour's; p[8] is the
    pairwise sum recompute_node stores in the parent."""
    cdef double s01 = c[0] + c[1]
    cdef double s23 = c[2] + c[3]
    cdef double s45 = c[4] + c[5]
    cdef double s67 = c[6] + c[7]
    cdef double s0123 = s01 + s23
    p[0] = 0.0
    p[1] = c[0]
    p[2] = s01
    p[3] = s01 + c[2]
    p[4] = s0123
    p[5] = s0123 + c[4]
    p[6] = s0123 + s45
    p[7] = s0123 + (s45 + c[6])
    p[8] = s0123 + (s45 + s67)


cdef bint tree_consistent(const TreeView* view) noexcept nogil:
    """Whether the root is what a writer leaves: its sum finite, >= 0 and the sum of its
    children (bit for bit, as recompute_node makes it), and its min the min of its children,
    theirs of theirs, down one path to a leaf that has it (a NaN, an infinity or a value that
    no leaf has, written into a min node, is caught). depth + 1 cache lines of the min tree,
    mostly cached: cheap beside any sample or update."""
    cdef double total = view.sums[view.offsets[view.depth]]
    cdef double low = tree_min(view)
    cdef double prefix[FANOUT + 1]
    cdef double value
    cdef int64_t node = 0, first, chosen
    cdef int level, c, live
    if not (total >= 0.0 and total < INFINITY):
        return False
    if view.depth == 0:
        return True
    prefix_sums(view.sums + view.offsets[view.depth - 1], prefix)
    if prefix[FANOUT] != total:
        return False
    for level in range(view.depth, 0, -1):
        first = node << FANOUT_BITS
        chosen = -1
        # Live children only: a padding node that holds the min (a corrupt segment) must not
        # lead the walk below it, past the end of the tree.
        live = <int>min(<int64_t>FANOUT, view.counts[level - 1] - first)
        for c in range(live):
            value = (min_key(view.sums[first + c]) if level == 1
                     else view.mins[view.offsets[level - 1] + first + c])
            if not value >= low:      # NaN, or below the min of the node above it
                return False
            if value == low and chosen < 0:
                chosen = first + c
        if chosen < 0:
            return False
        node = chosen
    return True


cdef int64_t tree_search(const TreeView* view, double* masses, int64_t* out,
                         int64_t count) noexcept nogil:
    """Prefix-sum search for a batch; `masses` is used as scratch and overwritten.

    The root must be positive. A zero-weight leaf is never returned: the walk only enters a
    child whose sum is positive, and a mass left over by rounding (>= the node's sum) goes to
    the last positive child, so a mass >= total lands on the last positive leaf. The whole
    batch descends one level at a time so the independent loads overlap.

    Returns how many walks met a corrupt tree: a padding node that is not 0 led past its level's
    live nodes (those stay on the level's last live node, so they never read outside the tree),
    or a node on the walk is not the sum of its children. A node is recomputed from its
    children by the very expression of the last prefix sum below, so in any tree a writer left
    the two are equal bit for bit; a NaN, an infinity or a negative value written into a node
    (a stray write, a hostile process) is caught on every walk that passes it.
    """
    cdef int64_t corrupt = 0
    cdef int64_t k
    cdef int level
    cdef double prefix[FANOUT + 1]
    cdef const double* children
    cdef const double* below
    cdef const double* here
    for k in range(count):
        out[k] = 0
    for level in range(view.depth, 0, -1):
        below = view.sums + view.offsets[level - 1]
        here = view.sums + view.offsets[level]
        if level == view.depth:
            # Every walk starts at the root: its children's prefix sums, and their check
            # against it, once for the batch (each walk met that node: each is counted).
            prefix_sums(below, prefix)
            if prefix[FANOUT] != here[0]:
                corrupt += count
            for k in range(count):
                corrupt += descend(view, level, below, prefix, masses, out, k)
            continue
        for k in range(count):
            children = below + (out[k] << FANOUT_BITS)
            prefix_sums(children, prefix)
            # The walk's node (read on the level above: in the cache) must be their sum.
            if prefix[FANOUT] != here[out[k]]:
                corrupt += 1       # (NaN != NaN: a NaN anywhere among them is caught too)
            corrupt += descend(view, level, children, prefix, masses, out, k)
    return corrupt


cdef inline int descend(const TreeView* view, int level, const double* children,
                        const double* prefix, double* masses, int64_t* out,
                        int64_t k) noexcept nogil:
    """Walk `k`'s step from its node on `level` to one of its `children` (whose prefix sums are
    `prefix`), taking the mass left of the chosen one off; 1 when a padding node that is not 0
    steered it past the live nodes (a corrupt tree), else 0."""
    cdef double mass = masses[k]
    cdef int64_t chosen = 0, node
    cdef int c
    cdef int corrupt = 0
    # Branch-free: the chosen child is the number of prefix sums <= mass. A zero child has the
    # same prefix as its left neighbour, so it can never be the one chosen.
    for c in range(1, FANOUT + 1):
        chosen += prefix[c] <= mass
    if chosen == FANOUT:
        # Rounding left more mass than this node holds: go to the last positive child and keep
        # going right-most below it.
        chosen = FANOUT - 1
        while chosen > 0 and not children[chosen] > 0.0:
            chosen -= 1
        mass = INFINITY
    else:
        mass -= prefix[chosen]
    masses[k] = mass
    node = (out[k] << FANOUT_BITS) + chosen
    # Only a padding node that is not 0 (a corrupt segment) can be chosen past the live nodes,
    # and below it the walk would read outside the tree: stay on the last one.
    if node >= view.counts[level - 1]:
        node = view.counts[level - 1] - 1
        corrupt = 1
    out[k] = node
    if level > 1:
        # Ask for the line this walk reads on the next level now: the rest of the batch is
        # walked before it is needed, so its cache miss is hidden.
        prefetch(view.sums + view.offsets[level - 2] + (node << FANOUT_BITS))
    return corrupt


cdef int64_t tree_sample(const TreeView* view, Xoshiro256* rng, double* scratch, int64_t* out,
                         int64_t count) noexcept nogil:
    """Stratified sampling: [0, total) in `count` equal strata, one uniform draw in each.
    Returns tree_search's count of walks that met a corrupt tree."""
    cdef double stratum = tree_total(view) / count
    cdef int64_t k
    for k in range(count):
        scratch[k] = (k + rng_uniform(rng)) * stratum
    return tree_search(view, scratch, out, count)


# ---------------------------------------------------------------------------------------------
# Random numbers: xoshiro256** seeded through splitmix64 (Blackman & Vigna). Small, fast, and
# usable without the GIL, which numpy's generators are not from Cython without cimport numpy.


cdef inline uint64_t rotl(uint64_t x, int k) noexcept nogil:
    return (x << k) | (x >> (64 - k))


cdef void rng_seed(Xoshiro256* rng, uint64_t seed) noexcept nogil:
    cdef int i
    cdef uint64_t z
    for i in range(4):
        seed += 0x9E3779B97F4A7C15ULL
        z = seed
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL
        rng.s[i] = z ^ (z >> 31)


cdef uint64_t rng_next(Xoshiro256* rng) noexcept nogil:
    cdef uint64_t result = rotl(rng.s[1] * 5, 7) * 9
    cdef uint64_t t = rng.s[1] << 17
    rng.s[2] ^= rng.s[0]
    rng.s[3] ^= rng.s[1]
    rng.s[1] ^= rng.s[2]
    rng.s[0] ^= rng.s[3]
    rng.s[2] ^= t
    rng.s[3] = rotl(rng.s[3], 45)
    return result


cdef double rng_uniform(Xoshiro256* rng) noexcept nogil:
    """Uniform double in [0, 1) from the top 53 bits."""
    return (rng_next(rng) >> 11) * (1.0 / 9007199254740992.0)


def _seed_from(seed):
    if seed is None:
        return int.from_bytes(os.urandom(8), "little")
    if isinstance(seed, _rules.NOT_NUMBERS) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"seed must be an int or None; got {type(seed).__name__}")
    if seed < 0:
        raise ValueError(f"seed must be >= 0; got {seed}")
    return int(seed) & 0xFFFFFFFFFFFFFFFF


cdef class Random:
    """A small seedable generator (xoshiro256**) usable inside GIL-free kernels.

    Parameters
    ----------
    seed : int or None
        Non-negative seed; None draws one from the operating system.

    Examples
    --------
    >>> from cpprb_ray._segtree import Random
    >>> a, b = Random(7), Random(7)
    >>> bool((a.random(4) == b.random(4)).all())
    True
    """

    def __init__(self, seed=None):
        rng_seed(&self.state, _seed_from(seed))

    def random(self, Py_ssize_t size):
        """random(size) -> ndarray[float64]: `size` uniform draws in [0, 1)."""
        if size < 0:
            raise ValueError(f"size must be >= 0; got {size}")
        out = np.empty(size, dtype=np.float64)
        cdef double[::1] values = out
        cdef Py_ssize_t i
        with nogil:
            for i in range(size):
                values[i] = rng_uniform(&self.state)
        return out


# ---------------------------------------------------------------------------------------------
# Validation shared by the Python-facing methods (and by _store through the same rules).


def as_indices(indices, Py_ssize_t capacity, str name="indices"):
    """Return `indices` as a C-contiguous int64 array in [0, capacity), or raise naming `name`
    (the rules of :mod:`cpprb_ray._rules`)."""
    array = _rules.index_vector(indices, name)
    _rules.check_in_range(array, capacity, name, str(capacity))
    return array


def as_values(values, Py_ssize_t count, str name="values", upper=None):
    """Return `values` as C-contiguous finite non-negative float64 of length `count` (each at
    most `upper` when given)."""
    array = _rules.real_vector(values, count, name, "index")
    bad = ~(np.isfinite(array) & (array >= 0))
    if bad.any():
        position = int(np.flatnonzero(bad)[0])
        raise ValueError(
            f"{name} must be finite and >= 0; got {array[position]} at position {position}"
        )
    if upper is not None and array.size and array.max() > upper:
        position = int(np.flatnonzero(array > upper)[0])
        raise ValueError(
            f"{name} must be <= {upper:.3g} so that the total stays finite; got "
            f"{array[position]} at position {position}"
        )
    return array


# ---------------------------------------------------------------------------------------------
# The Python-facing tree


cdef class SegmentTree:
    """Sum and min trees of float64 over `capacity` leaves, laid in memory it is given.

    Parameters
    ----------
    memory : writable buffer
        Any writable, contiguous buffer of at least ``offset + SegmentTree.nbytes(capacity)``
        bytes whose address plus `offset` is 8-byte aligned. The tree keeps a reference to it.
    capacity : int
        Number of leaves, >= 1 (any value, not only powers of two).
    offset : int, optional
        Byte offset of the tree inside `memory`.
    initialize : bool, optional
        Clear the tree (all leaves unset). Pass False to bind to a tree another process laid.

    Notes
    -----
    ``min()`` is taken over leaves that were set; unset leaves (never set, or passed to
    ``clear``) do not count, and ``min()`` of a tree with none set is ``inf``.

    Examples
    --------
    >>> from cpprb_ray._segtree import SegmentTree
    >>> memory = bytearray(SegmentTree.nbytes(5))
    >>> tree = SegmentTree(memory, 5)
    >>> tree.set([0, 3, 3], [1.0, 5.0, 2.0])   # duplicates: last wins
    >>> tree.total(), tree.min()
    (3.0, 1.0)
    >>> tree.search([0.5, 1.5, 99.0]).tolist()
    [0, 3, 3]
    """

    @staticmethod
    def nbytes(capacity):
        """nbytes(capacity) -> int: bytes a tree of `capacity` leaves needs (a multiple of 64).

        The leaves (shared by the sum and min trees) and each inner level are padded to whole
        64-byte lines; the min tree stores only its inner levels.

        Examples
        --------
        >>> from cpprb_ray._segtree import SegmentTree
        >>> SegmentTree.nbytes(1), SegmentTree.nbytes(8), SegmentTree.nbytes(9)
        (64, 192, 384)
        """
        return 8 * tree_doubles(_check_capacity(capacity), NULL)

    def __cinit__(self):
        self._has_buffer = False
        self._owner = None

    def __init__(self, memory, capacity, *, Py_ssize_t offset=0, bint initialize=True):
        cdef int64_t checked = _check_capacity(capacity)
        if offset < 0:
            raise ValueError(f"offset must be >= 0; got {offset}")
        if self._has_buffer:
            raise RuntimeError("SegmentTree is already initialized")
        try:
            PyObject_GetBuffer(memory, &self._buffer, PyBUF_WRITABLE | PyBUF_ANY_CONTIGUOUS)
        except (BufferError, TypeError, ValueError) as error:  # numpy raises ValueError
            raise TypeError(
                f"memory must be a writable contiguous buffer; got {type(memory).__name__}"
            ) from error
        self._has_buffer = True
        needed = offset + SegmentTree.nbytes(checked)
        available = self._buffer.len
        if available < needed:
            self.release()
            raise ValueError(
                f"memory must hold at least {needed} bytes for capacity {checked} at offset "
                f"{offset}; got {available}"
            )
        cdef char* start = <char*>self._buffer.buf + offset
        if (<uintptr_t>start) % 8:
            self.release()
            raise ValueError("memory + offset must be 8-byte aligned")
        self._owner = memory
        tree_bind(&self.view, <double*>start, checked)
        if initialize:
            with nogil:
                tree_clear_all(&self.view)

    def __dealloc__(self):
        if self._has_buffer:
            PyBuffer_Release(&self._buffer)
            self._has_buffer = False

    def release(self):
        """Drop the reference to the memory (so e.g. ``SharedMemory.close()`` can succeed).

        Any later call raises ValueError.
        """
        if self._has_buffer:
            PyBuffer_Release(&self._buffer)
            self._has_buffer = False
        self._owner = None

    cdef int _check_open(self) except -1:
        if not self._has_buffer:
            raise ValueError("this SegmentTree was released")
        return 0

    @property
    def capacity(self):
        """Number of leaves."""
        return self.view.capacity

    def set(self, indices, values):
        """set(indices, values): set leaves; duplicates resolve last-wins.

        Raises IndexError for an index outside ``[0, capacity)``, TypeError for non-integer
        indices and ValueError for a value that is not finite and >= 0; nothing is changed then.
        """
        self._check_open()
        index_array = as_indices(indices, self.view.capacity)
        # Bounded so that even all leaves at the bound sum to a finite total.
        value_array = as_values(values, index_array.shape[0],
                                upper=DBL_MAX / (2.0 * self.view.capacity))
        cdef const int64_t[::1] idx = index_array
        cdef const double[::1] vals = value_array
        cdef int64_t count = idx.shape[0]
        if count == 0:
            return
        with nogil:
            tree_set(&self.view, &idx[0], &vals[0], count)

    def clear(self, indices=None):
        """clear(indices=None): unset the given leaves (all leaves when None)."""
        self._check_open()
        if indices is None:
            with nogil:
                tree_clear_all(&self.view)
            return
        index_array = as_indices(indices, self.view.capacity)
        cdef const int64_t[::1] idx = index_array
        cdef int64_t count = idx.shape[0]
        if count == 0:
            return
        with nogil:
            tree_unset(&self.view, &idx[0], count)

    def get(self, indices):
        """get(indices) -> ndarray[float64]: leaf values (0.0 for unset leaves)."""
        self._check_open()
        index_array = as_indices(indices, self.view.capacity)
        cdef const int64_t[::1] idx = index_array
        out = np.empty(idx.shape[0], dtype=np.float64)
        cdef double[::1] values = out
        cdef Py_ssize_t k
        with nogil:
            for k in range(idx.shape[0]):
                values[k] = self.view.sums[idx[k]] + 0.0   # an unset leaf's -0.0 reads as 0.0
        return out

    def total(self):
        """total() -> float: sum of all leaves."""
        self._check_open()
        return tree_total(&self.view)

    def min(self):
        """min() -> float: smallest set leaf; ``inf`` when none is set."""
        self._check_open()
        return tree_min(&self.view)

    def rebuild(self):
        """rebuild(): recompute every internal node from the leaves."""
        self._check_open()
        with nogil:
            tree_rebuild(&self.view)

    def search(self, masses):
        """search(masses) -> ndarray[int64]: for each mass, the leaf where the prefix sum passes it.

        A zero leaf is never returned; a mass >= total (rounding) maps to the last positive leaf.
        Raises ValueError when the tree's total is 0 or a mass is not finite and >= 0.
        """
        self._check_open()
        mass_array = np.array(as_values(masses, np.size(masses), "masses"), dtype=np.float64)
        if not tree_total(&self.view) > 0:
            raise ValueError("cannot search a tree whose total is 0")
        cdef double[::1] mass_view = mass_array
        out = np.empty(mass_view.shape[0], dtype=np.int64)
        cdef int64_t[::1] out_view = out
        cdef int64_t corrupt = 0
        if mass_view.shape[0]:
            with nogil:
                corrupt = tree_search(&self.view, &mass_view[0], &out_view[0],
                                      mass_view.shape[0])
        if corrupt:
            raise_corrupt_tree()
        return out

    def sample(self, Py_ssize_t batch_size, Random rng not None):
        """sample(batch_size, rng) -> ndarray[int64]: stratified proportional sample.

        [0, total) is split into `batch_size` equal strata and one uniform draw from `rng`
        (a :class:`Random`) is taken in each.

        Examples
        --------
        >>> from cpprb_ray._segtree import Random, SegmentTree
        >>> tree = SegmentTree(bytearray(SegmentTree.nbytes(4)), 4)
        >>> tree.set([1, 2], [1.0, 3.0])
        >>> tree.sample(4, Random(0)).tolist()
        [1, 2, 2, 2]
        """
        self._check_open()
        if batch_size <= 0:
            raise ValueError(f"batch_size must be > 0; got {batch_size}")
        if not tree_total(&self.view) > 0:
            raise ValueError("cannot sample a tree whose total is 0")
        scratch = np.empty(batch_size, dtype=np.float64)
        out = np.empty(batch_size, dtype=np.int64)
        cdef double[::1] scratch_view = scratch
        cdef int64_t[::1] out_view = out
        cdef int64_t corrupt
        with nogil:
            corrupt = tree_sample(&self.view, &rng.state, &scratch_view[0], &out_view[0],
                                  batch_size)
        if corrupt:
            raise_corrupt_tree()
        return out


def raise_corrupt_tree():
    raise ValueError("the tree is corrupt: a padding node is not 0 (memory written by something "
                     "other than this tree)")


def _check_capacity(capacity):
    if isinstance(capacity, _rules.NOT_NUMBERS) or not isinstance(capacity,
                                                                  (int, np.integer)):
        raise TypeError(f"capacity must be an int; got {type(capacity).__name__}")
    if capacity < 1:
        raise ValueError(f"capacity must be >= 1; got {capacity}")
    if capacity > (1 << 48):
        raise ValueError(f"capacity must be <= 2**48; got {capacity}")
    return int(capacity)
