"""Checkpoints of laned buffers (frames with next_of / stack_compress, lanes=, N-step in lanes):
the same exactness as a plain buffer's.

* Round trips: every live row at its slot, every generation and the tree bit for bit are the
  original's; with the same seed a view of the original and the loaded copy sample identical
  batches; the loaded buffer has no lane owners, and new writers take lanes and go on exact.
  One bounded lane and two lanes, wrapped many times.
* Consistency: saves taken while writer processes (spawn) add into their lanes, the records
  copied in chunks between their adds: every row of every loaded copy is exact, and each
  stream's rows are a run of its adds that ends where an add ended (whole adds only).
* N-step in lanes: committed rows as saved; steps staged at the save are not rows in the copy
  (never sampled), and new writers' N-step rows are those of a plain N-step buffer.
* Refusals: a lane section cut, an owner, a head, a link, a leaf or a row count no write
  leaves, a version that does not match the sections: a ValueError naming the file, before
  anything large is allocated.
"""

from __future__ import annotations

import multiprocessing
import os
import struct
import sys
import time

import numpy as np
import pytest

from cpprb_ray import PrioritizedReplayBuffer, ReplayBuffer, _parts, checkpoint

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
if TESTS_DIR not in sys.path:  # spawned children import the workers from the parent's path
    sys.path.insert(0, TESTS_DIR)

import _checkpoint_workers  # noqa: E402
import _frame_streams as streams  # noqa: E402
from _workers import tree_problems  # noqa: E402
from test_checkpoint import _load_with_1_gib, _set, refused  # noqa: E402

CLASSES = [ReplayBuffer, PrioritizedReplayBuffer]
FRAMED = {"next_of": "obs", "stack_compress": "obs"}
TIMEOUT = 60.0


def make(cls, size, backend="auto", env=None, **options):
    return cls(size, env or streams.ENV, backend=backend, seed=1, **dict(FRAMED, **options))


def add(rb, rows, random):
    if isinstance(rb, PrioritizedReplayBuffer):
        return rb.add(priorities=random.random(len(rows["act"])) + 0.1, **rows)
    return rb.add(**rows)


def live_rows(rb):
    """Every live row of a laned buffer and its slot, in slot order (the lanes' own read)."""
    return rb._sampler._lanes.all_rows(rb._layout.capacity, True)


def assert_same_image(original, copy) -> None:
    """The copy holds the original's rows at the same slots, its generations and tree bit for
    bit, its counters; its lanes have no owner."""
    assert type(copy) is type(original)
    assert copy.get_stored_size() == original.get_stored_size()
    assert copy._store.rows_added == original._store.rows_added
    assert copy.env_dict.keys() == original.env_dict.keys() and copy.nstep == original.nstep
    assert copy.get_buffer_size() == original.get_buffer_size()
    (mine, my_slots), (theirs, their_slots) = live_rows(original), live_rows(copy)
    assert np.array_equal(my_slots, their_slots)
    assert len(my_slots) == original.get_stored_size()
    for name in mine:
        assert np.array_equal(mine[name], theirs[name]), name
    every = original.get_all_transitions()
    again = copy.get_all_transitions()
    assert all(np.array_equal(every[name], again[name]) for name in every)
    slots = np.arange(original._layout.capacity)
    assert np.array_equal(copy._store.generations_of(slots), original._store.generations_of(slots))
    _, sums, _, mins = original._store.check_tree()
    _, copy_sums, _, copy_mins = copy._store.check_tree()
    assert sums.tobytes() == copy_sums.tobytes() and mins.tobytes() == copy_mins.tobytes()
    assert tree_problems(copy._store.check_tree()) == []
    if isinstance(original, PrioritizedReplayBuffer):
        assert copy.get_max_priority() == original.get_max_priority()
    lanes = copy._sampler._lanes
    assert (lanes.lane_owners() == 0).all()
    assert np.array_equal(lanes.lane_next_slots(), original._sampler._lanes.lane_next_slots())


def compare_samples(original, copy, batches: int = 30) -> None:
    rng = np.random.default_rng(3)
    for _ in range(batches):
        size = int(rng.integers(1, 64))
        if isinstance(original, PrioritizedReplayBuffer):
            beta = float(rng.random())
            a, b = original.sample(size, beta), copy.sample(size, beta)
        else:
            a, b = original.sample(size), copy.sample(size)
        assert sorted(a) == sorted(b)
        for key in a:
            assert a[key].dtype == b[key].dtype and np.array_equal(a[key], b[key]), key
        streams.check(b)


@pytest.mark.parametrize("cls", CLASSES)
@pytest.mark.parametrize("lanes", [1, 2])
def test_framed_lanes_load_exact(cls, lanes, backend, tmp_path):
    """One bounded lane (cpprb's next_of / stack_compress) or two lanes with a writer each,
    wrapped many times, priorities updated: the loaded buffer is the same buffer, sampled the
    same; new writers then take its lanes and every row stays exact."""
    random = np.random.default_rng(0)
    file = tmp_path / "rb.ckpt"
    with make(cls, 128, backend, lanes=None if lanes == 1 else lanes) as rb, \
            cls.attach(rb.name) as other:
        writers = [(rb, streams.Stream(0, 10)), (other, streams.Stream(1, 11))][:lanes]
        for round_ in range(300):
            for handle, source in writers:
                add(handle, source.transitions(int(random.integers(1, 4))), random)
            if cls is PrioritizedReplayBuffer and round_ % 50 == 49:
                batch = rb.sample(32)
                rb.update_priorities(batch["indexes"], random.random(32) * 3.0,
                                     batch["generations"])
        assert rb._store.rows_added > 2 * rb.get_buffer_size() * lanes   # wrapped
        rb.save(file)
        path = {"path": str(tmp_path / "copy.buf")} if backend == "mmap" else {}
        with cls.attach(rb.name, seed=11) as view, \
                cls.load(file, backend=backend, seed=11, **path) as copy:
            assert copy.is_owner and copy.backend == backend
            assert_same_image(rb, copy)
            # Rows by the indexes _encode_sample takes (slots; a bounded lane's numbers).
            numbers = copy._sampler._numbered_rows(copy._layout.capacity)[1][::7]
            picked, before = copy._encode_sample(numbers), rb._encode_sample(numbers)
            assert all(np.array_equal(picked[name], before[name]) for name in before)
            assert streams.check(picked) == len(numbers) > 0
            compare_samples(view, copy)
            # New writers take the lanes (none is owned) and go on, exact.
            with cls.attach(copy.name) as copy_view:
                late = [(copy, streams.Stream(5, 50)), (copy_view, streams.Stream(6, 60))]
                for _ in range(60):
                    for handle, source in late[:lanes]:
                        add(handle, source.transitions(int(random.integers(1, 4))), random)
                assert sorted(h._writer.lane for h, _ in late[:lanes]) == list(range(lanes))
                everything = copy.get_all_transitions()
                streams.check(everything)
                kept = {int(act) // 2 // 100_000 // 10_000 for act in everything["act"].ravel()}
                assert {5, 6} & kept and len(everything["act"]) == copy.get_stored_size()
                if cls is PrioritizedReplayBuffer:
                    batch = copy.sample(16)
                    assert copy.update_priorities(batch["indexes"], np.full(16, 2.0),
                                                  batch["generations"]) > 0
                assert tree_problems(copy._store.check_tree()) == []


PAD = 1024        # a column that makes each record about 4 KiB: the copy goes in chunks


def stream_of(acts: np.ndarray) -> np.ndarray:
    return acts // 2 // 100_000 // 10_000


def add_ends(stream: int, seed: int, last_act: int):
    """The acts of `stream`'s writer in order, and where each of its adds ended, up to the add
    that holds `last_act`."""
    acts, ends = [], set()
    for batch, _ in _checkpoint_workers.stream_adds(stream, seed):
        acts.extend(int(a) for a in batch["act"])
        ends.add(len(acts) - 1)
        if last_act in acts[-len(batch["act"]):]:
            return acts, ends
        assert len(acts) < 10**7


def saves_during_writes(rb, target, arguments, folder) -> list:
    """The checkpoint files of `rb` saved into `folder` while spawned writers add: one process
    per entry of `arguments` (of its `ready` event, which it sets after its first add: target's
    arguments), killed after the saves. Six saves, more (40 at most) until one met a write (on a
    quiet machine a dump can run between two adds: a copy that never re-copied checks nothing of
    the last hold). Asserts that `rb`'s records take several chunks and that each dump took
    them in several holds."""
    assert rb._layout.capacity * rb._layout.row_stride > 3 * (4 << 20)
    ctx = multiprocessing.get_context("spawn")
    readies = [ctx.Event() for _ in arguments]
    writers = [ctx.Process(target=target, args=arguments_of(ready))
               for arguments_of, ready in zip(arguments, readies)]
    for writer in writers:
        writer.start()
    files, recopied, holds = [], 0, []
    try:
        assert all(ready.wait(TIMEOUT) for ready in readies), "a writer never added"
        for k in range(40):
            if k >= 6 and recopied > 0:
                break
            time.sleep(0.05)
            files.append(folder / f"rb{k}.ckpt")
            rb.save(files[-1])
            header = rb._image.dump()[0]
            recopied += header["recopied"]
            holds.append(header["lock_holds"])
    finally:
        for writer in writers:
            writer.kill()
            writer.join(TIMEOUT)
    assert min(holds) >= 5, holds     # 4 chunks at least, and the last hold
    assert recopied > 0, "no record moved while a dump copied them"
    return files


def test_save_while_writer_processes_add_into_lanes(tmp_path):
    """Two spawned writers add their streams into their lanes while the parent saves: the
    records are copied in chunks of 4 MiB between their adds, and the last hold copies again
    those that moved. Every loaded copy holds exact rows only, and each stream's rows are a run
    of its transitions that ends where one of its adds ended."""
    env = dict(streams.ENV, pad={"shape": (PAD,), "dtype": np.float32})
    seeds = {0: 100, 1: 101}
    with make(PrioritizedReplayBuffer, 4096, env=env, lanes=2) as rb:
        files = saves_during_writes(
            rb, _checkpoint_workers.add_stream_forever,
            [lambda ready, s=stream, seed=seed: (rb, s, seed, ready, PAD)
             for stream, seed in seeds.items()], tmp_path)
        states = set()
        for file in files:
            assert struct.unpack_from("<I", file.read_bytes(), 8) == (checkpoint.FORMAT_VERSION,)
            with PrioritizedReplayBuffer.load(file, seed=3) as copy:
                states.add(copy._store.rows_added)
                everything = copy.get_all_transitions()
                assert len(everything["act"]) == copy.get_stored_size() > 0
                streams.check(everything)
                acts = everything["act"].ravel()
                assert (everything["pad"] == (acts % 1000)[:, None]).all()
                for stream, seed in seeds.items():
                    mine = np.sort(acts[stream_of(acts) == stream])
                    if not len(mine):
                        continue
                    order, ends = add_ends(stream, seed, int(mine[-1]))
                    positions = [order.index(int(act)) for act in mine]
                    # Consecutive transitions (the oldest may have gone), up to an add's end.
                    assert positions == list(range(positions[0], positions[-1] + 1)), stream
                    assert positions[-1] in ends, (stream, positions[-1])
                assert tree_problems(copy._store.check_tree()) == []
                for _ in range(5):
                    streams.check(copy.sample(64))
        assert len(states) > 1, "the writers added nothing between the saves"


@pytest.mark.parametrize("cls", CLASSES)
def test_nstep_in_lanes(cls, tmp_path):
    """Committed N-step rows load as saved; steps staged at the save (in the lanes, their
    windows open) are never rows of the copy; new writers' N-step rows in the copy are a plain
    N-step buffer's, both stacks included."""
    spec = {"size": 3, "gamma": 0.5, "rew": "rew", "next": "next_obs"}
    whole = dict(streams.ENV, next_obs=streams.ENV["obs"])
    random = np.random.default_rng(4)
    file = tmp_path / "rb.ckpt"
    with make(cls, 256, Nstep=spec, lanes=2) as rb, cls.attach(rb.name) as other:
        sources = [(rb, streams.Stream(0, 20)), (other, streams.Stream(1, 21))]
        for round_ in range(120):
            for handle, source in sources:
                add(handle, source.transitions(int(random.integers(1, 3))), random)
                if round_ % 37 == 36:
                    handle.on_episode_end()
                    source.episode += 1
                    source.step = 0
        assert rb.stats()["nstep_staged"] > 0 and other.stats()["nstep_staged"] > 0
        rb.save(file)
        committed = {int(act) for act in live_rows(rb)[0]["act"].ravel()}
        with cls.attach(rb.name, seed=11) as view, cls.load(file, seed=11) as copy:
            assert copy.nstep == rb.nstep and copy.stats()["nstep_staged"] == 0
            assert_same_image(rb, copy)
            compare = np.random.default_rng(8)
            for _ in range(20):
                size = int(compare.integers(1, 64))
                a, b = view.sample(size), copy.sample(size)
                assert all(np.array_equal(a[key], b[key]) for key in a)
                assert (b["discounts"] > 0).all()
                assert {int(act) for act in b["act"].ravel()} <= committed
            # A new writer's N-step rows: those of a plain N-step buffer of whole stacks.
            with cls(4096, whole, Nstep=spec) as reference:
                source = streams.Stream(2, 22)
                for _ in range(40):
                    rows = source.transitions(int(random.integers(1, 3)))
                    for target in (copy, reference):
                        add(target, rows, np.random.default_rng(0))
                for target in (copy, reference):
                    target.on_episode_end()
                ours, theirs = copy.get_all_transitions(), reference.get_all_transitions()
                new = stream_of(ours["act"].ravel()) == 2
                assert new.sum() == len(theirs["act"]) > 30
                by_act = {int(a): k for k, a in enumerate(theirs["act"].ravel())}
                for k in np.flatnonzero(new):
                    other_row = by_act[int(ours["act"][k, 0])]
                    for name in ours:
                        assert (ours[name][k] == theirs[name][other_row]).all(), name
                assert tree_problems(copy._store.check_tree()) == []


# -- refusals -----------------------------------------------------------------------------------

@pytest.fixture
def laned(tmp_path):
    """A small laned, framed, prioritized checkpoint's path."""
    file = tmp_path / "rb.ckpt"
    random = np.random.default_rng(1)
    with make(PrioritizedReplayBuffer, 64, lanes=2) as rb, \
            PrioritizedReplayBuffer.attach(rb.name) as other:
        for handle, source in ((rb, streams.Stream(0, 1)), (other, streams.Stream(1, 2))):
            for _ in range(12):
                add(handle, source.transitions(2), random)
        rb.save(file)
    return file


def _lane_field(lane: int, field: int, value: int):
    def change(description, sections):
        np.frombuffer(sections["lanes"], dtype=np.uint64)[8 * lane + field] = value
    return change


def _slot_of(description, sections, live: bool) -> int:
    stride = description["row_stride"]
    return int(np.flatnonzero(checkpoint._live_rows(sections["rows"], description["capacity"],
                                                    stride) == live)[0])


def _link(ahead: bool, value: int):
    def change(description, sections):
        slot = _slot_of(description, sections, True)
        at = slot * description["row_stride"] + 8 + 4 * ahead
        struct.pack_into("<i", sections["rows"], at, value)
    return change


def _leaf_on_no_row(description, sections):
    slot = _slot_of(description, sections, False)
    np.frombuffer(sections["leaves"], dtype=np.float64)[slot] = 1.0


def _version(version: int):
    def change(description, sections):
        description["format_version"] = version
    return change


@pytest.mark.parametrize("change, match", [
    (lambda d, s: s.update(lanes=s["lanes"][:64]), "64 bytes of lanes for 64 slots in 2 lanes"),
    (lambda d, s: s.pop("lanes"), r"sections \['lanes'\] missing"),
    (lambda d, s: s.update(rows=s["rows"][:-8]), "bytes of rows"),
    (lambda d, s: s.update(leaves=s["leaves"][:-8]), "bytes of leaves"),
    (_lane_field(1, 0, 4321), "lane 1 has an owner"),
    (_lane_field(0, 3, 32), "lane 0: head 32 and fill"),
    (_lane_field(1, 4, 33), "lane 1: head .* and fill 33 do not fit its 32 slots"),
    (_link(False, 5), "link is 5, which no write leaves"),
    (_link(False, -3), "link is -3"),
    (_link(True, 17), "next stack is 17 slots ahead"),
    (_leaf_on_no_row, r"not unset \(its slot holds no row\)"),
    (_set(["state", "stored_size"], 3), "rows in its slots, its state says 3"),
    (_set(["state", "rows_since_clear"], 1), "rows since the last clear 1 with"),
    (_set(["lanes", "count"], 4), "bytes of lanes for 64 slots in 4 lanes"),
    (_set(["lanes", "frames", 0, "stack"], 2), "row layout differs|inconsistent"),
    (_set(["lanes"], "two"), "inconsistent"),
    (_version(1), "format version 1 with a lane section"),
])
def test_crafted_lane_sections_are_refused(laned, change, match):
    """Behind valid checksums: every lane section and record a write never leaves is refused,
    naming the file, and no segment is left behind (the autouse fixture)."""
    assert_refused_after(laned, change, match)


def assert_refused_after(file, change, match: str) -> None:
    """`file` rewritten with valid checksums after `change(description, sections)` (the format
    version stays unless the change sets one): its load is refused, naming the file."""
    def changed(description, sections):
        version = description.pop("format_version", None)
        change(description, sections)
        description.setdefault("format_version", version)

    _crafted_versioned(file, changed)
    with refused(file, match):
        PrioritizedReplayBuffer.load(file)


def _crafted_versioned(file, change) -> None:
    """_crafted, with the format version the change leaves in the description."""
    description, sections = checkpoint.read_file(file)
    del description["sections"]
    sections = {name: bytearray(view) for name, view in sections.items()}
    change(description, sections)
    version = description.pop("format_version")
    checkpoint.write_file(file, description, list(sections.items()), version)


def test_files_of_the_earlier_versions_load_and_their_version_says_the_kind(tmp_path):
    """Every save writes the newest version. A plain buffer's file written as version 1 (a
    crc32 of the payload, as earlier releases wrote it) loads the same state; as version 2,
    which was a laned buffer's, it is refused by its version."""
    file = tmp_path / "plain.ckpt"
    with PrioritizedReplayBuffer(8, dict(streams.ENV, next_obs=streams.ENV["obs"])) as rb:
        rb.add(**streams.Stream(0, 0).transitions(2), priorities=[1.0, 2.0])
        rb.save(file)
        expected = rb.get_all_transitions()
    assert struct.unpack_from("<I", file.read_bytes(), 8) == (checkpoint.FORMAT_VERSION,)
    with PrioritizedReplayBuffer.load(file) as copy:
        assert copy.get_stored_size() == 2
    _crafted_versioned(file, _version(1))
    assert struct.unpack_from("<I", file.read_bytes(), 8) == (1,)
    with PrioritizedReplayBuffer.load(file) as copy:
        assert copy.get_stored_size() == 2 and copy.get_max_priority() == 2.0
        for name, column in copy.get_all_transitions().items():
            np.testing.assert_array_equal(column, expected[name])
    _crafted_versioned(file, _version(2))
    with refused(file, "format version 2 without a lane section"):
        PrioritizedReplayBuffer.load(file)


def test_a_large_laned_payload_is_refused_before_it_is_allocated(laned):
    """A laned description consistent with 2**25 slots (about 1.8 GiB of records and leaves),
    as a sparse file whose checksums are right around a payload never written, in a process
    that may map 1 GiB: refused naming the file before its payload or its segment is
    allocated."""
    file = laned
    description, _ = checkpoint.read_file(file)
    capacity = 1 << 25
    layout, _, _ = _parts.plan_layout(capacity, description["env_dict"], True, "shm",
                                      lanes=2, **{k: "obs" for k in FRAMED})
    description.update(capacity=capacity, lanes=layout.meta["lanes"])
    description["state"].update(stored_size=0, next_index=0, rows_added=0, rows_since_clear=0)
    description["rate_limiter"] = None
    stride = description["row_stride"]
    lengths = {"rows": capacity * stride, "leaves": 8 * capacity, "lanes": 128}
    spans, end = {}, 0
    for name, length in lengths.items():
        spans[name] = [end, length]
        end = (end + length + 63) // 64 * 64
    end = spans["lanes"][0] + 128
    del description["format_version"]
    description["sections"] = spans
    text = checkpoint.json.dumps(description).encode()
    text += b" " * ((-len(text)) % 64)
    head = checkpoint._PREFIX.pack(checkpoint.MAGIC, 2, 64, len(text), end,
                                   checkpoint.zlib.crc32(text), 0, bytes(20), 0)[:-4]
    with open(file, "wb") as handle:
        handle.write(head + struct.pack("<I", checkpoint.zlib.crc32(head)) + text)
        handle.truncate(64 + len(text) + end)
    said = _load_with_1_gib(file)
    assert said.startswith(f"ValueError: '{file}' is not a loadable cpprb_ray checkpoint: "), said
    assert "this process may use" in said, said
