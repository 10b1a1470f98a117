"""R2D2 on CartPole with the velocities hidden: K Ray actors, one learner, ONE shared buffer.

    python examples/r2d2.py --actors 2 --seconds 600 --seed 0 --plot r2d2.png

- The task needs memory: each observation is the cart's position and the pole's angle only
  (CartPole-v1 without its two velocities), so the Q-network is recurrent (a GRU, numpy, in
  ``r2d2_numpy.py`` beside this file) and must infer the velocities from what it has seen.
- Actors store sequences of ``--length`` steps that start every ``--period`` steps of each
  episode, with the recurrent state the actor had before the sequence's first step (the
  "stored state"); a sequence that reaches past its episode's end is padded and its mask is
  False there. Each sequence is one row of a :class:`cpprb_ray.PrioritizedReplayBuffer` whose
  columns have shape ``(length, ...)``, plus a mask column; its first priority is the actor's
  own eta-mixed n-step TD error.
- The driver is the learner: it samples sequences by priority, replays the first ``--burn-in``
  steps from the stored state to warm up both networks' states, trains on the rest with
  n-step double-DQN targets computed inside the sequence (backpropagation through time), and
  writes back one priority per sequence, ``eta * max|td| + (1 - eta) * mean|td|`` (eta 0.9),
  with the generations of the sample. A ``SampleToInsertRatio`` limiter (its unit: one
  sequence) keeps the replay ratio steady.
- Weights go to the actors through Ray's object store; transitions never do (the buffer handle
  pickles by name and each actor attaches to the same shared memory).

Progress goes to stderr; stdout gets exactly one line of JSON at the end. docs/r2d2.md walks
through the example and gives measured results.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional

# One BLAS thread: the learner's matrices are small (a batch of GRU states), and a second
# thread spinning on a shared, loaded machine made each learner step several times slower.
# Set before numpy is imported (Ray sets the same for its workers).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402

import cpprb_ray  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import apex  # noqa: E402  (the progress line, the plot and the JSON conventions)
import dqn_numpy  # noqa: E402
import r2d2_numpy  # noqa: E402

GAMMA = 0.99
ETA = 0.9
ACTIONS = 2
# CartPole-v1's observation is (x, x_dot, theta, theta_dot); the agent sees (x, theta), scaled
# to about [-1, 1] by the limits at which an episode terminates.
VISIBLE = [0, 2]
SCALE = np.array([1 / 2.4, 1 / 0.2095], dtype=np.float32)
OBS_SIZE = len(VISIBLE)
SOLVED_RETURN = apex.SOLVED_RETURN
RECENT_EPISODES = apex.RECENT_EPISODES
WAIT_SLICE_S = apex.WAIT_SLICE_S


def epsilon_ladder(actors: int, base: float) -> List[float]:
    """Ape-X's ladder with base `base`: ``eps_i = base ** (1 + 7 i / (K - 1))``, `base` when
    K = 1 (Ape-X and R2D2 use base 0.4).

    Examples
    --------
    >>> [round(eps, 5) for eps in epsilon_ladder(2, 0.1)]
    [0.1, 0.0]
    >>> epsilon_ladder(3, 0.4) == apex.epsilon_ladder(3)
    True
    """
    if actors == 1:
        return [base]
    return [base ** (1 + 7 * i / (actors - 1)) for i in range(actors)]


def env_dict(length: int, hidden: int) -> Dict[str, Dict[str, Any]]:
    """The buffer's columns: one row is one sequence of `length` steps.

    Examples
    --------
    >>> {name: spec["shape"] for name, spec in env_dict(30, 16).items()}
    {'obs': (30, 2), 'act': 30, 'rew': 30, 'done': 30, 'mask': 30, 'core': 16}
    """
    return {"obs": {"shape": (length, OBS_SIZE)}, "act": {"shape": length, "dtype": np.int64},
            "rew": {"shape": length}, "done": {"shape": length},
            "mask": {"shape": length, "dtype": np.uint8}, "core": {"shape": hidden}}


def make_buffer(args: argparse.Namespace) -> cpprb_ray.PrioritizedReplayBuffer:
    """The shared buffer of sequences, prioritized (alpha 0.9, as R2D2), with a
    SampleToInsertRatio limiter counted in sequences.

    Examples
    --------
    >>> rb = make_buffer(parse_args(["--buffer-size", "256", "--min-size", "16"]))
    >>> rb.get_buffer_size(), type(rb.rate_limiter).__name__
    (256, 'SampleToInsertRatio')
    >>> rb.close()
    """
    limiter = cpprb_ray.SampleToInsertRatio(args.samples_per_insert, args.min_size,
                                            error_buffer(args))
    return cpprb_ray.PrioritizedReplayBuffer(args.buffer_size, env_dict(args.length, args.hidden),
                                             alpha=0.9, eps=1e-3, seed=args.seed,
                                             rate_limiter=limiter)


def network(args: argparse.Namespace, seed: Optional[int] = None) -> r2d2_numpy.RecurrentQ:
    """The recurrent Q-network of this run's sizes."""
    return r2d2_numpy.RecurrentQ(OBS_SIZE, args.hidden, args.head, ACTIONS, seed=seed)


# ---------------------------------------------------------------------------------------------
# Sequences: how an actor cuts its episode into overlapping, padded windows.

class Episode:
    """One actor's current episode, step by step, and the sequences cut from it.

    A sequence starts at step 0, period, 2 * period, ... of the episode and holds `length`
    steps; it is ready once its last step is taken, or at the episode's end (padded then).

    Examples
    --------
    >>> import numpy as np
    >>> episode = Episode(length=4, period=2, hidden=1)
    >>> for t in range(5):
    ...     episode.append(np.full(2, t), t % 2, 1.0, False, np.zeros(1), np.zeros(2))
    ...     print(t, [start for start, _ in episode.ready()])
    0 []
    1 []
    2 []
    3 [0]
    4 []
    >>> [(start, rows["mask"].tolist()) for start, rows in episode.ready(end=True)]
    [(2, [1, 1, 1, 0]), (4, [1, 0, 0, 0])]
    """

    def __init__(self, length: int, period: int, hidden: int) -> None:
        self.length, self.period, self.hidden = length, period, hidden
        self.steps: Dict[str, list] = {name: [] for name in ("obs", "act", "rew", "done",
                                                             "core", "q")}
        self.next_start = 0

    def __len__(self) -> int:
        return len(self.steps["act"])

    def append(self, obs: np.ndarray, act: int, rew: float, done: bool, core: np.ndarray,
               q: np.ndarray) -> None:
        """Record one step: what was seen, done, got, whether it terminated, the state before
        the step and the actor's Q-values at it."""
        for name, value in (("obs", obs), ("act", act), ("rew", rew), ("done", float(done)),
                            ("core", core), ("q", q)):
            self.steps[name].append(value)

    def ready(self, end: bool = False) -> List[Any]:
        """The sequences that became ready, as ``(start, columns)``; with `end`, every
        sequence left (the episode is over)."""
        out = []
        while self.next_start < len(self) and (end or self.next_start + self.length
                                               <= len(self)):
            out.append((self.next_start, self.sequence(self.next_start)))
            self.next_start += self.period
        return out

    def sequence(self, start: int) -> Dict[str, np.ndarray]:
        """Steps ``start .. start + length - 1``, zeros past the episode's end; ``core`` is the
        state before the first step, ``q`` the actor's Q-values (for its first priority)."""
        stop = min(start + self.length, len(self))
        real = stop - start
        columns: Dict[str, np.ndarray] = {}
        for name, dtype, shape in (("obs", np.float32, (OBS_SIZE,)), ("act", np.int64, ()),
                                   ("rew", np.float32, ()), ("done", np.float32, ()),
                                   ("q", np.float32, (ACTIONS,))):
            column = np.zeros((self.length, *shape), dtype=dtype)
            column[:real] = np.asarray(self.steps[name][start:stop], dtype=dtype).reshape(
                real, *shape)
            columns[name] = column
        columns["mask"] = (np.arange(self.length) < real).astype(np.uint8)
        columns["core"] = np.asarray(self.steps["core"][start], dtype=np.float32)
        return columns


def actor_priority(columns: Dict[str, np.ndarray], burn_in: int, nstep: int) -> float:
    """A new sequence's first priority: the eta mix of the actor's own n-step TD errors on the
    steps the learner will train on (its Q-values as both online and target network).

    Examples
    --------
    >>> import numpy as np
    >>> columns = {"rew": np.ones(4), "done": np.array([0, 0, 0, 1.0]),
    ...            "mask": np.ones(4, np.uint8), "q": np.ones((4, 2)), "act": np.zeros(4)}
    >>> round(actor_priority(columns, burn_in=2, nstep=1), 4)   # |1 - 1.99| and |1 - 1|
    0.9405
    """
    q = np.asarray(columns["q"], dtype=np.float64)[:, None]
    mask = np.asarray(columns["mask"], dtype=bool)[:, None]
    targets, has = r2d2_numpy.nstep_targets(columns["rew"][:, None], columns["done"][:, None],
                                            mask, q, q, nstep, GAMMA)
    chosen = q[np.arange(q.shape[0]), 0, np.asarray(columns["act"]).astype(np.int64)]
    abs_td = np.abs(chosen - targets[:, 0])
    has[:burn_in] = False
    return float(r2d2_numpy.mixed_priority(abs_td[None], has.T, ETA)[0])


# ---------------------------------------------------------------------------------------------
# Actors.

def until_admitted(call: Callable[[float], Any], stopping: threading.Event) -> bool:
    """call(timeout) until the rate limiter lets it through (True) or a stop comes (False)."""
    while True:
        try:
            call(WAIT_SLICE_S)
            return True
        except TimeoutError:
            if stopping.is_set():
                return False


def actor_class():
    """The Ray actor class (made on demand so that importing this module needs no Ray)."""
    import ray

    @ray.remote(max_concurrency=4)  # run() in one thread; publish/report/stop in the others
    class Actor:
        def __init__(self, rb, index: int, epsilon: float, seed: int,
                     args: argparse.Namespace) -> None:
            import gymnasium

            self.rb = rb
            self.index = index
            self.epsilon = epsilon
            self.args = args
            self.env = gymnasium.make("CartPole-v1")
            self.rng = np.random.default_rng(seed)
            self.seed = seed
            self.network = network(args)
            self.latest: Optional[Any] = None  # ObjectRef of the newest published weights
            self.loaded: Optional[Any] = None
            self.stopping = threading.Event()
            self.lock = threading.Lock()
            self.sequences_added = 0
            self.steps = 0
            self.episodes: List[Any] = []  # (end time, return, actor)

        def publish(self, refs: list) -> None:
            # The ref arrives inside a list so that Ray does not resolve it here.
            self.latest = refs[0]

        def report(self) -> Dict[str, Any]:
            with self.lock:
                episodes, self.episodes = self.episodes, []
                return {"rows_added": self.sequences_added, "steps": self.steps,
                        "episodes": episodes}

        def stop(self) -> None:
            self.stopping.set()

        def _pull_weights(self) -> None:
            latest = self.latest
            if latest is not None and latest is not self.loaded:
                self.network.set_weights(ray.get(latest))
                self.loaded = latest

        def _add(self, ready: List[Any]) -> bool:
            if not ready:
                return True
            rows = {name: np.stack([columns[name] for _, columns in ready])
                    for name in ("obs", "act", "rew", "done", "mask", "core")}
            priorities = np.array([actor_priority(columns, self.args.burn_in, self.args.nstep)
                                   for _, columns in ready])
            if not until_admitted(lambda timeout: self.rb.add(
                    priorities=priorities, timeout=timeout, **rows), self.stopping):
                return False
            with self.lock:
                self.sequences_added += len(ready)
            return True

        def run(self) -> int:
            args = self.args
            full, _ = self.env.reset(seed=self.seed)
            obs = full[VISIBLE] * SCALE
            state = self.network.initial_state(1)
            episode = Episode(args.length, args.period, args.hidden)
            episode_return = 0.0
            while not self.stopping.is_set():
                self._pull_weights()
                q, next_state = self.network.act(obs[None], state)
                if self.rng.random() < self.epsilon:
                    action = int(self.rng.integers(ACTIONS))
                else:
                    action = int(np.argmax(q[0]))
                full, reward, terminated, truncated, _ = self.env.step(action)
                episode.append(obs, action, float(reward), bool(terminated), state[0], q[0])
                episode_return += float(reward)
                self.steps += 1
                over = terminated or truncated
                if not self._add(episode.ready(end=over)):
                    break
                if over:
                    with self.lock:
                        self.episodes.append((time.time(), episode_return, self.index))
                    episode_return = 0.0
                    full, _ = self.env.reset()
                    state = self.network.initial_state(1)
                    episode = Episode(args.length, args.period, args.hidden)
                else:
                    state = next_state
                obs = full[VISIBLE] * SCALE
            return self.steps

    return Actor


# ---------------------------------------------------------------------------------------------
# The learner (this process) and the run.

def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--actors", type=int, default=2, help="Ray actors, one CartPole each")
    parser.add_argument("--seconds", type=float, default=600.0,
                        help="how long actors and learner run (after Ray is up)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--plot", metavar="PATH", help="write a PNG of return and throughput")
    parser.add_argument("--stop-when-solved", action="store_true",
                        help=f"stop once the mean return of the last {RECENT_EPISODES} "
                             f"episodes reaches {SOLVED_RETURN:g}")
    parser.add_argument("--length", type=int, default=30, help="steps per sequence")
    parser.add_argument("--period", type=int, default=10,
                        help="steps between the starts of an episode's sequences")
    parser.add_argument("--burn-in", type=int, default=10,
                        help="leading steps of a sequence that only warm up the state")
    parser.add_argument("--nstep", type=int, default=5, help="n of the n-step targets")
    parser.add_argument("--hidden", type=int, default=32, help="GRU state width")
    parser.add_argument("--head", type=int, default=64, help="width of the ReLU layer after it")
    parser.add_argument("--buffer-size", type=int, default=10_000, help="buffer rows (sequences)")
    parser.add_argument("--batch-size", type=int, default=64, help="sequences per learner step")
    parser.add_argument("--samples-per-insert", type=float, default=4.0,
                        help="replay ratio the rate limiter keeps (sequences sampled per "
                             "sequence added)")
    parser.add_argument("--min-size", type=int, default=200,
                        help="sequences stored before the learner starts")
    parser.add_argument("--learning-rate", "--lr", type=float, default=1e-3)
    parser.add_argument("--target-every", type=int, default=400,
                        help="learner steps between target-network copies")
    parser.add_argument("--publish-every", type=int, default=50,
                        help="learner steps between weight publications")
    parser.add_argument("--epsilon", type=float, default=0.1,
                        help="base of the actors' epsilon ladder (Ape-X's 0.4 ** (1 + 7i/(K-1)) "
                             "with this base)")
    parser.add_argument("--no-progress", action="store_true", help="no live line on stderr")
    args = parser.parse_args(argv)
    for name in ("actors", "length", "period", "nstep", "hidden", "head", "buffer_size",
                 "batch_size", "min_size", "target_every", "publish_every"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be > 0; got {getattr(args, name)}")
    if args.seconds <= 0 or args.samples_per_insert <= 0:
        parser.error("--seconds and --samples-per-insert must be > 0")
    if not 0 <= args.burn_in < args.length - 1:
        parser.error(f"--burn-in must be in [0, --length - 1); got {args.burn_in}")
    if args.period > args.length:
        parser.error(f"--period must be <= --length ({args.length}); got {args.period}")
    if args.min_size > args.buffer_size:
        parser.error(f"--min-size ({args.min_size}) must be <= --buffer-size "
                     f"({args.buffer_size})")
    if not 0 <= args.epsilon <= 1 or args.learning_rate < 0:
        parser.error("--epsilon must be in [0, 1] and --learning-rate >= 0")
    return args


def error_buffer(args: argparse.Namespace) -> float:
    """The limiter's slack, in sampled sequences: a few learner batches, plus the most
    sequences every actor can add at once (all of an episode's open ones, at its end)."""
    open_sequences = -(-args.length // args.period)
    return 4.0 * args.batch_size + 2.0 * open_sequences * args.actors * args.samples_per_insert


def run(args: argparse.Namespace) -> Dict[str, Any]:
    # Our own single node stays on loopback (docs/apex.md): set before ray is imported.
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    cpus = os.cpu_count() or 1
    ray.init(address="local", num_cpus=cpus, include_dashboard=False, log_to_driver=False,
             configure_logging=False, _node_ip_address="127.0.0.1")
    # Ray workers cannot import the examples' modules by name: ship their code by value.
    for module in (dqn_numpy, r2d2_numpy):
        ray.cloudpickle.register_pickle_by_value(module)
    rb = None
    try:
        rb = make_buffer(args)
        print(f"r2d2: buffer {rb.name}: sequences of {args.length} steps every {args.period}, "
              f"burn-in {args.burn_in}; rate limiter {rb.rate_limiter!r}", file=sys.stderr)
        return learn(args, rb, cpus)
    finally:
        if rb is not None:
            rb.close()
        ray.shutdown()


def learn(args: argparse.Namespace, rb: cpprb_ray.PrioritizedReplayBuffer,
          cpus: int) -> Dict[str, Any]:
    import ray

    learner = r2d2_numpy.R2D2(network(args, seed=args.seed), burn_in=args.burn_in,
                              nstep=args.nstep, gamma=GAMMA, learning_rate=args.learning_rate,
                              target_every=args.target_every, eta=ETA)
    Actor = actor_class()
    per_actor_cpus = min(1.0, cpus / args.actors)
    actors = [Actor.options(num_cpus=per_actor_cpus).remote(rb, i, eps, args.seed * 1000 + i,
                                                            args)
              for i, eps in enumerate(epsilon_ladder(args.actors, args.epsilon))]
    weights = ray.put(learner.network.get_weights())
    ray.get([actor.publish.remote([weights]) for actor in actors])

    start = time.time()
    runs = [actor.run.remote() for actor in actors]
    progress = apex.Progress(start, args.seconds, enabled=not args.no_progress)
    samples = 0
    next_report = start
    deadline = start + args.seconds
    try:
        while True:
            now = time.time()
            if now >= next_report:
                finished, _ = ray.wait(runs, num_returns=len(runs), timeout=0)
                if finished:  # an actor's run() ended before it was told to: show why
                    ray.get(finished)
                    raise RuntimeError(f"{len(finished)} actor(s) stopped before the end")
                reports = ray.get([actor.report.remote() for actor in actors])
                progress.update(reports, samples, learner.steps, rb.get_stored_size(),
                                rb.get_buffer_size())
                next_report = time.time() + 1.0
                if args.stop_when_solved and progress.solved_at() is not None:
                    break
            if now >= deadline:
                break
            beta = 0.6 + 0.4 * min(1.0, (now - start) / args.seconds)
            try:
                batch = rb.sample(args.batch_size, beta, timeout=WAIT_SLICE_S)
            except TimeoutError:
                continue
            priorities = learner.train_step(batch)
            rb.update_priorities(batch["indexes"], priorities, batch["generations"])
            samples += args.batch_size
            if learner.steps % args.publish_every == 0:
                weights = ray.put(learner.network.get_weights())
                for actor in actors:
                    actor.publish.remote([weights])
    finally:
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
        progress.plot(args.plot, f"R2D2 on CartPole-v1 without velocities: {args.actors} "
                                 f"actor{'s' if args.actors != 1 else ''}, one shared buffer "
                                 f"(seed {args.seed}, learning rate {args.learning_rate:g})")
        print(f"r2d2: plot written to {os.path.abspath(args.plot)}", file=sys.stderr)
    result: Dict[str, Any] = {
        "actors": args.actors,
        "seconds": round(elapsed, 2),
        "sequences_added": progress.rows_added,
        "add_rate": round(progress.rows_added / elapsed, 1),
        "learner_steps": learner.steps,
        "sample_rate": round(samples / elapsed, 1),
        "mean_return_last_20": progress.recent_mean(),
        "mean_return_last_20_by_actor": progress.recent_mean_by_actor(args.actors),
        "solved_at_seconds": progress.solved_at(),
        "episodes": len(progress.episodes),
        "env_steps": int(sum(steps)),
        "seed": args.seed,
        "learning_rate": args.learning_rate,
        "sequence": {"length": args.length, "period": args.period, "burn_in": args.burn_in},
        "nstep": args.nstep,
        "gamma": GAMMA,
        "eta": ETA,
        "epsilons": epsilon_ladder(args.actors, args.epsilon),
        "rate_limiter": type(rb.rate_limiter).__name__,
        "samples_per_insert": round(samples / max(progress.rows_added, 1), 2),
        "rate_limit": {"samples_per_insert": args.samples_per_insert,
                       "min_size": args.min_size, "error_buffer": error_buffer(args)},
    }
    result["buffer_stats"] = rb.stats()
    result["ray_nodes"] = sorted({node["NodeManagerAddress"] for node in ray.nodes()})
    return result


def main(argv: Optional[List[str]] = None) -> None:
    result = run(parse_args(argv))
    solved = result["solved_at_seconds"]
    print(f"r2d2: {result['learner_steps']} learner steps, {result['sequences_added']} sequences "
          f"added in {result['seconds']:.0f} s; mean return of the last {RECENT_EPISODES} "
          f"episodes {'never reached' if solved is None else 'reached'} {SOLVED_RETURN:g}"
          f"{'' if solved is None else f' at {solved:.1f} s'}, "
          f"{result['mean_return_last_20']} at the end", file=sys.stderr)
    print(json.dumps(result, default=float), flush=True)


if __name__ == "__main__":
    main()
