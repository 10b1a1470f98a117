# cython: language_level=3
"""A shared mapping of a segment's file, placed so that the kernel can back it with 2 MiB pages.

A sample walks the tree's lower levels and gathers rows at random places in the segment: with
4 KiB pages each of those reads is also a TLB miss, and in a virtual machine a miss walks two
page tables. numpy arrays as large as a replay buffer's get transparent huge pages
(``/sys/kernel/mm/transparent_hugepage/enabled`` is ``madvise`` on most hosts, and numpy asks),
but a file in ``/dev/shm`` does not: ``shmem_enabled`` and the mount's ``huge=`` are ``never``
on most hosts. Two things are needed to change that, and Python's ``mmap`` allows neither:

- the address: a 2 MiB page can back a range of a mapping only where the address and the file
  offset agree modulo 2 MiB, and ``mmap.mmap`` lets the kernel choose a page-aligned address.
  :class:`Mapping` reserves 2 MiB more address space than it needs and maps the file at the
  first 2 MiB boundary inside it;
- the advice: ``madvise(MADV_COLLAPSE)`` (Linux >= 6.1) turns the whole 2 MiB units of a range
  into huge pages synchronously, whatever ``shmem_enabled`` and ``huge=`` say (except
  ``deny``). The pages stay huge in the page cache, so another process that maps the segment
  this way and asks again only installs the mappings.

Where the kernel cannot (an older kernel, a filesystem without huge pages, no 2 MiB of free
contiguous memory), :meth:`Mapping.collapse` says so and the segment keeps its 4 KiB pages: the
contents and every behaviour are the same either way.
"""

cimport cython
from cpython.buffer cimport PyBuffer_FillInfo
from cpython.exc cimport PyErr_CheckSignals
from libc.errno cimport EINVAL, errno
from libc.stdint cimport uintptr_t
from libc.string cimport strerror
from posix.mman cimport (MAP_ANONYMOUS, MAP_FAILED, MAP_FIXED, MAP_NORESERVE, MAP_PRIVATE,
                         MAP_SHARED, PROT_NONE, PROT_READ, PROT_WRITE, madvise, mmap, munmap)
from posix.unistd cimport sysconf, _SC_PAGESIZE

cdef extern from *:
    """
    #include <sys/mman.h>
    /* Linux's value, for C libraries whose headers predate it (glibc < 2.37); any other system
       gets -1 and collapse() reports that it cannot. */
    #if defined(__linux__) && !defined(MADV_COLLAPSE)
    #define MADV_COLLAPSE 25
    #endif
    #ifdef MADV_COLLAPSE
    #define CPPRB_RAY_MADV_COLLAPSE MADV_COLLAPSE
    #else
    #define CPPRB_RAY_MADV_COLLAPSE (-1)
    #endif
    """
    const int MADV_COLLAPSE "CPPRB_RAY_MADV_COLLAPSE"

# A PMD's span: the huge page size of x86-64, and of arm64 with 4 KiB pages (with 64 KiB
# pages it is 512 MiB, and collapse() then makes nothing huge).
HUGE_PAGE = 2 << 20
cdef size_t HUGE = 2 << 20


cdef inline uintptr_t round_up(uintptr_t value, uintptr_t multiple) noexcept nogil:
    return (value + multiple - 1) // multiple * multiple


@cython.auto_pickle(False)
cdef class Mapping:
    """Mapping(fd, size): `size` bytes of the file `fd`, shared and read-write, at an address on
    a 2 MiB boundary. What a segment's ``memory`` is: a writable buffer of bytes (numpy,
    memoryview and the store take it), closed by :meth:`close`, which refuses while a buffer
    exported from it is alive, as ``mmap.close`` does. The descriptor may be closed once this
    returns.

    Examples
    --------
    >>> import os, tempfile
    >>> from cpprb_ray._mapping import HUGE_PAGE, Mapping
    >>> with tempfile.TemporaryFile() as handle:
    ...     os.ftruncate(handle.fileno(), 4096)
    ...     memory = Mapping(handle.fileno(), 4096)
    >>> view = memoryview(memory)
    >>> view[:5] = b"hello"
    >>> bytes(view[:5]), len(memory), memory.address % HUGE_PAGE
    (b'hello', 4096, 0)
    >>> memory.close()
    Traceback (most recent call last):
    ...
    BufferError: cannot close exported pointers exist
    >>> view.release()
    >>> memory.close()
    >>> memory.closed
    True
    """

    cdef char* start
    cdef size_t size
    cdef size_t mapped          # bytes mapped: size rounded up to whole pages
    cdef Py_ssize_t exports
    cdef bint is_closed
    cdef bytearray huge_units   # 1 for each 2 MiB unit collapse() has made huge

    def __cinit__(self, *args, **kwargs):
        self.is_closed = True       # nothing to unmap until __init__ has mapped it

    def __init__(self, int fd, Py_ssize_t size):
        cdef size_t page = <size_t>sysconf(_SC_PAGESIZE)
        cdef char* reserved
        cdef char* aligned
        cdef void* placed
        cdef int error
        if not self.is_closed:
            raise ValueError("this Mapping is mapped already")
        if size <= 0:
            raise ValueError(f"size must be > 0; got {size}")
        self.size = <size_t>size
        self.mapped = round_up(self.size, page)
        # Address space only (no memory, no swap): the file is mapped over part of it below,
        # and the rest is given back.
        reserved = <char*>mmap(NULL, self.mapped + HUGE, PROT_NONE,
                               MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0)
        if <void*>reserved == MAP_FAILED:
            error = errno
            raise OSError(error, strerror(error).decode())
        aligned = <char*>round_up(<uintptr_t>reserved, HUGE)
        placed = mmap(aligned, self.mapped, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED,
                      fd, 0)
        if placed == MAP_FAILED:
            error = errno
            munmap(reserved, self.mapped + HUGE)
            raise OSError(error, strerror(error).decode())
        # Give back the reservation's head (empty when it was aligned already) and its tail
        # (never empty: aligned < reserved + HUGE).
        if aligned > reserved:
            munmap(reserved, <size_t>(aligned - reserved))
        munmap(aligned + self.mapped, <size_t>(reserved + HUGE - aligned))
        self.start = aligned
        self.huge_units = bytearray(self.size // HUGE)
        self.is_closed = False

    def __dealloc__(self):
        # No buffer can be exported any more (each export holds a reference to this object).
        if not self.is_closed:
            munmap(self.start, self.mapped)

    def __getbuffer__(self, Py_buffer* buffer, int flags):
        if self.is_closed:
            raise ValueError("mmap closed or invalid")
        PyBuffer_FillInfo(buffer, self, self.start, <Py_ssize_t>self.size, 0, flags)
        self.exports += 1

    def __releasebuffer__(self, Py_buffer* buffer):
        self.exports -= 1

    def __len__(self):
        return <Py_ssize_t>self.size

    def __getitem__(self, key):
        """As an mmap: an int for an index, bytes for a slice."""
        view = memoryview(self)
        try:
            return view[key].tobytes() if isinstance(key, slice) else view[key]
        finally:
            view.release()

    def __setitem__(self, key, value):
        """As an mmap: an int (0..255) at an index, bytes of the same length over a slice."""
        view = memoryview(self)
        try:
            view[key] = value
        finally:
            view.release()

    @property
    def closed(self):
        """True once :meth:`close` has unmapped it."""
        return self.is_closed

    @property
    def huge_bytes(self):
        """Bytes that :meth:`collapse` has made huge in this mapping."""
        return self.huge_units.count(1) * <Py_ssize_t>HUGE

    @property
    def address(self):
        """The mapping's first byte, as an integer (on a 2 MiB boundary)."""
        return <uintptr_t>self.start

    def close(self):
        """Unmap; BufferError while a buffer exported from it is alive. Closing twice is a
        no-op."""
        if self.is_closed:
            return
        if self.exports > 0:
            raise BufferError("cannot close exported pointers exist")
        munmap(self.start, self.mapped)
        self.is_closed = True

    def collapse(self, Py_ssize_t offset, Py_ssize_t length):
        """Ask the kernel to back the 2 MiB units that ``[offset, offset + length)`` touches
        with huge pages now (``MADV_COLLAPSE``), except a unit that the end of the mapping
        cuts, or that an earlier call made huge; returns the bytes it made huge: 0 when no unit
        qualifies or the kernel declined (a unit it declines keeps its 4 KiB pages). It copies
        every 4 KiB page of a unit that is not huge yet (0.3 to 2.7 ms per MiB here), with the
        GIL released; contents never change.

        Examples
        --------
        >>> import os, tempfile
        >>> from cpprb_ray._mapping import HUGE_PAGE, Mapping
        >>> with tempfile.TemporaryFile() as handle:
        ...     os.ftruncate(handle.fileno(), HUGE_PAGE - 4096)
        ...     memory = Mapping(handle.fileno(), HUGE_PAGE - 4096)
        >>> memory.collapse(0, 4096)   # its only unit is cut by the end of the mapping
        0
        >>> memory.close()
        """
        cdef size_t unit, last
        cdef size_t done = 0
        cdef char* marks
        cdef int status, error
        if self.is_closed:
            raise ValueError("mmap closed or invalid")
        if offset < 0 or length < 0 or <size_t>offset > self.size:
            raise ValueError(f"offset and length must lie inside the {self.size} bytes mapped; "
                             f"got offset {offset}, length {length}")
        if MADV_COLLAPSE < 0 or length == 0:
            return 0
        # Units counted from the start of the mapping (on a 2 MiB boundary): the ones the range
        # touches (other bytes of a unit are the same file's, so making them huge too does no
        # harm), but only those wholly inside the mapping, since a unit the end of the file
        # cuts cannot be one huge page. `last` is also the length of huge_units.
        unit = <size_t>offset // HUGE
        last = min(round_up(<size_t>offset + <size_t>length, HUGE) // HUGE, self.size // HUGE)
        marks = self.huge_units
        self.exports += 1       # close() from another thread is refused until this ends
        try:
            # One unit at a time: a unit the kernel cannot make huge (EAGAIN, ENOMEM) does not
            # stop the others, and the count says how much was done. EINVAL: the kernel or the
            # filesystem has no such advice, so no other unit can succeed either. Signals are
            # looked at between two units (a unit takes milliseconds, a GiB seconds), so that
            # Ctrl-C or a SIGTERM handler does not wait for the whole range.
            while unit < last:
                if not marks[unit]:
                    with nogil:
                        status = madvise(self.start + unit * HUGE, HUGE, MADV_COLLAPSE)
                        error = errno
                    if status == 0:
                        marks[unit] = 1
                        done += HUGE
                    elif error == EINVAL:
                        break
                    PyErr_CheckSignals()
                unit += 1
        finally:
            self.exports -= 1
        return <Py_ssize_t>done
