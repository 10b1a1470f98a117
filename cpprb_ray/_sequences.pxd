# cython: language_level=3
# Sequences for recurrent learners, nogil: a laned buffer whose slots hold steps, each lane one
# writer's stream, and whose sampled unit is a sequence of `length` consecutive steps of one
# episode, identified by the slot of its first step (its start). A start's link (_core's laned
# record, the int32 after the generation) says what it is:
#   SEQ_OPEN   a sequence whose steps are still being written (its leaf unset)
#   >= 1       a committed sequence of that many steps (the rest is padding); its leaf weighs it
#   else       a step that starts no sequence, or whose sequence is gone
# The store validates, locks, and calls these through its driver; seq_bind makes a laned view a
# sequence buffer's (the part's hooks, through which the core's repair, draw, update and clear
# see its sequences).

from libc.stdint cimport int64_t, uint8_t, uint64_t

from cpprb_ray._core cimport StoreView

cdef enum:
    SEQ_OPEN = -3

# A writer's stream, kept by the writer between its adds (in/out): where its episode is and the
# sequences it has started but not yet committed (at most `open_room`).
cdef struct SeqStream:
    int64_t position          # steps of the current episode written
    # Its lane's `writes` after its last add (another value: the lane was cleared or repaired
    # since, and its open sequences are gone).
    uint64_t writes
    int64_t open_count
    int64_t open_room
    int64_t* open_slots
    uint64_t* open_generations
    int64_t* open_positions   # the episode position of each one's first step
    double* open_max          # the largest step priority seen in it
    double* open_sum          # the sum of its steps' priorities
    int64_t* open_missing     # its steps that came without a priority

cdef struct SeqAdd:
    int64_t lane
    uint64_t token            # the writer's: the lane must still be its own
    int64_t count             # steps (0: only end the episode)
    int64_t length
    int64_t period
    double eta
    const uint8_t** sources   # per store column, `count` values back to back
    const double* priorities  # per step (NULL: none)
    const uint8_t* ends       # per step: the episode ends after it (NULL: none does)
    bint end_after            # the episode ends after the last step (on_episode_end)
    SeqStream* stream
    int64_t committed         # out: sequences committed

cdef void seq_bind(StoreView* view) noexcept nogil
cdef int64_t seq_add(StoreView* view, SeqAdd* add) noexcept nogil
cdef int64_t seq_commits(const SeqStream* stream, int64_t count, int64_t length, int64_t period,
                         const uint8_t* ends, bint end_after) noexcept nogil
cdef int64_t seq_gather(StoreView* view, const int64_t* indexes, int64_t batch, int64_t length,
                        uint64_t* generations, uint8_t** outputs, uint8_t* mask) noexcept nogil
cdef int64_t seq_live(StoreView* view, int64_t* indexes, int64_t room) noexcept nogil
