# cython: language_level=3
# Included by _store.pyx: the rate limiter's side of THE driver. A call declares its side and
# rows (ReplayStore.run's arguments); the driver admits it under the lock before the kernel runs
# (store_admits), settles its wait after, and sleeps on its gate between tries. Nothing else
# decides admission. The limiter's refusals live here too, as functions of the store: a record
# no constructor writes (check_limiter), a call no state ever admits (check_admissible), a call
# held back past its timeout (raise_rate_limited).

cdef enum:
    WAKE_INSERTERS = 1
    WAKE_SAMPLERS = 2


cdef void rate_start(RateCall* rate, int side, int64_t rows, double timeout) noexcept:
    rate.side = side
    rate.rows = rows
    rate.timeout = timeout
    rate.started = -1.0
    rate.waited = 0.0
    rate.sleeping = False


cdef bint rate_admits(StoreView* view, RateCall* rate) noexcept nogil:
    """Under the lock, before the kernel: whether the limiter lets the declared call go now. A
    call with no rows of its side (a reset, an N-step lane write that completes none) is not
    held back."""
    if rate.rows <= 0 or (rate.side != SIDE_INSERT and rate.side != SIDE_SAMPLE):
        return True
    return store_admits(view, rate.side, rate.rows)


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


# -- the limiter's refusals, as the driver and the constructor raise them -------------------------

cdef int check_limiter(ReplayStore store) except -1:
    """Refuse a limiter record that no constructor writes (its parameters steer waits)."""
    cdef Limiter* limiter = store.view.limiter
    cdef str problem = None
    if limiter.kind == LIMITER_NONE:
        return 0
    if limiter.kind not in LIMITER_KINDS:
        problem = f"kind {limiter.kind}"
    elif not limiter.samples_per_insert > 0 or isnan(limiter.min_diff) or isnan(
            limiter.max_diff) or not limiter.max_diff >= limiter.min_diff:
        problem = (f"samples_per_insert {limiter.samples_per_insert}, min_diff "
                   f"{limiter.min_diff}, max_diff {limiter.max_diff}")
    elif not 1 <= limiter.min_size_to_sample <= <uint64_t>store.view.capacity:
        problem = f"min_size_to_sample {limiter.min_size_to_sample}"
    if problem is None:
        return 0
    PyBuffer_Release(&store._buffer)
    store._has_buffer = False
    raise ValueError(f"the buffer's segment is corrupt: its rate limiter record has "
                     f"{problem}, which no constructor writes")


cdef int check_admissible(ReplayStore store, int side, int64_t rows) except -1:
    """NeverAdmitted (a ValueError) when no state of the limiter ever admits `rows` rows of
    `side` at once: waiting would be forever."""
    if not store.view.limited or not limiter_never_admits(
            store.view.limiter, side, store.view.capacity, rows):
        return 0
    state = limiter_state(store.view.header, store.view.limiter)
    if side == SIDE_SAMPLE:
        raise NeverAdmitted(
            f"batch_size {rows} can never be sampled at once under {describe_limiter(state)}: "
            f"a sample of k rows needs inserts * samples_per_insert - samples - k >= "
            f"min_diff, and that diff never exceeds max(max_diff, min_size_to_sample * "
            f"samples_per_insert); sample fewer rows or widen the error_buffer")
    raise NeverAdmitted(
        f"an add of {rows} rows can never be admitted at once under "
        f"{describe_limiter(state)}: past min_size_to_sample it needs (inserts + k) * "
        f"samples_per_insert - samples <= max_diff, and the diff never falls below "
        f"min(0, min_diff); add fewer rows at a time or widen the error_buffer")


cdef int raise_rate_limited(ReplayStore store, RateCall* rate) except -1:
    """TimeoutError for a call the limiter held back past its timeout: what it was, the rule
    that held it, and the counts now."""
    state = limiter_state(store.view.header, store.view.limiter)
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
        f"stored={store.view.header.stored_size}; {undone}")
