"""Ape-X DQN on CartPole-v1: K Ray actors and one learner around ONE shared prioritized buffer.

    python examples/apex.py --actors 2 --seconds 240 --seed 0 --plot apex.png

- The driver creates a :class:`cpprb_ray.PrioritizedReplayBuffer` and passes it to K Ray actors
  as an ordinary argument (the handle pickles by name; each actor re-attaches to the same
  shared memory). There is no replay actor, and no transition goes through Ray's object store.
- Actor i runs its own gymnasium ``CartPole-v1`` with the Ape-X epsilon
  ``0.4 ** (1 + 7 i / (K - 1))``, seeds each row's priority with its own TD error and adds
  straight into the buffer; with the buffer's N-step staging (n = 3, gamma = 0.99) it adds single
  steps and the buffer stores 3-step rows.
- The driver is the learner: double DQN on prioritized batches, priorities written back with
  their generations (an update for a row overwritten since it was sampled is dropped), weights
  published with ``ray.put`` every few hundred steps and pulled by the actors, and a
  ``SampleToInsertRatio`` rate limiter that keeps the replay ratio steady. With ``--prefetch``
  the learner's batches are sampled ahead on a thread (``rb.prefetch``, docs/learner.md) while
  its network step runs; either way the JSON line reports the learner's wait for its batches.
- The Q-network is numpy (``dqn_numpy.py`` beside this file).

Progress goes to stderr; stdout gets exactly one line of JSON at the end. docs/apex.md walks
through the example and gives measured results.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

import cpprb_ray

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dqn_numpy  # noqa: E402

GAMMA = 0.99
NSTEP = 3
HIDDEN = (64, 64)
OBS_SIZE = 4
ACTIONS = 2
SOLVED_RETURN = 150.0
RECENT_EPISODES = 20
ENV_DICT = {"obs": {"shape": OBS_SIZE}, "act": {"dtype": np.int64}, "rew": {},
            "next_obs": {"shape": OBS_SIZE}, "done": {}}
# How long one blocking add/sample waits before it looks at the clock and the stop flag again.
WAIT_SLICE_S = 0.2


def epsilon_ladder(actors: int) -> List[float]:
    """Ape-X's exploration rates: ``eps_i = 0.4 ** (1 + 7 i / (K - 1))``, 0.4 when K = 1.

    Examples
    --------
    >>> [round(eps, 5) for eps in epsilon_ladder(3)]
    [0.4, 0.01619, 0.00066]
    >>> epsilon_ladder(1)
    [0.4]
    """
    if actors == 1:
        return [0.4]
    return [0.4 ** (1 + 7 * i / (actors - 1)) for i in range(actors)]


# ---------------------------------------------------------------------------------------------
# The buffer: N-step staging in each handle, and the rate limiter in the segment.

def make_buffer(size: int, seed: int, samples_per_insert: float, min_size: int,
                error_buffer: float) -> cpprb_ray.PrioritizedReplayBuffer:
    """The shared buffer: 3-step rows, and a SampleToInsertRatio limiter.

    Examples
    --------
    >>> rb = make_buffer(1024, seed=0, samples_per_insert=8.0, min_size=100, error_buffer=512.0)
    >>> rb.nstep["size"], type(rb.rate_limiter).__name__
    (3, 'SampleToInsertRatio')
    >>> rb.close()
    """
    limiter = cpprb_ray.SampleToInsertRatio(samples_per_insert, min_size, error_buffer)
    nstep = {"size": NSTEP, "gamma": GAMMA, "rew": "rew", "next": "next_obs"}
    return cpprb_ray.PrioritizedReplayBuffer(size, ENV_DICT, alpha=0.6, eps=1e-3, seed=seed,
                                             Nstep=nstep, rate_limiter=limiter)


# ---------------------------------------------------------------------------------------------
# Actors.

def actor_class():
    """The Ray actor class (made on demand so that importing this module needs no Ray)."""
    import ray

    @ray.remote(max_concurrency=4)  # run() in one thread; publish/report/stop in the others
    class Actor:
        def __init__(self, rb, index: int, epsilon: float, seed: int, add_batch: int) -> None:
            import gymnasium

            self.rb = rb
            self.index = index
            self.epsilon = epsilon
            self.add_batch = add_batch
            self.env = gymnasium.make("CartPole-v1")
            self.rng = np.random.default_rng(seed)
            self.seed = seed
            self.network = dqn_numpy.MLP([OBS_SIZE, *HIDDEN, ACTIONS])
            self.latest: Optional[Any] = None  # ObjectRef of the newest published weights
            self.loaded: Optional[Any] = None
            self.stopping = threading.Event()
            self.lock = threading.Lock()
            self.rows_added = 0
            self.steps = 0
            self.episodes: List[Tuple[float, float, int]] = []  # (end time, return, actor)

        def publish(self, refs: list) -> None:
            # The ref arrives inside a list so that Ray does not resolve it here: the actor
            # pulls the weights itself, at its next step.
            self.latest = refs[0]

        def report(self) -> Dict[str, Any]:
            with self.lock:
                episodes, self.episodes = self.episodes, []
                return {"rows_added": self.rows_added, "steps": self.steps,
                        "episodes": episodes}

        def stop(self) -> None:
            self.stopping.set()

        def _pull_weights(self) -> None:
            latest = self.latest
            if latest is not None and latest is not self.loaded:
                self.network.set_weights(ray.get(latest))
                self.loaded = latest

        def _add(self, columns: Dict[str, np.ndarray], episode_over: bool) -> None:
            # The actor's own 1-step TD error seeds the priority of the row that starts at each
            # step; the learner replaces it with the (N-step) TD error the first time it
            # samples the row.
            priorities = dqn_numpy.greedy_td_errors(self.network, columns["obs"], columns["act"],
                                                    columns["rew"], columns["next_obs"],
                                                    columns["done"], GAMMA)
            # The rate limiter holds adds back while the learner is behind; wait in slices so
            # that a stop is seen.
            if not self._until_admitted(lambda timeout: self.rb.add(
                    priorities=priorities, timeout=timeout, **columns)):
                return
            if episode_over:
                # Flushes the buffer's N-step staging: the episode's last steps are stored with
                # shorter windows (bootstrapping from the last next_obs if it was truncated).
                if not self._until_admitted(
                        lambda timeout: self.rb.on_episode_end(timeout=timeout)):
                    return
            with self.lock:
                self.rows_added += priorities.shape[0]

        def _until_admitted(self, call) -> bool:
            """call(timeout) until the limiter lets it through (True) or a stop comes (False)."""
            while True:
                try:
                    call(WAIT_SLICE_S)
                    return True
                except TimeoutError:
                    if self.stopping.is_set():
                        return False

        def run(self) -> int:
            obs, _ = self.env.reset(seed=self.seed)
            staged: Dict[str, list] = {name: [] for name in ENV_DICT}
            episode_return = 0.0
            while not self.stopping.is_set():
                self._pull_weights()
                if self.rng.random() < self.epsilon:
                    action = int(self.rng.integers(ACTIONS))
                else:
                    action = int(np.argmax(self.network.forward(obs)[0]))
                next_obs, reward, terminated, truncated, _ = self.env.step(action)
                for name, value in (("obs", obs), ("act", action), ("rew", reward),
                                    ("next_obs", next_obs), ("done", float(terminated))):
                    staged[name].append(value)
                episode_return += float(reward)
                self.steps += 1
                over = terminated or truncated
                if over or len(staged["act"]) >= self.add_batch:
                    # A batch never spans two episodes: the buffer's N-step windows end with it.
                    self._add({name: np.asarray(values) for name, values in staged.items()},
                              over)
                    staged = {name: [] for name in ENV_DICT}
                if over:
                    with self.lock:
                        self.episodes.append((time.time(), episode_return, self.index))
                    episode_return = 0.0
                    obs, _ = self.env.reset()
                else:
                    obs = next_obs
            return self.steps

    return Actor


# ---------------------------------------------------------------------------------------------
# Progress: what the terminal shows, the JSON line and the plot.

class Progress:
    """Collects the actors' episodes and the throughput, draws the live line, keeps history."""

    def __init__(self, start: float, seconds: float, enabled: bool) -> None:
        self.start = start
        self.episodes: List[Tuple[float, float, int]] = []
        self.history: List[Dict[str, float]] = []
        self.rows_added = 0
        self.bar = None
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=int(seconds), unit="s", file=sys.stderr, dynamic_ncols=True,
                            bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} s {postfix}")

    def recent_mean(self) -> Optional[float]:
        if not self.episodes:
            return None
        return float(np.mean([ret for _, ret, _ in self.episodes[-RECENT_EPISODES:]]))

    def recent_mean_by_actor(self, actors: int) -> List[Optional[float]]:
        means: List[Optional[float]] = []
        for actor in range(actors):
            mine = [ret for _, ret, index in self.episodes if index == actor]
            means.append(float(np.mean(mine[-RECENT_EPISODES:])) if mine else None)
        return means

    def update(self, reports: List[Dict[str, Any]], samples: int, learner_steps: int,
               stored: int, capacity: int, final: bool = False) -> None:
        """Take in the actors' reports; draw the live line. `final`: the count after the stop,
        kept for the totals but neither drawn nor plotted (its span is the part of a second
        in which actors and learner were being stopped: a rate over it is a drop to zero
        that never happened)."""
        now = time.time()
        for report in reports:
            self.episodes.extend(report["episodes"])
        self.episodes.sort()
        self.rows_added = sum(report["rows_added"] for report in reports)
        if final:
            if self.bar is not None:  # the seconds run, drawn once by close()
                self.bar.n = min(int(now - self.start), self.bar.total)
            return
        last = self.history[-1] if self.history else {"t": 0.0, "rows": 0, "samples": 0}
        elapsed = now - self.start
        span = elapsed - last["t"]
        if span < 0.5:  # the first report, at the start: no rate over nothing
            return
        point = {"t": elapsed, "rows": self.rows_added, "samples": samples,
                 "add_rate": (self.rows_added - last["rows"]) / span,
                 "sample_rate": (samples - last["samples"]) / span}
        self.history.append(point)
        if self.bar is not None:
            recent = self.recent_mean()
            self.bar.set_postfix_str(
                f"adds/s {point['add_rate']:7.0f}  samples/s {point['sample_rate']:8.0f}  "
                f"fill {stored}/{capacity}  learner steps {learner_steps}  "
                f"episodes {len(self.episodes)}  return(last {RECENT_EPISODES}) "
                f"{'-' if recent is None else f'{recent:.1f}'}", refresh=False)
            self.bar.n = min(int(elapsed), self.bar.total)
            self.bar.refresh()

    def solved_at(self) -> Optional[float]:
        """Seconds from the start to the first episode end at which the mean return of the last
        20 finished episodes (all actors, in order of their end) reached SOLVED_RETURN."""
        returns = [ret for _, ret, _ in self.episodes]
        for last in range(RECENT_EPISODES, len(returns) + 1):
            if np.mean(returns[last - RECENT_EPISODES:last]) >= SOLVED_RETURN:
                return round(self.episodes[last - 1][0] - self.start, 2)
        return None

    def close(self) -> None:
        # The bar as last drawn stays on the terminal (tqdm's close() redraws it once, with
        # its newline); the summary line that follows says how the run ended.
        if self.bar is not None:
            self.bar.close()

    def plot(self, path: str, title: str) -> None:
        """Write the PNG: episode returns (per actor, and the rolling mean) over time, and rows
        added and sampled per second, one point per whole second of the run."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        figure, (returns_axis, rate_axis) = plt.subplots(2, 1, figsize=(9, 7), sharex=True)
        times = np.array([end - self.start for end, _, _ in self.episodes])
        returns = np.array([ret for _, ret, _ in self.episodes])
        if times.size:
            actor_of = np.array([actor for _, _, actor in self.episodes])
            for actor in np.unique(actor_of):
                mine = actor_of == actor
                returns_axis.plot(times[mine], returns[mine], ".", alpha=0.3,
                                  label=f"episode return, actor {actor}")
            window = np.ones(min(RECENT_EPISODES, returns.size)) / min(RECENT_EPISODES,
                                                                       returns.size)
            rolling = np.convolve(returns, window, mode="valid")
            returns_axis.plot(times[times.size - rolling.size:], rolling,
                              label=f"mean of last {RECENT_EPISODES}")
        returns_axis.axhline(SOLVED_RETURN, color="gray", linestyle="--", linewidth=1,
                             label=f"solved: mean of last {RECENT_EPISODES} >= "
                                   f"{SOLVED_RETURN:g}")
        returns_axis.set_ylabel("return")
        # Legends right of the panels: inside, they covered episodes.
        returns_axis.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
        history_t = [p["t"] for p in self.history]
        rate_axis.plot(history_t, [p["add_rate"] for p in self.history], label="rows added/s")
        rate_axis.plot(history_t, [p["sample_rate"] for p in self.history],
                       label="rows sampled/s")
        rate_axis.set_xlabel("seconds")
        rate_axis.set_ylabel("rows per second")
        rate_axis.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
        returns_axis.set_title(title)
        figure.tight_layout()
        figure.savefig(path, dpi=100, bbox_inches="tight")
        plt.close(figure)


# ---------------------------------------------------------------------------------------------
# The learner (this process) and the run.

def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--actors", type=int, default=2, help="Ray actors, one CartPole each")
    parser.add_argument("--seconds", type=float, default=240.0,
                        help="how long actors and learner run (after Ray is up)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--buffer-size", type=int, default=100_000, help="buffer rows")
    parser.add_argument("--batch-size", type=int, default=64, help="rows per learner step")
    parser.add_argument("--plot", metavar="PATH", help="write a PNG of return and throughput")
    parser.add_argument("--stop-when-solved", action="store_true",
                        help=f"stop once the mean return of the last {RECENT_EPISODES} "
                             f"episodes reaches {SOLVED_RETURN:g}")
    parser.add_argument("--samples-per-insert", type=float, default=8.0,
                        help="replay ratio the rate limiter keeps (rows sampled per row added)")
    parser.add_argument("--min-size", type=int, default=1000,
                        help="rows stored before the learner starts")
    parser.add_argument("--learning-rate", type=float, default=5e-4)
    parser.add_argument("--target-every", type=int, default=1000,
                        help="learner steps between target-network copies")
    parser.add_argument("--publish-every", type=int, default=200,
                        help="learner steps between weight publications")
    parser.add_argument("--add-batch", type=int, default=16,
                        help="steps an actor collects per add (fewer at an episode's end)")
    parser.add_argument("--no-progress", action="store_true", help="no live line on stderr")
    parser.add_argument("--prefetch", action="store_true",
                        help="sample the learner's batches ahead on a thread (rb.prefetch)")
    args = parser.parse_args(argv)
    for name in ("actors", "buffer_size", "batch_size", "min_size", "target_every",
                 "publish_every", "add_batch"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be > 0; got {getattr(args, name)}")
    if args.seconds <= 0 or args.samples_per_insert <= 0:
        parser.error("--seconds and --samples-per-insert must be > 0")
    if args.min_size > args.buffer_size:
        parser.error(f"--min-size ({args.min_size}) must be <= --buffer-size "
                     f"({args.buffer_size})")
    return args


class LearnerBatches:
    """The learner's batches, sampled when asked or (`prefetch`) ahead on a thread
    (``rb.prefetch``, docs/learner.md), and the seconds the learner waited for them.

    ``take()`` returns the next batch, or None when the rate limiter held it back for a slice
    (``WAIT_SLICE_S``: the caller looks at the clock and its reports, then asks again). A
    batch stays valid until the next ``take()``: the learner trains on it and writes its
    priorities back before that. `beta` is a callable of the batch number (the prefetch
    thread's annealing; the direct sample calls it too).

    Examples
    --------
    >>> with cpprb_ray.PrioritizedReplayBuffer(64, {"obs": {}}, seed=0) as rb:
    ...     _ = rb.add(obs=np.arange(8.0))
    ...     batches = LearnerBatches(rb, 4, lambda _k: 0.4, prefetch=True)
    ...     print(batches.take()["obs"].shape)
    ...     batches.close()
    ...     print(sorted(batches.report(1)))
    (4, 1)
    ['learner_wait_s', 'learner_wait_us_per_step', 'prefetch']
    """

    def __init__(self, rb: Any, batch_size: int, beta: Callable[[int], float],
                 prefetch: bool, depth: int = 2) -> None:
        self.rb = rb
        self.batch_size = batch_size
        self.beta = beta
        self.waited = 0.0
        self.prefetch = (rb.prefetch(batch_size, beta=beta, depth=depth, timeout=WAIT_SLICE_S)
                         if prefetch else None)

    def take(self) -> Optional[Dict[str, Any]]:
        asked = time.perf_counter()
        try:
            if self.prefetch is not None:
                return next(self.prefetch)
            return self.rb.sample(self.batch_size, self.beta(0), timeout=WAIT_SLICE_S)
        except TimeoutError:
            return None
        finally:
            self.waited += time.perf_counter() - asked

    def close(self) -> None:
        if self.prefetch is not None:
            self.prefetch.close()

    def report(self, steps: int) -> Dict[str, Any]:
        """The JSON line's keys: whether it prefetched, and the learner's wait (the whole
        sample without prefetch, rate limiter waits included; what the thread had not ready
        yet with it), in all and per learner step."""
        return {"prefetch": self.prefetch is not None,
                "learner_wait_s": round(self.waited, 3),
                "learner_wait_us_per_step": round(1e6 * self.waited / max(steps, 1), 1)}


def error_buffer(args: argparse.Namespace) -> float:
    """The limiter's slack, in sampled rows: a few learner batches, plus one add batch of every
    actor at once (else an actor's whole batch could never fit in the window)."""
    return 4.0 * args.batch_size + 2.0 * args.add_batch * args.actors * args.samples_per_insert


def run(args: argparse.Namespace) -> Dict[str, Any]:
    # Our own single node stays on loopback: without this (before ray is imported), Ray binds
    # a local instance to the machine's outward address, even given 127.0.0.1.
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    cpus = os.cpu_count() or 1
    # address="local": always a fresh instance of our own, never a cluster someone else started.
    ray.init(address="local", num_cpus=cpus, include_dashboard=False, log_to_driver=False,
             configure_logging=False, _node_ip_address="127.0.0.1")
    # Ray workers cannot import dqn_numpy by name: ship its code with the actor class.
    ray.cloudpickle.register_pickle_by_value(dqn_numpy)
    rb = None
    try:
        rb = make_buffer(args.buffer_size, args.seed, args.samples_per_insert, args.min_size,
                         error_buffer(args))
        print(f"apex: buffer {rb.name}: N-step in the buffer (n={NSTEP}, gamma={GAMMA}); "
              f"rate limiter {rb.rate_limiter!r}", file=sys.stderr)
        return learn(args, rb, cpus)
    finally:
        if rb is not None:
            rb.close()
        ray.shutdown()


def learn(args: argparse.Namespace, rb: cpprb_ray.PrioritizedReplayBuffer,
          cpus: int) -> Dict[str, Any]:
    import ray

    learner = dqn_numpy.DoubleDQN(dqn_numpy.MLP([OBS_SIZE, *HIDDEN, ACTIONS], seed=args.seed),
                                  learning_rate=args.learning_rate,
                                  target_every=args.target_every)
    Actor = actor_class()
    per_actor_cpus = min(1.0, cpus / args.actors)
    actors = [Actor.options(num_cpus=per_actor_cpus).remote(
        rb, i, eps, args.seed * 1000 + i, args.add_batch)
        for i, eps in enumerate(epsilon_ladder(args.actors))]
    weights = ray.put(learner.network.get_weights())
    ray.get([actor.publish.remote([weights]) for actor in actors])

    start = time.time()
    runs = [actor.run.remote() for actor in actors]
    progress = Progress(start, args.seconds, enabled=not args.no_progress)
    samples = 0
    next_report = start
    deadline = start + args.seconds

    def beta_now(_step: int) -> float:
        return 0.4 + 0.6 * min(1.0, (time.time() - start) / args.seconds)

    # With --prefetch, a thread samples the next batches while train_step runs; depth 4 for
    # batches this small (a sample of tens of microseconds): it wakes once per three batches
    # (docs/learner.md).
    batches = LearnerBatches(rb, args.batch_size, beta_now, args.prefetch, depth=4)
    try:
        while True:
            now = time.time()
            if now >= next_report:
                finished, _ = ray.wait(runs, num_returns=len(runs), timeout=0)
                if finished:  # an actor's run() ended before it was told to: show why
                    ray.get(finished)
                    raise RuntimeError(f"{len(finished)} actor(s) stopped before the end")
                # Control plane only: counts and finished episodes, never transitions.
                reports = ray.get([actor.report.remote() for actor in actors])
                progress.update(reports, samples, learner.steps, rb.get_stored_size(),
                                rb.get_buffer_size())
                # A second from the end of this report (which can take a while on a loaded
                # machine), so that every rate is over about a second, never a sliver.
                next_report = time.time() + 1.0
                if args.stop_when_solved and progress.solved_at() is not None:
                    break
            if now >= deadline:
                break
            # The rate limiter holds the sample back until min_size rows are in and while the
            # learner is ahead of samples_per_insert; wait in slices to keep the report going.
            batch = batches.take()
            if batch is None:
                continue
            # gamma ** m per row: m < 3 for the windows cut short at an episode's end.
            priorities = learner.train_step(batch, batch["discounts"])
            rb.update_priorities(batch["indexes"], priorities, batch["generations"])
            samples += args.batch_size
            if learner.steps % args.publish_every == 0:
                weights = ray.put(learner.network.get_weights())
                for actor in actors:
                    actor.publish.remote([weights])
    finally:
        batches.close()
        for actor in actors:
            actor.stop.remote()
        steps = ray.get(runs, timeout=60)
        progress.update(ray.get([actor.report.remote() for actor in actors]), samples,
                        learner.steps, rb.get_stored_size(), rb.get_buffer_size(), final=True)
        progress.close()
        for actor in actors:
            ray.kill(actor)
    elapsed = time.time() - start
    if args.plot:
        progress.plot(args.plot, f"Ape-X DQN on CartPole-v1: {args.actors} actor"
                                 f"{'s' if args.actors != 1 else ''}, one shared buffer "
                                 f"(seed {args.seed})")
        print(f"apex: plot written to {os.path.abspath(args.plot)}", file=sys.stderr)
    result: Dict[str, Any] = {
        "actors": args.actors,
        "seconds": round(elapsed, 2),
        "transitions_added": progress.rows_added,
        "add_rate": round(progress.rows_added / elapsed, 1),
        "learner_steps": learner.steps,
        "sample_rate": round(samples / elapsed, 1),
        "mean_return_last_20": progress.recent_mean(),
        "mean_return_last_20_by_actor": progress.recent_mean_by_actor(args.actors),
        "solved_at_seconds": progress.solved_at(),
        "episodes": len(progress.episodes),
        "env_steps": int(sum(steps)),
        "seed": args.seed,
        "nstep": NSTEP,
        "gamma": GAMMA,
        "rate_limiter": type(rb.rate_limiter).__name__,
        "samples_per_insert": round(samples / max(progress.rows_added, 1), 2),
        "rate_limit": {"samples_per_insert": args.samples_per_insert,
                       "min_size": args.min_size, "error_buffer": error_buffer(args)},
        **batches.report(learner.steps),
    }
    result["buffer_stats"] = rb.stats()
    # Where Ray's node listens: 127.0.0.1 (docs/apex.md).
    result["ray_nodes"] = sorted({node["NodeManagerAddress"] for node in ray.nodes()})
    return result


def main(argv: Optional[List[str]] = None) -> None:
    result = run(parse_args(argv))
    solved = result["solved_at_seconds"]
    print(f"apex: {result['learner_steps']} learner steps, {result['transitions_added']} rows "
          f"added in {result['seconds']:.0f} s; mean return of the last {RECENT_EPISODES} "
          f"episodes {'never reached' if solved is None else 'reached'} {SOLVED_RETURN:g}"
          f"{'' if solved is None else f' at {solved:.1f} s'}, "
          f"{result['mean_return_last_20']} at the end", file=sys.stderr)
    print(json.dumps(result, default=float), flush=True)


if __name__ == "__main__":
    main()
