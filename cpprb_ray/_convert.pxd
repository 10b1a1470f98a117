# cython: language_level=3
# Conversions of add's input, without numpy: buffer format codes and same_kind casts between the
# plain numeric dtypes (bool, 8- to 64-bit integers, float32, float64). numpy's astype costs a
# few microseconds per call, which is most of an add of one row; a cast loop here costs
# nanoseconds. The caller decides castability (numpy's own can_cast, once per column and code).

from libc.stdint cimport int8_t, int16_t, int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t


# -- reading one item -----------------------------------------------------------------

cdef inline double load_real(const uint8_t* p, char code) noexcept nogil:
    if code == b"d":
        return (<const double*>p)[0]
    if code == b"f":
        return (<const float*>p)[0]
    if code == b"?" or code == b"B":
        return p[0]
    if code == b"b":
        return (<const int8_t*>p)[0]
    if code == b"h":
        return (<const int16_t*>p)[0]
    if code == b"H":
        return (<const uint16_t*>p)[0]
    if code == b"i":
        return (<const int32_t*>p)[0]
    if code == b"I":
        return (<const uint32_t*>p)[0]
    if code == b"l" or code == b"q":
        return <double>(<const int64_t*>p)[0]
    return <double>(<const uint64_t*>p)[0]


cdef inline uint64_t load_integer(const uint8_t* p, char code) noexcept nogil:
    # Two's complement bits of the value, as numpy's integer casts wrap them.
    if code == b"?" or code == b"B":
        return p[0]
    if code == b"b":
        return <uint64_t><int64_t>(<const int8_t*>p)[0]
    if code == b"h":
        return <uint64_t><int64_t>(<const int16_t*>p)[0]
    if code == b"H":
        return (<const uint16_t*>p)[0]
    if code == b"i":
        return <uint64_t><int64_t>(<const int32_t*>p)[0]
    if code == b"I":
        return (<const uint32_t*>p)[0]
    return (<const uint64_t*>p)[0]


cdef inline void convert(uint8_t* dst, char dst_code, int dst_size, const uint8_t* src,
                         char src_code, int src_size, int64_t count) noexcept nogil:
    """Cast `count` items as numpy's astype does for a same_kind pair (the caller checked it)."""
    cdef int64_t k
    cdef uint64_t bits
    if dst_code == b"f" and src_code == b"d":          # the common one: float64 into float32
        for k in range(count):
            (<float*>dst)[k] = <float>(<const double*>src)[k]
        return
    if dst_code == b"f" or dst_code == b"d":
        for k in range(count):
            if dst_size == 4:
                (<float*>dst)[k] = <float>load_real(src + k * src_size, src_code)
            else:
                (<double*>dst)[k] = load_real(src + k * src_size, src_code)
        return
    if dst_code == b"?":
        for k in range(count):
            dst[k] = 1 if src[k] else 0
        return
    for k in range(count):
        bits = load_integer(src + k * src_size, src_code)
        if dst_size == 1:
            dst[k] = <uint8_t>bits
        elif dst_size == 2:
            (<uint16_t*>dst)[k] = <uint16_t>bits
        elif dst_size == 4:
            (<uint32_t*>dst)[k] = <uint32_t>bits
        else:
            (<uint64_t*>dst)[k] = bits


cdef inline char format_code(const char* fmt) noexcept:
    """The one struct code of a native-order numeric buffer format, or 0."""
    if fmt == NULL:
        return 0
    if fmt[0] == b"@" or fmt[0] == b"=" or fmt[0] == b"<":
        fmt += 1
    if fmt[0] == 0 or fmt[1] != 0:
        return 0
    return fmt[0]


cdef inline bint is_format(const Py_buffer* view, const char* codes, Py_ssize_t itemsize):
    cdef char code = format_code(view.format)
    if view.itemsize != itemsize or view.ndim > 1 or code == 0:
        return False
    while codes[0]:
        if codes[0] == code:
            return True
        codes += 1
    return False
