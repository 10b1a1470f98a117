"""The segment's mapping (cpprb_ray/_mapping.pyx): shared, on a 2 MiB boundary, closed like an
mmap, and backed by 2 MiB pages where the kernel can do it (MADV_COLLAPSE, Linux >= 6.1).

Huge pages are checked in the kernel's own account of each mapping (/proc/self/smaps), on real
tmpfs files: the machine's /dev/shm, and a small tmpfs filled to its last block in a private
mount namespace, as a container's /dev/shm is.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import platform
import shutil
import signal
import subprocess
import sys
import threading

import numpy as np
import pytest

import cpprb_ray
from cpprb_ray._mapping import HUGE_PAGE, Mapping

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MIB = 2**20


def kernel_collapses_shmem() -> bool:
    """What this kernel is documented to do: MADV_COLLAPSE of shmem from Linux 6.1 on, unless
    shmem_enabled says "deny". The tests below expect huge pages exactly when this holds."""
    release = platform.release().split("-")[0].split(".")
    version = tuple(int(part) for part in release[:2] if part.isdigit())
    try:
        with open("/sys/kernel/mm/transparent_hugepage/shmem_enabled") as handle:
            setting = handle.read()
    except OSError:
        return False
    return sys.platform.startswith("linux") and version >= (6, 1) and "[deny]" not in setting


def pmd_mapped_bytes(address: int) -> int:
    """Bytes of the mapping that starts at `address` mapped by 2 MiB entries, from smaps."""
    found = False
    with open("/proc/self/smaps") as handle:
        for line in handle:
            fields = line.split()
            if "-" in fields[0] and len(fields) >= 5 and not fields[0].endswith(":"):
                start = int(fields[0].split("-")[0], 16)
                if found:
                    break
                found = start == address
            elif found and fields[0] in ("ShmemPmdMapped:", "FilePmdMapped:"):
                if int(fields[1]):
                    return int(fields[1]) * 1024
    return 0


@pytest.fixture
def shm_file():
    """A file in /dev/shm (a tmpfs), removed afterwards."""
    path = f"/dev/shm/cpprb_ray_test_mapping_{os.getpid()}"
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        yield fd
    finally:
        os.close(fd)
        os.unlink(path)


def test_a_mapping_is_shared_aligned_and_closes_like_an_mmap(shm_file):
    size = 3 * MIB + 123
    os.ftruncate(shm_file, size)
    memory = Mapping(shm_file, size)
    other = Mapping(shm_file, size)
    try:
        assert memory.address % HUGE_PAGE == 0 and other.address % HUGE_PAGE == 0
        assert len(memory) == size and not memory.closed
        view = memoryview(memory)
        assert view.nbytes == size and not view.readonly
        view[size - 5:] = b"tail!"
        view[:4] = b"head"
        memory[4] = 33                     # indexing and slices as on an mmap
        memory[5:7] = b"!?"
        assert memory[4] == 33 and memory[:7] == b"head!!?" and memory[-5:] == b"tail!"
        # The same file: another mapping and a plain read see the writes at once.
        assert bytes(memoryview(other)[size - 5:]) == b"tail!"
        assert os.pread(shm_file, 4, 0) == b"head"
        with pytest.raises(BufferError, match="cannot close exported pointers exist"):
            memory.close()
        assert not memory.closed and bytes(view[:4]) == b"head"   # still mapped
        part = view[10:20]                  # a slice holds the export too
        view.release()
        with pytest.raises(BufferError):
            memory.close()
        part.release()
        memory.close()
        memory.close()                      # twice: nothing
        assert memory.closed
        with pytest.raises(ValueError, match="closed"):
            memoryview(memory)
        with pytest.raises(ValueError, match="closed"):
            memory.collapse(0, size)
    finally:
        memory.close()
        other.close()


def test_bad_arguments_are_refused(shm_file):
    os.ftruncate(shm_file, 4096)
    with pytest.raises(ValueError, match="size must be > 0"):
        Mapping(shm_file, 0)
    with pytest.raises(OSError) as error:
        Mapping(-1, 4096)
    assert error.value.errno == 9        # EBADF
    memory = Mapping(shm_file, 4096)
    try:
        with pytest.raises(ValueError, match="mapped already"):
            memory.__init__(shm_file, 4096)     # would leak the first mapping
        for offset, length in ((-1, 10), (0, -1), (4097, 1)):
            with pytest.raises(ValueError, match="offset and length must lie inside"):
                memory.collapse(offset, length)
        assert memory.collapse(0, 0) == 0
    finally:
        memory.close()


def test_collapse_makes_2_mib_pages_and_keeps_every_byte(shm_file):
    size = 7 * MIB + 4096                # 3 whole units; the 4th is cut by the end
    os.posix_fallocate(shm_file, 0, size)
    memory = Mapping(shm_file, size)
    contents = np.random.default_rng(0).integers(0, 256, size, dtype=np.uint8)
    try:
        array = np.frombuffer(memory, dtype=np.uint8)
        array[:] = contents
        assert pmd_mapped_bytes(memory.address) == 0
        done = memory.collapse(1, 5 * MIB)   # touches units 0, 1 and 2
        if not kernel_collapses_shmem():
            assert done == 0 and memory.huge_bytes == 0
            return
        assert done == 6 * MIB and memory.huge_bytes == 6 * MIB
        assert pmd_mapped_bytes(memory.address) == 6 * MIB
        assert memory.collapse(0, size) == 0      # units 0-2 done; unit 3 is cut by the end
        assert memory.huge_bytes == 6 * MIB
        assert (array == contents).all()
        array[::4097] += 1                        # and it is still the file, read-write
        assert os.pread(shm_file, 1, 4097) == bytes([(int(contents[4097]) + 1) % 256])
        # Another mapping of the same file finds the pages huge and only maps them.
        other = Mapping(shm_file, size)
        try:
            assert other.collapse(0, size) == 6 * MIB
            assert pmd_mapped_bytes(other.address) == 6 * MIB
            assert (np.frombuffer(other, dtype=np.uint8) == array).all()
        finally:
            other.close()
        del array
    finally:
        memory.close()


def test_close_while_another_thread_collapses(shm_file):
    """close() is refused (BufferError, as for a live export) until the collapse has left the
    mapping: madvise never runs on an address that was unmapped, and perhaps reused, under it."""
    size = 64 * MIB
    os.posix_fallocate(shm_file, 0, size)
    memory = Mapping(shm_file, size)
    results: list = []

    def collapse() -> None:
        try:
            results.append(memory.collapse(0, size))
        except ValueError as error:          # close() came first: nothing was asked
            results.append(str(error))

    worker = threading.Thread(target=collapse)
    worker.start()
    refused = 0
    while True:
        try:
            memory.close()
            break
        except BufferError:
            refused += 1
    worker.join(60)
    assert not worker.is_alive() and len(results) == 1 and memory.closed
    if refused:          # the collapse was running when close() came: it ran to its end
        assert results[0] in range(0, size + 1, HUGE_PAGE)
    else:
        assert results[0] in range(0, size + 1, HUGE_PAGE) or "closed" in results[0]


def _attached_huge_bytes(name: str, queue) -> None:
    with cpprb_ray.PrioritizedReplayBuffer.attach(name) as view:
        batch = view.sample(8)
        queue.put((view._segment.memory.huge_bytes,
                   pmd_mapped_bytes(view._segment.memory.address), len(batch["indexes"])))


def test_a_buffer_asks_for_huge_pages_for_its_tree_and_rows():
    with cpprb_ray.PrioritizedReplayBuffer(2**18, {"obs": {"shape": 4}}) as rb:
        memory = rb._segment.memory
        (tree_at, tree_bytes), (rows_at, rows_bytes) = rb._layout.hot_regions()
        # The units the two regions touch, less a last unit cut by the end of the segment.
        first, end = min(tree_at, rows_at) // HUGE_PAGE, -(-max(tree_at + tree_bytes,
                                                               rows_at + rows_bytes) // HUGE_PAGE)
        units = min(end, rb._segment.size // HUGE_PAGE) - first
        expected = units * HUGE_PAGE if kernel_collapses_shmem() else 0
        assert memory.huge_bytes == expected
        assert pmd_mapped_bytes(memory.address) == expected
        rb.add(obs=np.ones((1000, 4)), priorities=np.arange(1000.0))
        # A view in another process maps the same pages and asks again.
        context = multiprocessing.get_context("spawn")
        queue = context.Queue()
        child = context.Process(target=_attached_huge_bytes, args=(rb.name, queue))
        child.start()
        try:
            assert queue.get(timeout=60) == (expected, expected, 8)
        finally:
            child.join(60)
        assert child.exitcode == 0


def _attach_and_collapse(name: str, queue) -> None:
    with cpprb_ray.ReplayBuffer.attach(name) as view:
        queue.put(view._segment.memory.huge_bytes)


def test_a_collapse_while_another_process_writes_loses_nothing(monkeypatch):
    """The owner keeps 4 KiB pages (CPPRB_RAY_HUGE_PAGES=0) and writes rows while a view in
    another process attaches and makes the same pages huge (the kernel copies them as they
    are written): every row is what was written, and the tree agrees with it."""
    monkeypatch.setenv("CPPRB_RAY_HUGE_PAGES", "0")
    capacity = 2**18
    with cpprb_ray.PrioritizedReplayBuffer(capacity, {"obs": {"shape": 4}}) as rb:
        assert rb._segment.memory.huge_bytes == 0
        monkeypatch.delenv("CPPRB_RAY_HUGE_PAGES")
        context = multiprocessing.get_context("spawn")
        queue = context.Queue()
        child = context.Process(target=_attach_and_collapse, args=(rb.name, queue))
        child.start()
        written = 0
        while child.is_alive() or written < capacity:
            block = np.arange(written, written + 4096, dtype=np.float64)
            rb.add(obs=np.repeat(block[:, None], 4, axis=1), priorities=block % 97 + 1)
            written += 4096
        child.join(60)
        assert child.exitcode == 0
        huge = queue.get(timeout=10)
        assert (huge > 0) == kernel_collapses_shmem()
        everything = rb.get_all_transitions()
        first = written - capacity            # the rows still held, oldest first by slot
        expected = np.arange(first, written, dtype=np.float64)
        slots = (np.arange(first, written) % capacity)
        assert (everything["obs"][slots] == expected[:, None]).all()
        leaves = rb._store.check_tree()[1]
        np.testing.assert_allclose(leaves[slots], (expected % 97 + 1 + 1e-4) ** 0.6,
                                   rtol=1e-12)


def test_the_environment_switch_turns_huge_pages_off():
    script = ("import cpprb_ray\n"
              "with cpprb_ray.PrioritizedReplayBuffer(2**18, {'obs': {'shape': 4}}) as rb:\n"
              "    print(rb._segment.memory.huge_bytes)\n")
    env = dict(os.environ, CPPRB_RAY_HUGE_PAGES="0",
               PYTHONPATH=os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p))
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["0"]


FULL_TMPFS_SCRIPT = """
import json, os, sys
import numpy as np
from cpprb_ray._mapping import Mapping
directory = sys.argv[1]
path = os.path.join(directory, "segment")
size = 6 << 20
fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
os.posix_fallocate(fd, 0, size)
memory = Mapping(fd, size)
array = np.frombuffer(memory, dtype=np.uint8)
contents = np.random.default_rng(1).integers(0, 256, size, dtype=np.uint8)
array[:] = contents
# Another job's files take every block left.
with open(os.path.join(directory, "filler"), "wb") as filler:
    try:
        while True:
            filler.write(bytes(1 << 16))
            filler.flush()
    except OSError:
        pass
free = os.statvfs(directory).f_bavail
done = memory.collapse(0, size)
same = bool((array == contents).all())
array[:] = 7                                   # every byte still writable: no SIGBUS
written = bool((np.frombuffer(os.pread(fd, size, 0), np.uint8) == 7).all())
del array
memory.close()
os.close(fd)
print(json.dumps({"free_blocks": free, "done": done, "same": same, "written": written}))
"""


def test_collapse_on_a_full_small_tmpfs_loses_nothing(tmp_path):
    if shutil.which("unshare") is None:
        pytest.fail("unshare(1) is missing: this test needs a private tmpfs (util-linux)")
    command = 'mount -t tmpfs -o size=16m tmpfs "$1" && shift && exec "$@"'
    result = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "bash", "-c", command, "bash",
         str(tmp_path), sys.executable, "-c", FULL_TMPFS_SCRIPT, str(tmp_path)],
        capture_output=True, text=True, timeout=120,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join(
            p for p in (REPO, os.environ.get("PYTHONPATH")) if p)))
    assert result.returncode != -signal.SIGBUS, result.stderr
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["free_blocks"] == 0
    # The kernel may or may not find room to copy a unit on a full tmpfs; either way every
    # byte is kept and the segment stays writable.
    assert report["done"] in (0, 2 * MIB, 4 * MIB, 6 * MIB)
    assert report["same"] and report["written"]
    assert os.listdir(tmp_path) == []         # the tmpfs was the child's own
