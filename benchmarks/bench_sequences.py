"""Sequences for recurrent learners (R2D2's layout): a learner step, the gather against the copy
floor, and the bytes per step.

    python benchmarks/bench_sequences.py [--quick] [--size N] [--json FILE]

(`--quick`: 2**14 steps, fewer repetitions; by default 2**20 steps.)

Layout (Acme's R2D2 defaults): obs float32[64], core float32[512] (the recurrent state stored
with every step), act int64, rew float32, done float32; ``sequence={"length": 120, "period":
40}``, 16 lanes (16 handles in this process, one writer each), alpha 0.9. The buffer is filled
with episodes of 50 to 1,000 steps, adds of 40 steps with a priority per step. Then, in one
process, medians over the repetitions:

- learner step: sample(64, beta=0.6) and update_priorities of its 64 sequences (one priority
  each, with their generations);
- sample(64) alone, against the copy floor: np.copyto of as many bytes as the sample returns
  (64 x 120 steps of every column, the mask) from a random place of a 256 MiB array, timed
  beside it (and, as bench_frames.py measures it, those bytes at the copy bandwidth of one
  core): the least a gather of them can take;
- bytes per step: the segment's bytes (rb.nbytes) over its steps (each step is stored once;
  overlapping sequences share it).

Where TorchRL 0.14 imports (its venv: make bench-peers, .venv-torchrl), the same steps go into
a TorchRL ``TensorDictReplayBuffer`` with a ``PrioritizedSliceSampler(slice_len=120,
traj_key="episode")`` over a ``LazyTensorStorage``, and its learner step (a sample of 64
slices of 120 steps, then update_priority of their 7,680 step indexes with each slice's
priority) is timed interleaved with ours (run it with that venv's python:
``.venv-torchrl/bin/python benchmarks/bench_sequences.py``; it finds this checkout's build).
Reverb is not measured here.

--json FILE writes {"rows": [{"library", "operation", "median_us", "min_us", "max_us"}, ...],
"floor": {...}, "memory": {...}}.
"""

from __future__ import annotations

import argparse
import json
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


def fill(handles, steps: int, seed: int = 0, peer=None) -> None:
    """`steps` steps in all, spread over the handles (one lane each), adds of PERIOD steps with
    a priority per step; episodes of 50 to 1,000 steps (done ends them). `peer`: a TorchRL
    buffer that gets the same steps, handle after handle."""
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
            if peer is not None:
                peer.add(values)
            written += count
        if peer is not None:
            peer.flush(stream_ends=True)


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

    def add(self, steps) -> None:
        """`steps`: a dict of numpy arrays (one add of ours); written in chunks of 8,192 steps
        (one extend and one update_priority each: TorchRL's per-call cost would make a fill
        of 2^20 steps in adds of 40 take half an hour)."""
        self.pending.append(steps)
        if sum(len(part["done"]) for part in self.pending) >= 8192:
            self.flush()

    def flush(self, stream_ends: bool = False) -> None:
        """Extend by the pending steps, episode ids from their done flags; `stream_ends`: the
        next steps are another writer's (a new episode)."""
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
        if stream_ends:
            self.episode += 1

    def learner_step(self, priorities) -> None:
        sample = self.buffer.sample()
        per_step = self.torch.from_numpy(np.repeat(priorities, LENGTH).astype(np.float32))
        self.buffer.update_priority(sample["index"], per_step)


def sample_bytes(batch: int) -> int:
    """Bytes one sample(batch) returns: every column's steps, the mask, and the per-sequence
    indexes, weights and generations."""
    step = sum(int(np.prod(spec["shape"] if "shape" in spec else 1)) * np.dtype(
        spec["dtype"]).itemsize for spec in ENV.values())
    return batch * (LENGTH * (step + 1) + 8 + 4 + 8)


def timed(call, repeats: int):
    values = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        values.append((time.perf_counter() - start) * 1e6)
    return values


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2**14 steps, fewer repetitions")
    parser.add_argument("--size", type=int, default=None, help="steps (default 2**20)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    size = args.size or (2**14 if args.quick else 2**20)
    repeats = 20 if args.quick else 100
    cpprb_ray = _common.import_cpprb_ray()
    bandwidth = copy_bandwidth()
    print(f"copy bandwidth (one core, 256 MiB): {bandwidth / 1e9:.1f} GB/s moved")
    rb = cpprb_ray.PrioritizedReplayBuffer(size, env(), alpha=0.9, lanes=LANES, seed=0,
                                           sequence={"length": LENGTH, "period": PERIOD})
    handles = [rb] + [cpprb_ray.PrioritizedReplayBuffer.attach(rb.name, seed=k)
                      for k in range(1, LANES)]
    rows = []
    peer = None
    try:
        peer = TorchRLSequences(size)
    except ImportError as error:
        print(f"TorchRL: skipped ({error})")
    try:
        start = time.perf_counter()
        fill(handles, size, peer=peer)
        print(f"filled {size} steps in {time.perf_counter() - start:.1f} s: "
              f"{rb.get_stored_size()} sequences", flush=True)
        random = np.random.default_rng(1)
        priorities = random.random(BATCH) + 0.1

        def learner_step():
            batch = rb.sample(BATCH, beta=0.6)
            rb.update_priorities(batch["indexes"], priorities, batch["generations"])

        def sample_only():
            rb.sample(BATCH, beta=0.6)

        moved = sample_bytes(BATCH)
        # The floor, measured beside the sample under the same load: a copy of as many bytes
        # from a random place of a 256 MiB array (outside every cache, as the sampled steps
        # are) into one array, np.copyto.
        source = np.ones(2**28, dtype=np.uint8)
        target = np.empty(moved, dtype=np.uint8)
        places = np.random.default_rng(2).integers(0, source.size - moved, repeats + 1)
        floor = iter(places.tolist())

        def copy_floor():
            at = next(floor)
            np.copyto(target, source[at:at + moved])

        calls = [("cpprb_ray", "learner step", learner_step),
                 ("cpprb_ray", "sample(64)", sample_only), ("numpy", "copy floor", copy_floor)]
        if peer is not None:
            calls.append(("torchrl", "learner step", lambda: peer.learner_step(priorities)))
        series = {(library, name): [] for library, name, _ in calls}
        for _, _, call in calls:
            call()
        for _ in range(repeats):       # interleaved: one call of each, in turn
            for library, name, call in calls:
                series[(library, name)] += timed(call, 1)
        for (library, name), values in series.items():
            rows.append({"library": library, "operation": name,
                         "median_us": statistics.median(values), "min_us": min(values),
                         "max_us": max(values)})
        # (The bandwidth's floor: a copy reads and writes each byte.)
        floor_us = [r for r in rows if r["operation"] == "copy floor"][0]["median_us"]
        bandwidth_floor_us = 2 * moved / bandwidth * 1e6
        memory = {"nbytes": rb.nbytes, "steps": size, "bytes_per_step": rb.nbytes / size,
                  "record_bytes": rb._layout.row_stride}
    finally:
        for handle in handles[1:]:
            handle.close()
        rb.close()
    sample_us = [r for r in rows if r["operation"] == "sample(64)"][0]["median_us"]
    print(f"\n{'library':<10} {'operation':<14} {'median us':>10} {'min us':>9} {'max us':>9}")
    for row in rows:
        print(f"{row['library']:<10} {row['operation']:<14} {row['median_us']:>10.0f} "
              f"{row['min_us']:>9.0f} {row['max_us']:>9.0f}")
    theirs = [r for r in rows if r["library"] == "torchrl"]
    if theirs:
        ours = [r for r in rows if r["library"] == "cpprb_ray"
                and r["operation"] == "learner step"][0]
        print(f"learner step, TorchRL / cpprb_ray: "
              f"{theirs[0]['median_us'] / ours['median_us']:.1f}x")
    print(f"\nsample(64) returns {moved / 2**20:.1f} MiB; copy floor {floor_us:.0f} us "
          f"(np.copyto of as many bytes; {bandwidth_floor_us:.0f} us at the 256 MiB copy's "
          f"bandwidth); sample/floor {sample_us / floor_us:.2f}")
    print(f"bytes per step: {memory['bytes_per_step']:.0f} (record {memory['record_bytes']} "
          f"bytes; segment {memory['nbytes'] / 2**20:.0f} MiB for {size} steps)")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"rows": rows, "floor": {"bytes": moved, "us": floor_us,
                                               "bandwidth": bandwidth,
                                               "bandwidth_us": bandwidth_floor_us},
                       "memory": memory}, handle, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
