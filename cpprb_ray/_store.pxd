# cython: language_level=3
# ReplayStore, the boundary of one mapped segment: its lifetime, THE driver that runs every
# kernel under the segment's lock (with the rate limiter's admission, decided once, from what
# each call declares), and the plain ring operations. Parts that drive other kernels (the lane
# part, _lanestore; checkpoint images, _image) hold a store and call its driver.

from libc.stdint cimport int64_t, uint32_t

from cpprb_ray._columns cimport ColumnTable
from cpprb_ray._core cimport StoreView
from cpprb_ray._limiter cimport Limiter
from cpprb_ray._outputs cimport SampleOutputs
from cpprb_ray._rules cimport PriorityRule
from cpprb_ray._segment cimport Header
from cpprb_ray._segtree cimport Xoshiro256

ctypedef int64_t (*Kernel)(StoreView* view, void* arguments) noexcept nogil

# A call on one side of the rate limiter, as the driver carries it through its waits.
cdef struct RateCall:
    int side                  # SIDE_INSERT (add), SIDE_SAMPLE (sample), SIDE_RESET (clear)
    int64_t rows              # rows it adds or samples
    double timeout            # seconds it may be held back; < 0: no limit
    double started            # monotonic time the limiter first held it back; < 0: not yet
    double waited             # seconds it was held back, once it went through or gave up
    double nap                # the next sleep on its gate (one slice, or what is left)
    uint32_t seen             # the gate's value when it decided to sleep
    bint sleeping             # it is to sleep on its gate and try again


cdef class ReplayStore:
    cdef Py_buffer _buffer
    cdef bint _has_buffer
    cdef object _memory
    cdef StoreView view
    cdef PriorityRule rule
    cdef Xoshiro256 rng
    cdef readonly bint prioritized
    cdef readonly double lock_timeout
    cdef unsigned long forks_seen   # fork_generation when `active` and the rng were last valid
    cdef int active                 # threads of this process inside a call on this store
    cdef bint closing
    cdef set interrupted            # thread idents whose waits end (interrupt_waits)
    cdef dict holds                 # thread ident: the SpinCounter its calls wait for (hold_calls)
    cdef ColumnTable columns
    cdef SampleOutputs outputs      # what sample() fills (the ring's sampler)

    cdef int enter(self) except -1
    cdef void leave(self) noexcept
    cdef int64_t run(self, Kernel kernel, void* arguments, int side, int64_t rows,
                     double timeout) except? -1
    cdef int weigh(self, const double* priorities, double* weights, int64_t count, str name,
                   const int64_t* update_indexes=*) except -1
    cdef Header* header(self) except NULL
    cdef int64_t index_bound(self) noexcept
    cdef int check_interrupted(self) except -1
    cdef object _add(self, values, priorities, double timeout, weighed=*)
    cdef object _sample(self, int64_t batch, double beta, out, double timeout)
    cdef object _update(self, indexes, priorities, generations)


cdef dict limiter_state(const Header* h, const Limiter* limiter)
