# cython: language_level=3
# Software prefetch, defined once for the tree (_segtree) and the store's kernels (_core): a
# hint to start a cache miss early, so that misses of independent walks and gathers overlap.
# Locality 1: the line is used once more soon, not kept for long.

cdef extern from *:
    """
    #if defined(__GNUC__) || defined(__clang__)
    #define CPPRB_RAY_PREFETCH(address) __builtin_prefetch((address), 0, 1)
    #define CPPRB_RAY_PREFETCH_WRITE(address) __builtin_prefetch((address), 1, 1)
    #else
    #define CPPRB_RAY_PREFETCH(address) ((void)(address))
    #define CPPRB_RAY_PREFETCH_WRITE(address) ((void)(address))
    #endif
    """
    void prefetch "CPPRB_RAY_PREFETCH"(const void* address) noexcept nogil
    void prefetch_write "CPPRB_RAY_PREFETCH_WRITE"(const void* address) noexcept nogil
