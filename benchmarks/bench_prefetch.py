"""A learner's wait for its batch, with and without ``rb.prefetch`` (docs/learner.md).

    python benchmarks/bench_prefetch.py [--quick] [--steps N] [--peers P ...]
        [--workloads apex,pixels,sequences,limited,threads] [--json FILE]
    python benchmarks/bench_prefetch.py --only-threads --threads torch [--steps N]

A learner loop: take a batch (``sample(..., out=)`` into one preallocated set, or ``next()`` of
``rb.prefetch(batch, depth=D)`` for each D of ``--depths``, 2 and 4 by default), a network
step simulated by T microseconds of GIL-releasing numpy work (``np.sin`` over a float64 array
sized for T: a core kept busy, as a network's forward and backward pass would), then
``update_priorities`` of the batch. For each workload the sample time S is measured first
(median of ``sample(out=)``), then T = 0.5 S, 1 S and 2 S are run, without prefetch and with
it at each depth (interleaved), each for `--steps` steps (3000; --quick 500), cut to what
fits in RUN_BUDGET_S seconds (at least RUN_MIN_STEPS): sequences' and TorchRL's samples take
milliseconds. Reported: the learner-visible wait per step (the time from asking for the batch
to having it: ``sample(out=)`` without prefetch, ``next()`` with it; median and mean over the
steps), the median's ratio to S, the network step's median as the learner saw it (T, and any
wait for the GIL at its end), the priority update's median, and steps per second.

Workloads (``--workloads``, all by default):

- apex: Ape-X rows (obs float32 x4, act, rew, next_obs, done), batch 256, 2^20 rows, a
  prioritized buffer (alpha 0.6), filled before anything is timed.
- pixels: the Atari layout (obs uint8 84x84x4 with next_of and stack_compress), batch 32,
  2^15 rows (--quick: 2^13) in episodes of 500 steps.
- sequences: R2D2's layout as benchmarks/bench_sequences.py makes and fills it (obs
  float32[64], core float32[512], act, rew, done; ``sequence={"length": 120, "period":
  40}``, 16 lanes, alpha 0.9; episodes of 50 to 1,000 steps), batch 64 sequences of 120
  steps, 2^18 steps (``--sequence-steps``; --quick: 2^14): 2^20 would take two copies of
  2.4 GB with TorchRL's beside it.
- limited: the apex loop at T = 60 us with prefetch, a SampleToInsertRatio limiter
  (samples_per_insert 8, error_buffer 4096 rows) and an actor thread adding 64 rows at a time:
  the ratio of samples to inserts at the end, and whether the limiter's diff stayed in its
  window (it does exactly: the thread's samples are admitted under the lock like any other).
- remote (not run by default: it starts a two-node Ray cluster, benchmarks/_two_nodes.py, and
  needs root for its mount namespace): the apex buffer at 2^16 rows made here, on the head;
  the learner is a Ray task on the second node, which cannot see the segment, so that its
  handle samples and updates through the buffer's proxy actor (cpprb_ray.remote). S is the
  median ``sample(out=)`` through the proxy there (a Ray call: milliseconds), and the loop
  runs as above: what prefetch hides of the Ray call's latency.
- threads: a learner whose step is a float32 192 x 192 matmul through numpy's BLAS or
  (``--threads torch``) through torch's intra-op threads, as a network's layers would be,
  with 2 math threads and with 1 (``OMP_NUM_THREADS`` / ``OPENBLAS_NUM_THREADS``, and
  ``torch.set_num_threads``; each run a process of its own, ``--rounds`` times, interleaved):
  the median sample(256) at 2^20 rows (--quick: 2^16) timed between steps, and steps per
  second and the learner's wait without prefetch and with it at depths 2 and 4.
  ``--only-threads`` runs this part alone.

Peers (``--peers torchrl`` or ``none``; by default every one that imports here): TorchRL
0.14 where torchrl imports (``make bench-peers`` makes .venv-torchrl, which has cpprb and
this package too; run the script with its python, e.g. ``.venv-torchrl/bin/python
benchmarks/bench_prefetch.py --peers torchrl``: it finds this checkout's build). On the same
rows (apex: benchmarks/_libraries.py's filled TorchRL buffer; pixels: the same episodes, obs
and next_obs stored whole; sequences: bench_sequences.py's ``PrioritizedSliceSampler(slice_len
=120)``, filled with the same steps), a ``TensorDictReplayBuffer`` over a ``LazyTensorStorage``
and its prioritized sampler, made with ``prefetch=D`` (its thread pool samples D batches
ahead) or without, runs the same learner loop after ours at each T and depth (``sample()``,
the step, ``update_priority`` of the sampled rows: for sequences each step of a slice gets
the slice's priority), and once more at T = its own sample time. The limited part has no
peer: TorchRL 0.14 has no rate limiter, and the ``RateLimitedReplayBuffer`` of later versions
refuses ``prefetch`` (a ValueError).

--json FILE writes {"info": ..., "rows": [{"library", "workload", "T_factor", "T_us",
"prefetch", "depth", "sample_us", "wait_us", "mean_wait_us", "wait_ratio", "step_us",
"update_us", "steps_per_s", "steps"}, ...], "limited": {...}, "threads": [...]} (T_factor: T
over cpprb_ray's S;
sample_us and wait_ratio: the row's library's own S).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Sequence

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import _common  # noqa: E402
from benchmarks import bench_sequences as sequences  # noqa: E402

PIXEL_SHAPE = (84, 84, 4)
PIXEL_EPISODE = 500
#: The peers, each measured where it imports (its module's name).
PEERS = ("torchrl",)
#: The parts of a run, in their order.
WORKLOADS = ("apex", "pixels", "sequences", "limited", "threads")
#: Parts run only when asked for (--workloads).
OPTIONAL_WORKLOADS = ("remote",)
#: Seconds a run takes at most: its steps are cut to fit (sequences' and TorchRL's samples
#: take milliseconds), to RUN_MIN_STEPS at the least.
RUN_BUDGET_S = 4.0
RUN_MIN_STEPS = 20


def busy_work(microseconds: float) -> Callable[[], None]:
    """A callable that keeps this core busy about `microseconds`, with the GIL released
    (numpy's ufunc loops release it): ``np.sin`` over an array sized for it, measured on that
    size (an estimate from a large array was off by 2x: its loop ran from memory, a small one
    from the cache), five times, each time resized to what the median call took."""
    source = np.random.default_rng(0).standard_normal(1 << 20)
    target = np.empty_like(source)
    started = time.perf_counter()
    for _ in range(5):
        np.sin(source, out=target)
    count = max(1, int(microseconds * 1e-6 / ((time.perf_counter() - started) / (5 * source.size))))
    for _ in range(5):
        data = np.random.default_rng(1).standard_normal(count)
        out = np.empty_like(data)
        times = []
        for _ in range(max(20, min(200, int(0.05 / max(microseconds * 1e-6, 1e-6))))):
            started = time.perf_counter()
            np.sin(data, out=out)
            times.append(time.perf_counter() - started)
        count = max(1, int(count * microseconds * 1e-6 / statistics.median(times)))
    data = np.random.default_rng(1).standard_normal(count)
    out = np.empty_like(data)

    def work() -> None:
        np.sin(data, out=out)
    return work


def apex_buffer(cpprb_ray: Any, capacity: int, **options: Any) -> Any:
    rb = cpprb_ray.PrioritizedReplayBuffer(capacity, _common.env_dict(), alpha=_common.ALPHA,
                                           seed=0, **options)
    _common.fill(rb, capacity, np.random.default_rng(0))
    return rb


def pixel_episodes(capacity: int):
    """Episodes of PIXEL_EPISODE steps (dicts of numpy columns: obs, next_obs, act, rew, done)
    until `capacity` steps: the same ones for every library."""
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 255, (PIXEL_EPISODE + 4,) + PIXEL_SHAPE[:2], dtype=np.uint8)
    stacks = np.stack([frames[i:i + PIXEL_EPISODE + 1] for i in range(4)], axis=-1)
    done = np.zeros(PIXEL_EPISODE, np.float32)
    done[-1] = 1
    for _ in range(-(-capacity // PIXEL_EPISODE)):
        yield {"obs": stacks[:-1], "next_obs": stacks[1:],
               "act": rng.integers(0, 4, PIXEL_EPISODE),
               "rew": rng.standard_normal(PIXEL_EPISODE).astype(np.float32), "done": done}


def pixel_buffer(cpprb_ray: Any, capacity: int) -> Any:
    env = {"obs": {"shape": PIXEL_SHAPE, "dtype": np.uint8}, "act": {"dtype": np.int64},
           "rew": {}, "done": {}}
    rb = cpprb_ray.PrioritizedReplayBuffer(capacity, env, alpha=_common.ALPHA, seed=0,
                                           next_of="obs", stack_compress="obs")
    for episode in pixel_episodes(capacity):
        rb.add(**episode)
    return rb


def sample_time_us(rb: Any, batch: int, calls: int = 300) -> float:
    """The median sample(out=) of `calls` calls in a row, after as many unmeasured: a buffer
    just filled samples slower at first (its pages settling), and S sets every T."""
    out = rb.sample(batch)
    for _ in range(calls):
        rb.sample(batch, out=out)
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        rb.sample(batch, out=out)
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e6


def learner(rb: Any, batch: int, work: Callable[[], None], steps: int,
            prefetch: bool, depth: int = 2) -> Dict[str, Any]:
    """The loop; the learner's wait per step (s: median and mean of the time from asking for
    a batch to having it, ``sample(out=)`` or ``next()``), its priority update (s, median),
    steps per second and steps."""
    rng = np.random.default_rng(2)
    priorities = rng.uniform(0.01, 10.0, batch).astype(np.float32)
    batches = rb.prefetch(batch, depth=depth) if prefetch else None
    out = rb.sample(batch)
    if batches is not None:
        next(batches)   # the ring allocated, the thread started
    waits, works, updates = [], [], []
    started = time.perf_counter()
    for _ in range(steps):
        asked = time.perf_counter()
        sampled = next(batches) if batches is not None else rb.sample(batch, out=out)
        stepped = time.perf_counter()
        work()
        asked_update = time.perf_counter()
        rb.update_priorities(sampled["indexes"], priorities, sampled["generations"])
        updated = time.perf_counter()
        waits.append(stepped - asked)
        works.append(asked_update - stepped)
        updates.append(updated - asked_update)
    elapsed = time.perf_counter() - started
    if batches is not None:
        batches.close()
    return loop_result(waits, updates, elapsed, works)


def loop_result(waits: List[float], updates: List[float], elapsed: float,
                works: List[float]) -> Dict[str, Any]:
    """A learner loop's figures: the wait for a batch (median and mean), the network step as
    the learner saw it (median: T, and whatever kept the learner from going on after it, such
    as waiting for the GIL), the priority update (median), steps per second, steps."""
    return {"wait_s": statistics.median(waits), "mean_wait_s": statistics.fmean(waits),
            "step_s": statistics.median(works), "update_s": statistics.median(updates),
            "steps_per_s": len(waits) / elapsed, "steps": len(waits)}


def run_steps(steps: int, step_us: float) -> int:
    """`steps`, cut so that a run of steps of about `step_us` takes RUN_BUDGET_S."""
    return max(RUN_MIN_STEPS, min(steps, int(RUN_BUDGET_S / (step_us * 1e-6))))


def result_row(library: str, name: str, factor: float, work_us: float, depth: int,
               sample_us: float, result: Dict[str, float]) -> Dict[str, Any]:
    """One run's row (`factor`: T over cpprb_ray's S; `sample_us`: the library's own S), and
    its line printed."""
    wait_us, mean_us = result["wait_s"] * 1e6, result["mean_wait_s"] * 1e6
    update_us, step_us = result["update_s"] * 1e6, result["step_s"] * 1e6
    print(f"{name:<9} {library:<9} T={factor:>4.2g}xS ({work_us:8.1f} us) "
          f"{f'depth {depth}' if depth else 'direct '}: wait median {wait_us:8.1f} us "
          f"({100 * wait_us / sample_us:5.1f}% of its S={sample_us:.1f} us), mean "
          f"{mean_us:8.1f} us, step {step_us:8.1f} us, update {update_us:8.1f} us, "
          f"{result['steps_per_s']:8.0f} "
          f"steps/s ({result['steps']} steps)", flush=True)
    return {"library": library, "workload": name, "T_factor": factor, "T_us": work_us,
            "prefetch": depth > 0, "depth": depth or None, "sample_us": sample_us,
            "wait_us": wait_us, "mean_wait_us": mean_us, "wait_ratio": wait_us / sample_us,
            "step_us": step_us, "update_us": update_us, "steps_per_s": result["steps_per_s"],
            "steps": result["steps"]}


def run_workload(name: str, rb: Any, batch: int, steps: int,
                 depths: Sequence[int] = (2, 4), peer: Any = None) -> List[Dict[str, Any]]:
    """For T = 0.5, 1 and 2 S (S: cpprb_ray's sample time): the learner without prefetch,
    then with it at each depth, interleaved; with `peer` (TorchRLPrefetch), TorchRL's learner
    after ours at each, and TorchRL's at T = its own S."""
    rows = []
    sample_us = sample_time_us(rb, batch)
    peer_us = peer.sample_time_us() if peer is not None else 0.0
    for factor in (0.5, 1.0, 2.0):
        work = busy_work(factor * sample_us)
        for depth in (0, *depths):   # 0: without prefetch
            count = run_steps(steps, (1 + factor) * sample_us)
            result = learner(rb, batch, work, count, depth > 0, depth or 2)
            rows.append(result_row("cpprb_ray", name, factor, factor * sample_us, depth,
                                   sample_us, result))
            if peer is not None:
                result = peer.learner(work, run_steps(steps, peer_us + factor * sample_us),
                                      depth)
                rows.append(result_row("torchrl", name, factor, factor * sample_us, depth,
                                       peer_us, result))
    if peer is not None:   # TorchRL's learner with a step as long as its own sample
        work = busy_work(peer_us)
        for depth in (0, *depths):
            result = peer.learner(work, run_steps(steps, 2 * peer_us), depth)
            rows.append(result_row("torchrl", name, peer_us / sample_us, peer_us, depth,
                                   peer_us, result))
    return rows


class TorchRLPrefetch:
    """TorchRL 0.14's learner on one workload's rows: a ``TensorDictReplayBuffer`` over a
    filled ``LazyTensorStorage`` and its prioritized sampler, made with ``prefetch=depth``
    (its thread pool samples that many batches ahead) or without; every such buffer shares
    the one storage and sampler, so the rows and priorities are the same in each run."""

    def __init__(self, buffer: Any, batch: int, repeat: int = 1):
        """`buffer`: a filled TorchRL buffer (its storage and sampler are taken); `batch`: its
        sample size in storage rows; `repeat`: rows per sampled item (a slice's steps: each
        step gets its slice's priority)."""
        import torch  # noqa: PLC0415 (TorchRL's own venv only)

        self.torch = torch
        self.storage, self.sampler = buffer.storage, buffer.sampler
        self.batch = batch
        priorities = np.random.default_rng(2).uniform(0.01, 10.0, batch // repeat)
        self.priorities = torch.from_numpy(np.repeat(priorities, repeat).astype(np.float32))

    def buffer(self, depth: int) -> Any:
        """A buffer over the shared storage and sampler, prefetching `depth` batches (0:
        none)."""
        from torchrl.data import TensorDictReplayBuffer  # noqa: PLC0415

        return TensorDictReplayBuffer(storage=self.storage, sampler=self.sampler,
                                      batch_size=self.batch, prefetch=depth or None)

    def sample_time_us(self) -> float:
        """The median sample() without prefetch, over about a second of calls."""
        buffer = self.buffer(0)
        started = time.perf_counter()
        buffer.sample()
        calls = max(10, min(300, int(1.0 / (time.perf_counter() - started))))
        times = []
        for _ in range(calls):
            started = time.perf_counter()
            buffer.sample()
            times.append(time.perf_counter() - started)
        return statistics.median(times) * 1e6

    def learner(self, work: Callable[[], None], steps: int, depth: int) -> Dict[str, Any]:
        """As learner(): sample() (from the prefetch queue when `depth`), the step, then
        update_priority of the sampled rows."""
        buffer = self.buffer(depth)
        buffer.sample()   # with prefetch: the pool started, `depth` batches on their way
        waits, works, updates = [], [], []
        started = time.perf_counter()
        for _ in range(steps):
            asked = time.perf_counter()
            sampled = buffer.sample()
            stepped = time.perf_counter()
            work()
            asked_update = time.perf_counter()
            buffer.update_priority(sampled["index"], self.priorities)
            updated = time.perf_counter()
            waits.append(stepped - asked)
            works.append(asked_update - stepped)
            updates.append(updated - asked_update)
        elapsed = time.perf_counter() - started
        buffer.shutdown()
        return loop_result(waits, updates, elapsed, works)


def torchrl_apex(capacity: int) -> TorchRLPrefetch:
    """The apex rows in TorchRL (benchmarks/_libraries.py's filled TorchRL buffer)."""
    from benchmarks import _libraries  # noqa: PLC0415

    api = _libraries.TorchRLApi(importlib.import_module("torchrl"), capacity, 0)
    return TorchRLPrefetch(api.buffer, 256)


def torchrl_pixels(capacity: int) -> TorchRLPrefetch:
    """The pixel rows in TorchRL: the same episodes, obs and next_obs stored whole (TorchRL
    has no frame stacking in its storage), random priorities."""
    import torch  # noqa: PLC0415
    from tensordict import TensorDict  # noqa: PLC0415
    from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer  # noqa: PLC0415
    from torchrl.data.replay_buffers.samplers import PrioritizedSampler  # noqa: PLC0415

    torch.manual_seed(0)
    buffer = TensorDictReplayBuffer(
        storage=LazyTensorStorage(capacity),
        sampler=PrioritizedSampler(capacity, alpha=_common.ALPHA, beta=_common.BETA,
                                   eps=_common.EPS))
    rng = np.random.default_rng(1)
    for episode in pixel_episodes(capacity):
        written = buffer.extend(TensorDict(
            {key: torch.from_numpy(np.ascontiguousarray(value)) for key, value in
             episode.items()}, batch_size=[PIXEL_EPISODE]))
        buffer.update_priority(written, torch.from_numpy(
            _common.random_priorities(rng, PIXEL_EPISODE)))
    return TorchRLPrefetch(buffer, 32)


def limited_run(cpprb_ray: Any, capacity: int, steps: int) -> Dict[str, Any]:
    """Prefetch under a SampleToInsertRatio limiter, an actor thread adding meanwhile."""
    spi = 8.0
    limiter = cpprb_ray.SampleToInsertRatio(samples_per_insert=spi, min_size_to_sample=1024,
                                            error_buffer=4096)
    rb = cpprb_ray.PrioritizedReplayBuffer(capacity, _common.env_dict(), alpha=_common.ALPHA,
                                           seed=0, rate_limiter=limiter)
    rng = np.random.default_rng(0)
    rows = _common.random_rows(rng, 64)
    stop = threading.Event()
    worst = {"min": float("inf"), "max": float("-inf")}

    def actor() -> None:
        while not stop.is_set():
            try:
                rb.add(timeout=0.1, **rows)
            except TimeoutError:
                continue

    thread = threading.Thread(target=actor)
    thread.start()
    try:
        sample_us = 60.0
        work = busy_work(sample_us)
        priorities = rng.uniform(0.01, 10.0, 256).astype(np.float32)
        with rb.prefetch(256, depth=2, timeout=30) as batches:
            for _ in range(steps):
                sampled = next(batches)
                work()
                rb.update_priorities(sampled["indexes"], priorities, sampled["generations"])
                state = rb.stats()["rate_limiter"]
                worst["min"] = min(worst["min"], state["diff"])
                worst["max"] = max(worst["max"], state["diff"])
            wait_us = batches.wait_seconds / batches.batches * 1e6
    finally:
        stop.set()
        thread.join()
    state = rb.stats()["rate_limiter"]
    rb.close()
    return {"samples": state["samples"], "inserts": state["inserts"],
            "ratio": state["samples"] / state["inserts"], "samples_per_insert": spi,
            "diff_window": [state["min_diff"], state["max_diff"]],
            "diff_seen": [worst["min"], worst["max"]], "wait_us": wait_us,
            "in_window": state["min_diff"] <= worst["min"] and worst["max"] <= state["max_diff"]}


def threads_probe(steps: int, library: str, capacity: int) -> None:
    """In this process (its math threads set by the caller's environment, and for torch by
    ``torch.set_num_threads`` as well): a learner whose step is a float32 192 x 192 matmul
    through `library` (numpy's BLAS, or torch's intra-op threads: a network's layers),
    sample(256) at `capacity` rows timed between steps, without and with prefetch. Prints
    JSON."""
    cpprb_ray = _common.import_cpprb_ray()
    rng = np.random.default_rng(0)
    a = rng.standard_normal((192, 192), dtype=np.float32)
    b = rng.standard_normal((192, 192), dtype=np.float32)
    result: Dict[str, Any] = {"library": library}
    if library == "torch":
        import torch  # noqa: PLC0415 (only here: not a dependency)
        threads = int(os.environ.get("OMP_NUM_THREADS", "0"))
        if threads > 0:
            torch.set_num_threads(threads)
        result["torch"] = torch.__version__
        result["torch_threads"] = torch.get_num_threads()
        a, b = torch.from_numpy(a), torch.from_numpy(b)
    rb = apex_buffer(cpprb_ray, capacity)
    try:
        out = rb.sample(256)
        for _ in range(steps // 10):   # warm: the math library's threads started
            a @ b
        times = []
        started = time.perf_counter()
        for _ in range(steps):
            a @ b
            asked = time.perf_counter()
            rb.sample(256, out=out)
            times.append(time.perf_counter() - asked)
        result["direct_steps_per_s"] = steps / (time.perf_counter() - started)
        result["sample_us"] = statistics.median(times) * 1e6
        for depth in (2, 4):
            with rb.prefetch(256, depth=depth) as batches:
                next(batches)
                waits = []
                started = time.perf_counter()
                for _ in range(steps):
                    asked = time.perf_counter()
                    next(batches)
                    waits.append(time.perf_counter() - asked)
                    a @ b
                result[f"prefetch{depth}_steps_per_s"] = steps / (time.perf_counter() - started)
                result[f"prefetch{depth}_wait_us"] = statistics.median(waits) * 1e6
                result[f"prefetch{depth}_mean_wait_us"] = statistics.fmean(waits) * 1e6
    finally:
        rb.close()
    print(json.dumps(result))


def threads_runs(steps: int, library: str, capacity: int,
                 rounds: int = 2) -> List[Dict[str, Any]]:
    """threads_probe with 2 math threads and with 1 (``OMP_NUM_THREADS`` and its kin; torch's
    set_num_threads too), each in a process of its own (a library reads them once), `rounds`
    times, interleaved."""
    found = []
    for _ in range(rounds):
        for threads in (2, 1):
            env = dict(os.environ, OMP_NUM_THREADS=str(threads),
                       OPENBLAS_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
            completed = subprocess.run(
                [sys.executable, os.path.abspath(__file__), "--threads-probe", library,
                 "--steps", str(steps), "--capacity-log2", str(capacity.bit_length() - 1)],
                env=env, capture_output=True, text=True, check=True)
            result = json.loads(completed.stdout.strip().splitlines()[-1])
            result["threads"] = threads
            result["load_average_1"] = os.getloadavg()[0]
            found.append(result)
            print(f"{library} threads {threads}: sample(256) at {capacity} rows between "
                  f"matmul steps {result['sample_us']:.1f} us median; steps/s direct "
                  f"{result['direct_steps_per_s']:.0f}, prefetch depth 2 "
                  f"{result['prefetch2_steps_per_s']:.0f} (learner wait per batch "
                  f"{result['prefetch2_wait_us']:.1f} us median, "
                  f"{result['prefetch2_mean_wait_us']:.1f} us mean), depth 4 "
                  f"{result['prefetch4_steps_per_s']:.0f} ("
                  f"{result['prefetch4_wait_us']:.1f} us, "
                  f"{result['prefetch4_mean_wait_us']:.1f} us); load "
                  f"{result['load_average_1']:.2f}", flush=True)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller buffers, fewer steps")
    parser.add_argument("--steps", type=int, default=None, help="steps per run")
    parser.add_argument("--depths", default="2,4",
                        help="prefetch depths to run, comma-separated (default 2,4)")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--peers", nargs="+", choices=list(PEERS) + ["none"],
                        help="only these peers (default: every one importable here; none: "
                             "ours alone)")
    parser.add_argument("--workloads", default=",".join(WORKLOADS),
                        help=f"the parts to run, comma-separated (default {','.join(WORKLOADS)}; "
                             f"also: {','.join(OPTIONAL_WORKLOADS)})")
    parser.add_argument("--sequence-steps", type=int, default=None,
                        help="steps in the sequence buffer (default 2**18; --quick 2**14)")
    parser.add_argument("--threads", choices=("numpy", "torch"), default="numpy",
                        help="the learner's math library in the threads runs (torch: where "
                             "it is installed)")
    parser.add_argument("--only-threads", action="store_true",
                        help="run the threads runs alone")
    parser.add_argument("--rounds", type=int, default=2,
                        help="rounds of the threads runs (each: 2 threads, then 1)")
    parser.add_argument("--spin-seconds", type=float, default=None,
                        help="the prefetch hand-over's longest spin (default: the library's, "
                             "cpprb_ray.prefetch.SPIN_SECONDS; 0: poll at once)")
    parser.add_argument("--poll-seconds", type=float, default=None,
                        help="how long the prefetch thread polls for a set once its spin ran "
                             "out (default: cpprb_ray.prefetch.POLL_SECONDS; 0 with "
                             "--spin-seconds 0: sleep at once, as before the spin)")
    parser.add_argument("--threads-probe", help=argparse.SUPPRESS)
    parser.add_argument("--capacity-log2", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    steps = args.steps or (500 if args.quick else 3000)
    capacity = 1 << (args.capacity_log2 or (16 if args.quick else 20))
    if args.threads_probe:
        threads_probe(steps, args.threads_probe, capacity)
        return
    if args.only_threads:   # (in an environment of its own, maybe without cpprb: no header)
        print(f"machine: {_common.machine()} ({os.cpu_count()} CPUs); Python "
              f"{sys.version.split()[0]}, numpy {np.__version__}; load average "
              f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
        threads = threads_runs(steps, args.threads, capacity, args.rounds)
        print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        if args.json:
            with open(args.json, "w") as handle:
                json.dump({"threads": threads}, handle, indent=1)
        return
    depths = [int(depth) for depth in args.depths.split(",")]
    workloads = args.workloads.split(",")
    unknown = sorted(set(workloads) - set(WORKLOADS) - set(OPTIONAL_WORKLOADS))
    if unknown:
        parser.error(f"--workloads expects some of {','.join(WORKLOADS + OPTIONAL_WORKLOADS)}; "
                     f"got {unknown}")
    cpprb_ray = _common.import_cpprb_ray()
    if args.spin_seconds is not None:
        importlib.import_module("cpprb_ray.prefetch").SPIN_SECONDS = args.spin_seconds
    if args.poll_seconds is not None:
        importlib.import_module("cpprb_ray.prefetch").POLL_SECONDS = args.poll_seconds
    info = _common.run_info(args.quick)
    info["spin_seconds"] = importlib.import_module("cpprb_ray.prefetch").SPIN_SECONDS
    peers, skipped = wanted_peers(args.peers)
    info["peers"], info["skipped"] = sorted(peers), skipped
    print(_common.header(info), flush=True)
    info["poll_seconds"] = importlib.import_module("cpprb_ray.prefetch").POLL_SECONDS
    print(f"prefetch hand-over: spins for at most {info['spin_seconds'] * 1e6:.0f} us, then "
          f"polls for at most {info['poll_seconds'] * 1e3:g} ms, then sleeps", flush=True)
    for key, why in skipped.items():
        print(f"{key}: skipped ({why})", flush=True)
    rows: List[Dict[str, Any]] = []
    # (the buffer's maker, its log2 rows with --quick and without, TorchRL's rows, the batch)
    plain = {"apex": (apex_buffer, 16, 20, torchrl_apex, 256),
             "pixels": (pixel_buffer, 13, 15, torchrl_pixels, 32)}
    for name, (make, quick_log2, log2, make_peer, batch) in plain.items():
        if name in workloads:
            rb = make(cpprb_ray, 1 << (quick_log2 if args.quick else log2))
            try:
                peer = make_peer(rb.get_buffer_size()) if "torchrl" in peers else None
                rows += run_workload(name, rb, batch, steps, depths, peer)
            finally:
                rb.close()
    if "sequences" in workloads:
        size = args.sequence_steps or (1 << (14 if args.quick else 18))
        handles = sequences.sequence_handles(cpprb_ray, size)
        try:
            torchrl = sequences.TorchRLSequences(size) if "torchrl" in peers else None
            started = time.perf_counter()
            sequences.fill(handles, size, peers=[torchrl] if torchrl else [])
            print(f"sequences: filled {size} steps in {time.perf_counter() - started:.1f} s: "
                  f"{handles[0].get_stored_size()} sequences of {sequences.LENGTH}", flush=True)
            peer = (TorchRLPrefetch(torchrl.buffer, sequences.BATCH * sequences.LENGTH,
                                    sequences.LENGTH) if torchrl else None)
            rows += run_workload("sequences", handles[0], sequences.BATCH, steps, depths, peer)
        finally:
            for handle in handles[::-1]:
                handle.close()
    if "remote" in workloads:
        rows += remote_rows(cpprb_ray, steps, depths)
    limited = None
    if "limited" in workloads:
        limited = limited_run(cpprb_ray, 1 << 16, steps)
        print(f"apex, rate-limited (samples_per_insert {limited['samples_per_insert']:g}): "
              f"{limited['samples']} samples / {limited['inserts']} inserts = "
              f"{limited['ratio']:.3f}; diff seen {limited['diff_seen']} in window "
              f"{limited['diff_window']}: {limited['in_window']}; learner wait "
              f"{limited['wait_us']:.1f} us per batch", flush=True)
    threads = (threads_runs(steps, args.threads, capacity, args.rounds)
               if "threads" in workloads else [])
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"info": info, "rows": rows, "limited": limited, "threads": threads},
                      handle, indent=1)


def remote_learner(rb: Any, steps: int, depths: Sequence[int]) -> List[Dict[str, Any]]:
    """On the node that cannot see `rb`'s segment (a Ray task): S through the proxy, then the
    learner loop at each T and depth, as run_workload; its rows."""
    rows = []
    sample_us = sample_time_us(rb, 256, calls=100)
    for factor in (0.5, 1.0, 2.0):
        work = busy_work(factor * sample_us)
        for depth in (0, *depths):
            result = learner(rb, 256, work, run_steps(steps, (1 + factor) * sample_us),
                             depth > 0, depth or 2)
            rows.append(result_row("cpprb_ray", "remote", factor, factor * sample_us, depth,
                                   sample_us, result))
    return rows


def remote_rows(cpprb_ray: Any, steps: int, depths: Sequence[int]) -> List[Dict[str, Any]]:
    """The remote part: a two-node cluster, the apex buffer on the head, the learner a task on
    the other node (remote_learner); [] (and why on stderr) where the cluster cannot start."""
    from benchmarks import _two_nodes

    why_not = _two_nodes.can_unshare()
    if why_not is not None:
        print(f"remote: skipped ({why_not})", file=sys.stderr, flush=True)
        return []
    import ray

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.pathsep.join([root] + [p for p in os.environ.get("PYTHONPATH", "").split(
        os.pathsep) if p])
    cluster = _two_nodes.TwoNodes(path.split(os.pathsep))
    try:
        ray.init(address=cluster.start(), log_to_driver=False, runtime_env={
            "env_vars": {"PYTHONPATH": path, "RAY_USAGE_STATS_ENABLED": "0"}})
        _two_nodes.wait_for_nodes(ray, 2)
        rb = apex_buffer(cpprb_ray, 1 << 16)
        try:
            task = ray.remote(num_cpus=0, resources={_two_nodes.REMOTE_RESOURCE: 0.01})(
                remote_learner)
            rows = ray.get(task.remote(rb, min(steps, 600), list(depths)), timeout=900)
        finally:
            rb.close()
    finally:
        ray.shutdown()
        cluster.stop()
    for row in rows:   # printed here too: the task's own lines go to its node's log
        how = f"depth {row['depth']}" if row["prefetch"] else "direct "
        print(f"remote    cpprb_ray T={row['T_factor']:>4.2g}xS ({row['T_us']:8.1f} us) {how}: "
              f"wait median {row['wait_us']:8.1f} us ({100 * row['wait_ratio']:5.1f}% of its "
              f"S={row['sample_us']:.1f} us), step {row['step_us']:8.1f} us, update "
              f"{row['update_us']:8.1f} us, "
              f"{row['steps_per_s']:8.0f} steps/s ({row['steps']} steps)", flush=True)
    return rows


def wanted_peers(asked: Sequence[str] | None) -> tuple:
    """({key} of the peers asked for (by default every one) that import here, {key: why
    not})."""
    peers, skipped = set(), {}
    for key in PEERS:
        if asked is not None and key not in asked:
            skipped[key] = "not asked for (--peers)"
            continue
        try:
            importlib.import_module(key)
            peers.add(key)
        except ImportError as error:
            skipped[key] = (f"not importable in this interpreter ({error}); `make "
                            f"bench-peers`, then run this script with .venv-{key}/bin/python")
    return peers, skipped


if __name__ == "__main__":
    main()
