"""R2D2 on CartPole with the velocities hidden: K Ray actors, one learner, ONE shared buffer.

    python examples/r2d2.py --actors 2 --seconds 600 --seed 0 --plot r2d2.png

- The task needs memory: each observation is the cart's position and the pole's angle only
  (CartPole-v1 without its two velocities), so the Q-network is recurrent (a GRU, numpy, in
  ``r2d2_numpy.py`` beside this file) and must infer the velocities from what it has seen.
- The buffer is a sequence buffer, :class:`cpprb_ray.PrioritizedReplayBuffer` with
  ``sequence={"length": 30, "period": 10}`` and one lane per actor: actors add single steps
  (with the recurrent state they had before each, the "core" column) and end episodes with
  ``rb.on_episode_end()``; the buffer cuts each actor's episodes into sequences of ``--length``
  steps starting every ``--period`` steps, stores each step once, and samples whole sequences
  (padded past an episode's end, ``mask`` False there). A step's priority is the actor's own
  n-step TD error; a sequence's first priority is the buffer's eta mix of its steps'.
- The driver is the learner: it samples sequences by priority (ahead, on a thread, while it
  trains on the batch before: ``rb.prefetch``, docs/learner.md; ``--no-prefetch`` samples
  each when asked; the JSON line reports the learner's wait either way), replays the first
  ``--burn-in`` steps from the stored state to warm up both networks' states, trains on the
  rest with n-step double-DQN targets computed inside the sequence (backpropagation through
  time), and writes back one priority per sequence, ``cpprb_ray.sequence_priority``:
  ``eta * max|td| + (1 - eta) * mean|td|`` (eta 0.9), with the generations of the sample. A
  ``SampleToInsertRatio`` limiter (its unit: one sequence) keeps the replay ratio steady.
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


def env_dict(hidden: int) -> Dict[str, Dict[str, Any]]:
    """The buffer's columns, one step each: ``core`` is the actor's recurrent state before the
    step (the learner starts a sequence from its first step's); ``done`` is 1 where the episode
    terminated, which ends it in the buffer too.

    Examples
    --------
    >>> sorted(env_dict(16))
    ['act', 'core', 'done', 'obs', 'rew']
    """
    return {"obs": {"shape": OBS_SIZE}, "act": {"dtype": np.int64}, "rew": {}, "done": {},
            "core": {"shape": hidden}}


def make_buffer(args: argparse.Namespace) -> cpprb_ray.PrioritizedReplayBuffer:
    """The shared sequence buffer: `--buffer-size` steps in one lane per actor, prioritized
    (alpha 0.9, as R2D2), with a SampleToInsertRatio limiter (its unit: one sequence).

    Examples
    --------
    >>> rb = make_buffer(parse_args(["--buffer-size", "512", "--min-size", "16"]))
    >>> rb.get_stored_size(), type(rb.rate_limiter).__name__     # sequences stored
    (0, 'SampleToInsertRatio')
    >>> rb.close()
    """
    limiter = cpprb_ray.SampleToInsertRatio(args.samples_per_insert, args.min_size,
                                            error_buffer(args))
    return cpprb_ray.PrioritizedReplayBuffer(
        args.buffer_size, env_dict(args.hidden), alpha=0.9, eps=1e-3, seed=args.seed,
        sequence={"length": args.length, "period": args.period, "eta": ETA},
        lanes=args.actors, rate_limiter=limiter)


def network(args: argparse.Namespace, seed: Optional[int] = None) -> r2d2_numpy.RecurrentQ:
    """The recurrent Q-network of this run's sizes."""
    return r2d2_numpy.RecurrentQ(OBS_SIZE, args.hidden, args.head, ACTIONS, seed=seed)


# ---------------------------------------------------------------------------------------------
# An actor's episode: its steps, and their priorities once they are known.

class Episode:
    """One actor's current episode, step by step, and the steps ready to be added.

    A step's priority is its n-step TD error under the actor's own Q-values, so it is known
    `nstep` steps later, or at the episode's end; :meth:`ready` hands out the steps whose
    priority is known, each once, with it, `batch` at a time (fewer at the end).

    Examples
    --------
    >>> import numpy as np
    >>> episode = Episode(nstep=2, batch=1)
    >>> for t in range(4):
    ...     episode.append(np.full(2, t), 0, 1.0, t == 3, np.zeros(1), np.zeros(2))
    ...     ready = episode.ready(end=(t == 3))
    ...     print(t, ready and (ready[0]["rew"].tolist(), ready[1].round(4).tolist()))
    0 None
    1 None
    2 ([1.0], [1.99])
    3 ([1.0, 1.0, 1.0], [1.99, 1.99, 1.0])
    """

    def __init__(self, nstep: int, batch: int) -> None:
        self.nstep, self.batch = nstep, batch
        self.steps: Dict[str, list] = {name: [] for name in ("obs", "act", "rew", "done",
                                                             "core", "q")}
        self.added = 0

    def __len__(self) -> int:
        return len(self.steps["act"])

    def append(self, obs: np.ndarray, act: int, rew: float, done: bool, core: np.ndarray,
               q: np.ndarray) -> None:
        """Record one step: what was seen, done, got, whether it terminated, the state before
        the step and the actor's Q-values at it."""
        for name, value in (("obs", obs), ("act", act), ("rew", rew), ("done", float(done)),
                            ("core", core), ("q", q)):
            self.steps[name].append(value)

    def ready(self, end: bool = False) -> Optional[Any]:
        """``(columns, priorities)`` of the steps not yet handed out whose priority is known
        (all of them with `end`: the episode is over), once there are `batch` of them or at
        the end; else None."""
        upto = len(self) if end else len(self) - self.nstep
        first = self.added
        if upto <= first or (not end and upto - first < self.batch):
            return None
        self.added = upto
        # The targets of steps first .. upto - 1 need the steps up to nstep after them.
        q = np.asarray(self.steps["q"][first:], dtype=np.float64)[:, None]
        rew = np.asarray(self.steps["rew"][first:])[:, None]
        done = np.asarray(self.steps["done"][first:])[:, None]
        act = np.asarray(self.steps["act"][first:upto], dtype=np.int64)
        targets, has = r2d2_numpy.nstep_targets(rew, done, np.ones_like(done, dtype=bool), q, q,
                                                self.nstep, GAMMA)
        count = upto - first
        # A truncated episode's last step has no successor, hence no target: priority 0.
        priorities = np.where(has[:count, 0],
                              np.abs(q[np.arange(count), 0, act] - targets[:count, 0]), 0.0)
        columns = {"obs": np.asarray(self.steps["obs"][first:upto], dtype=np.float32),
                   "act": act, "rew": rew[:count, 0], "done": done[:count, 0],
                   "core": np.asarray(self.steps["core"][first:upto], dtype=np.float32)}
        return columns, priorities


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
            self.steps_added = 0
            self.steps = 0
            self.episodes: List[Any] = []  # (end time, return, actor)

        def publish(self, refs: list) -> None:
            # The ref arrives inside a list so that Ray does not resolve it here.
            self.latest = refs[0]

        def report(self) -> Dict[str, Any]:
            with self.lock:
                episodes, self.episodes = self.episodes, []
                return {"steps_added": self.steps_added, "steps": self.steps,
                        "episodes": episodes}

        def stop(self) -> None:
            self.stopping.set()

        def _pull_weights(self) -> None:
            latest = self.latest
            if latest is not None and latest is not self.loaded:
                self.network.set_weights(ray.get(latest))
                self.loaded = latest

        def _add(self, ready: Optional[Any], over: bool) -> bool:
            if ready is not None:
                columns, priorities = ready
                # The rate limiter holds adds back while the learner is behind; wait in slices
                # so that a stop is seen.
                if not until_admitted(lambda timeout: self.rb.add(
                        priorities=priorities, timeout=timeout, **columns), self.stopping):
                    return False
                with self.lock:
                    self.steps_added += priorities.shape[0]
            if over:
                # Ends the episode in the buffer (a terminated one is ended by its done=1
                # already; a truncated one only by this): its open sequences are padded and
                # become sampleable.
                return until_admitted(lambda timeout: self.rb.on_episode_end(timeout=timeout),
                                      self.stopping)
            return True

        def run(self) -> int:
            args = self.args
            full, _ = self.env.reset(seed=self.seed)
            obs = full[VISIBLE] * SCALE
            state = self.network.initial_state(1)
            episode = Episode(args.nstep, args.add_batch)
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
                if not self._add(episode.ready(end=over), over):
                    break
                if over:
                    with self.lock:
                        self.episodes.append((time.time(), episode_return, self.index))
                    episode_return = 0.0
                    full, _ = self.env.reset()
                    state = self.network.initial_state(1)
                    episode = Episode(args.nstep, args.add_batch)
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
    parser.add_argument("--buffer-size", type=int, default=100_000,
                        help="buffer steps (all lanes together)")
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
    parser.add_argument("--add-batch", type=int, default=8,
                        help="steps an actor adds at once (fewer at an episode's end)")
    parser.add_argument("--epsilon", type=float, default=0.1,
                        help="base of the actors' epsilon ladder (Ape-X's 0.4 ** (1 + 7i/(K-1)) "
                             "with this base)")
    parser.add_argument("--no-progress", action="store_true", help="no live line on stderr")
    parser.add_argument("--no-prefetch", dest="prefetch", action="store_false",
                        help="sample each batch when the learner asks for it, instead of ahead "
                             "on a thread (rb.prefetch) while the learner trains")
    args = parser.parse_args(argv)
    for name in ("actors", "length", "period", "nstep", "hidden", "head", "buffer_size",
                 "batch_size", "min_size", "target_every", "publish_every", "add_batch"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be > 0; got {getattr(args, name)}")
    if args.seconds <= 0 or args.samples_per_insert <= 0:
        parser.error("--seconds and --samples-per-insert must be > 0")
    if not 0 <= args.burn_in < args.length - 1:
        parser.error(f"--burn-in must be in [0, --length - 1); got {args.burn_in}")
    if args.period > args.length:
        parser.error(f"--period must be <= --length ({args.length}); got {args.period}")
    if args.buffer_size // args.actors < args.length:
        parser.error(f"--buffer-size {args.buffer_size} leaves fewer than --length "
                     f"({args.length}) steps to each actor's lane")
    if not 0 <= args.epsilon <= 1 or args.learning_rate < 0:
        parser.error("--epsilon must be in [0, 1] and --learning-rate >= 0")
    return args


def error_buffer(args: argparse.Namespace) -> float:
    """The limiter's slack, in sampled sequences: a few learner batches, plus the most
    sequences every actor can complete at once (an add batch's, and all of an episode's open
    ones at its end)."""
    at_once = -(-args.length // args.period) + -(-args.add_batch // args.period)
    return 4.0 * args.batch_size + 2.0 * at_once * args.actors * args.samples_per_insert


def with_sequences(reports: List[Dict[str, Any]], rb: Any) -> List[Dict[str, Any]]:
    """The actors' reports for the progress line, plus the sequences the buffer has made of
    their steps so far (its insert count: the rate limiter's unit) as the rows added."""
    sequences = {"rows_added": int(rb.stats()["inserts"]), "episodes": []}
    return [dict(report, rows_added=0) for report in reports] + [sequences]


def sequence_batch(batch: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """A sampled batch as the learner takes it: scalar columns ``(B, L)``, and ``core`` the
    state before each sequence's first step, ``(B, H)``."""
    out = dict(batch)
    rows, length = batch["mask"].shape
    for name in ("act", "rew", "done"):
        out[name] = np.asarray(batch[name]).reshape(rows, length)
    out["core"] = batch["core"][:, 0]
    return out


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
                              target_every=args.target_every)
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

    def beta_now(_step: int) -> float:
        return 0.6 + 0.4 * min(1.0, (time.time() - start) / args.seconds)

    # A thread samples the next batch of sequences while train_step runs (unless
    # --no-prefetch): the learner takes it ready. It stays valid until the next take().
    batches = apex.LearnerBatches(rb, args.batch_size, beta_now, args.prefetch)
    try:
        while True:
            now = time.time()
            if now >= next_report:
                finished, _ = ray.wait(runs, num_returns=len(runs), timeout=0)
                if finished:  # an actor's run() ended before it was told to: show why
                    ray.get(finished)
                    raise RuntimeError(f"{len(finished)} actor(s) stopped before the end")
                reports = ray.get([actor.report.remote() for actor in actors])
                progress.update(with_sequences(reports, rb), samples, learner.steps,
                                rb.get_stored_size(), rb.get_buffer_size())
                next_report = time.time() + 1.0
                if args.stop_when_solved and progress.solved_at() is not None:
                    break
            if now >= deadline:
                break
            batch = batches.take()
            if batch is None:   # the limiter held it back a slice: look at the clock again
                continue
            abs_td, trained = learner.train_step(sequence_batch(batch))
            priorities = cpprb_ray.sequence_priority(abs_td, mask=trained, eta=ETA)
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
        final_reports = ray.get([actor.report.remote() for actor in actors])
        progress.update(with_sequences(final_reports, rb), samples, learner.steps,
                        rb.get_stored_size(), rb.get_buffer_size(), final=True)
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
        "steps_added": int(sum(report["steps_added"] for report in final_reports)),
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
        **batches.report(learner.steps),
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
