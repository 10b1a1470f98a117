"""Stop a child process at every instruction of one compiled function (Linux x86_64, ptrace).

The crash tests kill writers at random moments, so a window of a few instructions (a store the
compiler moved past the "operation done" marker, say) shows up once in thousands of runs. This
helper makes those windows deterministic: a child is started under ptrace, a breakpoint stops it
on entry to a function of the extension, and the parent single-steps it to the function's
return. Between two steps the child's stores up to that instruction are exactly what a SIGKILL
there would leave in shared memory (x86 makes retired stores visible in program order).

Only ctypes and the kernel's ptrace interface: no debugger, nothing to install.
"""

from __future__ import annotations

import ctypes
import os
import platform
import signal
import subprocess
import sys
import time
from typing import Callable, List, Optional, Sequence, Tuple

SUPPORTED = platform.system() == "Linux" and platform.machine() in ("x86_64", "AMD64")
RUN_TIMEOUT = 60.0  # seconds a child may run untraced: start-up (numpy, the buffer) and so on

PTRACE_TRACEME = 0
PTRACE_PEEKDATA = 2
PTRACE_POKEDATA = 5
PTRACE_CONT = 7
PTRACE_SINGLESTEP = 9
PTRACE_GETREGS = 12
PTRACE_SETREGS = 13

_libc = ctypes.CDLL(None, use_errno=True)
_ptrace = _libc.ptrace
_ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
_ptrace.restype = ctypes.c_long


class Registers(ctypes.Structure):
    """struct user_regs_struct of x86_64 (sys/user.h)."""

    _fields_ = [(name, ctypes.c_ulonglong) for name in (
        "r15", "r14", "r13", "r12", "rbp", "rbx", "r11", "r10", "r9", "r8", "rax", "rcx",
        "rdx", "rsi", "rdi", "orig_rax", "rip", "cs", "eflags", "rsp", "ss", "fs_base",
        "gs_base", "ds", "es", "fs", "gs")]


# What a child runs first: make the parent its tracer, then stop until the parent is ready.
TRACE_ME = (
    "import ctypes, os, signal\n"
    "_libc = ctypes.CDLL(None, use_errno=True)\n"
    "_libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]\n"
    "def trace_me():\n"
    "    if _libc.ptrace(0, 0, None, None) != 0:\n"
    "        raise OSError(ctypes.get_errno(), 'PTRACE_TRACEME failed')\n"
    "    os.kill(os.getpid(), signal.SIGSTOP)\n"
)


def _check(result: int, what: str) -> int:
    if result == -1:
        errno = ctypes.get_errno()
        if errno:
            raise OSError(errno, f"ptrace {what}: {os.strerror(errno)}")
    return result


def symbol_offset(library: str, symbol_part: str) -> int:
    """File offset of the one defined function whose name ends with `symbol_part`.

    Cython's cdef methods are static, so they are in the symbol table but not in the dynamic
    one: nm (binutils, present wherever the extension was compiled) reads them."""
    listing = subprocess.run(["nm", "--defined-only", library], check=True,
                             stdout=subprocess.PIPE, text=True).stdout
    found = [line.split() for line in listing.splitlines()]
    found = [fields for fields in found
             if len(fields) == 3 and fields[1] in "tT" and fields[2].endswith(symbol_part)]
    if len(found) != 1:
        raise LookupError(f"expected one function matching {symbol_part!r} in {library}; "
                          f"found {[fields[2] for fields in found]}")
    return int(found[0][0], 16)


def load_address(pid: int, library: str) -> int:
    """Where `library` is mapped in `pid`: the start of its mapping at file offset 0."""
    real = os.path.realpath(library)
    with open(f"/proc/{pid}/maps") as maps:
        for line in maps:
            fields = line.split()
            if len(fields) >= 6 and os.path.realpath(fields[5]) == real and int(fields[2], 16) == 0:
                return int(fields[0].split("-")[0], 16)
    raise LookupError(f"{library} is not mapped in process {pid}")


class Tracee:
    """A child started with `code` (which must call trace_me() from TRACE_ME before the work
    to trace), stopped and traced by this process."""

    def __init__(self, code: str, args: Sequence[str] = ()) -> None:
        environment = dict(os.environ, OPENBLAS_NUM_THREADS="1")  # one thread: the traced one
        self.process = subprocess.Popen([sys.executable, "-c", TRACE_ME + code, *args],
                                        env=environment)
        self.pid = self.process.pid
        self.alive = True
        self._expect_stop(signal.SIGSTOP, "the child's own SIGSTOP", RUN_TIMEOUT)

    # -- plumbing ---------------------------------------------------------------------------------

    def _wait(self, timeout: Optional[float] = None) -> int:
        """The child's next status change. A single step always comes back at once; a child
        left to run (start-up, up to a breakpoint, to its end) gets `timeout` seconds, then it
        is killed, so a test never hangs on it."""
        if timeout is None:
            _, status = os.waitpid(self.pid, 0)
        else:
            deadline = time.monotonic() + timeout
            while True:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
                if pid:
                    break
                if time.monotonic() > deadline:
                    self.kill()
                    raise TimeoutError(f"child {self.pid} did not stop within {timeout} s")
                time.sleep(0.001)
        if os.WIFEXITED(status) or os.WIFSIGNALED(status):
            self.alive = False
            self.process.returncode = (os.WEXITSTATUS(status) if os.WIFEXITED(status)
                                       else -os.WTERMSIG(status))
        return status

    def _expect_stop(self, sig: int, what: str, timeout: Optional[float] = None) -> None:
        status = self._wait(timeout)
        if not os.WIFSTOPPED(status) or os.WSTOPSIG(status) != sig:
            raise RuntimeError(
                f"child {self.pid} did not stop for {what}: status {status:#x} (exit code "
                f"{self.process.returncode}; an exit code of 1 at start-up with 'PTRACE_TRACEME "
                f"failed' above means ptrace is not allowed here: Yama, seccomp)")

    def registers(self) -> Registers:
        regs = Registers()
        _check(_ptrace(PTRACE_GETREGS, self.pid, None, ctypes.addressof(regs)), "GETREGS")
        return regs

    def _set_registers(self, regs: Registers) -> None:
        _check(_ptrace(PTRACE_SETREGS, self.pid, None, ctypes.addressof(regs)), "SETREGS")

    def peek(self, address: int) -> int:
        ctypes.set_errno(0)
        word = _check(_ptrace(PTRACE_PEEKDATA, self.pid, address, None), "PEEKDATA")
        return word & 0xFFFFFFFFFFFFFFFF

    def _poke(self, address: int, word: int) -> None:
        signed = word - (1 << 64) if word >= 1 << 63 else word
        _check(_ptrace(PTRACE_POKEDATA, self.pid, address, signed), "POKEDATA")

    # -- control ----------------------------------------------------------------------------------

    def run_to_function(self, library: str, symbol_part: str) -> None:
        """Let the child run until it enters the function (a one-shot int3 breakpoint)."""
        address = load_address(self.pid, library) + symbol_offset(library, symbol_part)
        original = self.peek(address)
        self._poke(address, (original & ~0xFF) | 0xCC)
        _check(_ptrace(PTRACE_CONT, self.pid, None, None), "CONT")
        self._expect_stop(signal.SIGTRAP, f"the breakpoint on {symbol_part}", RUN_TIMEOUT)
        self._poke(address, original)
        regs = self.registers()
        if regs.rip != address + 1:
            raise RuntimeError(f"stopped at {regs.rip:#x}, not after the breakpoint")
        regs.rip = address
        self._set_registers(regs)
        self._return_to = self.peek(regs.rsp)
        self._caller_rsp = regs.rsp + 8

    def step(self) -> bool:
        """One instruction; False once the function has returned to its caller."""
        _check(_ptrace(PTRACE_SINGLESTEP, self.pid, None, None), "SINGLESTEP")
        self._expect_stop(signal.SIGTRAP, "a single step")
        regs = self.registers()
        return not (regs.rip == self._return_to and regs.rsp == self._caller_rsp)

    def kill(self) -> int:
        """SIGKILL the stopped child (by its pid; it is ours) and reap it; its exit status."""
        if self.alive:
            os.kill(self.pid, signal.SIGKILL)
            while self.alive:
                self._wait()
        return self.process.returncode

    def finish(self) -> int:
        """Let the child run to its end; its exit code."""
        _check(_ptrace(PTRACE_CONT, self.pid, None, None), "CONT")
        while self.alive:
            status = self._wait(RUN_TIMEOUT)
            if self.alive and os.WIFSTOPPED(status):  # pass any signal on, untouched
                _check(_ptrace(PTRACE_CONT, self.pid, None, os.WSTOPSIG(status)), "CONT")
        return self.process.returncode


def step_through(tracee: Tracee, library: str, symbol_part: str, watch: Callable[[], bytes],
                 limit: int = 200_000) -> List[Tuple[int, bytes]]:
    """Single-step the function from entry to return: (steps taken, `watch()`) on entry and
    after every step that changed what `watch()` returns.

    Those are the distinct states a kill inside the function can leave behind."""
    tracee.run_to_function(library, symbol_part)
    last = watch()
    states = [(0, last)]
    for count in range(1, limit + 1):
        inside = tracee.step()
        now = watch()
        if now != last:
            states.append((count, now))
            last = now
        if not inside:
            return states
    raise RuntimeError(f"{symbol_part} did not return within {limit} instructions")


def spread(points: Sequence[int], how_many: int) -> List[int]:
    """About `how_many` of `points`, evenly spread, first and last included."""
    if len(points) <= how_many:
        return list(points)
    last = len(points) - 1
    return sorted({points[round(k * last / (how_many - 1))] for k in range(how_many)})
