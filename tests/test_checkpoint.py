"""Checkpoints: save and load give the same buffer, atomically, and refuse every bad file.

* Round trips: with the same seed, a view of the original and the loaded copy sample identical
  batches (every array), and go on identically through updates, adds and clears; the trees are
  bit for bit equal. Wrapped, cleared, partial, empty and torn buffers; N-step config.
* Consistency: saves taken while another process adds and another updates give a buffer whose
  rows, tree and counters agree with each other.
* Atomicity: a process saving in a loop is SIGKILLed at random moments; the file at the path
  always loads and holds one of the states saved, and no temporary file survives the next save.
* Refusals: truncated files, a flipped byte anywhere, other format versions, the other kind, a
  foreign layout and crafted descriptions each give a ValueError naming the file.
* Hostile arguments: an int is not taken as a file descriptor, a FIFO or a device is refused
  without blocking, a save never replaces a FIFO or a live segment, and a damaged transitions
  file gives a ValueError naming it.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import re
import signal
import stat
import struct
import subprocess
import sys
import time
import zlib

import numpy as np
import pytest

import cpprb_ray
from cpprb_ray import _atomic, checkpoint

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
if TESTS_DIR not in sys.path:  # forkserver children import the workers from the parent's path
    sys.path.insert(0, TESTS_DIR)

import _checkpoint_workers  # noqa: E402
import _workers  # noqa: E402
from _workers import ENV, rows  # noqa: E402

TIMEOUT = 60.0


def context():
    return multiprocessing.get_context("forkserver")


def make(kind: str, capacity: int, backend: str, **options):
    if kind == "prioritized":
        return cpprb_ray.PrioritizedReplayBuffer(capacity, ENV, backend=backend, alpha=0.7,
                                                 eps=1e-3, **options)
    return cpprb_ray.ReplayBuffer(capacity, ENV, backend=backend, **options)


def fill(rb, scenario: str) -> None:
    """Bring `rb` (64 slots) into one of the states a buffer can be in."""
    prioritized = isinstance(rb, cpprb_ray.PrioritizedReplayBuffer)
    rng = np.random.default_rng(7)

    def add(first: int, count: int) -> None:
        batch = rows(first, count)
        if prioritized and first % 2:
            priorities = rng.random(count) * 3.0
            priorities[::5] = 0.0
            rb.add(priorities=priorities, **batch)
        else:
            rb.add(**batch)

    if scenario == "wrapped":      # full, overwritten more than once, priorities updated
        add(0, 50)
        add(51, 60)
        add(200, 37)
        if prioritized:
            batch = rb.sample(40)
            rb.update_priorities(batch["indexes"], rng.random(40) * 9.0, batch["generations"])
    elif scenario == "cleared":    # generations past the stored rows are not zero
        add(0, 57)
        rb.clear()
        add(101, 20)
    elif scenario == "partial":
        add(1, 11)
    # "empty": nothing


def compare_samples(original, copy, prioritized: bool, batches: int = 40) -> None:
    rng = np.random.default_rng(3)
    for _ in range(batches):
        size = int(rng.integers(1, 100))
        if prioritized:
            beta = float(rng.random())
            a, b = original.sample(size, beta), copy.sample(size, beta)
        else:
            a, b = original.sample(size), copy.sample(size)
        assert sorted(a) == sorted(b)
        for key in a:
            assert a[key].dtype == b[key].dtype, key
            assert np.array_equal(a[key], b[key]), key


def assert_same_state(original, copy) -> None:
    assert type(copy) is type(original)
    assert copy.get_stored_size() == original.get_stored_size()
    assert copy.get_next_index() == original.get_next_index()
    assert copy._store.rows_added == original._store.rows_added
    assert copy.env_dict == original.env_dict
    assert copy.nstep == original.nstep
    assert copy.get_buffer_size() == original.get_buffer_size()
    mine, theirs = original.get_all_transitions(), copy.get_all_transitions()
    assert all(np.array_equal(mine[key], theirs[key]) for key in mine)
    slots = np.arange(original.get_buffer_size())
    assert np.array_equal(copy._store.generations_of(slots), original._store.generations_of(slots))
    if isinstance(original, cpprb_ray.PrioritizedReplayBuffer):
        assert copy.get_max_priority() == original.get_max_priority()
        header_a = cpprb_ray._segment.read_header(original._segment.memory)
        header_b = cpprb_ray._segment.read_header(copy._segment.memory)
        assert (header_a["alpha"], header_a["eps"]) == (header_b["alpha"], header_b["eps"])
        root_sum, sums, root_min, mins = original._store.check_tree()
        copy_sum, copy_sums, copy_min, copy_mins = copy._store.check_tree()
        # Bit for bit: the loaded tree is rebuilt from the leaves, the original grew by updates.
        assert sums.tobytes() == copy_sums.tobytes()
        assert (root_sum, root_min) == (copy_sum, copy_min)
        assert _workers.tree_problems(copy._store.check_tree()) == []


@pytest.mark.parametrize("kind", ["prioritized", "uniform"])
@pytest.mark.parametrize("scenario", ["wrapped", "cleared", "partial", "empty"])
def test_loaded_buffer_is_the_same_buffer(kind, scenario, backend, tmp_path):
    """Same seed, same batches; then the same after updates, adds and a clear on both."""
    file = tmp_path / "rb.ckpt"
    prioritized = kind == "prioritized"
    with make(kind, 64, backend) as rb:
        fill(rb, scenario)
        rb.save(file)
        path = {"path": str(tmp_path / "copy.buf")} if backend == "mmap" else {}
        cls = type(rb)
        with cls.attach(rb.name, seed=11) as view, \
                cls.load(file, backend=backend, seed=11, **path) as copy:
            assert copy.is_owner and copy.backend == backend and copy.name != rb.name
            if path:
                assert copy.name == path["path"]
            assert_same_state(rb, copy)
            view.save(tmp_path / "from_view.ckpt")   # any handle saves the same file
            assert (tmp_path / "from_view.ckpt").read_bytes() == file.read_bytes()
            if scenario == "empty":
                for handle in (view, copy):
                    with pytest.raises(ValueError, match="empty"):
                        handle.sample(1)
            else:
                compare_samples(view, copy, prioritized)
            rng = np.random.default_rng(5)
            for step in range(6):  # the same operations on both keep them the same
                if step == 3:
                    view.clear()
                    copy.clear()
                batch = rows(1000 + 30 * step, 1 + 13 * step)
                if prioritized and step % 2:
                    priorities = rng.random(len(batch["act"])) * 2.0
                    assert view.add(priorities=priorities, **batch) == \
                        copy.add(priorities=priorities, **batch)
                else:
                    assert view.add(**batch) == copy.add(**batch)
                if prioritized:
                    sampled = view.sample(32)
                    assert np.array_equal(sampled["indexes"], copy.sample(32)["indexes"])
                    new = rng.random(32) * 5.0
                    assert view.update_priorities(sampled["indexes"], new,
                                                  sampled["generations"]) == \
                        copy.update_priorities(sampled["indexes"], new, sampled["generations"])
                compare_samples(view, copy, prioritized, batches=5)
            assert_same_state(rb, copy)


def test_torn_rows_stay_torn(backend, tmp_path):
    """Slots a dead writer tore inside the stored range are copied torn and never sampled."""
    with cpprb_ray.PrioritizedReplayBuffer(64, ENV, backend=backend) as rb:
        rb.add(**rows(0, 64))
        rb.add(**rows(64, 5))    # slots 0..4: its pending range stays in the header
        child = context().Process(target=_workers.die_holding_the_lock,
                                  args=(rb.name, {"op": 1}))   # killed mid-add: OP_ADD
        child.start()
        child.join(TIMEOUT)
        assert child.exitcode == 0
        rb.save(tmp_path / "rb.ckpt")     # takes the lock: repairs, slots 0..4 torn
        assert rb._store.repairs == 1
        torn = rb._store.generations_of(np.arange(5))
        assert (torn % 2 == 1).all()
        with cpprb_ray.PrioritizedReplayBuffer.load(tmp_path / "rb.ckpt", backend=backend,
                                                    seed=1) as copy:
            assert np.array_equal(copy._store.generations_of(np.arange(5)), torn)
            assert copy.get_stored_size() == 64
            assert len(copy.get_all_transitions()["act"]) == 59
            with cpprb_ray.PrioritizedReplayBuffer.attach(rb.name, seed=1) as view:
                compare_samples(view, copy, True)
            for _ in range(20):
                batch = copy.sample(256)
                assert _workers.check_sample(copy, batch) == []
                assert (batch["indexes"] >= 5).all()


def test_nstep_config_is_saved_and_staging_is_not(tmp_path):
    env = {"obs": {"dtype": np.float64}, "rew": {}, "next_obs": {"dtype": np.float64},
           "done": {}}
    spec = {"size": 3, "gamma": 0.5, "rew": "rew", "next": "next_obs"}
    with cpprb_ray.PrioritizedReplayBuffer(32, env, Nstep=spec, seed=2) as rb:
        for step in range(10):
            rb.add(obs=step, rew=1.0, next_obs=step + 1, done=float(step == 6))
        staged = rb._writer.staged
        assert staged > 0
        rb.save(tmp_path / "rb.ckpt")
        stored = rb.get_stored_size()
        with cpprb_ray.PrioritizedReplayBuffer.load(tmp_path / "rb.ckpt", seed=4) as copy:
            assert copy.nstep == rb.nstep == {"size": 3, "gamma": 0.5, "rew": ["rew"],
                                              "next": ["next_obs"]}
            assert copy.get_stored_size() == stored      # the staged steps are not in it
            assert copy._writer.staged == 0
            with cpprb_ray.PrioritizedReplayBuffer.attach(rb.name, seed=4) as view:
                compare_samples(view, copy, True)
                assert "discounts" in copy.sample(4)
            copy.add(obs=20.0, rew=1.0, next_obs=21.0, done=1.0)   # N-step staging works
            assert copy.get_stored_size() == stored + 1


@pytest.mark.parametrize("capacity", [4096, 1 << 18])
def test_save_while_other_processes_add_and_update(backend, tmp_path, capacity):
    """A writer adds rows of consecutive serials and an updater changes priorities while the
    parent saves: every checkpoint holds exactly the last `stored` serials in their ring slots,
    its counters agree, its tree is exact, and no torn row is ever sampled from it. At 2**18
    rows the save copies them in chunks, each under its own hold of the lock, while the
    writer adds between them; the slots it wrote meanwhile are copied again in the last."""
    ctx = context()
    start = 64 if capacity == 4096 else capacity      # the big one full: every chunk copies
    with cpprb_ray.PrioritizedReplayBuffer(capacity, ENV, backend=backend) as rb:
        rb.add(**rows(0, start))
        progress = ctx.Value("q", start)
        writer_ready, updater_ready = ctx.Event(), ctx.Event()
        writer = ctx.Process(target=_workers.kill_writer,
                             args=(rb, start, 97, progress, writer_ready))
        updater = ctx.Process(target=_workers.kill_updater, args=(rb, updater_ready))
        writer.start()
        updater.start()
        files = []
        try:
            assert writer_ready.wait(TIMEOUT) and updater_ready.wait(TIMEOUT)
            for k in range(8):
                time.sleep(0.02)
                files.append(tmp_path / f"rb{k}.ckpt")
                rb.save(files[-1])
            holds = rb._image.dump()[0]["lock_holds"]
            stride = rb._layout.row_stride
            # A start, a hold per 4 MiB of rows (one whole copy only if writers outpaced it
            # three times), and the last.
            assert holds >= 2 + capacity * stride // (4 << 20) or holds == 7, holds
        finally:
            for child in (writer, updater):
                child.kill()
                child.join(TIMEOUT)
        states = set()
        for file in files:
            with cpprb_ray.PrioritizedReplayBuffer.load(file, backend=backend) as copy:
                stored, added = copy.get_stored_size(), copy._store.rows_added
                states.add(added)
                assert added >= start and (added - start) % 97 == 0     # whole adds only
                assert stored == min(added, capacity)
                assert copy.get_next_index() == added % capacity
                everything = copy.get_all_transitions()
                assert np.array_equal(everything["act"].ravel(),
                                      _checkpoint_workers.saved_state(capacity, added))
                assert len(_workers.torn(everything)) == 0
                assert _workers.tree_problems(copy._store.check_tree()) == []
                _, sums, _, _ = copy._store.check_tree()
                assert (sums[:stored] > 0).all() and (sums[stored:] == 0).all()
                for _ in range(10):
                    assert _workers.check_sample(copy, copy.sample(256)) == []
        assert len(states) > 1, "the writer added nothing between the saves"


def _kill_while_saving(tmp_path, anonymous: bool, kills: int) -> None:
    file = str(tmp_path / "rb.ckpt")
    capacity = 1 << 16
    ctx = context()
    killed = []
    states = set()
    temporaries_seen = 0
    for round_ in range(kills):
        saves = ctx.Value("q", 0)
        receiver, sender = ctx.Pipe(duplex=False)
        child = ctx.Process(target=_checkpoint_workers.save_forever,
                            args=(sender, file, capacity, anonymous, saves))
        child.start()
        try:
            assert receiver.poll(TIMEOUT), "the saver never started"
            backend, name = receiver.recv()
            # Random moments: before the first save is whole, and inside later ones.
            deadline = time.monotonic() + TIMEOUT
            wanted = random.randint(0 if round_ % 3 else 1, 3)
            while saves.value < wanted and time.monotonic() < deadline:
                time.sleep(0.001)
            time.sleep(random.uniform(0.0, 0.08))
        finally:
            child.kill()
            child.join(TIMEOUT)
            cpprb_ray.remove_buffer(name)
        killed.append(child.pid)
        if os.path.exists(file):
            with cpprb_ray.PrioritizedReplayBuffer.load(file) as copy:
                added = copy._store.rows_added
                states.add(added)
                assert added > 0 and added % _checkpoint_workers.SAVE_BATCH == 0
                everything = copy.get_all_transitions()
                assert np.array_equal(everything["act"].ravel(),
                                      _checkpoint_workers.saved_state(capacity, added))
                assert len(_workers.torn(everything)) == 0
                assert _workers.tree_problems(copy._store.check_tree()) == []
        leftovers = [name for name in os.listdir(tmp_path) if name != "rb.ckpt"]
        temporaries_seen += len(leftovers)
        for leftover in leftovers:   # only temporaries of the killed savers
            assert leftover.startswith(".rb.ckpt.") and leftover.endswith(".tmp"), leftover
            assert int(leftover.rsplit(".", 3)[1]) in killed, leftover
    assert os.path.exists(file), "no save ever completed"
    assert len(states) > 1, f"every kill left the same checkpoint {states}"
    if not anonymous:   # most kills land while a save writes (about 2/3 of its time)
        assert temporaries_seen > 0, "no kill landed while a save was writing its file"
    checkpoint.remove_stale_temporaries(file)
    assert os.listdir(tmp_path) == ["rb.ckpt"]


@pytest.mark.parametrize("temporary", ["anonymous", "named"])
def test_save_killed_at_any_moment_leaves_a_whole_checkpoint(temporary, tmp_path):
    _kill_while_saving(tmp_path, temporary == "anonymous", kills=8)


class _Interrupted(Exception):
    """What the test's SIGALRM handler raises, as a KeyboardInterrupt or SystemExit would."""


@pytest.mark.parametrize("temporary", ["anonymous", "named"])
def test_saves_interrupted_by_a_signal_handler_leave_no_temporary_behind(temporary, tmp_path,
                                                                         monkeypatch):
    # An exception from a signal handler lands right after the system call it interrupted: after
    # the temporary's open or link it left the name behind (about one interrupted save in 40),
    # and in a process that lives on (a caught KeyboardInterrupt) no later save removed it, as
    # saves removed dead processes' temporaries only.
    monkeypatch.setattr(_atomic, "_ANONYMOUS_TEMPORARY", temporary == "anonymous")
    file = str(tmp_path / "notes")
    chunk = b"x" * 65536

    def interrupt(signum, frame):
        raise _Interrupted()

    previous = signal.signal(signal.SIGALRM, interrupt)
    interrupted = 0
    delays = random.Random(0)
    try:
        for _ in range(1500):
            try:
                signal.setitimer(signal.ITIMER_REAL, delays.uniform(1e-6, 400e-6))
                try:
                    _atomic.write_atomically(file, [chunk])
                finally:
                    signal.setitimer(signal.ITIMER_REAL, 0)
            except _Interrupted:
                interrupted += 1
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert interrupted > 100, f"only {interrupted} of 1500 saves were interrupted"
    _atomic.write_atomically(file, [b"last"])   # an uninterrupted save cleans up
    assert os.listdir(tmp_path) == ["notes"]
    with open(file, "rb") as handle:
        assert handle.read() == b"last"


# -- refusals -------------------------------------------------------------------------------------

@pytest.fixture
def saved(tmp_path):
    """A small prioritized checkpoint's path and bytes."""
    file = tmp_path / "rb.ckpt"
    with cpprb_ray.PrioritizedReplayBuffer(16, ENV) as rb:
        rb.add(priorities=np.arange(10) + 0.5, **rows(0, 10))
        rb.save(file)
    return file, file.read_bytes()


def refused(file, match: str):
    return pytest.raises(ValueError, match=rf"^'{file}' is not a loadable cpprb_ray "
                                           rf"checkpoint: .*{match}")


def test_truncated_files_are_refused(saved):
    file, data = saved
    description_end = 64 + struct.unpack_from("<Q", data, 16)[0]
    for length in (0, 5, 63, 64, 100, description_end, description_end + 7, len(data) - 1):
        file.write_bytes(data[:length])
        with refused(file, "truncated"):
            cpprb_ray.PrioritizedReplayBuffer.load(file)
    file.write_bytes(data + b"\0")
    with refused(file, "past the end"):
        cpprb_ray.PrioritizedReplayBuffer.load(file)


def test_a_flipped_byte_anywhere_is_refused(saved):
    file, data = saved
    description_end = 64 + struct.unpack_from("<Q", data, 16)[0]
    positions = sorted(set(list(range(0, 64)) + random.sample(range(64, description_end), 40)
                           + random.sample(range(description_end, len(data)), 200)
                           + [len(data) - 1]))
    for position in positions:
        for flip in (0x01, 0x80, 0xFF):
            corrupt = bytearray(data)
            corrupt[position] ^= flip
            file.write_bytes(bytes(corrupt))
            where = ("magic" if position < 8 else "prefix" if position < 64 else
                     "description" if position < description_end else "payload")
            with refused(file, where):
                cpprb_ray.PrioritizedReplayBuffer.load(file)


def _rewrite_prefix(file, data: bytes, **fields) -> None:
    values = dict(zip(("magic", "version", "prefix_size", "text_length", "payload_length",
                       "text_crc", "payload_crc", "reserved", "crc"),
                      checkpoint._PREFIX.unpack(data[:64])))
    values.update(fields)
    head = checkpoint._PREFIX.pack(*values.values())[:-4]
    file.write_bytes(head + struct.pack("<I", zlib.crc32(head)) + data[64:])


def test_another_format_version_is_refused(saved):
    file, data = saved
    _rewrite_prefix(file, data, version=checkpoint.FORMAT_VERSION + 1)
    with refused(file, f"format version {checkpoint.FORMAT_VERSION + 1}; this cpprb_ray reads "
                       f"versions 1 to {checkpoint.FORMAT_VERSION}"):
        cpprb_ray.PrioritizedReplayBuffer.load(file)


def test_files_that_are_not_checkpoints_are_refused(tmp_path):
    file = tmp_path / "notes.txt"
    file.write_bytes(b"hello, world " * 20)
    with refused(file, "magic"):
        cpprb_ray.ReplayBuffer.load(file)
    with cpprb_ray.ReplayBuffer(4, ENV, backend="mmap", path=str(tmp_path / "seg.buf")) as rb:
        with refused(tmp_path / "seg.buf", "magic"):    # a live segment is not a checkpoint
            cpprb_ray.ReplayBuffer.load(rb.name)
    with pytest.raises(FileNotFoundError):
        cpprb_ray.ReplayBuffer.load(tmp_path / "missing.ckpt")
    with pytest.raises(IsADirectoryError):
        cpprb_ray.ReplayBuffer.load(tmp_path)


def test_kinds_are_decided_like_attach(tmp_path):
    """PrioritizedReplayBuffer.load refuses a uniform buffer's file; ReplayBuffer.load loads
    either kind as that kind, as attach does."""
    uniform, prioritized = tmp_path / "uniform.ckpt", tmp_path / "prioritized.ckpt"
    with cpprb_ray.ReplayBuffer(8, ENV) as rb:
        rb.add(**rows(0, 3))
        rb.save(uniform)
    with cpprb_ray.PrioritizedReplayBuffer(8, ENV) as rb:
        rb.add(**rows(0, 3))
        rb.save(prioritized)
    with refused(uniform, r"uniform buffer; load it with ReplayBuffer\.load\(\)"):
        cpprb_ray.PrioritizedReplayBuffer.load(uniform)
    with cpprb_ray.ReplayBuffer.load(uniform) as copy:
        assert type(copy) is cpprb_ray.ReplayBuffer
    with cpprb_ray.ReplayBuffer.load(prioritized) as copy:
        assert type(copy) is cpprb_ray.PrioritizedReplayBuffer
        assert copy.get_stored_size() == 3


def _crafted(file, change) -> None:
    """Rewrite a checkpoint with its description changed by `change`, with valid checksums: the
    checks behind the checksums."""
    description, sections = checkpoint.read_file(file)
    del description["sections"]
    version = description.pop("format_version")
    sections = {name: bytearray(view) for name, view in sections.items()}
    change(description, sections)
    checkpoint.write_file(file, description, list(sections.items()), version)


def _set(path, value):
    def change(description, sections):
        target = description
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
    return change


def _leaf(index, value):
    def change(description, sections):
        np.frombuffer(sections["leaves"], dtype=np.float64)[index] = value
    return change


def _tear(description, sections):   # slot 0: odd generation, its leaf still set
    np.frombuffer(sections["rows"], dtype=np.uint64)[0] |= np.uint64(1)


@pytest.mark.parametrize("change, match", [
    (_set(["kind"], "lifo"), "unknown kind"),
    (_set(["capacity"], 0), "capacity"),
    (_set(["capacity"], "16"), "capacity must be an integer"),
    (_set(["alpha"], -1.0), "alpha"),
    (_set(["state", "stored_size"], 17), "stored size 17 of 16"),
    (_set(["state", "next_index"], 3), "next index 3"),
    (_set(["state", "max_priority"], -2.0), "max priority"),
    (_set(["env_dict", "obs", "dtype"], "object"), "dtype"),
    (_set(["env_dict", "extra"], {"shape": [1], "dtype": "<f4"}), "columns are not those"),
    (_set(["nstep"], {"size": 0}), "Nstep"),   # ({"size": 2} alone is a valid spec, as cpprb's)
    (_set(["row_stride"], 64), "bytes of rows"),
    (_set(["columns", 1, "offset"], 12), "row layout differs"),
    (_leaf(2, float("nan")), "leaf 2 is nan"),
    (_leaf(3, 0.0), "leaf 3 is 0.0"),
    (_leaf(4, -1.0), "leaf 4 is -1.0"),
    (_leaf(5, 1e308), "leaf 5 is 1e[+]308, more than the .* that keeps the total of 16 slots "
                      "finite"),
    (_tear, "slot 0 is torn"),
    (lambda description, sections: sections.pop("leaves"), "missing"),
    (lambda description, sections: sections.update(tail_generations=bytearray(3)),
     "not whole uint64"),
])
def test_crafted_descriptions_are_refused(saved, change, match):
    file, _ = saved
    _crafted(file, change)
    with refused(file, match):
        cpprb_ray.PrioritizedReplayBuffer.load(file)


def test_a_refused_load_leaves_no_segment(saved):
    """The layout check runs after the new buffer exists: a refusal frees it (the autouse
    fixture fails the test if a segment leaks)."""
    file, _ = saved
    _crafted(file, _set(["columns", 1, "offset"], 12))
    with refused(file, "row layout differs"):
        cpprb_ray.PrioritizedReplayBuffer.load(file, backend="mmap")


@pytest.fixture
def saved_large(tmp_path):
    """A prioritized checkpoint of more than three read chunks (the checksums then run on a
    thread while the reads go on) whose rows a load reads into its new segment."""
    file = tmp_path / "large.ckpt"
    env = {"obs": {"shape": 4096, "dtype": np.uint8}, "rew": {}}
    with cpprb_ray.PrioritizedReplayBuffer(2**14, env) as rb:
        rng = np.random.default_rng(3)
        for _ in range(4):
            rb.add(obs=rng.integers(0, 255, (4096, 4096), dtype=np.uint8),
                   rew=rng.random(4096), priorities=rng.random(4096) + 0.1)
        rb.save(file)
        assert os.path.getsize(file) > 3 * checkpoint._READ_CHUNK
        with cpprb_ray.PrioritizedReplayBuffer.load(file) as copy:
            assert_same_state(rb, copy)
    return file, file.read_bytes()


def test_a_large_load_refused_for_its_payload_frees_its_segment(saved_large):
    """A flipped byte in the rows (read into the new segment, checksummed on a thread), and a
    payload whose checksums match but whose rows are inconsistent (a torn row with a weight,
    found while the last checksums are made): each load is refused, its segment freed and its
    name free again (the autouse fixture fails the test if a segment leaks)."""
    file, data = saved_large
    name = f"cpprb_ray_test_large_load_{os.getpid()}"
    corrupt = bytearray(data)
    corrupt[len(data) // 2] ^= 0x10
    file.write_bytes(bytes(corrupt))
    with refused(file, "payload's checksum does not match"):
        cpprb_ray.PrioritizedReplayBuffer.load(file, name=name)
    file.write_bytes(data)

    def tear(description, sections):
        sections["rows"][description["row_stride"] * 5] |= 1   # slot 5's generation: odd

    _crafted(file, tear)
    with refused(file, "slot 5 is torn"):
        cpprb_ray.PrioritizedReplayBuffer.load(file, name=name)
    file.write_bytes(data)
    with cpprb_ray.PrioritizedReplayBuffer.load(file, name=name) as copy:
        assert os.path.basename(copy.name) == name and copy.get_stored_size() == 2**14


def test_save_errors(tmp_path):
    with cpprb_ray.ReplayBuffer(4, ENV) as rb:
        rb.add(**rows(0, 2))
        with pytest.raises(IsADirectoryError):
            rb.save(tmp_path)
        with pytest.raises(FileNotFoundError):
            rb.save(tmp_path / "no" / "such" / "dir.ckpt")
        rb._layout.meta["rate_limit"] = {"ratio": 8}     # a feature checkpoints do not know
        with pytest.raises(ValueError, match=r"uses \['rate_limit'\], which this cpprb_ray's "
                                             r"checkpoints do not record"):
            rb.save(tmp_path / "rb.ckpt")
        del rb._layout.meta["rate_limit"]
        rb.save(tmp_path / "rb.ckpt")
    with pytest.raises(ValueError, match="closed"):
        rb.save(tmp_path / "rb.ckpt")
    assert sorted(os.listdir(tmp_path)) == ["rb.ckpt"]


def test_save_replaces_the_previous_checkpoint(tmp_path):
    file = tmp_path / "rb.ckpt"
    with cpprb_ray.ReplayBuffer(8, ENV) as rb:
        rb.add(**rows(0, 2))
        rb.save(file)
        rb.add(**rows(2, 3))
        rb.save(str(file))
    with cpprb_ray.ReplayBuffer.load(str(file)) as copy:
        assert copy.get_all_transitions()["act"].ravel().tolist() == [0, 1, 2, 3, 4]
    assert os.listdir(tmp_path) == ["rb.ckpt"]
    assert os.stat(file).st_mode & 0o777 == 0o600


# -- hostile arguments and files ------------------------------------------------------------------

def test_file_must_be_a_path_and_an_fd_is_never_used(tmp_path):
    """An int is not taken as a file descriptor: load(3) once read fd 3 and closed it."""
    receiver, sender = os.pipe()
    try:
        with cpprb_ray.ReplayBuffer(4, ENV) as rb:
            rb.add(**rows(0, 2))
            for bad in (receiver, None, 1.5, ["rb.ckpt"]):
                with pytest.raises(TypeError, match=r"^file must be a path .*got "
                                                    rf"{type(bad).__name__}$"):
                    rb.save(bad)
                with pytest.raises(TypeError, match=r"^file must be a path .*got "
                                                    rf"{type(bad).__name__}$"):
                    cpprb_ray.ReplayBuffer.load(bad)
            os.fstat(receiver)     # still open
            rb.save(os.fsencode(tmp_path / "rb.ckpt"))     # a bytes path is a path
        with cpprb_ray.ReplayBuffer.load(os.fsencode(tmp_path / "rb.ckpt")) as copy:
            assert copy.get_stored_size() == 2
    finally:
        os.close(receiver)
        os.close(sender)
    assert os.listdir(tmp_path) == ["rb.ckpt"]


def _in_child(target, *args, timeout: float = 20.0):
    """Run `target(*args)` in a child; its outcome ("ok" or the exception's type and text), or
    "hung" when it did not finish in `timeout` seconds (then the child is killed)."""
    receiver, sender = context().Pipe(duplex=False)
    child = context().Process(target=_checkpoint_workers.report, args=(sender, target) + args)
    child.start()
    try:
        if not receiver.poll(timeout):
            return "hung"
        return receiver.recv()
    finally:
        child.kill()
        child.join(TIMEOUT)


def test_a_fifo_or_a_device_is_refused_without_blocking(tmp_path):
    """Opening a FIFO for reading blocks until a writer comes: a load of one hung forever."""
    fifo = tmp_path / "rb.ckpt"
    os.mkfifo(fifo)
    outcome = _in_child(_checkpoint_workers.load_checkpoint, str(fifo))
    assert outcome == ("ValueError", f"'{fifo}' is not a loadable cpprb_ray checkpoint: it is a "
                                     f"FIFO, not a regular file")
    with refused("/dev/null", "it is a character device, not a regular file"):
        cpprb_ray.ReplayBuffer.load("/dev/null")
    outcome = _in_child(_checkpoint_workers.load_transitions, str(fifo))
    assert outcome == ("ValueError", f"file '{fifo}' is a FIFO, not a regular file")
    fifo_npz = tmp_path / "rb.npz"        # np.savez opened it for writing: blocked too
    os.mkfifo(fifo_npz)
    outcome = _in_child(_checkpoint_workers.save_transitions, str(fifo_npz))
    assert outcome == ("ValueError", f"file '{fifo_npz}' is a FIFO, not a regular file")
    assert sorted(os.listdir(tmp_path)) == ["rb.ckpt", "rb.npz"]


def test_save_transitions_refuses_a_fifo_that_a_process_reads_and_writes_nothing(tmp_path):
    """With a reader at the other end, opening a FIFO for writing does not fail: what was
    opened is checked (fstat) before a byte goes out. (The check was a stat() of the path,
    then np.savez opened the path itself, so a FIFO swapped in between blocked it: a race this
    test cannot stage; it holds the behaviour the fix keeps.)"""
    fifo = tmp_path / "rows.npz"
    os.mkfifo(fifo)
    (tmp_path / "folder.npz").mkdir()
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        with cpprb_ray.ReplayBuffer(8, ENV) as rb:
            rb.add(**rows(0, 2))
            with pytest.raises(ValueError, match=rf"^file '{fifo}' is a FIFO, not a regular "
                                                 rf"file$"):
                rb.save_transitions(fifo)
            with pytest.raises(IsADirectoryError):
                rb.save_transitions(tmp_path / "folder")     # ".npz" is appended
        assert os.read(reader, 16) == b""        # nothing was written (no writer is left)
    finally:
        os.close(reader)
    assert sorted(os.listdir(tmp_path)) == ["folder.npz", "rows.npz"]


def test_save_replaces_only_regular_files(tmp_path):
    """A save renamed its file over whatever was at the path: a FIFO, a device node (as root,
    /dev/null), or the buffer's own live segment, which then lost its name (no process could
    attach any more) and left the checkpoint behind in /dev/shm."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with cpprb_ray.ReplayBuffer(4, ENV, backend="mmap", path=str(tmp_path / "seg.buf")) as rb, \
            cpprb_ray.ReplayBuffer(4, ENV) as other:   # shm where it exists
        rb.add(**rows(0, 2))
        with pytest.raises(ValueError, match=rf"^file '{fifo}' is a FIFO, not a regular file"):
            rb.save(fifo)
        assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
        for segment in (rb.name, os.path.join("/dev/shm", other.name)):
            if not os.path.exists(segment):
                continue
            with pytest.raises(ValueError, match=rf"^file '{segment}' is a cpprb_ray buffer's "
                                                 rf"segment, not a checkpoint"):
                rb.save(segment)
        with cpprb_ray.ReplayBuffer.attach(rb.name) as view:
            assert view.get_stored_size() == 2
        with cpprb_ray.ReplayBuffer.attach(other.name) as view:
            assert view.get_stored_size() == 0
        (tmp_path / "old.ckpt").write_bytes(b"anything else is replaced")
        rb.save(tmp_path / "old.ckpt")
    with cpprb_ray.ReplayBuffer.load(tmp_path / "old.ckpt") as copy:
        assert copy.get_stored_size() == 2
    assert sorted(os.listdir(tmp_path)) == ["fifo", "old.ckpt"]


def _raw_checkpoint(file, text: bytes, payload: bytes = b"", version: int = 1) -> None:
    """A file with a valid prefix and checksums around `text` and `payload`."""
    text += b" " * ((-len(text)) % 64)
    head = checkpoint._PREFIX.pack(checkpoint.MAGIC, version, 64, len(text), len(payload),
                                   zlib.crc32(text), zlib.crc32(payload), bytes(20), 0)[:-4]
    file.write_bytes(head + struct.pack("<I", zlib.crc32(head)) + text + payload)


@pytest.mark.parametrize("text, match", [
    (b"[" * 100000 + b"]" * 100000, "unreadable description"),
    (b'{"sections": {"rows": [0, 1e400]}}', "unreadable description"),
    (b'{"sections": {"rows": [0.5, 0]}}', "unreadable description"),
])
def test_crafted_json_is_refused(tmp_path, text, match):
    """A description nested too deeply raised RecursionError, an infinite section length
    OverflowError, instead of the refusal."""
    file = tmp_path / "rb.ckpt"
    _raw_checkpoint(file, text)
    with refused(file, match):
        cpprb_ray.ReplayBuffer.load(file)


@pytest.mark.parametrize("change, match", [
    (_set(["state", "rows_added"], -5), "rows added -5"),
    (_set(["state", "rows_added"], 1 << 70), "rows added 1180591620717411303424"),
    (lambda description, sections: (_set(["alpha"], 2.0)(description, sections),
                                    _set(["state", "max_priority"], 1e300)(description, sections)),
     "max_priority"),
    (_set(["state", "max_priority"], "2.0"), "max_priority must be a number"),
    (_set(["eps"], "0.1"), "eps must be a number"),
    (_set(["capacity"], 1 << 62),
     r"size 4611686018427387904 makes a segment of more than 2\*\*63 - 1 bytes"),
    (_set(["alpha"], True), "alpha must be a number"),
    # Fewer rows ever added than stored: no writer leaves that (it loaded before).
    (_set(["state", "rows_added"], 5), "rows added 5 with 10 rows stored"),
])
def test_crafted_state_is_refused(saved, change, match):
    """rows_added out of uint64 raised OverflowError; a max priority whose weight overflows the
    tree was loaded, and the loaded buffer's next add made its total inf; strings were read as
    numbers."""
    file, _ = saved
    _crafted(file, change)
    with refused(file, match):
        cpprb_ray.PrioritizedReplayBuffer.load(file)


def test_a_foreign_layout_is_refused_before_a_buffer_is_made(saved):
    """The layout was checked only after the new buffer was made: a crafted file with a
    foreign layout and a huge capacity failed with "no space" instead of the refusal."""
    file, _ = saved
    _crafted(file, lambda description, sections: (
        _set(["columns", 1, "offset"], 12)(description, sections),
        _set(["capacity"], 1 << 45)(description, sections)))
    with refused(file, "row layout differs"):
        cpprb_ray.PrioritizedReplayBuffer.load(file)


def test_a_prefix_of_another_version_names_the_version(saved):
    """A later format may change the prefix past the version field: its checksum then does not
    match ours, and the refusal must still name both versions, not only "corrupt"."""
    file, data = saved
    other = bytearray(data)
    struct.pack_into("<II", other, 8, checkpoint.FORMAT_VERSION + 1, 128)
    file.write_bytes(bytes(other))
    with refused(file, f"format version {checkpoint.FORMAT_VERSION + 1}.*versions 1 to "
                       f"{checkpoint.FORMAT_VERSION}"):
        cpprb_ray.PrioritizedReplayBuffer.load(file)


def test_a_corrupt_transitions_file_is_refused(tmp_path):
    """A flipped byte or a cut anywhere in a transitions file gives a ValueError naming the
    file (it gave zipfile's BadZipFile, zlib.error, EOFError, NotImplementedError...), and the
    buffer is unchanged."""
    file = tmp_path / "rb.npz"
    with cpprb_ray.ReplayBuffer(64, ENV) as rb:
        rb.add(**rows(0, 10))
        rb.save_transitions(file)
        data = file.read_bytes()
        loaded = 0
        for position in range(len(data)):
            for flip in (0x01, 0x80, 0xFF):
                corrupt = bytearray(data)
                corrupt[position] ^= flip
                file.write_bytes(bytes(corrupt))
                before = rb._store.rows_added
                try:
                    rb.load_transitions(file)
                    loaded += 1     # a flip in zip metadata that nothing reads
                except ValueError as error:
                    assert str(error).startswith(repr(file)), error
                    assert rb._store.rows_added == before
        assert loaded < 3 * len(data)
        for length in range(0, len(data), 7):
            file.write_bytes(data[:length])
            with pytest.raises(ValueError, match="^" + re.escape(repr(file))):
                rb.load_transitions(file)
        for method in (rb.load_transitions, rb.save_transitions):
            with pytest.raises(TypeError, match=r"^file must be a path .* or a binary file "
                                                r"object; got int$"):
                method(3)


LOAD_LIMITED = """
import resource, sys
import cpprb_ray
resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
try:
    cpprb_ray.ReplayBuffer.load(sys.argv[1])
except ValueError as error:
    print("ValueError:", error)
except BaseException as error:
    print(f"{type(error).__name__}: {error}")
"""


def _load_with_1_gib(file) -> str:
    """ReplayBuffer.load(file) in a child process that may map 1 GiB: what it
    raised, as "Type: message"."""
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    result = subprocess.run([sys.executable, "-c", LOAD_LIMITED, str(file)], capture_output=True,
                            text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def _declaring(file, data: bytes, payload_length: int) -> None:
    """`data` (a checkpoint) with its prefix saying `payload_length`, as a sparse file of that
    apparent size: the lengths agree with the file's size, and nothing else does."""
    head = bytearray(data[:64])
    struct.pack_into("<Q", head, 24, payload_length)
    struct.pack_into("<I", head, 60, zlib.crc32(bytes(head[:60])))
    text_length = struct.unpack_from("<Q", head, 16)[0]
    with open(file, "wb") as handle:
        handle.write(bytes(head) + data[64:64 + text_length])
        handle.truncate(64 + text_length + payload_length)


@pytest.mark.parametrize("gib", [2, 40])
def test_a_declared_payload_is_not_allocated_before_the_description_accounts_for_it(saved, gib):
    """A sparse file of a few KB on disk whose prefix declares a 2 or 40 GiB payload: 40 GiB
    was numpy's MemoryError ("Unable to allocate 40.0 GiB"), 2 GiB was read whole (11.6 s, 2 GB
    of RSS) before its checksum failed. The description's sections must account for the
    payload before it is allocated; here, in a process that may map 1 GiB, a refusal naming
    the file."""
    file, data = saved
    _declaring(file, data, gib << 30)
    said = _load_with_1_gib(file)
    assert said.startswith(f"ValueError: '{file}' is not a loadable cpprb_ray checkpoint: its "
                           f"payload is {gib << 30} bytes, its sections "), said


def _consistent(description, sections, stored: int, capacity: int) -> None:
    """The description of a uniform buffer of `capacity` slots holding `stored` zero rows,
    each section as long as it says."""
    description.update(kind="uniform", capacity=capacity)
    description["state"].update(stored_size=stored, next_index=stored % capacity,
                                rows_added=stored)
    sections["rows"] = bytearray(stored * description["row_stride"])
    sections["tail_generations"] = bytearray(0)
    sections["leaves"] = bytearray(0)


def test_a_payload_this_process_cannot_hold_is_refused_before_it_is_read(saved):
    """A description consistent with 2 GiB of rows (checksums valid around it), in a process
    that may map 1 GiB: refused naming the file and the limit (its segment could not be held,
    nor its payload), before the payload is allocated or read (it was numpy's MemoryError)."""
    file, _ = saved
    description, sections = checkpoint.read_file(file)
    stored = (2 << 30) // description["row_stride"]
    _consistent(description, {}, stored, stored)
    rows = stored * description["row_stride"]
    end = (rows + 63) // 64 * 64
    description["sections"] = {"rows": [0, rows], "tail_generations": [end, 0],
                               "leaves": [end, 0]}
    text = json.dumps(description).encode()
    text += b" " * ((-len(text)) % 64)
    head = checkpoint._PREFIX.pack(checkpoint.MAGIC, 1, 64, len(text), end, zlib.crc32(text),
                                   0, bytes(20), 0)[:-4]
    with open(file, "wb") as handle:           # sparse: 2 GiB of rows that take no disk
        handle.write(head + struct.pack("<I", zlib.crc32(head)) + text)
        handle.truncate(64 + len(text) + end)
    said = _load_with_1_gib(file)
    assert said.startswith(f"ValueError: '{file}' is not a loadable cpprb_ray checkpoint: "), said
    assert "this process may use" in said, said


def test_a_capacity_the_machine_cannot_hold_is_refused_before_a_buffer_is_made(saved):
    """An empty buffer of 2**40 slots (a valid checkpoint of a few KB): the constructor's
    OSError ("no space") before; a refusal naming the file, the capacity and what is free."""
    file, _ = saved
    _crafted(file, lambda description, sections: _consistent(description, sections, 0, 1 << 40))
    with refused(file, f"its capacity {1 << 40} needs a segment of "):
        cpprb_ray.ReplayBuffer.load(file)


def test_torn_records_are_found_whatever_the_chunks_cut():
    """A load scans the rows for torn (odd) generations chunk by chunk, as the chunks arrive:
    each record is looked at in exactly one chunk, whichever chunk boundaries cut it (its
    generation's bytes split between two chunks included)."""
    stride, count = 72, 500
    random = np.random.default_rng(3)
    records = np.zeros((count, stride), dtype=np.uint8)
    generations = random.integers(0, 1 << 40, size=count, dtype=np.uint64) * 2
    torn = np.sort(random.choice(count, size=37, replace=False))
    generations[torn] += 1
    records[:, :8] = generations.view(np.uint8).reshape(count, 8)
    data = memoryview(records.reshape(-1))
    for chunk in (1, 7, 8, 64, 71, 72, 73, 4096, len(data)):
        found = np.concatenate([checkpoint._odd_generations(data[start:start + chunk], start,
                                                            stride)
                                for start in range(0, len(data), chunk)])
        np.testing.assert_array_equal(found, torn, err_msg=f"chunks of {chunk} bytes")
