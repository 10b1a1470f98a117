"""Pixel observations: the Atari layout with next_of + stack_compress, cpprb_ray against cpprb.

    python benchmarks/bench_frames.py [--quick] [--size N] [--writers 4] [--json FILE]

(`--quick`: 2**13 rows, what benchmarks/compare.py --quick runs; by default 2**20 rows, of
which 2**17 are filled: the rows sampled lie far outside every cache either way.)

Layout: obs uint8 (84, 84, 4) (a frame stack), act int64, rew float32, done float32, next_obs
by next_of, stack_compress="obs". Both libraries get the same episodes (frames of random bytes,
episodes of 20 to 2,000 steps) one step per add, with a priority per add for the prioritized
buffers. Measured in one process, call by call, the two libraries interleaved: add of one
step, sample(32), sample(256), update(256). Then cpprb_ray with `--writers` writer processes
(spawn, one lane each) adding while this process samples: rows per second in, samples per
second out; cpprb's next_of/stack_compress cannot be shared between processes at all.

Also the memory: the segment's bytes (rb.nbytes) at the size, against the same layout with
both stacks stored whole; and the floor of any sample: the bytes it must move (per row, 5
planes read, two stacks written) at the copy bandwidth of one core (np.copyto of 256 MiB).

--json FILE writes {"rows": [{"library", "operation", "median_us", "min_us", "max_us"}, ...],
"memory": {...}, "writers": {...}} (benchmarks/compare.py reads "rows").
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import _common  # noqa: E402

SHAPE = (84, 84, 4)
ENV = {"obs": {"shape": SHAPE, "dtype": np.uint8}, "act": {"dtype": np.int64},
       "rew": {"dtype": np.float32}, "done": {"dtype": np.float32}}


def env():
    return {key: dict(spec) for key, spec in ENV.items()}


class Episodes:
    """Steps of Atari-like episodes: a reset stack, then one new frame per step."""

    def __init__(self, seed: int):
        self.random = np.random.default_rng(seed)
        self.pool = self.random.integers(0, 256, (4096, 84, 84), dtype=np.uint8)
        self._reset()

    def _reset(self):
        self.length = int(self.random.integers(20, 2000))
        self.t = 0
        start = int(self.random.integers(0, 4096))
        self.stack = np.stack([self.pool[(start + j) % 4096] for j in range(4)], -1)
        self.cursor = start + 4

    def step(self):
        """(obs, act, rew, next_obs, done) of the next step."""
        obs = self.stack
        following = np.empty_like(obs)
        following[..., :-1] = obs[..., 1:]
        following[..., -1] = self.pool[self.cursor % 4096]
        self.cursor += 1
        self.t += 1
        done = self.t == self.length
        step = (obs, int(self.random.integers(0, 18)), float(self.random.random()), following,
                float(done))
        if done:
            self._reset()
        else:
            self.stack = following
        return step


def fill(rb, episodes: Episodes, count: int, prioritized: bool):
    for _ in range(count):
        obs, act, rew, following, done = episodes.step()
        if prioritized:
            rb.add(obs=obs, act=act, rew=rew, next_obs=following, done=done, priorities=1.0)
        else:
            rb.add(obs=obs, act=act, rew=rew, next_obs=following, done=done)
        if done and hasattr(rb, "on_episode_end"):
            rb.on_episode_end()


def writer(handle, seed: int, seconds: float, queue):
    episodes = Episodes(seed)
    added = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        obs, act, rew, following, done = episodes.step()
        handle.add(obs=obs, act=act, rew=rew, next_obs=following, done=done, priorities=1.0)
        added += 1
    queue.put(added)
    handle.close()


def copy_bandwidth() -> float:
    """Bytes per second one core moves (read + written) copying 256 MiB: the floor of any
    sample, which must read a row's planes and write its stacks."""
    source = np.ones(2**28, dtype=np.uint8)
    target = np.empty_like(source)
    np.copyto(target, source)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        np.copyto(target, source)
        best = min(best, time.perf_counter() - start)
    return 2 * source.nbytes / best


def sample_floor_us(batch: int, bandwidth: float) -> float:
    """The least time a sample(batch) of this layout can take: per row, 5 planes read (obs's
    4 and next_obs's newest) and two stacks written, at the copy bandwidth."""
    plane = 84 * 84
    moved = batch * (5 * plane + 2 * 4 * plane)
    return moved / bandwidth * 1e6


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2**13 rows, fewer repetitions")
    parser.add_argument("--size", type=int, default=None, help="rows (default 2**20; quick 2**13)")
    parser.add_argument("--writers", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=None, help="the writers' run")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    size = args.size or (2**13 if args.quick else 2**20)
    repeats = 20 if args.quick else 100
    seconds = args.seconds or (1.0 if args.quick else 10.0)
    cpprb_ray = _common.import_cpprb_ray()
    try:
        import cpprb
    except ImportError as error:
        cpprb = None
        print(f"cpprb: skipped ({error})")
    rows = []
    memory = {}
    bandwidth = copy_bandwidth()
    print(f"copy bandwidth (one core, 256 MiB): {bandwidth / 1e9:.1f} GB/s moved")
    for kind in ("ReplayBuffer", "PrioritizedReplayBuffer"):
        prioritized = kind.startswith("Prioritized")
        ours = getattr(cpprb_ray, kind)(size, env(), next_of="obs", stack_compress="obs",
                                        lanes=1)
        theirs = (getattr(cpprb, kind)(size, env(), next_of="obs", stack_compress="obs")
                  if cpprb is not None else None)
        try:
            memory[kind] = {"nbytes": ours.nbytes, "rows": size}
            fill_count = min(size, 2**13 if args.quick else 2**17)
            print(f"{kind}: filling {fill_count} steps each ...", flush=True)
            fill(ours, Episodes(0), fill_count, prioritized)
            if theirs is not None:
                fill(theirs, Episodes(0), fill_count, prioritized)
            libraries = [("cpprb_ray", ours)] + ([("cpprb", theirs)] if theirs else [])
            streams = {name: Episodes(1) for name, _ in libraries}
            indexes = np.random.default_rng(2).integers(0, fill_count, 256)
            priorities = np.random.default_rng(3).random(256) + 0.1
            operations = ["add(1)", "sample(32)", "sample(256)"]
            operations += ["update(256)"] if prioritized else []
            for operation in operations:
                series = {name: [] for name, _ in libraries}
                for _ in range(repeats):      # interleaved: one call of each, in turn
                    for name, rb in libraries:
                        if operation == "add(1)":
                            # The step is made outside the timed call: only the add counts.
                            obs, act, rew, following, done = streams[name].step()
                            extra = {"priorities": 1.0} if prioritized else {}
                            start = time.perf_counter()
                            rb.add(obs=obs, act=act, rew=rew, next_obs=following, done=done,
                                   **extra)
                        elif operation.startswith("sample"):
                            batch = int(operation[7:-1])
                            start = time.perf_counter()
                            rb.sample(batch)
                        else:
                            start = time.perf_counter()
                            rb.update_priorities(indexes, priorities)
                        series[name].append((time.perf_counter() - start) * 1e6)
                for name, _ in libraries:
                    values = series[name]
                    rows.append({"library": name, "class": kind, "operation": operation,
                                 "median_us": statistics.median(values), "min_us": min(values),
                                 "max_us": max(values)})
        finally:
            ours.close()
    print(f"\n{'class':<24} {'operation':<12} {'cpprb_ray us':>13} {'cpprb us':>10} "
          f"{'cpprb/ours':>10} {'floor us':>9} {'cpprb/floor':>11}")
    for row in rows:
        if row["library"] != "cpprb_ray":
            continue
        peer = [r for r in rows if r["library"] == "cpprb" and r["class"] == row["class"]
                and r["operation"] == row["operation"]]
        theirs_us = peer[0]["median_us"] if peer else float("nan")
        floor_us = (sample_floor_us(int(row["operation"][7:-1]), bandwidth)
                    if row["operation"].startswith("sample") else float("nan"))
        print(f"{row['class']:<24} {row['operation']:<12} {row['median_us']:>13.1f} "
              f"{theirs_us:>10.1f} {theirs_us / row['median_us']:>9.1f}x {floor_us:>9.1f} "
              f"{theirs_us / floor_us:>10.1f}x")
    whole = cpprb_ray._layout.plan(size, cpprb_ray._layout.parse_env_dict(
        dict(env(), next_obs=dict(ENV["obs"]))), True, "shm").total_size
    for kind, figures in memory.items():
        figures["whole_stacks_nbytes"] = whole
        print(f"memory, {kind} at {size} rows: {figures['nbytes'] / 2**30:.2f} GiB "
              f"(both stacks whole: {whole / 2**30:.2f} GiB)")
    # Many writers: what cpprb's next_of / stack_compress cannot do (one process only).
    context = multiprocessing.get_context("spawn")
    shared = cpprb_ray.PrioritizedReplayBuffer(size, env(), next_of="obs",
                                               stack_compress="obs", lanes=args.writers)
    try:
        queue = context.Queue()
        processes = [context.Process(target=writer, args=(shared, 10 + k, seconds, queue))
                     for k in range(args.writers)]
        for process in processes:
            process.start()
        while shared.get_stored_size() < 256:
            time.sleep(0.01)
        samples = 0
        start = time.monotonic()
        while any(p.is_alive() for p in processes):
            shared.sample(32)
            samples += 32
            if time.monotonic() - start > seconds + 60:
                break
        elapsed = time.monotonic() - start
        added = sum(queue.get(timeout=60) for _ in processes)
        for process in processes:
            process.join(60)
        writers = {"writers": args.writers, "seconds": seconds, "rows_added": added,
                   "add_rate": added / seconds, "sample_rate": samples / elapsed}
        print(f"{args.writers} writer processes ({seconds:g} s): {added / seconds:,.0f} steps/s "
              f"in, {samples / elapsed:,.0f} rows/s sampled (batches of 32) meanwhile")
    finally:
        shared.close()
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"rows": rows, "memory": memory, "writers": writers, "size": size,
                       "copy_bandwidth_bytes_per_s": bandwidth,
                       "sample_floor_us": {b: sample_floor_us(b, bandwidth) for b in (32, 256)}},
                      out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
