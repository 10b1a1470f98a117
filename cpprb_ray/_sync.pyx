# cython: language_level=3
"""The robust, process-shared mutex that guards a buffer's segment.

It lives in the segment itself (PTHREAD_PROCESS_SHARED), so no manager process or authkey is
needed, and it is robust (PTHREAD_MUTEX_ROBUST): when a holder dies, the next locker gets
EOWNERDEAD at once instead of waiting forever, repairs what the dead holder left half done and
marks the mutex consistent. Waiting always happens with the GIL released.

It also holds the futex calls that the rate limiter's blocked calls sleep on (``gate_wait``,
``gate_wake``): a 32-bit word in the segment that every add or sample advances; and
:class:`SpinCounter`, the hand-over between a prefetch thread and its learner, which waits
without sleeping where the wait is shorter than a wake-up (a store's call can spin on one
without the GIL before its kernel: ``ReplayStore.hold_calls``), and :class:`Handover`, the
learner's side of that hand-over in C.
"""

cimport cython
from cpython.buffer cimport (PyBUF_ANY_CONTIGUOUS, PyBUF_WRITABLE, PyBuffer_Release,
                             PyObject_GetBuffer)
from libc.stdint cimport int64_t, uint32_t, uint64_t, uintptr_t
from posix.time cimport CLOCK_MONOTONIC, CLOCK_REALTIME, clock_gettime, nanosleep
from libc.string cimport memset

cdef extern from "<sched.h>" nogil:
    int sched_yield()

cdef extern from *:
    """
    #include <pthread.h>
    /* Checked when the extension is built, not when it is imported: a libc whose mutex does not
       fit the 64 bytes a segment reserves for it (MUTEX_BYTES) cannot build us at all. */
    _Static_assert(sizeof(pthread_mutex_t) <= 64,
                   "pthread_mutex_t outgrew the 64 bytes a segment reserves for it");

    #include <limits.h>
    #include <stdint.h>
    #include <time.h>
    #if defined(__linux__)
    #include <linux/futex.h>
    #include <sys/syscall.h>
    #include <unistd.h>
    #endif
    /* Sleep while *gate == seen, at most `seconds`: returns at once if it differs already (no
       wake-up lost between the caller's unlock and this), on a wake, a signal or the time.
       FUTEX_WAIT, not FUTEX_WAIT_PRIVATE: the word is in memory other processes map, and their
       FUTEX_WAKE must reach us. Elsewhere than Linux: the caller's slices poll. */
    static void cpprb_ray_gate_wait(uint32_t* gate, uint32_t seen, double seconds) {
        struct timespec timeout;
        if (!(seconds > 0.0)) return;
        timeout.tv_sec = (time_t)seconds;
        timeout.tv_nsec = (long)((seconds - (double)timeout.tv_sec) * 1e9);
    #if defined(__linux__)
        syscall(SYS_futex, gate, FUTEX_WAIT, seen, &timeout, NULL, 0);
    #else
        if (__atomic_load_n(gate, __ATOMIC_ACQUIRE) == seen) nanosleep(&timeout, NULL);
    #endif
    }
    static void cpprb_ray_gate_wake(uint32_t* gate) {
    #if defined(__linux__)
        syscall(SYS_futex, gate, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
    #else
        (void)gate;
    #endif
    }
    """
    void futex_sleep "cpprb_ray_gate_wait"(uint32_t* gate, uint32_t seen,
                                           double seconds) noexcept nogil
    void futex_wake_all "cpprb_ray_gate_wake"(uint32_t* gate) noexcept nogil

MUTEX_NBYTES = MUTEX_BYTES

cdef enum:
    FUTEX_TID_MASK = 0x3fffffff
    KIND_INT = 4                  # the kind word's index, in ints, in glibc's pthread_mutex_t

cdef unsigned int FUTEX_WAITERS_BIT = 0x80000000u


cdef int mutex_init(pthread_mutex_t* mutex) noexcept nogil:
    cdef pthread_mutexattr_t attr
    cdef int status
    memset(mutex, 0, MUTEX_BYTES)
    status = pthread_mutexattr_init(&attr)
    if status:
        return status
    status = pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED)
    if not status:
        status = pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST)
    if not status:
        status = pthread_mutex_init(mutex, &attr)
    pthread_mutexattr_destroy(&attr)
    return status


cdef inline int lock_result(int status) noexcept nogil:
    """What a pthread lock call returned, as LOCKED, LOCKED_OWNER_DIED (the caller repairs,
    then mutex_consistent), LOCK_TIMED_OUT (busy, or out of time) or -errno."""
    if status == 0:
        return LOCKED
    if status == EOWNERDEAD:
        return LOCKED_OWNER_DIED
    if status == EBUSY or status == ETIMEDOUT:
        return LOCK_TIMED_OUT
    return -status


cdef int made_kind() noexcept nogil:
    """The kind word (the int after the lock word, count, owner and users: glibc's __kind)
    that mutex_init leaves, read from a scratch mutex made the same way."""
    # MUTEX_BYTES (64), as a segment reserves: mutex_init clears all of them. 8-byte aligned.
    cdef uint64_t scratch[8]
    cdef pthread_mutex_t* mutex = <pthread_mutex_t*>scratch
    cdef int kind
    if mutex_init(mutex):
        return -1
    kind = (<const int*>mutex)[KIND_INT]
    pthread_mutex_destroy(mutex)
    return kind


# The kind word says how glibc treats the mutex (robust, shared, priority inheritance, ...) and
# no call changes it. A stray write there made glibc take a path for another kind of mutex
# against our lock word, and abort the process on an assertion (fuzzer: seed 14, case 244): it is
# checked before every lock, a load from the line the lock takes anyway.
cdef int MADE_KIND = made_kind()


cdef inline bint kind_intact(const pthread_mutex_t* mutex) noexcept nogil:
    return (<const int*>mutex)[KIND_INT] == MADE_KIND


cdef int mutex_lock(pthread_mutex_t* mutex) noexcept nogil:
    if not kind_intact(mutex):
        return LOCK_CORRUPT
    return lock_result(pthread_mutex_lock(mutex))


cdef int mutex_trylock(pthread_mutex_t* mutex) noexcept nogil:
    """mutex_lock that returns at once: LOCK_TIMED_OUT when someone else holds it."""
    if not kind_intact(mutex):
        return LOCK_CORRUPT
    return lock_result(pthread_mutex_trylock(mutex))


cdef int mutex_timedlock(pthread_mutex_t* mutex, double seconds) noexcept nogil:
    """mutex_lock that gives up after `seconds`: LOCKED, LOCKED_OWNER_DIED, LOCK_TIMED_OUT or
    -errno. Callers wait in slices so that they can look at signals and their own deadline
    between two slices (a holder that is stopped, or a lock word no thread will ever clear,
    must not block them forever)."""
    cdef timespec deadline
    cdef long nanoseconds
    if not kind_intact(mutex):
        return LOCK_CORRUPT
    clock_gettime(CLOCK_REALTIME, &deadline)   # timedlock measures against CLOCK_REALTIME
    nanoseconds = deadline.tv_nsec + <long>((seconds - <long>seconds) * 1e9)
    deadline.tv_sec += <long>seconds + nanoseconds // 1000000000
    deadline.tv_nsec = nanoseconds % 1000000000
    return lock_result(pthread_mutex_timedlock(mutex, &deadline))


cdef int mutex_holder(const pthread_mutex_t* mutex) noexcept nogil:
    """Thread id of the holder (0 when free): glibc keeps it in the first int of a robust
    mutex, under the FUTEX_WAITERS and FUTEX_OWNER_DIED bits."""
    return (<const int*>mutex)[0] & FUTEX_TID_MASK


cdef bint mutex_contended(const pthread_mutex_t* mutex) noexcept nogil:
    """Whether a thread sleeps waiting for the mutex (the FUTEX_WAITERS bit of glibc's robust
    lock word), read by its holder."""
    return ((<const unsigned int*>mutex)[0] & FUTEX_WAITERS_BIT) != 0


cdef void mutex_hand_over(const pthread_mutex_t* mutex, double seconds) noexcept nogil:
    """After an unlock that woke a waiter (mutex_contended before it): yield until someone
    holds the mutex, at most `seconds`. A holder that unlocks and locks again at once (a save's
    chunks) would otherwise take the lock back before the woken waiter runs, and the waiter
    would wait for all the chunks, not one."""
    cdef double deadline = monotonic_seconds() + seconds
    while mutex_holder(mutex) == 0 and monotonic_seconds() < deadline:
        sched_yield()


cdef int mutex_unlock(pthread_mutex_t* mutex) noexcept nogil:
    return pthread_mutex_unlock(mutex)


cdef int mutex_consistent(pthread_mutex_t* mutex) noexcept nogil:
    return pthread_mutex_consistent(mutex)


cdef class SharedMutex:
    """A robust process-shared mutex laid in the first MUTEX_NBYTES bytes of `memory`.

    Parameters
    ----------
    memory : writable buffer
        Where the mutex lives (e.g. ``SharedMemory.buf`` or an mmap), 8-byte aligned.
    initialize : bool
        Initialize a new mutex there. Only the creator does this, before others attach.

    Examples
    --------
    >>> from cpprb_ray._sync import MUTEX_NBYTES, SharedMutex
    >>> memory = bytearray(MUTEX_NBYTES)
    >>> mutex = SharedMutex(memory, initialize=True)
    >>> mutex.acquire()       # False: the previous holder did not die
    False
    >>> mutex.release()
    """

    def __cinit__(self):
        self._has_buffer = False
        self.mutex = NULL

    def __init__(self, memory, *, bint initialize=False):
        PyObject_GetBuffer(memory, &self._buffer, PyBUF_WRITABLE | PyBUF_ANY_CONTIGUOUS)
        self._has_buffer = True
        if self._buffer.len < MUTEX_BYTES or (<uintptr_t>self._buffer.buf) % 8:
            self.close()
            raise ValueError(f"memory must be 8-byte aligned and hold {MUTEX_BYTES} bytes")
        self._owner = memory
        self.mutex = <pthread_mutex_t*>self._buffer.buf
        if initialize:
            status = mutex_init(self.mutex)
            if status:
                self.close()
                raise OSError(status, "pthread_mutex_init failed")

    def __dealloc__(self):
        if self._has_buffer:
            PyBuffer_Release(&self._buffer)

    def close(self):
        """Drop the reference to the memory."""
        if self._has_buffer:
            PyBuffer_Release(&self._buffer)
            self._has_buffer = False
        self.mutex = NULL
        self._owner = None

    def acquire(self):
        """acquire() -> bool: lock, waiting with the GIL released.

        Returns True when the previous holder died while holding it; the caller then owns the
        repair and must call ``mark_consistent()`` before ``release()``.
        """
        if self.mutex == NULL:
            raise ValueError("this SharedMutex is closed")
        cdef int status
        with nogil:
            status = mutex_lock(self.mutex)
        if status == LOCK_CORRUPT:
            raise ValueError("the mutex is corrupt: its kind word is not what a process-shared "
                             "robust mutex holds (memory written by something else)")
        if status < 0:
            raise OSError(-status, "pthread_mutex_lock failed")
        return status == LOCKED_OWNER_DIED

    def mark_consistent(self):
        """Declare the state repaired after ``acquire()`` returned True."""
        if self.mutex == NULL:
            raise ValueError("this SharedMutex is closed")
        status = mutex_consistent(self.mutex)
        if status:
            raise OSError(status, "pthread_mutex_consistent failed")

    def release(self):
        """Unlock."""
        if self.mutex == NULL:
            raise ValueError("this SharedMutex is closed")
        status = mutex_unlock(self.mutex)
        if status:
            raise OSError(status, "pthread_mutex_unlock failed")


# -- gates: futex words for the rate limiter -----------------------------------------------------

cdef void gate_wait(uint32_t* gate, uint32_t seen, double seconds) noexcept nogil:
    """Sleep while the word at `gate` is still `seen`, at most `seconds` (one slice)."""
    futex_sleep(gate, seen, seconds)


cdef void gate_wake(uint32_t* gate) noexcept nogil:
    """Wake every thread of every process asleep on `gate`."""
    futex_wake_all(gate)


cdef double monotonic_seconds() noexcept nogil:
    cdef timespec now
    clock_gettime(CLOCK_MONOTONIC, &now)
    return now.tv_sec + now.tv_nsec * 1e-9


# -- spinning hand-overs between two threads of a process ----------------------------------------

cdef extern from *:
    """
    static inline int64_t cpprb_ray_load_acquire(const int64_t* p) {
        return __atomic_load_n(p, __ATOMIC_ACQUIRE);
    }
    static inline void cpprb_ray_store_release(int64_t* p, int64_t v) {
        __atomic_store_n(p, v, __ATOMIC_RELEASE);
    }
    /* A spin-wait hint: the core runs the other hyperthread (x86 pause, ARM yield) and the
       loop does not flood the memory system with loads. */
    static inline void cpprb_ray_cpu_relax(void) {
    #if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
    #elif defined(__aarch64__)
        __asm__ __volatile__("yield");
    #endif
    }
    """
    int64_t load_acquire "cpprb_ray_load_acquire"(const int64_t* p) noexcept nogil
    void store_release "cpprb_ray_store_release"(int64_t* p, int64_t v) noexcept nogil
    void cpu_relax "cpprb_ray_cpu_relax"() noexcept nogil


cdef enum:
    SPINS_PER_CLOCK = 64   # spins between two reads of the clock (one read: about 20 ns)

# A polling wait's sleep between two looks: with the kernel's default timer slack (50 us) a
# look every 60 to 110 us on the machines measured, a few thousand wake-ups a second of a core
# that is otherwise idle, none of them asked of the thread that raises the count.
cdef double POLL_SLEEP_S = 20e-6


class SpinExpired(Exception):
    """A call that was to wait for a :class:`SpinCounter` first (``arm``, and a store's
    ``hold_calls``) did nothing: the count did not reach its target within the spin, or the
    counter was stopped."""


@cython.auto_pickle(False)   # a count between two threads of one process: nothing to send
cdef class SpinCounter:
    """A count that one thread of a process raises and another waits on: without the GIL and
    without sleeping, for at most a given time. Waking a sleeping thread costs the waker a
    system call and the sleeper the time it takes the scheduler to run it again: 8 to 30 us
    on the 2-vCPU virtual machines measured, as long as an Ape-X sample. A wait that ends
    sooner than that is cheaper spun; a longer one should sleep (the caller's choice: a
    spinning thread holds a core).

    A wait may also be armed (:meth:`arm`) for a C caller to spin on later
    (:meth:`pass_armed`, without the GIL): how a store's call waits for a count in the same
    stretch without the GIL as its kernel, so that the thread needs no GIL between the count
    coming and its work starting. :meth:`stop` ends every wait at once, unreached.

    Examples
    --------
    >>> import threading
    >>> from cpprb_ray._sync import SpinCounter
    >>> counter = SpinCounter()
    >>> counter.wait_for(1, 0.001)    # nobody raises it: False after a millisecond
    False
    >>> raiser = threading.Timer(0.01, counter.set, (3,))
    >>> raiser.start()
    >>> counter.wait_for(2, 5.0), counter.value
    (True, 3)
    >>> raiser.join()
    >>> raiser = threading.Timer(0.01, counter.set, (4,))
    >>> raiser.start()
    >>> counter.wait_for(4, 0.0, poll=5.0), counter.last_pass    # sleeping between looks
    (True, 2)
    >>> raiser.join()
    >>> counter.stop()
    >>> counter.wait_for(9, 5.0), counter.stopped    # at once
    (False, True)
    """

    def __cinit__(self):
        self.armed_target = -1

    @property
    def value(self):
        """The count (as the last :meth:`set` left it)."""
        return load_acquire(&self.count)

    @property
    def stopped(self):
        """Whether :meth:`stop` was called."""
        return load_acquire(&self.stopped_flag) != 0

    @property
    def armed(self):
        """Whether a wait is armed (:meth:`arm`) and not yet passed."""
        return self.armed_target >= 0

    def set(self, int64_t value):
        """Make the count `value`; a thread waiting for it sees it at once."""
        store_release(&self.count, value)

    def stop(self):
        """End every wait, now and later, unreached (a thread spinning sees it at once)."""
        store_release(&self.stopped_flag, 1)

    @property
    def last_pass(self):
        """How the last wait ended: 1 reached while spinning, 2 reached while polling, 0 not
        reached (or stopped)."""
        return self.passed

    @property
    def last_wait(self):
        """Seconds the last wait took (0.0 where the count was there already)."""
        return self.waited

    def arm(self, int64_t target, double seconds, double poll=0.0):
        """Arm a wait for the count to reach `target` (>= 0), passed later by
        :meth:`pass_armed` as :meth:`wait_for` waits (one pass disarms it). The thread that
        arms it passes it."""
        if target < 0:
            raise ValueError(f"target must be >= 0; got {target}")
        self.armed_seconds = seconds
        self.armed_poll = poll
        self.armed_target = target

    cdef bint pass_armed(self) noexcept nogil:
        """Wait for the armed count, then disarm it: True once the count reached the target
        (at once where it had, or none was armed); False where the wait ran out or the
        counter was stopped."""
        cdef int64_t target = self.armed_target
        self.armed_target = -1
        if target < 0:
            return True
        return self.spin(target, self.armed_seconds, self.armed_poll)

    cdef bint spin(self, int64_t target, double seconds, double poll) noexcept nogil:
        """Spin for the count at most `seconds`, then look at it every POLL_SLEEP_S for at most
        `poll` seconds more, sleeping between two looks (nanosleep: the core is free, and
        nobody has to wake this thread); sets `passed`."""
        cdef double started, deadline
        cdef int64_t spins = 0
        cdef timespec nap
        self.passed = 0
        self.waited = 0.0
        if load_acquire(&self.stopped_flag):
            return False
        if load_acquire(&self.count) >= target:
            self.passed = 1
            return True
        started = monotonic_seconds()
        if seconds > 0.0:
            deadline = started + seconds
            while True:
                if load_acquire(&self.count) >= target:
                    self.passed = 1
                    self.waited = monotonic_seconds() - started
                    return True
                cpu_relax()
                spins += 1
                if spins % SPINS_PER_CLOCK == 0:
                    if load_acquire(&self.stopped_flag):
                        break
                    if monotonic_seconds() >= deadline:
                        break
                    # A process waiting for this core (an actor on a machine without a core
                    # to spare) runs now; on an idle core this returns at once.
                    sched_yield()
        if poll > 0.0 and not load_acquire(&self.stopped_flag):
            deadline = monotonic_seconds() + poll
            nap.tv_sec = 0
            nap.tv_nsec = <long>(POLL_SLEEP_S * 1e9)
            while True:
                nanosleep(&nap, NULL)
                if load_acquire(&self.count) >= target:
                    self.passed = 2
                    self.waited = monotonic_seconds() - started
                    return True
                if load_acquire(&self.stopped_flag) or monotonic_seconds() >= deadline:
                    break
        self.waited = monotonic_seconds() - started
        return False

    def wait_for(self, int64_t target, double seconds, double poll=0.0):
        """True once the count is at least `target`; False if it is not after spinning for
        `seconds`, then polling (sleeping between two looks) for `poll` seconds more, or at
        once when stopped. Waits with the GIL released, so the thread that raises the count
        runs meanwhile."""
        cdef bint reached
        with nogil:
            reached = self.spin(target, seconds, poll)
        return reached


cpdef wake_one(lock):
    """Wake the thread waiting on `lock`, a one-slot wake-up (a threading.Lock held while none is
    pending), or leave the wake-up for its next wait. Releasing a lock nobody waits on costs no
    system call; in C, a call of it costs the hand-over no Python frame.

    Examples
    --------
    >>> import threading
    >>> from cpprb_ray._sync import wake_one
    >>> lock = threading.Lock()
    >>> _ = lock.acquire()
    >>> wake_one(lock); wake_one(lock)    # the second finds the wake-up pending
    >>> lock.locked()
    False
    """
    if lock.locked():
        try:
            lock.release()
        except RuntimeError:   # another waker released it first: one wake-up is pending
            pass


@cython.auto_pickle(False)   # one learner's hand-over with its own thread: nothing to send
cdef class Handover:
    """The learner's side of a prefetch ring (cpprb_ray.prefetch), in C: a learner whose next
    batch is ready gives back the set it held and takes that batch here, with
    :class:`HandIterator`'s next() around it: 0.4 to 0.6 us at the median after a step that left
    the cache cold (benchmarks/bench_prefetch.py, Ape-X rows), where the same steps as Python
    took 1.0 to 1.9 us.

    The thread appends an entry to `ready` per batch (None: in set ``batches % depth``; or the
    exception that replaces it). :meth:`take` is the common path only: it returns None, having
    taken nothing but the give-back, where the next entry is not a ready batch with its views
    made (then the caller waits, raises the error or makes the views).

    Examples
    --------
    >>> import collections, threading
    >>> from cpprb_ray._sync import Handover, SpinCounter
    >>> ready, wake = collections.deque(), threading.Lock()
    >>> hand = Handover(2, ready, wake, SpinCounter())
    >>> hand.take() is None          # nothing ready
    True
    >>> ready.append(None)
    >>> hand.views[0] = {"obs": "set 0"}
    >>> hand.take(), hand.batches, hand.released
    ({'obs': 'set 0'}, 1, 0)
    >>> hand.take(), hand.released, hand.given_back.value     # set 0 given back
    (None, 1, 1)
    """

    cdef readonly int64_t released      # sets the learner gave back
    cdef public int64_t taken           # entries of `ready` taken (batches and errors)
    cdef public int64_t batches         # batches taken
    cdef public int64_t wake_at         # the thread sleeps until `released` reaches this
    cdef public bint held               # the learner holds set (batches - 1) % depth
    cdef readonly int64_t depth
    cdef readonly SpinCounter given_back
    cdef readonly list views            # per set: the dict yielded for it, or None
    cdef object ready
    cdef object thread_wake

    def __cinit__(self, *args, **kwargs):
        # Usable before (or without) __init__: a subclass's may skip it.
        self.depth = 1
        self.views = [None]
        self.given_back = SpinCounter()
        self.wake_at = 1 << 62

    def __init__(self, int64_t depth, ready, thread_wake, SpinCounter given_back not None):
        if depth < 1:
            raise ValueError(f"depth must be >= 1; got {depth}")
        self.depth = depth
        self.ready = ready
        self.thread_wake = thread_wake
        self.given_back = given_back
        self.views = [None] * depth

    cpdef give_back(self):
        """Give back one set: the thread may refill it (and is woken where it sleeps until
        then)."""
        self.released += 1
        store_release(&self.given_back.count, self.released)
        if self.released >= self.wake_at:
            wake_one(self.thread_wake)

    cpdef take(self):
        """Give back the set held, then take the next batch where it is ready (its views, a
        new dict); None where it is not (nothing more taken)."""
        cdef object views
        if self.held:
            self.held = False
            self.give_back()
        if not self.ready or self.ready[0] is not None:
            return None
        views = self.views[self.batches % self.depth]
        if views is None:
            return None
        self.ready.popleft()
        self.taken += 1
        self.batches += 1
        self.held = True
        return (<dict>views).copy()


@cython.auto_pickle(False)   # a learner's iterator over its own thread's ring: nothing to send
cdef class HandIterator:
    """An iterator whose next() is a :class:`Handover`'s take, in C, and falls back to the
    subclass's ``_next_waited()`` where no batch was ready (cpprb_ray.prefetch.Prefetch): a
    ready batch costs no Python frame.

    Examples
    --------
    >>> import collections, threading
    >>> from cpprb_ray._sync import HandIterator, Handover, SpinCounter
    >>> class Ready(HandIterator):
    ...     def _next_waited(self):
    ...         self.done = True
    ...         raise StopIteration
    >>> ready = collections.deque([None])
    >>> batches = Ready()
    >>> batches.hand = Handover(1, ready, threading.Lock(), SpinCounter())
    >>> batches.hand.views[0] = {"obs": 1}
    >>> list(batches), batches.done
    ([{'obs': 1}], True)
    """

    cdef public Handover hand
    cdef public bint done

    def __iter__(self):
        return self

    def __next__(self):
        cdef object batch
        if self.done:
            raise StopIteration
        if self.hand is not None:
            batch = self.hand.take()
            if batch is not None:
                return batch
        return self._next_waited()
