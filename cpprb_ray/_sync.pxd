# cython: language_level=3
# A process-shared, robust pthread mutex that lives inside the segment it guards.

from libc.stdint cimport int64_t, uint32_t
from posix.time cimport timespec

cdef extern from "<pthread.h>" nogil:
    ctypedef struct pthread_mutex_t:
        pass
    ctypedef struct pthread_mutexattr_t:
        pass
    int PTHREAD_PROCESS_SHARED
    int PTHREAD_MUTEX_ROBUST
    int pthread_mutexattr_init(pthread_mutexattr_t* attr)
    int pthread_mutexattr_destroy(pthread_mutexattr_t* attr)
    int pthread_mutexattr_setpshared(pthread_mutexattr_t* attr, int pshared)
    int pthread_mutexattr_setrobust(pthread_mutexattr_t* attr, int robust)
    int pthread_mutex_init(pthread_mutex_t* mutex, const pthread_mutexattr_t* attr)
    int pthread_mutex_destroy(pthread_mutex_t* mutex)
    int pthread_mutex_lock(pthread_mutex_t* mutex)
    int pthread_mutex_unlock(pthread_mutex_t* mutex)
    int pthread_mutex_consistent(pthread_mutex_t* mutex)
    int pthread_mutex_trylock(pthread_mutex_t* mutex)
    int pthread_mutex_timedlock(pthread_mutex_t* mutex, const timespec* deadline)

cdef extern from "<errno.h>" nogil:
    int EOWNERDEAD
    int ETIMEDOUT
    int EBUSY

cdef enum:
    # Bytes reserved for the mutex in a segment: sizeof(pthread_mutex_t) is 40 on x86_64 glibc
    # and 48 on aarch64; the module checks it fits at import.
    MUTEX_BYTES = 64

# Results of mutex_lock.
cdef enum:
    LOCKED = 0
    LOCKED_OWNER_DIED = 1     # we hold it; the previous holder died: repair, then mark consistent
    LOCK_TIMED_OUT = 2        # not acquired within the time given
    LOCK_CORRUPT = 3          # not tried: the mutex's kind is not what mutex_init makes

cdef int mutex_init(pthread_mutex_t* mutex) noexcept nogil
cdef int mutex_lock(pthread_mutex_t* mutex) noexcept nogil
cdef int mutex_trylock(pthread_mutex_t* mutex) noexcept nogil
cdef int mutex_timedlock(pthread_mutex_t* mutex, double seconds) noexcept nogil
cdef int mutex_holder(const pthread_mutex_t* mutex) noexcept nogil
cdef bint mutex_contended(const pthread_mutex_t* mutex) noexcept nogil
cdef void mutex_hand_over(const pthread_mutex_t* mutex, double seconds) noexcept nogil
cdef int mutex_unlock(pthread_mutex_t* mutex) noexcept nogil
cdef int mutex_consistent(pthread_mutex_t* mutex) noexcept nogil

# Futex waits on a 32-bit word in the segment (shared, not FUTEX_PRIVATE: the waker is
# usually another process), for the rate limiter's gates.
cdef void gate_wait(uint32_t* gate, uint32_t seen, double seconds) noexcept nogil
cdef void gate_wake(uint32_t* gate) noexcept nogil
cdef double monotonic_seconds() noexcept nogil

cdef class SharedMutex:
    cdef pthread_mutex_t* mutex
    cdef object _owner
    cdef Py_buffer _buffer
    cdef bint _has_buffer

cdef class SpinCounter:
    cdef int64_t count
    cdef int64_t stopped_flag
    cdef int64_t armed_target          # -1: none armed
    cdef double armed_seconds
    cdef double armed_poll
    cdef int passed                    # how the last wait ended (last_pass)
    cdef double waited                 # and how long it took (last_wait)
    cdef bint pass_armed(self) noexcept nogil
    cdef bint spin(self, int64_t target, double seconds, double poll) noexcept nogil
