"""Checkpoints of sequence buffers (sequence=): the same exactness as a laned buffer's.

* Round trips: three lanes with a writer each, wrapped several times, padded (episode ends) and
  open sequences at the save: the loaded buffer's image (every record, leaf, lane head, fill and
  write count) is the original's byte for byte; with the same seed a view of the original and
  the copy sample identical sequences (columns, mask, indexes, weights, generations), every one
  the stream oracle's; priorities updated after the load go in, and are skipped by their
  generations once the ring overwrites the sequence; sequences open at the save stay open
  (never sampled); new writers take the lanes and go on exact.
* Consistency: saves taken while two spawned writers add their streams, with records of about
  4 KiB (the copy takes several holds and records move between them): in every loaded copy each
  stream's committed sequences are exactly the oracle's after a whole number of its adds.
* The rate limiter (unit: one sequence) and its counts round trip.
* Refusals: links, second links, open or committed starts, torn steps, counts and sequence
  configs that no write leaves, a version that does not match the sections, flipped or cut
  bytes: a ValueError naming the file, and no segment left behind (conftest).
"""

from __future__ import annotations

import os
import struct
import sys

import numpy as np
import pytest

from cpprb_ray import (
    PrioritizedReplayBuffer,
    ReplayBuffer,
    SampleToInsertRatio,
    checkpoint,
    sequences,
)

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
if TESTS_DIR not in sys.path:  # spawned children import the workers from the parent's path
    sys.path.insert(0, TESTS_DIR)

import _checkpoint_workers  # noqa: E402
import _sequence_streams as streams  # noqa: E402
from _workers import tree_problems  # noqa: E402
from test_checkpoint import _crafted, refused  # noqa: E402
from test_checkpoint_lanes import (  # noqa: E402
    _crafted_versioned,
    _version,
    assert_refused_after,
    saves_during_writes,
)
from test_sequences import Oracle  # noqa: E402

CLASSES = [ReplayBuffer, PrioritizedReplayBuffer]
SEQUENCE = {"length": streams.LENGTH, "period": streams.PERIOD}
SEED_OF = streams.seed_of_stream


def make(cls, size, backend="auto", env=None, **options):
    options.setdefault("sequence", SEQUENCE)
    return cls(size, env or streams.ENV, backend=backend, seed=1, **options)


def marks(rb):
    """(generations, links) of every slot, and the lane table, of a quiet buffer's image."""
    _, rows, _, lanes = rb._image.dump()
    generations, links, _ = checkpoint._record_marks(rows, rb._layout.capacity,
                                                     rb._layout.row_stride)
    return generations, links, lanes


def lane_writes(rb) -> np.ndarray:
    """Each lane's count of steps written (the lane table's write counts)."""
    table = marks(rb)[2].view(np.uint64).reshape(-1, 8)
    return table[:, 5].astype(np.int64)


def open_starts(rb) -> np.ndarray:
    return np.flatnonzero(marks(rb)[1] == sequences.OPEN_LINK)


def assert_same_image(original, copy) -> None:
    """The copy's image is the original's byte for byte (records, leaves, lane table with no
    owner), and so are its counters."""
    assert type(copy) is type(original)
    mine, theirs = original._image.dump(), copy._image.dump()
    for name in ("stored_size", "next_index", "max_priority", "rows_added", "rows_since_clear",
                 "rate_limiter"):
        assert mine[0][name] == theirs[0][name], name
    for k, name in ((1, "rows"), (2, "leaves"), (3, "lanes")):
        assert mine[k].tobytes() == theirs[k].tobytes(), name
    assert copy.get_stored_size() == original.get_stored_size() > 0
    lanes = copy._sampler._sequences.lanes
    assert (lanes.lane_owners() == 0).all()
    _, sums, _, mins = original._store.check_tree()
    _, copy_sums, _, copy_mins = copy._store.check_tree()
    assert sums.tobytes() == copy_sums.tobytes() and mins.tobytes() == copy_mins.tobytes()
    assert tree_problems(copy._store.check_tree()) == []


def draw(rb, size, beta):
    return rb.sample(size, beta) if isinstance(rb, PrioritizedReplayBuffer) else rb.sample(size)


def compare_samples(view, copy, batches: int = 20) -> None:
    """Same seed: the same sequences, masks, indexes, weights and generations, each the
    oracle's."""
    rng = np.random.default_rng(3)
    for _ in range(batches):
        size, beta = int(rng.integers(1, 40)), float(rng.random())
        a, b = draw(view, size, beta), draw(copy, size, beta)
        assert sorted(a) == sorted(b)
        for key in a:
            assert a[key].dtype == b[key].dtype and np.array_equal(a[key], b[key]), key
        streams.check(b, SEED_OF)


@pytest.mark.parametrize("cls", CLASSES)
def test_round_trip_is_the_same_buffer(cls, backend, tmp_path):
    """Three lanes (a writer each), wrapped several times, with padded sequences and sequences
    open at the save: the copy is the same buffer and samples the same; updates after the load
    go in (and are skipped once their sequence is overwritten); open sequences stay open; new
    writers take the lanes and stay exact."""
    prioritized = cls is PrioritizedReplayBuffer
    random = np.random.default_rng(0) if prioritized else None
    file = tmp_path / "rb.ckpt"
    lane_slots = 30
    with make(cls, 3 * lane_slots, backend, lanes=3) as rb, cls.attach(rb.name) as second, \
            cls.attach(rb.name) as third:
        sources = [(handle, streams.Stream(k, SEED_OF(k)))
                   for k, handle in enumerate((rb, second, third))]
        for round_ in range(200):
            for handle, source in sources:
                streams.write(handle, source, 1, random)
            if prioritized and round_ % 10 == 9:
                batch = rb.sample(16)
                rb.update_priorities(batch["indexes"], random.random(16) * 3.0,
                                     batch["generations"])
            everything = rb.get_all_transitions()
            if (round_ >= 40 and len(open_starts(rb)) >= 2
                    and not everything["mask"].all()):
                break
        assert rb._store.rows_added > 0 and len(open_starts(rb)) >= 2
        assert not everything["mask"].all(), "no padded sequence"
        assert lane_writes(rb).min() > 2 * lane_slots, "a lane did not wrap twice"
        rb.save(file)
        assert struct.unpack_from("<I", file.read_bytes(), 8) == (checkpoint.FORMAT_VERSION,)
        opened = open_starts(rb)
        path = {"path": str(tmp_path / "copy.buf")} if backend == "mmap" else {}
        with cls.attach(rb.name, seed=11) as view, \
                cls.load(file, backend=backend, seed=11, **path) as copy:
            assert copy.is_owner and copy.backend == backend
            assert copy._layout.meta["sequence"] == rb._layout.meta["sequence"]
            assert_same_image(rb, copy)
            every, again = rb.get_all_transitions(), copy.get_all_transitions()
            assert all(np.array_equal(every[name], again[name]) for name in every)
            assert streams.check(again, SEED_OF) == copy.get_stored_size()
            compare_samples(view, copy)
            # Open at the save, open in the copy: never drawn.
            assert np.array_equal(open_starts(copy), opened)
            drawn = np.concatenate([draw(copy, 32, 0.4)["indexes"] for _ in range(20)])
            assert np.array_equal(drawn, np.concatenate(
                [draw(view, 32, 0.4)["indexes"] for _ in range(20)]))
            assert not np.isin(drawn, opened).any()
            # Updates after the load: the same in both, so they keep sampling alike.
            batch = draw(copy, 16, 0.4)
            assert np.array_equal(batch["indexes"], draw(view, 16, 0.4)["indexes"])
            if prioritized:
                new = np.linspace(0.5, 4.0, 16)
                assert copy.update_priorities(batch["indexes"], new, batch["generations"]) > 0
                view.update_priorities(batch["indexes"], new, batch["generations"])
                assert copy.get_max_priority() == view.get_max_priority() == 4.0
                compare_samples(view, copy, 5)
            # New writers take the lanes (none is owned) and go on, exact; they overwrite the
            # sampled sequences, whose late updates are then skipped.
            with cls.attach(copy.name) as copy_view:
                late = [(copy, streams.Stream(5, SEED_OF(5))),
                        (copy_view, streams.Stream(6, SEED_OF(6)))]
                for _ in range(60):
                    for handle, source in late:
                        streams.write(handle, source, 1, random)
                assert sorted(handle._writer.lane for handle, _ in late) == [0, 1]
                everything = copy.get_all_transitions()
                assert streams.check(everything, SEED_OF) == copy.get_stored_size()
                # Lanes 0 and 1 written all over again since the load; lane 2, which no new
                # writer took, keeps its sequences.
                assert (lane_writes(copy)[:2] - lane_writes(rb)[:2] > lane_slots).all()
                assert {int(stream) for stream in everything["obs"][:, 0, 0]} == {2, 5, 6}
                if prioritized:
                    stale = batch["indexes"] < 2 * lane_slots
                    assert stale.any()
                    assert copy.update_priorities(batch["indexes"][stale],
                                                  np.ones(int(stale.sum())),
                                                  batch["generations"][stale]) == 0
                    fresh = draw(copy, 8, 0.4)
                    assert copy.update_priorities(fresh["indexes"], np.full(8, 2.0),
                                                  fresh["generations"]) > 0
                assert tree_problems(copy._store.check_tree()) == []


PAD = 4096        # a column that makes each record about 16 KiB: the copy goes in chunks


class Replay:
    """A writer's adds as the parent replays them (_checkpoint_workers.sequence_adds), kept as
    they are made: each add's [(episode, t)] of its steps and whether an episode end follows."""

    def __init__(self, stream: int):
        self.stream = stream
        self.adds = []
        self._source = _checkpoint_workers.sequence_adds(stream)

    def committed_after(self, writes: int, lane_slots: int):
        """The oracle's committed sequences after the adds whose steps come to `writes`
        (AssertionError if no whole number of adds does): the set once its last add's episode
        end (if any) is made, and the set before it."""
        oracle = Oracle(self.stream, SEED_OF(self.stream), lane_slots)
        for k in range(10**6):
            if k == len(self.adds):
                _, _, truncated, names = next(self._source)
                self.adds.append((names, truncated))
            names, truncated = self.adds[k]
            oracle.wrote(names)
            assert oracle.written <= writes, f"{writes} steps end inside an add"
            if oracle.written < writes:
                continue
            ended = oracle.live()
            if not truncated:
                return ended, ended
            # Before on_episode_end: the episode's sequences shorter than `length` still open.
            episode, _ = names[-1]
            steps = oracle.episode_steps[episode]
            return ended, {(s, e, t) for s, e, t in ended
                           if e != episode or steps - t >= streams.LENGTH}
        raise AssertionError("the writer cannot have made a million adds")


def test_save_while_writer_processes_add_sequences(tmp_path):
    """Two spawned writers add their streams (per-step priorities, terminal and truncated
    episode ends) while the parent saves: the records are copied in chunks of 4 MiB between
    their adds, and the last hold copies again those that moved. In every loaded copy each
    stream's committed sequences are the oracle's after a whole number of its adds (the lane's
    write count says how many steps), every one exact, padding and mask included."""
    env = dict(streams.ENV, pad={"shape": (PAD,), "dtype": np.float32})
    lane_slots = 512
    with make(PrioritizedReplayBuffer, 2 * lane_slots, env=env, lanes=2) as rb:
        files = saves_during_writes(
            rb, _checkpoint_workers.add_sequences_forever,
            [lambda ready, s=stream: (rb, s, ready, PAD) for stream in range(2)], tmp_path)
        states, wrapped = set(), False
        replays = {stream: Replay(stream) for stream in range(2)}
        for file in files:
            assert struct.unpack_from("<I", file.read_bytes(), 8) == (checkpoint.FORMAT_VERSION,)
            with PrioritizedReplayBuffer.load(file, seed=3) as copy:
                states.add(copy._store.rows_added)
                everything, slots = copy._sampler._sequences.all_rows(copy._layout.capacity,
                                                                      True)
                assert streams.check(everything, SEED_OF) == copy.get_stored_size() > 0
                assert (everything["pad"] == everything["obs"][:, :, 3:4]).all()
                writes = lane_writes(copy)
                wrapped |= bool(writes.max() > lane_slots)
                for lane in range(2):
                    mine = (slots // lane_slots) == lane
                    found = {streams.identify(everything, k) for k in np.flatnonzero(mine)}
                    owners = {stream for stream, _, _ in found}
                    assert len(owners) <= 1, (lane, owners)
                    if not owners:
                        continue
                    ended, before_end = replays[owners.pop()].committed_after(
                        int(writes[lane]), lane_slots)
                    assert found in (ended, before_end), lane
                assert tree_problems(copy._store.check_tree()) == []
                for _ in range(3):
                    streams.check(copy.sample(32), SEED_OF)
        assert len(states) > 1, "the writers added nothing between the saves"
        assert wrapped, "no lane wrapped around"


def test_rate_limiter_and_its_counts_round_trip(tmp_path):
    """A sequence buffer's limiter (its unit: one sequence) and its insert and sample counts:
    the copy admits and holds back exactly the calls the original does."""
    limiter = SampleToInsertRatio(samples_per_insert=2.0, min_size_to_sample=3,
                                  error_buffer=(4.0, 12.0))
    env = {"obs": {}, "done": {}}
    file = tmp_path / "limited.ckpt"

    def attempts(rb):
        said = []
        for size in (1, 2, 4, 8):
            try:
                rb.sample(size, timeout=0)
                said.append(("sample", size, True))
            except TimeoutError:
                said.append(("sample", size, False))
        for steps in (1, 3, 6):
            try:
                rb.add(obs=np.arange(float(steps)), done=np.r_[np.zeros(steps - 1), 1.0],
                       timeout=0)
                said.append(("add", steps, True))
            except TimeoutError:
                said.append(("add", steps, False))
        return said

    with PrioritizedReplayBuffer(64, env, seed=0, rate_limiter=limiter,
                                 sequence={"length": 2, "period": 1}) as rb:
        rb.add(obs=[1.0, 2.0, 3.0, 4.0], done=[0, 0, 0, 1])   # four sequences
        rb.sample(3)
        rb.add(obs=[5.0, 6.0], done=[0, 0])                  # (5, 6) committed, 6 open
        # Its end commits (6, padding): the original's writer then starts an episode as the
        # copy's new writer does, and their adds commit as many sequences.
        rb.on_episode_end()
        before = rb.stats()["rate_limiter"]
        assert before["inserts"] == 6 and before["samples"] == 3
        rb.save(file)
        with PrioritizedReplayBuffer.load(file, seed=0) as copy:
            assert copy.rate_limiter == limiter
            after = copy.stats()["rate_limiter"]
            for key in ("kind", "inserts", "samples", "diff", "can_insert", "can_sample",
                        "min_diff", "max_diff"):
                assert after[key] == before[key], key
            theirs, ours = attempts(rb), attempts(copy)
            assert theirs == ours
            assert {admitted for _, _, admitted in ours} == {True, False}


# -- refusals -----------------------------------------------------------------------------------

@pytest.fixture
def saved(tmp_path):
    """A small prioritized sequence buffer's checkpoint, two lanes written past their ends,
    with committed (full and padded) and open sequences."""
    file = tmp_path / "rb.ckpt"
    random = np.random.default_rng(1)
    with make(PrioritizedReplayBuffer, 64, lanes=2) as rb, \
            PrioritizedReplayBuffer.attach(rb.name) as other:
        sources = [(rb, streams.Stream(0, SEED_OF(0))), (other, streams.Stream(1, SEED_OF(1)))]
        for round_ in range(100):
            for handle, source in sources:
                streams.write(handle, source, 1, random)
            links = marks(rb)[1]
            if (round_ > 10 and (links == sequences.OPEN_LINK).any()
                    and (links == streams.LENGTH).any() and (1 <= links).any()
                    and ((1 <= links) & (links < streams.LENGTH)).any()):
                break
        rb.save(file)
    return file


def _marks_of(description, sections):
    return checkpoint._record_marks(sections["rows"], description["capacity"],
                                    description["row_stride"])


def _slot(description, sections, which) -> int:
    """The first slot `which(generations, links)` picks."""
    found = np.flatnonzero(which(*_marks_of(description, sections)[:2]))
    assert found.size, "the fixture has no such slot"
    return int(found[0])


def _set_link(which, value, second=False):
    def change(description, sections):
        slot = _slot(description, sections, which)
        at = slot * description["row_stride"] + 8 + 4 * second
        struct.pack_into("<i", sections["rows"], at, value)
    return change


def _tear(which):
    def change(description, sections):
        slot = _slot(description, sections, which)
        at = slot * description["row_stride"]
        generation = struct.unpack_from("<Q", sections["rows"], at)[0]
        struct.pack_into("<Q", sections["rows"], at, generation | 1)
    return change


def _committed(generations, links):
    return links >= 1


def _full(generations, links):
    return links == streams.LENGTH


def _open(generations, links):
    return links == sequences.OPEN_LINK


def _step_of_full(generations, links):
    """The second step of a full sequence (not a start: the period is 3)."""
    return np.roll(links == streams.LENGTH, 1) & (links == sequences.LINK_DEAD)


def _leaf_on_open(description, sections):
    slot = _slot(description, sections, _open)
    np.frombuffer(sections["leaves"], dtype=np.float64)[slot] = 1.0


def _past_head(description, sections):
    """An open start (fewer steps written than a sequence has) made a full sequence."""
    _set_link(_open, streams.LENGTH)(description, sections)
    description["state"]["open_sequences"] -= 1
    description["state"]["stored_size"] += 1


def _sequence(**values):
    def change(description, sections):
        description["sequence"] = dict(description["sequence"], **values)
    return change


def _drop_sequence(description, sections):
    del description["sequence"]


@pytest.mark.parametrize("change, match", [
    (_set_link(_committed, streams.LENGTH + 1), "link is 7, which no write of sequences of 6 "
                                                "steps leaves"),
    (_set_link(_committed, -1), "link is -1, which no write"),
    (_set_link(_committed, 5, second=True), "second link is 5; a sequence buffer never sets"),
    (_past_head, "sequence of 6 steps reaches past its lane's head"),
    (_tear(_step_of_full), "sequence has a torn step"),
    (_tear(_open), "opens a sequence, but it is torn"),
    (_leaf_on_open, r"not unset \(its slot holds no row\)"),
    (lambda d, s: d["state"].update(open_sequences=d["state"]["open_sequences"] + 1),
     "open sequences in its slots, its state says"),
    (lambda d, s: d["state"].update(stored_size=d["state"]["stored_size"] - 1),
     "committed sequences in its slots, its state says"),
    (_sequence(length=4), r"link is \d, which no write of sequences of 4 steps leaves"),
    (_sequence(length=40), "longer than a lane"),
    (_sequence(period=7), r"sequence\['period'\] must be in \[1, length 6\]"),
    (_sequence(period=0), r"sequence\['period'\] must be in"),
    (_sequence(eta=1.5), r"sequence\['eta'\] must be in \[0, 1\]"),
    (_sequence(length="6"), "inconsistent"),
    (_sequence(period=None), "inconsistent"),
    (lambda d, s: d.update(sequence=[6, 3]), "inconsistent"),
    (lambda d, s: d["sequence"].pop("period"), "is not a config this cpprb_ray writes"),
    (lambda d, s: d["state"].pop("open_sequences"), "open_sequences"),
    (lambda d, s: s.update(rows=s["rows"][:-64]), "bytes of rows"),
    (lambda d, s: s.pop("lanes"), r"sections \['lanes'\] missing"),
    (lambda d, s: (_drop_sequence(d, s), _version(3)(d, s)),
     "format version 3 without a sequence section"),
    (_version(2), "format version 2 with a sequence section"),
    (_version(1), "format version 1 with a lane section"),
    (lambda d, s: d.update(nstep={"size": 3, "gamma": 0.9, "rew": "obs", "next": "obs"}),
     "inconsistent"),
])
def test_crafted_sequence_sections_are_refused(saved, change, match):
    """Behind valid checksums: every sequence record, count and config that no write leaves is
    refused, naming the file, and no segment is left behind (the autouse fixture)."""
    assert_refused_after(saved, change, match)


def test_the_fixture_loads_as_it_was_written(saved):
    """The crafting rewrites a file that loads (each refusal above is its change's)."""
    _crafted(saved, lambda description, sections: None)
    with PrioritizedReplayBuffer.load(saved) as copy:
        assert copy.get_stored_size() > 0 and len(open_starts(copy)) > 0


def test_flipped_and_cut_bytes_of_a_sequence_file_are_refused(saved):
    """Bytes flipped in the sequence records (start links, the generation of a step) and in the
    description's sequence entry are caught by the checksums; a cut file by its lengths."""
    data = saved.read_bytes()
    description, sections = checkpoint.read_file(saved)
    text_length = struct.unpack_from("<Q", data, 16)[0]
    payload = 64 + text_length
    rows_at = payload + description["sections"]["rows"][0]
    generations, links, _ = _marks_of(description, sections)
    stride = description["row_stride"]
    starts = np.flatnonzero(links >= 1)
    opened = np.flatnonzero(links == sequences.OPEN_LINK)
    places = [rows_at + int(starts[0]) * stride + 8, rows_at + int(starts[-1]) * stride + 8,
              rows_at + int(opened[0]) * stride + 8, rows_at + int(starts[0]) * stride + stride,
              data.index(b'"sequence"'), data.index(b'"open_sequences"') + 3]
    for at in places:
        for flip in (0x01, 0x80, 0xFF):
            damaged = bytearray(data)
            damaged[at] ^= flip
            saved.write_bytes(bytes(damaged))
            with refused(saved, "checksum does not match"):
                PrioritizedReplayBuffer.load(saved)
    for length in (64, payload, rows_at + stride * int(starts[0]) + 9, len(data) - 1):
        saved.write_bytes(data[:length])
        with refused(saved, "truncated"):
            PrioritizedReplayBuffer.load(saved)


def test_older_readers_refuse_a_newer_file_by_its_version_and_version_3_still_loads(
        saved, monkeypatch):
    """Every save writes the newest version: a reader of versions 1 to 3 (this version's reader
    with its older list) refuses it from its prefix, naming both. The same sequence buffer's
    file written as version 3 (a crc32 of the payload, as the release before wrote it) loads
    the same sequences."""
    assert struct.unpack_from("<I", saved.read_bytes(), 8) == (checkpoint.FORMAT_VERSION,)
    monkeypatch.setattr(checkpoint, "_READABLE", (1, 2, 3))
    monkeypatch.setattr(checkpoint, "_READS", "versions 1 to 3")
    with refused(saved, f"format version {checkpoint.FORMAT_VERSION}; this cpprb_ray reads "
                        f"versions 1 to 3"):
        PrioritizedReplayBuffer.load(saved)
    monkeypatch.undo()
    with PrioritizedReplayBuffer.load(saved) as copy:
        expected = copy.get_all_transitions()
    _crafted_versioned(saved, _version(3))
    assert struct.unpack_from("<I", saved.read_bytes(), 8) == (3,)
    with PrioritizedReplayBuffer.load(saved) as copy:
        for name, column in copy.get_all_transitions().items():
            np.testing.assert_array_equal(column, expected[name])
