"""A learner's wait for its batch, with and without ``rb.prefetch`` (docs/learner.md).

    python benchmarks/bench_prefetch.py [--quick] [--steps N] [--json FILE]
    python benchmarks/bench_prefetch.py --only-threads --threads torch [--steps N]

A learner loop: take a batch (``sample(..., out=)`` into one preallocated set, or ``next()`` of
``rb.prefetch(batch, depth=D)`` for each D of ``--depths``, 2 and 4 by default), a network
step simulated by T microseconds of GIL-releasing numpy work (``np.sin`` over a float64 array
sized for T: a core kept busy, as a network's forward and backward pass would), then
``update_priorities`` of the batch. For each workload the sample time S is measured first
(median of ``sample(out=)``), then T = 0.5 S, 1 S and 2 S are run, without prefetch and with
it at each depth (interleaved), each for `--steps` steps. Reported: the learner-visible wait
per step (the time from asking for the batch to having it: ``sample(out=)`` without prefetch,
``next()`` with it; median and mean over the steps), the median's ratio to S, and steps per
second.

Workloads:

- apex: Ape-X rows (obs float32 x4, act, rew, next_obs, done), batch 256, 2^20 rows, a
  prioritized buffer (alpha 0.6), filled before anything is timed.
- pixels: the Atari layout (obs uint8 84x84x4 with next_of and stack_compress), batch 32,
  2^15 rows (--quick: 2^13) in episodes of 500 steps.
- apex, rate-limited: the apex loop at T = S with prefetch, a SampleToInsertRatio limiter
  (samples_per_insert 8, error_buffer 4096 rows) and an actor thread adding 64 rows at a time:
  the ratio of samples to inserts at the end, and whether the limiter's diff stayed in its
  window (it does exactly: the thread's samples are admitted under the lock like any other).

- threads: a learner whose step is a float32 192 x 192 matmul through numpy's BLAS or
  (``--threads torch``) through torch's intra-op threads, as a network's layers would be,
  with 2 math threads and with 1 (``OMP_NUM_THREADS`` / ``OPENBLAS_NUM_THREADS``, and
  ``torch.set_num_threads``; each run a process of its own, ``--rounds`` times, interleaved):
  the median sample(256) at 2^20 rows (--quick: 2^16) timed between steps, and steps per
  second and the learner's wait without prefetch and with it at depths 2 and 4.
  ``--only-threads`` runs this part alone.

Sequences (recurrent learners) are measured here once the buffer has them (``sequence=``);
TorchRL's prefetching buffer is compared where torchrl is installed (it is not in this
project's environments).

--json FILE writes {"info": ..., "rows": [{"workload", "T_us", "prefetch", "depth", "sample_us",
"wait_us", "wait_ratio", "steps_per_s"}, ...], "limited": {...}}.
"""

from __future__ import annotations

import argparse
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

PIXEL_SHAPE = (84, 84, 4)


def busy_work(microseconds: float) -> Callable[[], None]:
    """A callable that keeps this core busy about `microseconds`, with the GIL released
    (numpy's ufunc loops release it)."""
    source = np.random.default_rng(0).standard_normal(1 << 20)
    target = np.empty_like(source)
    started = time.perf_counter()
    for _ in range(5):
        np.sin(source, out=target)
    per_element = (time.perf_counter() - started) / (5 * source.size)
    count = max(1, int(microseconds * 1e-6 / per_element))
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


def pixel_buffer(cpprb_ray: Any, capacity: int) -> Any:
    env = {"obs": {"shape": PIXEL_SHAPE, "dtype": np.uint8}, "act": {"dtype": np.int64},
           "rew": {}, "done": {}}
    rb = cpprb_ray.PrioritizedReplayBuffer(capacity, env, alpha=_common.ALPHA, seed=0,
                                           next_of="obs", stack_compress="obs")
    rng = np.random.default_rng(0)
    episode = 500
    frames = rng.integers(0, 255, (episode + 4,) + PIXEL_SHAPE[:2], dtype=np.uint8)
    stacks = np.stack([frames[i:i + episode + 1] for i in range(4)], axis=-1)
    done = np.zeros(episode, np.float32)
    done[-1] = 1
    while rb.get_stored_size() < capacity:
        rb.add(obs=stacks[:-1], next_obs=stacks[1:], act=rng.integers(0, 4, episode),
               rew=rng.standard_normal(episode).astype(np.float32), done=done)
    return rb


def sample_time_us(rb: Any, batch: int, calls: int = 300) -> float:
    out = rb.sample(batch)
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        rb.sample(batch, out=out)
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e6


def learner(rb: Any, batch: int, work: Callable[[], None], steps: int,
            prefetch: bool, depth: int = 2) -> Dict[str, float]:
    """The loop; the learner's wait per step (s: median and mean of the time from asking for
    a batch to having it, ``sample(out=)`` or ``next()``) and steps per second."""
    rng = np.random.default_rng(2)
    priorities = rng.uniform(0.01, 10.0, batch).astype(np.float32)
    batches = rb.prefetch(batch, depth=depth) if prefetch else None
    out = rb.sample(batch)
    if batches is not None:
        next(batches)   # the ring allocated, the thread started
    waits = []
    started = time.perf_counter()
    for _ in range(steps):
        asked = time.perf_counter()
        sampled = next(batches) if batches is not None else rb.sample(batch, out=out)
        waits.append(time.perf_counter() - asked)
        work()
        rb.update_priorities(sampled["indexes"], priorities, sampled["generations"])
    elapsed = time.perf_counter() - started
    if batches is not None:
        batches.close()
    return {"wait_s": statistics.median(waits), "mean_wait_s": statistics.fmean(waits),
            "steps_per_s": steps / elapsed}


def run_workload(name: str, rb: Any, batch: int, steps: int,
                 depths: Sequence[int] = (2, 4)) -> List[Dict[str, Any]]:
    """For T = 0.5, 1 and 2 S: the learner without prefetch, then with it at each depth,
    interleaved."""
    rows = []
    sample_us = sample_time_us(rb, batch)
    for factor in (0.5, 1.0, 2.0):
        work = busy_work(factor * sample_us)
        for depth in (0, *depths):   # 0: without prefetch
            result = learner(rb, batch, work, steps, depth > 0, depth or 2)
            wait_us = result["wait_s"] * 1e6
            mean_us = result["mean_wait_s"] * 1e6
            rows.append({"workload": name, "T_factor": factor, "T_us": factor * sample_us,
                         "prefetch": depth > 0, "depth": depth or None,
                         "sample_us": sample_us, "wait_us": wait_us, "mean_wait_us": mean_us,
                         "wait_ratio": wait_us / sample_us,
                         "steps_per_s": result["steps_per_s"]})
            print(f"{name:<8} T={factor:>3}xS ({factor * sample_us:7.1f} us) "
                  f"{f'depth {depth}' if depth else 'direct '}: wait median {wait_us:7.1f} us "
                  f"({100 * wait_us / sample_us:5.1f}% of S={sample_us:.1f} us), mean "
                  f"{mean_us:7.1f} us, {result['steps_per_s']:8.0f} steps/s", flush=True)
    return rows


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
    parser.add_argument("--threads", choices=("numpy", "torch"), default="numpy",
                        help="the learner's math library in the threads runs (torch: where "
                             "it is installed)")
    parser.add_argument("--only-threads", action="store_true",
                        help="run the threads runs alone")
    parser.add_argument("--rounds", type=int, default=2,
                        help="rounds of the threads runs (each: 2 threads, then 1)")
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
    cpprb_ray = _common.import_cpprb_ray()
    info = _common.run_info(args.quick)
    print(_common.header(info), flush=True)
    rows: List[Dict[str, Any]] = []
    rb = apex_buffer(cpprb_ray, 1 << (16 if args.quick else 20))
    try:
        rows += run_workload("apex", rb, 256, steps, depths)
    finally:
        rb.close()
    rb = pixel_buffer(cpprb_ray, 1 << (13 if args.quick else 15))
    try:
        rows += run_workload("pixels", rb, 32, steps, depths)
    finally:
        rb.close()
    limited = limited_run(cpprb_ray, 1 << 16, steps)
    print(f"apex, rate-limited (samples_per_insert {limited['samples_per_insert']:g}): "
          f"{limited['samples']} samples / {limited['inserts']} inserts = "
          f"{limited['ratio']:.3f}; diff seen {limited['diff_seen']} in window "
          f"{limited['diff_window']}: {limited['in_window']}; learner wait "
          f"{limited['wait_us']:.1f} us per batch", flush=True)
    threads = threads_runs(steps, args.threads, capacity, args.rounds)
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"info": info, "rows": rows, "limited": limited, "threads": threads},
                      handle, indent=1)


if __name__ == "__main__":
    main()
