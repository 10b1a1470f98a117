"""Sequences for recurrent learners (R2D2's layout): a learner step against TorchRL's and
Reverb's, the gather against the copy floor, and the bytes per step.

    python benchmarks/bench_sequences.py [--quick] [--size N] [--peers P ...] [--json FILE]

(`--quick`: 2**14 steps, fewer repetitions; by default 2**20 steps. `--peers`: torchrl,
reverb, reverb_grpc, or none; by default every one that imports here.)

Layout (Acme's R2D2 defaults): obs float32[64], core float32[512] (the recurrent state stored
with every step), act int64, rew float32, done float32; ``sequence={"length": 120, "period":
40}``, 16 lanes (16 handles in this process, one writer each), alpha 0.9. The buffer is filled
with episodes of 50 to 1,000 steps, adds of 40 steps with a priority per step; every peer gets
the same steps. Then, in one process, single calls interleaved one by one (one call of each
per round, the order rotated every round: benchmarks/_common.one_by_one_times), medians over
the rounds:

- learner step: sample(64, beta=0.6) and update_priorities of its 64 sequences (one priority
  each, with their generations); with Reverb, also "in a row": blocks of consecutive learner
  steps, the libraries taking turns block by block, each block after a pause of 0.5 s and 8
  untimed steps (Reverb's dataset makes batches ahead on threads of its own: between two of
  its calls interleaved one by one, the other libraries' calls give those threads the time to
  make the next batch on the second core, which hides their cost; in a row, each timed step
  waits for work done in the timed span). Reverb is judged in a row;
- the gather against the copy floor: sample(64) (new output arrays) and sample(64, out=) (an
  earlier sample's arrays filled again), each judged against a copy of as many bytes (64 x 120
  steps of every column, the mask, the per-sequence indexes, weights and generations) from a
  random place of a 256 MiB array, outside every cache as the sampled steps are, into a new
  array and into one array reused respectively; and, for reference, the same bytes copied
  again and again (warm). Each gather's figure is the median of its per-round ratios to its
  floor (the two calls made in the same round, under the same load), with their quartiles,
  the same median in each fifth of the rounds, and the ratio of the minima; also the bytes at
  the copy bandwidth of one core, as bench_frames.py measures it. Twice: first with the
  learner's mapping as the fill left it ("mapping cold": the pages other handles wrote are not
  mapped in the sampling handle yet, and a first read of each faults), then after one byte of
  every page was read through it ("mapping warm", as a learner's mapping is after its first
  pass over the buffer);
- bytes per step: the segment's bytes (rb.nbytes) over its steps (each step is stored once;
  overlapping sequences share it).

Peers, each where it imports (``make bench-peers`` makes their venvs; run the script with that
venv's python, e.g. ``.venv-reverb/bin/python benchmarks/bench_sequences.py --peers reverb``:
it finds this checkout's build):

- TorchRL 0.14: a ``TensorDictReplayBuffer`` with a ``PrioritizedSliceSampler(slice_len=120,
  traj_key="episode")`` over a ``LazyTensorStorage``; its learner step is a sample of 64
  slices of 120 steps, then update_priority of their 7,680 step indexes with each slice's
  priority.
- Reverb 0.14 as Acme's R2D2 uses it: a trajectory writer appends every step and, as Acme's
  SequenceAdder (period 40, length 120, episode ends padded with zero steps so that every
  sequence starting in an episode is whole), makes an item ``create_item(table, priority,
  {column: history[column][-120:]})`` every 40 steps, its priority R2D2's mix of its steps'
  (0.9 max + 0.1 mean); a prioritized table (exponent 0.9, FIFO, never full); its learner
  step is the next batch of 64 from a ``TrajectoryDataset`` and ``mutate_priorities`` of their
  64 keys. In benchmarks/_reverb.py's two placements (how each call is made is said there):
  ``reverb``, the server in this process (Reverb's fastest: the dataset reads the table
  without gRPC), and ``reverb_grpc``, the server in a process of its own (this script's
  hidden ``serve STEPS``), as Acme runs its learner and replay.

--json FILE writes {"rows": [{"library", "operation", "median_us", "min_us", "max_us"}, ...],
"gathers": [...], "verdicts": [...], "skipped": {...}, "floor": {...}, "memory": {...},
"load_average": [...]} (benchmarks/compare.py reads "rows" and "verdicts").
"""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import _common  # noqa: E402
from benchmarks.bench_frames import copy_bandwidth  # noqa: E402

LENGTH = 120
PERIOD = 40
BATCH = 64
LANES = 16
ENV = {"obs": {"shape": 64, "dtype": np.float32}, "core": {"shape": 512, "dtype": np.float32},
       "act": {"dtype": np.int64}, "rew": {"dtype": np.float32},
       "done": {"dtype": np.float32}}


def env():
    return {key: dict(spec) for key, spec in ENV.items()}


def fill(handles, steps: int, seed: int = 0, peers=()) -> None:
    """`steps` steps in all, spread over the handles (one lane each), adds of PERIOD steps with
    a priority per step; episodes of 50 to 1,000 steps (done ends them). `peers`: buffers of
    other libraries that get the same steps, handle after handle (``put(steps)``, then
    ``end_stream()`` after each handle's)."""
    random = np.random.default_rng(seed)
    pool_obs = random.random((4096, 64), dtype=np.float32)
    pool_core = random.random((4096, 512), dtype=np.float32)
    per_handle = steps // len(handles)
    for number, rb in enumerate(handles):
        left = int(random.integers(50, 1000))
        written = 0
        while written < per_handle:
            count = min(PERIOD, per_handle - written)
            at = int(random.integers(0, 4096 - count))
            done = np.zeros(count, dtype=np.float32)
            if left <= count:
                done[left - 1] = 1.0
                count = left
                done = done[:count]
                left = int(random.integers(50, 1000))
            else:
                left -= count
            values = {"obs": pool_obs[at:at + count], "core": pool_core[at:at + count],
                      "act": np.full(count, number, dtype=np.int64),
                      "rew": np.ones(count, dtype=np.float32), "done": done,
                      "priorities": random.random(count) + 0.1}
            rb.add(**values)
            for peer in peers:
                peer.put(values)
            written += count
        for peer in peers:
            peer.end_stream()


def sequence_handles(cpprb_ray, size: int) -> list:
    """The sequence buffer of `size` steps (the layout above, alpha 0.9) and LANES handles to
    it, this process's first: fill() writes through them, one lane each."""
    rb = cpprb_ray.PrioritizedReplayBuffer(size, env(), alpha=0.9, lanes=LANES, seed=0,
                                           sequence={"length": LENGTH, "period": PERIOD})
    return [rb] + [cpprb_ray.PrioritizedReplayBuffer.attach(rb.name, seed=k)
                   for k in range(1, LANES)]


class TorchRLSequences:
    """TorchRL's sequence sampling: a PrioritizedSliceSampler over a LazyTensorStorage, filled
    with the same steps (an "episode" id per step: its slices never cross one)."""

    def __init__(self, size: int):
        import torch
        from tensordict import TensorDict
        from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
        from torchrl.data.replay_buffers.samplers import PrioritizedSliceSampler

        self.torch, self.TensorDict = torch, TensorDict
        torch.manual_seed(0)
        sampler = PrioritizedSliceSampler(max_capacity=size, alpha=0.9, beta=0.6, eps=1e-4,
                                          slice_len=LENGTH, traj_key="episode",
                                          strict_length=True)
        self.buffer = TensorDictReplayBuffer(storage=LazyTensorStorage(size), sampler=sampler,
                                             batch_size=BATCH * LENGTH)
        self.episode = 0
        self.pending: list = []

    def put(self, steps) -> None:
        """`steps`: a dict of numpy arrays (one add of ours); written in chunks of 8,192 steps
        (one extend and one update_priority each: TorchRL's per-call cost would make a fill
        of 2^20 steps in adds of 40 take half an hour)."""
        self.pending.append(steps)
        if sum(len(part["done"]) for part in self.pending) >= 8192:
            self.flush()

    def end_stream(self) -> None:
        """The next steps are another writer's (a new episode)."""
        self.flush()
        self.episode += 1

    def flush(self) -> None:
        """Extend by the pending steps, episode ids from their done flags."""
        if self.pending:
            steps = {key: np.concatenate([part[key] for part in self.pending])
                     for key in self.pending[0]}
            self.pending = []
            done = steps["done"].reshape(-1)
            ends = np.concatenate([[0], np.cumsum(done[:-1] > 0)])
            tensors = {key: self.torch.from_numpy(np.ascontiguousarray(value))
                       for key, value in steps.items() if key != "priorities"}
            tensors["episode"] = self.torch.from_numpy(self.episode + ends.astype(np.int64))
            self.episode += int((done > 0).sum())
            written = self.buffer.extend(self.TensorDict(tensors, batch_size=[len(done)]))
            self.buffer.update_priority(written, self.torch.from_numpy(
                steps["priorities"].astype(np.float32)))

    def close(self) -> None:
        """Nothing to release: its storage goes with the object."""

    def learner_step(self, priorities) -> None:
        sample = self.buffer.sample()
        per_step = self.torch.from_numpy(np.repeat(priorities, LENGTH).astype(np.float32))
        self.buffer.update_priority(sample["index"], per_step)


class ReverbSequences:
    """Acme's R2D2 over Reverb: sequence items made by a trajectory writer as Acme's
    SequenceAdder (period PERIOD, length LENGTH, episode ends padded) makes them, in a
    prioritized table (sequence_table) served in this process or in one of its own
    (`placement`), sampled through a TrajectoryDataset and updated by mutate_priorities
    (benchmarks/_reverb.py's ReverbApi: its placements, its dataset and its learner step)."""

    def __init__(self, steps: int, placement: str):
        from benchmarks import _reverb

        reverb = _reverb.import_reverb()
        if placement == "inprocess":
            self.api = _reverb.ReverbApi(reverb, steps, 0, placement,
                                         table=sequence_table(steps))
        else:
            self.api = _reverb.ReverbApi(reverb, steps, 0, placement, command=[
                sys.executable, os.path.abspath(__file__), "serve", str(steps)])
        self.table, self.pool = _reverb.TABLE, _reverb.POOL
        # Acme's adders keep `sequence_length` steps alive in the writer's history.
        self.writer = self.api.client.trajectory_writer(num_keep_alive_refs=LENGTH)
        self.padding = {key: np.zeros(shape_of(spec), dtype=spec["dtype"])
                        for key, spec in ENV.items()}
        self.priorities: list = []      # the episode's step priorities so far
        self.next_start = 0             # the episode's step where the next item starts

    def _append(self, step, priority: float | None) -> None:
        """One step (`priority` None: a padding step), and the item that it completes."""
        self.writer.append(step)
        if priority is not None:
            self.priorities.append(priority)
        if self.writer.episode_steps == self.next_start + LENGTH:
            real = self.priorities[self.next_start:self.next_start + LENGTH]
            # R2D2's mix of its steps' priorities, as ours makes a sequence's first priority.
            priority = 0.9 * max(real) + 0.1 * sum(real) / len(real)
            history = self.writer.history
            self.writer.create_item(self.table, priority,
                                    {key: history[key][-LENGTH:] for key in ENV})
            self.next_start += PERIOD

    def put(self, steps) -> None:
        """One add of ours: its steps appended one by one, as an actor's adder does."""
        priorities = steps["priorities"].tolist()
        for k, priority in enumerate(priorities):
            self._append({key: steps[key][k] for key in ENV}, priority)
            if steps["done"][k]:
                # An episode's end: padding until every sequence that starts in it is whole
                # (Acme's pad_end_of_episode), then a new episode.
                while self.next_start < len(self.priorities):
                    self._append(self.padding, None)
                self._new_episode()

    def _new_episode(self) -> None:
        self.writer.end_episode(clear_buffers=True)
        self.priorities, self.next_start = [], 0

    def end_stream(self) -> None:
        """Another writer's steps follow: its episode's unfinished sequences are dropped (ours
        never makes them sampleable either)."""
        self._new_episode()

    def items(self) -> int:
        """Items in the table."""
        from benchmarks import _reverb

        return _reverb.table_size(self.api.client)

    def close(self) -> None:
        self.writer.close()
        self.api.close()


def sequence_table(steps: int):
    """Reverb's table of sequence items: prioritized (exponent 0.9, as our alpha), FIFO, a
    signature of LENGTH steps of every column, room for as many items as steps (a sequence
    starts every PERIOD steps: it never evicts, as ours holds every sequence of its steps)."""
    from benchmarks import _reverb

    reverb = _reverb.import_reverb()
    import tensorflow as tf

    signature = {key: tf.TensorSpec((LENGTH,) + shape_of(spec), tf.as_dtype(spec["dtype"]))
                 for key, spec in ENV.items()}
    return reverb.Table(
        name=_reverb.TABLE, sampler=reverb.selectors.Prioritized(priority_exponent=0.9),
        remover=reverb.selectors.Fifo(), max_size=steps,
        rate_limiter=reverb.rate_limiters.MinSize(1), signature=signature)


def shape_of(spec) -> tuple:
    """A column's step shape, as a tuple."""
    shape = spec.get("shape", ())
    return (shape,) if isinstance(shape, int) else tuple(shape)


def sample_bytes(batch: int) -> int:
    """Bytes one sample(batch) returns: every column's steps, the mask, and the per-sequence
    indexes, weights and generations."""
    step = sum(int(np.prod(spec["shape"] if "shape" in spec else 1)) * np.dtype(
        spec["dtype"]).itemsize for spec in ENV.values())
    return batch * (LENGTH * (step + 1) + 8 + 4 + 8)


#: The peers: their modules, names, what the issue asks of our learner step against theirs,
#: and the measure judged. Reverb's dataset makes its batches ahead on threads of its own
#: (4 batches prefetched, 2 batches of samples in flight), and between two of its calls
#: interleaved one by one the other calls give those threads the time to make the next batch
#: on the second core: its learner step is judged IN_A_ROW, where each timed call waits for
#: work done in the timed span. TorchRL does nothing between calls.
IN_A_ROW = "learner step, in a row"
PEERS = {"torchrl": ("torchrl", "TorchRL", 10.0, "learner step"),
         "reverb": ("reverb", "Reverb (in process)", 50.0, IN_A_ROW),
         "reverb_grpc": ("reverb", "Reverb (gRPC)", 50.0, IN_A_ROW)}
#: Reverb's placements (benchmarks/_reverb.py): its server in this process, or in a process
#: of its own reached over gRPC, as Acme runs a learner and its replay.
REVERB = {"reverb": "inprocess", "reverb_grpc": "grpc"}
#: In a row: per block, a pause of SETTLE seconds (Reverb's threads finish making batches
#: ahead, which would otherwise run during the next block, whoever's it is), AHEAD calls
#: untimed (those batches), then the timed calls; the libraries take turns block by block, the
#: order rotated every block.
SETTLE = 0.5
AHEAD = 8
#: A sample's gather against the copy floor of its bytes: the most it may take.
FLOOR_TARGET = 1.5
#: Each gather row and the floor it is judged against (same output kind: a new array, or the
#: arrays of an earlier sample).
GATHER_PAIRS = (("sample(64)", "copy floor, new array"),
                ("sample(64, out=)", "copy floor, into an array"))
BLOCKS = 5
#: The gathers are measured twice: first as the run finds the learner's mapping (its pages not
#: yet mapped in this handle where other handles wrote them: a first read of each faults), then
#: once every page of the segment has been read through it (as a learner's mapping is after
#: its first pass over the buffer).
MAPPINGS = ("mapping cold", "mapping warm")


def make_peers(wanted, steps: int):
    """({key: filled-to-be peer} of the peers asked for that import here, {key: why not})."""
    peers, skipped = {}, {}
    for key, (module, _, _, _) in PEERS.items():
        if key not in wanted:
            skipped[key] = "not asked for (--peers)"
            continue
        try:
            importlib.import_module(module)
            peers[key] = (TorchRLSequences(steps) if key == "torchrl" else
                          ReverbSequences(steps, REVERB[key]))
        except ImportError as error:
            skipped[key] = (f"not importable in this interpreter ({error}); `make "
                            f"bench-peers`, then run this script with .venv-{key}/bin/python")
    return peers, skipped


def in_a_row(calls, blocks: int, steps: int):
    """{key: [seconds per call of each block]}: per block, a pause of SETTLE s, each call AHEAD
    times untimed, then `steps` times timed as one span; the keys take turns, the order
    rotated every block."""
    keys = list(calls)
    times = {key: [] for key in keys}
    for number in range(blocks):
        shift = number % len(keys)
        for key in keys[shift:] + keys[:shift]:
            call = calls[key]
            time.sleep(SETTLE)
            for _ in range(AHEAD):
                call()
            start = time.perf_counter()
            for _ in range(steps):
                call()
            times[key].append((time.perf_counter() - start) / steps)
    return times


def stats(values) -> dict:
    """Median, min and max of per-call seconds, in µs."""
    return {"median_us": 1e6 * statistics.median(values), "min_us": 1e6 * min(values),
            "max_us": 1e6 * max(values)}


def touch_pages(rb) -> int:
    """Read one byte of every 4 KiB page of `rb`'s segment through `rb`'s own mapping (each
    page then mapped in this handle); returns how many pages."""
    pages = np.frombuffer(rb._segment.memory, dtype=np.uint8)[::4096]
    try:
        int(pages.sum())
        return pages.size
    finally:
        del pages   # the segment's mapping cannot close while a view of it lives


def paired(times, gather: str, floor: str) -> dict:
    """A gather's time over its floor's: per round (the two calls made in the same round, one
    right after the other or nearly), their median and quartiles, the same median in each of
    BLOCKS blocks of consecutive rounds (how much it moves over the run), and the ratio of the
    minima."""
    ratios = [a / b for a, b in zip(times[gather], times[floor])]
    quartiles = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
    size = max(1, len(ratios) // BLOCKS)
    blocks = [statistics.median(ratios[k:k + size]) for k in range(0, len(ratios), size)]
    return {"gather": gather, "floor": floor, "median": statistics.median(ratios),
            "q1": quartiles[0], "q3": quartiles[-1], "blocks": blocks,
            "minima": min(times[gather]) / min(times[floor]), "rounds": len(ratios)}


def summary(rows, gathers, skipped) -> list:
    """The issue's target lines: our learner step against each peer's, each gather against
    its floor. A target is met only when the ratio of the medians and that of the minima
    both meet it (benchmarks/_common.verdict)."""
    def row(library, operation):
        return next((r for r in rows if r["library"] == library
                     and r["operation"] == operation), None)

    lines = []
    for key, (_, name, target, operation) in PEERS.items():
        ours, theirs = row("cpprb_ray", operation), row(key, operation)
        head = f"target {operation} >= {target:g}x {name}: "
        if theirs is None or ours is None:
            lines.append(head + f"not measured ({skipped.get(key, 'not run')})")
            continue
        median = theirs["median_us"] / ours["median_us"]
        minima = theirs["min_us"] / ours["min_us"]
        lines.append(head + f"{_common.verdict(median >= target, minima >= target)} "
                     f"({median:.1f}x; {minima:.1f}x of the minima)")
    for pair in gathers:
        judged = _common.verdict(pair["median"] <= FLOOR_TARGET, pair["minima"] <= FLOOR_TARGET,
                                 "the per-round ratios' median and the minima's ratio")
        lines.append(
            f"target {pair['gather']} within {FLOOR_TARGET:g}x of its copy floor "
            f"({pair['floor']}), {pair['mapping']}: {judged} "
            f"({pair['median']:.2f}x, quartiles {pair['q1']:.2f}-{pair['q3']:.2f}, blocks "
            f"{min(pair['blocks']):.2f}-{max(pair['blocks']):.2f}; "
            f"{pair['minima']:.2f}x of the minima)")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2**14 steps, fewer repetitions")
    parser.add_argument("--size", type=int, default=None, help="steps (default 2**20)")
    parser.add_argument("--peers", nargs="+", choices=list(PEERS) + ["none"],
                        help="only these peers (default: every one importable here; none: "
                             "ours alone)")
    parser.add_argument("--json", default=None)
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["serve"]:   # the gRPC placement's server process (ReverbApi starts it)
        from benchmarks import _reverb

        return _reverb.serve(int(argv[1]), 0, table=sequence_table(int(argv[1])))
    args = parser.parse_args(argv)
    size = args.size or (2**14 if args.quick else 2**20)
    repeats = 20 if args.quick else 100
    cpprb_ray = _common.import_cpprb_ray()
    bandwidth = copy_bandwidth()
    print(f"copy bandwidth (one core, 256 MiB): {bandwidth / 1e9:.1f} GB/s moved")
    handles = sequence_handles(cpprb_ray, size)
    rb = handles[0]
    peers, skipped = make_peers(args.peers or list(PEERS), size)
    for key, why in skipped.items():
        print(f"{PEERS[key][1]}: skipped ({why})")
    try:
        start = time.perf_counter()
        fill(handles, size, peers=list(peers.values()))
        print(f"filled {size} steps in {time.perf_counter() - start:.1f} s: "
              f"{rb.get_stored_size()} sequences"
              + "".join(f" ({PEERS[key][1]}: {peers[key].items()} items)" for key in REVERB
                        if key in peers),
              flush=True)
        priorities = np.random.default_rng(1).random(BATCH) + 0.1

        def learner_step():
            batch = rb.sample(BATCH, beta=0.6)
            rb.update_priorities(batch["indexes"], priorities, batch["generations"])

        reused = rb.sample(BATCH, beta=0.6)
        moved = sample_bytes(BATCH)
        # The floors, measured beside the samples under the same load: a copy of as many bytes
        # from a random place of a 256 MiB array (outside every cache, as the sampled steps
        # are: the segment is larger still), into a new array (as sample(64) makes its
        # outputs) or into one array reused (as sample(64, out=) fills an earlier sample's);
        # and, warm, the same bytes again every time (what the 32 MiB-class caches keep of
        # them).
        source = np.ones(2**28, dtype=np.uint8)
        target = np.empty(moved, dtype=np.uint8)
        places = iter(np.random.default_rng(2).integers(
            0, source.size - moved, 5 * (repeats + 1)).tolist())

        def new_array():
            at = next(places)
            source[at:at + moved].copy()

        def into_array():
            at = next(places)
            np.copyto(target, source[at:at + moved])

        calls = {("cpprb_ray", "learner step"): learner_step,
                 ("cpprb_ray", "sample(64)"): lambda: rb.sample(BATCH, beta=0.6),
                 ("cpprb_ray", "sample(64, out=)"): lambda: rb.sample(BATCH, beta=0.6,
                                                                       out=reused),
                 ("numpy", "copy floor, new array"): new_array,
                 ("numpy", "copy floor, into an array"): into_array,
                 ("numpy", "copy floor, warm"): lambda: np.copyto(target, source[:moved])}
        if "torchrl" in peers:
            calls[("torchrl", "learner step")] = lambda: peers["torchrl"].learner_step(
                priorities)
        for key in REVERB:
            if key in peers:
                api = peers[key].api
                # (ReverbApi cycles through a pool of POOL priority arrays: the same one here.)
                calls[(key, "learner step")] = api.learner_step([priorities] * peers[key].pool,
                                                                BATCH)
                calls[(key, "sample(64)")] = api.sample(BATCH)
        for call in calls.values():
            call()
        # Interleaved: one call of each per round, the order rotated every round.
        times = _common.one_by_one_times(calls, repeats)
        rows = [dict(library=library, operation=name, **stats(times[(library, name)]))
                for library, name in calls]
        if any(key in peers for key in REVERB):
            blocks = in_a_row(dict([("cpprb_ray", learner_step)] + [
                (key, calls[(key, "learner step")]) for key in REVERB if key in peers]),
                3 if args.quick else 5, 8 if args.quick else 24)
            rows += [dict(library=library, operation=IN_A_ROW, **stats(series))
                     for library, series in blocks.items()]
        gathers = []
        for mapping in MAPPINGS:
            if mapping != MAPPINGS[0]:
                pages = touch_pages(rb)
                print(f"read {pages} pages of the segment through the learner's mapping")
                again = {key: calls[key] for pair in GATHER_PAIRS for key in (
                    ("cpprb_ray", pair[0]), ("numpy", pair[1]))}
                times = _common.one_by_one_times(again, repeats)
                rows += [dict(library=library, operation=f"{name}, {mapping}",
                              **stats(times[(library, name)])) for library, name in again]
            for gather, floor in GATHER_PAIRS:
                series = {gather: times[("cpprb_ray", gather)], floor: times[("numpy", floor)]}
                gathers.append(dict(paired(series, gather, floor), mapping=mapping))
        memory = {"nbytes": rb.nbytes, "steps": size, "bytes_per_step": rb.nbytes / size,
                  "record_bytes": rb._layout.row_stride}
    finally:
        for peer in peers.values():
            peer.close()
        for handle in handles[1:]:
            handle.close()
        rb.close()
    print(f"\n{'library':<12} {'operation':<40} {'median us':>10} {'min us':>9} {'max us':>9}")
    for row in rows:
        print(f"{row['library']:<12} {row['operation']:<40} {row['median_us']:>10.0f} "
              f"{row['min_us']:>9.0f} {row['max_us']:>9.0f}")
    bandwidth_floor_us = 2 * moved / bandwidth * 1e6
    print(f"\nsample(64) returns {moved / 2**20:.1f} MiB ({bandwidth_floor_us:.0f} us at the "
          f"256 MiB copy's bandwidth)")
    lines = summary(rows, gathers, skipped)
    print("\n".join(lines))
    print(f"bytes per step: {memory['bytes_per_step']:.0f} (record {memory['record_bytes']} "
          f"bytes; segment {memory['nbytes'] / 2**20:.0f} MiB for {size} steps)")
    _common.write_json(args.json, {
        "rows": rows, "gathers": gathers, "verdicts": lines, "skipped": skipped,
        "floor": {"bytes": moved, "bandwidth": bandwidth, "bandwidth_us": bandwidth_floor_us},
        "memory": memory, "load_average": os.getloadavg()})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
