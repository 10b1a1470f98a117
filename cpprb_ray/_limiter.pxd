# cython: language_level=3
# The rate limiter's record in the segment and its rules: Reverb's RateLimiter (MinSize is a
# SampleToInsertRatio with an unbounded window), checked by the add and sample kernels under
# the segment's lock. Only declarations and inline arithmetic: no module of its own, nothing to
# import at run time. The blocking side (futex waits on the two gates) is the driver's, in
# _store.ReplayStore.run; the futex calls are in _sync.
#
# Counts are derived, not kept: the limiter's inserts are header.rows_added - insert_base and its
# samples header.rows_sampled - sample_base. rows_added is already in the add's rollback record
# (a repair takes back the inserts of an add it rolls back), rows_sampled moves in one store at
# the end of a sample, and only clear moves the bases (a repaired clear is redone whole), so the
# limiter can never disagree with what the buffer holds after a crash.

from libc.stdint cimport int64_t, uint32_t, uint64_t

cdef enum:
    LIMITER_BYTES = 128      # reserved at _segment.LIMITER_AT (the layout starts at 512)

cdef enum LimiterKind:
    LIMITER_NONE = 0
    LIMITER_MIN_SIZE = 1
    LIMITER_SAMPLE_TO_INSERT_RATIO = 2

# Which side of the limiter an operation is on: what it may be held back by and whom its
# progress may let through.
cdef enum Side:
    SIDE_NONE = 0            # update, snapshot: neither
    SIDE_INSERT = 1          # add: held back by max_diff; lets samplers through
    SIDE_SAMPLE = 2          # sample: held back by min size and min_diff; lets inserters through
    SIDE_RESET = 3           # clear: counts start again; may let either through

cdef enum:
    GATE_WAITING = 0x80000000     # a gate's top bit: somebody sleeps on it (wake on progress)
    GATE_COUNT_MASK = 0x7fffffff


# Every field is 8 bytes but the two gates, which share one; they are 32-bit futex words.
cdef struct Limiter:
    uint64_t kind                 # LimiterKind; 0 in a segment made without a limiter
    double samples_per_insert
    uint64_t min_size_to_sample
    double min_diff
    double max_diff
    uint64_t insert_base          # rows_added at the last clear
    uint64_t sample_base          # rows_sampled at the last clear
    uint32_t insert_gate          # inserters sleep on it; samples and clears advance it
    uint32_t sample_gate          # samplers sleep on it; adds and clears advance it
    # Statistics only (never read by a decision): calls held back at least once, the time they
    # were held back, and those that gave up (TimeoutError, timeout=0 included).
    uint64_t insert_blocks
    uint64_t sample_blocks
    uint64_t insert_wait_ns
    uint64_t sample_wait_ns
    uint64_t insert_timeouts
    uint64_t sample_timeouts


cdef inline bint limiter_admits(const Limiter* limiter, int side, double inserts,
                                double samples, uint64_t stored, uint64_t capacity,
                                int64_t rows) noexcept nogil:
    """Whether an add (SIDE_INSERT) or sample (SIDE_SAMPLE) of `rows` rows may go now, as one
    step: Reverb's CanInsert / CanSample with `rows` in place of 1. `inserts` and `samples`
    count since the last clear; the table's size is the stored size (the ring's overwrites are
    Reverb's deletes)."""
    cdef uint64_t after
    if side == SIDE_INSERT:
        after = stored + <uint64_t>rows
        if after > capacity:
            after = capacity
        # Until the minimum size is reached inserts are free (Reverb's stage 1).
        if after <= limiter.min_size_to_sample:
            return True
        return ((inserts + <double>rows) * limiter.samples_per_insert - samples
                <= limiter.max_diff)
    if side == SIDE_SAMPLE:
        if stored < limiter.min_size_to_sample:
            return False
        return (inserts * limiter.samples_per_insert - samples - <double>rows
                >= limiter.min_diff)
    return True


cdef inline bint limiter_never_admits(const Limiter* limiter, int side, uint64_t capacity,
                                      int64_t rows) noexcept nogil:
    """Whether no state the limiter can reach admits this batch (so waiting would be forever).

    The diff D = inserts * samples_per_insert - samples never exceeds max(max_diff,
    min_size_to_sample * samples_per_insert) (an insert past the minimum size needs D <=
    max_diff after it, and the free inserts before stop there) and never falls below
    min(0, min_diff) (a sample needs D >= min_diff after it). When the minimum size is the
    capacity every insert is free and D is unbounded. Conservative: True only when it is sure."""
    cdef double spi = limiter.samples_per_insert
    cdef uint64_t least = limiter.min_size_to_sample
    cdef double highest, lowest
    if limiter.kind == LIMITER_NONE or least >= capacity:
        return False
    if side == SIDE_SAMPLE:
        highest = limiter.max_diff
        if least * spi > highest:
            highest = least * spi
        return <double>rows > highest - limiter.min_diff
    if side == SIDE_INSERT:
        if <uint64_t>rows <= least:
            return False          # free from an empty (new or cleared) buffer
        lowest = limiter.min_diff if limiter.min_diff < 0.0 else 0.0
        return <double>rows * spi + lowest > limiter.max_diff
    return False


cdef inline uint32_t* limiter_gate(Limiter* limiter, int side) noexcept nogil:
    """The gate a call of `side` sleeps on while it is held back."""
    return &limiter.insert_gate if side == SIDE_INSERT else &limiter.sample_gate


cdef inline uint32_t gate_arm(uint32_t* gate) noexcept nogil:
    """Under the lock: mark that somebody will sleep on `gate`; returns the value to sleep on
    (any progress changes it, so a wake-up between the unlock and the sleep is not lost)."""
    cdef uint32_t value = gate[0] | GATE_WAITING
    gate[0] = value
    return value


cdef inline bint gate_advance(uint32_t* gate) noexcept nogil:
    """Under the lock: count one step of progress on `gate`; returns whether somebody marked
    it (then wake it after unlocking). A sleeper that died leaves its mark: one wake for
    nobody, and the mark is gone."""
    cdef uint32_t value = gate[0]
    gate[0] = (value + 1) & GATE_COUNT_MASK
    return (value & GATE_WAITING) != 0
