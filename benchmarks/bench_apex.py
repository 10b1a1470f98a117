"""Benchmark: Ape-X ingest on Ray, the shared buffer against a replay actor and cpprb's MP buffer.

Run from the repository root (``make venv`` first; Ray and cpprb are in .venv)::

    .venv/bin/python benchmarks/bench_apex.py                  # 3 ways, 20 s each
    .venv/bin/python benchmarks/bench_apex.py --quick          # 3 s each (a smoke run)
    .venv/bin/python benchmarks/bench_apex.py --actors 4 --seconds 30 --json apex.json

K Ray actors (``--actors``, default 2) add batches of 50 transitions with their initial
priorities, as Ape-X actors do, and one learner (this process) loops ``sample(256, beta=0.4)``
and an update of the sampled rows' priorities, all for ``--seconds`` from one common start. The
same work three ways, one after the other in one run:

(a) shared
    cpprb_ray's PrioritizedReplayBuffer: each actor gets the buffer handle as an argument (it
    pickles by name and re-attaches in place) and adds straight in; the learner samples and
    updates (with the sample's generations) on its own handle. No actor or object store in the
    data path.
(b) replay actor
    RLlib's old Ape-X way: one replay Ray actor holds cpprb's PrioritizedReplayBuffer. Actors
    call ``add.remote(...)`` with at most 4 calls in flight each (counting a batch when its call
    has completed); the learner calls ``ray.get(sample.remote(256, 0.4))`` and then
    ``update_priorities.remote(...)`` without waiting, as RLlib's learner did.
(c) cpprb MP
    cpprb's MPPrioritizedReplayBuffer through cpprb's documented Ray recipe: a SyncManager as its
    ``ctx``, ``backend="SharedMemory"``, and each actor sets its process's authkey to the
    driver's in ``__init__`` so that it may talk to the manager. Actors get the buffer as an
    argument and add in; the learner samples and updates it directly. When the recipe does not
    run with this Ray, the report says why and (c) is left out.

Every buffer holds the transition of benchmarks/_common.ENV_DICT at capacity 2^20 (``--exponent``),
alpha 0.6, eps 1e-4, and is filled to capacity before the clock starts. Rows added per second
count the rows that every actor got into the buffer within the window; learner steps per
second, the learner's completed sample + update pairs. Each side also records its counts per
second of the window: a target is "met" only when the ratio of the totals and the ratio of the
medians of the per-second rates both meet it (benchmarks/_common.verdict).

Options being prepared for features built on other branches (each is refused with "not available
in this build" until the buffer supports it; nothing is faked):

--nstep N
    N-step staging (cpprb's ``Nstep={"size": N, "gamma": 0.99, ...}``) in every actor's handle
    for (a); for (b) and (c), each actor stages in a local cpprb ReplayBuffer with the same Nstep
    and sends what it completes, cpprb's own Ape-X recipe (the MP buffer takes no Nstep). The
    actors' batches are then episodes' steps with done only at a batch's end, followed by
    ``on_episode_end()``.
--rate-limit SPI
    (a) only: a ``SampleToInsertRatio(SPI, min_size_to_sample, error_buffer)`` limiter; adds and
    samples block while it forbids them. (b) and (c) have no limiter and run unlimited, so their
    ratios then compare a paced buffer with unpaced ones; the report says so.
--remote
    The writers on a second Ray node that cannot see the learner's shared memory (issue 10):
    the script starts its own two-node cluster on this machine (benchmarks/_two_nodes.py: the
    head, and a node in its own mount namespace over a private /dev/shm, like a second host;
    needs root) and ends it afterwards. The learner (this process) stays on the head and owns
    the buffer. (a): the writers' handles are remote handles (cpprb_ray.remote: adds batched,
    sent to the buffer's proxy actor on the head); (b): the replay actor is pinned to the head,
    beside the learner, as RLlib would place it. (c) cannot cross hosts and is left out. Rows
    added are counted where they land: (a) by the owner's insert counter, read at every whole
    second of the window (a row still queued in a writer is not counted); (b) as before, when
    the writer's add.remote call has completed. The targets are then 3x (rows) and 10x (learner
    steps).
"""

from __future__ import annotations

import argparse
import base64
import functools
import inspect
import multiprocessing
import os
import statistics
import sys
import threading
import time
from typing import Any, Dict, List, Optional

import numpy as np

if __package__:
    from . import _common as common
    from . import _two_nodes
else:  # run as a script: this file's folder is sys.path[0]
    import _common as common
    import _two_nodes

BATCH = 256  # rows per sample
ADD_ROWS = 50  # rows per actor add
POOL = 64  # pre-drawn batches per actor, cycled
IN_FLIGHT = 4  # (b): add.remote calls an actor keeps in flight
START_MARGIN_S = 3.0  # actors receive their call and unpickle the buffer before the clock starts
GAMMA = 0.99
WAYS = ("shared", "replay_actor", "cpprb_mp")
LABELS = {"shared": "(a) shared buffer", "replay_actor": "(b) replay actor (cpprb)",
          "cpprb_mp": "(c) cpprb MPPrioritizedReplayBuffer + SyncManager"}
#: The issue's targets, (a) / (b) at least: rows added per second, learner steps per second.
TARGETS = {"rows_added_per_s": 20.0, "learner_steps_per_s": 50.0}
#: With the writers on another node (--remote).
REMOTE_TARGETS = {"rows_added_per_s": 3.0, "learner_steps_per_s": 10.0}
RATES = {"rows_added_per_s": "rows added/s", "learner_steps_per_s": "learner steps/s"}


# ---------------------------------------------------------------------------------------------
# Inputs and counting, shared by the actors and the learner


def actor_batches(seed: int, nstep: int) -> List[Dict[str, np.ndarray]]:
    """POOL batches of ADD_ROWS rows with float32 priorities under "priorities".

    With N-step on, a batch is consecutive steps of one episode: done only on its last row,
    which ends the episode one batch in five.
    """
    rng = np.random.default_rng(seed)
    batches = []
    for index in range(POOL):
        batch: Dict[str, np.ndarray] = common.random_rows(rng, ADD_ROWS)
        if nstep:
            batch["done"] = np.zeros(ADD_ROWS, np.float32)
            batch["done"][-1] = np.float32(index % 5 == 4)
        batch["priorities"] = common.random_priorities(rng, ADD_ROWS)
        batches.append(batch)
    return batches


def nstep_spec(nstep: int) -> Dict[str, Any]:
    """cpprb's Nstep argument, for cpprb's buffers and ours alike."""
    return {"size": nstep, "gamma": GAMMA, "rew": "rew", "next": "next_obs"}


class Window:
    """Counts per whole second since `start`; the total within [start, start + seconds)."""

    def __init__(self, start: float, seconds: float):
        self.start, self.seconds = start, seconds
        self.per_second = [0] * max(1, int(np.ceil(seconds)))

    def count(self, amount: int, now: float) -> bool:
        """Count `amount` done at `now`; False once the window is over (not counted)."""
        offset = now - self.start
        if offset >= self.seconds:
            return False
        self.per_second[min(int(offset), len(self.per_second) - 1)] += amount
        return True

    def report(self, began: float) -> Dict[str, Any]:
        """The counts, and how late after `start` the counting side began (`began`)."""
        return {"total": sum(self.per_second), "per_second": self.per_second,
                "late_s": max(0.0, began - self.start)}


def wait_until(moment: float) -> None:
    """Sleep until time.time() reaches `moment` (a wall-clock time every process shares)."""
    delay = moment - time.time()
    if delay > 0:
        time.sleep(delay)


# ---------------------------------------------------------------------------------------------
# Ray actors (defined when Ray is imported, in make_actor_classes)


def make_actor_classes(ray: Any) -> Dict[str, Any]:
    """The Ray actor classes: a writer and (b)'s replay actor. num_cpus=0: any K fits."""
    authkey = base64.b64encode(bytes(multiprocessing.current_process().authkey))

    @ray.remote(num_cpus=0)
    class Writer:
        """An Ape-X actor that only adds: batches of ADD_ROWS rows with their priorities."""

        def __init__(self, seed: int, nstep: int, set_authkey: bool):
            if set_authkey:
                # cpprb's Ray recipe: this process must share the driver's authkey to talk to
                # the SyncManager that holds the MP buffer's locks.
                multiprocessing.current_process().authkey = base64.b64decode(authkey)
            self.batches = actor_batches(seed, nstep)
            self.nstep = nstep

        def ready(self) -> bool:
            """Returns once __init__ has run (the actor's process is up, its pool drawn)."""
            return True

        def _local_stager(self):
            """cpprb's N-step staging in a local buffer (cpprb's Ape-X recipe), for (b), (c)."""
            import cpprb

            return cpprb.ReplayBuffer(2 * ADD_ROWS, common.env_dict(),
                                      Nstep=nstep_spec(self.nstep))

        def add_direct(self, buffer: Any, start: float, seconds: float, stage_locally: bool,
                       add_kwargs: Dict[str, Any]) -> Dict[str, Any]:
            """(a) and (c): add straight into `buffer` (a handle passed as an argument).

            `stage_locally`: N-step staging in a local cpprb buffer ((c)); otherwise the
            handle stages itself ((a)). `add_kwargs` (a rate-limited run: a timeout) go to
            every add; an add that times out adds nothing and is tried again.
            """
            window = Window(start, seconds)
            stager = self._local_stager() if self.nstep and stage_locally else None
            add = buffer.add
            if add_kwargs:
                add = functools.partial(add, **add_kwargs)
            if getattr(buffer, "is_remote", False):
                # A remote handle starts (or finds) the buffer's proxy actor on its first call:
                # before the clock, as the actors' own start-up is.
                buffer.get_stored_size()
            wait_until(start)
            began = time.time()
            k = 0
            while True:
                batch = self.batches[k % POOL]
                k += 1
                if stager is not None:
                    added = _stage_and_flush(stager, batch, add)
                else:
                    try:
                        add(**batch)
                    except TimeoutError:  # the rate limiter held it back; nothing was added
                        k -= 1
                        added = 0
                    else:
                        # With N-step on, our handle stages the steps itself; each step added
                        # becomes one stored transition (at an episode's end or n steps on).
                        if self.nstep and batch["done"][-1]:
                            buffer.on_episode_end()
                        added = ADD_ROWS
                if not window.count(added, time.time()):
                    break
            close = getattr(buffer, "close", None)
            if close is not None:
                close()  # a view: closing never frees the owner's segment
            return window.report(began)

        def add_via(self, replay: Any, start: float, seconds: float) -> Dict[str, Any]:
            """(b): add.remote into the replay actor, at most IN_FLIGHT calls outstanding."""
            window = Window(start, seconds)
            stager = self._local_stager() if self.nstep else None
            pending: Dict[Any, int] = {}

            def send(**rows):
                pending[replay.add.remote(**rows)] = len(rows["rew"])
            wait_until(start)
            began = time.time()
            k = 0
            done = False
            while not done:
                while len(pending) < IN_FLIGHT:
                    batch = self.batches[k % POOL]
                    k += 1
                    if stager is not None:
                        _stage_and_flush(stager, batch, send)
                    else:
                        send(**batch)
                finished, _ = ray.wait(list(pending), num_returns=1)
                now = time.time()
                for ref in finished:
                    if not window.count(pending.pop(ref), now):
                        done = True
            ray.get(list(pending))  # drain; finished past the window, so not counted
            return window.report(began)

    @ray.remote(num_cpus=0)
    class ReplayActor:
        """(b): cpprb's PrioritizedReplayBuffer in a Ray actor, RLlib's old Ape-X layout."""

        def __init__(self, capacity: int, seed: int):
            import cpprb

            self.buffer = cpprb.PrioritizedReplayBuffer(
                capacity, common.env_dict(), alpha=common.ALPHA, eps=common.EPS)
            common.fill(self.buffer, capacity, np.random.default_rng(seed))

        def add(self, priorities=None, **rows):
            self.buffer.add(priorities=priorities, **rows)

        def sample(self, batch_size: int, beta: float):
            return self.buffer.sample(batch_size, beta)

        def update_priorities(self, indexes, priorities):
            self.buffer.update_priorities(indexes, priorities)

    return {"Writer": Writer, "ReplayActor": ReplayActor}


def _stage_and_flush(stager: Any, batch: Dict[str, np.ndarray], add: Any) -> int:
    """Add `batch` to a local cpprb N-step buffer, send what it completed to `add`; rows sent.

    The staged rows' priorities are not carried through cpprb's local buffer, so what is sent
    gets the priorities of the batch's first rows (one per completed row): the same amount of
    data as an actor that computes them from its TD errors would send. cpprb's clear() also
    empties its N-step staging, so mid-episode each flush loses the n - 1 steps still staged
    (cpprb's recipe as documented; the rows sent are counted, not the steps added).
    """
    rows = {key: value for key, value in batch.items() if key != "priorities"}
    stager.add(**rows)
    if batch["done"][-1]:
        stager.on_episode_end()
    completed = stager.get_all_transitions()
    count = len(completed["rew"]) if completed else 0
    if count:
        stager.clear()
        add(priorities=batch["priorities"][:count].copy(), **completed)
    return count


# ---------------------------------------------------------------------------------------------
# The learner (this process)


def count_inserts(buffer: Any, start: float, seconds: float, report: Dict[str, Any]) -> None:
    """(a) with --remote: the rows that reached `buffer` in each whole second of the window,
    from its insert counter (a thread of the learner's process; one cheap read a second)."""
    window = Window(start, seconds)
    wait_until(start)
    report["began"] = time.time()
    last = buffer.stats()["inserts"]
    for second in range(len(window.per_second)):
        wait_until(start + min(second + 1, seconds))
        now = buffer.stats()["inserts"]
        window.per_second[second] = now - last
        last = now
    report.update(window.report(report["began"]))


def learn(sample: Any, update: Any, start: float, seconds: float, seed: int) -> Dict[str, Any]:
    """sample(256) + update of its rows for `seconds` from `start`; counts per second."""
    rng = np.random.default_rng(seed)
    priorities = [common.random_priorities(rng, BATCH) for _ in range(POOL)]
    window = Window(start, seconds)
    wait_until(start)
    began = time.time()
    k = 0
    while True:
        try:
            batch = sample()
        except TimeoutError:  # the rate limiter held the sample back
            steps = 0
        else:
            update(batch, priorities[k % POOL])
            k += 1
            steps = 1
        if not window.count(steps, time.time()):
            break
    return window.report(began)


# ---------------------------------------------------------------------------------------------
# The three ways


def run_way(way: str, ray: Any, classes: Dict[str, Any], args: argparse.Namespace,
            features: Dict[str, Any]) -> Dict[str, Any]:
    """One way, timed: K writers and the learner for args.seconds; its report."""
    capacity = 2**args.exponent
    beta = common.BETA
    cleanup: List[Any] = []
    # --remote: the writers on the second node; what the learner uses stays on this one.
    placement = {"resources": {"remote": 0.01}} if args.remote else {}
    here = _on_this_node(ray) if args.remote else {}
    inserts: Dict[str, Any] = {}
    counter = None
    writers = [classes["Writer"].options(**placement).remote(
        args.seed + 1 + w, args.nstep, way == "cpprb_mp") for w in range(args.actors)]
    try:
        # Worker processes can take seconds to start on a loaded machine: wait for them, so
        # that the clock starts with every actor up.
        ray.get([writer.ready.remote() for writer in writers], timeout=300)
        if way == "shared":
            cpprb_ray = common.import_cpprb_ray()
            buffer = cpprb_ray.PrioritizedReplayBuffer(
                capacity, common.env_dict(), alpha=common.ALPHA, eps=common.EPS, seed=args.seed,
                **features["shared_kwargs"])
            cleanup.append(buffer.close)
            if "fill_rows" in features:  # a rate-limited run starts at its limiter's minimum
                _fill_some(buffer, features["fill_rows"], args.seed)
            else:
                common.fill(buffer, capacity, np.random.default_rng(args.seed))
            sample_kwargs = features.get("sample_kwargs", {})

            def sample():
                return buffer.sample(BATCH, beta, **sample_kwargs)

            def update(batch, priorities):
                buffer.update_priorities(batch["indexes"], priorities, batch["generations"])
            start = time.time() + START_MARGIN_S
            calls = [w.add_direct.remote(buffer, start, args.seconds, False,
                                         features.get("add_kwargs", {})) for w in writers]
            if args.remote:
                counter = threading.Thread(target=count_inserts,
                                           args=(buffer, start, args.seconds, inserts))
                counter.start()
        elif way == "replay_actor":
            replay = classes["ReplayActor"].options(**here).remote(capacity, args.seed)
            cleanup.append(lambda: ray.kill(replay))
            ray.get(replay.sample.remote(1, beta))  # filled and ready

            def sample():
                return ray.get(replay.sample.remote(BATCH, beta))

            def update(batch, priorities):
                replay.update_priorities.remote(batch["indexes"], priorities)
            start = time.time() + START_MARGIN_S
            calls = [w.add_via.remote(replay, start, args.seconds) for w in writers]
        else:
            import cpprb

            manager = multiprocessing.get_context().Manager()
            cleanup.append(manager.shutdown)
            buffer = cpprb.MPPrioritizedReplayBuffer(
                capacity, common.env_dict(), alpha=common.ALPHA, eps=common.EPS, ctx=manager,
                backend="SharedMemory")
            common.fill(buffer, capacity, np.random.default_rng(args.seed))

            def sample():
                return buffer.sample(BATCH, beta)

            def update(batch, priorities):
                buffer.update_priorities(batch["indexes"], priorities)
            start = time.time() + START_MARGIN_S
            calls = [w.add_direct.remote(buffer, start, args.seconds, True, {})
                     for w in writers]
        learner = learn(sample, update, start, args.seconds, args.seed + 100)
        reports = ray.get(calls, timeout=args.seconds + 120)
        if counter is not None:
            counter.join()
            # What landed in the buffer, not what the writers queued.
            reports = [{key: inserts[key] for key in ("total", "per_second", "late_s")}]
    finally:
        for writer in writers:
            ray.kill(writer)
        for step in reversed(cleanup):
            step()
    per_second = [sum(counts) for counts in zip(*(r["per_second"] for r in reports))]
    late = max(r["late_s"] for r in reports + [learner])
    if late > 0.5:
        print(f"  warning: {LABELS[way]}: a side began {late:.1f} s after the common start "
              f"(the window counts from the start; raise START_MARGIN_S)", file=sys.stderr)
    return {
        "way": way,
        "rows_added_per_s": sum(r["total"] for r in reports) / args.seconds,
        "learner_steps_per_s": learner["total"] / args.seconds,
        "rows_added_per_second": per_second,
        "learner_steps_per_second": learner["per_second"],
        "late_s": late,
    }


def _on_this_node(ray: Any) -> Dict[str, Any]:
    """Ray options that pin an actor to the node of this process (the learner's)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    node = ray.get_runtime_context().get_node_id()
    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(node, soft=False)}


def _fill_some(buffer: Any, rows: int, seed: int) -> None:
    """Add `rows` random rows in one call."""
    batch = common.random_rows(np.random.default_rng(seed), rows)
    buffer.add(**batch)


# ---------------------------------------------------------------------------------------------
# Features that other branches are building: detected, never imitated


def detect_features(args: argparse.Namespace) -> Dict[str, Any]:
    """What --nstep / --rate-limit need from this build; raises SystemExit(2) when missing."""
    cpprb_ray = common.import_cpprb_ray()
    parameters = inspect.signature(cpprb_ray.PrioritizedReplayBuffer.__init__).parameters
    features: Dict[str, Any] = {"shared_kwargs": {}}
    missing = []
    if args.nstep:
        if "Nstep" not in parameters:
            missing.append("--nstep: not available in this build (PrioritizedReplayBuffer "
                           "takes no Nstep=)")
        else:
            features["shared_kwargs"]["Nstep"] = nstep_spec(args.nstep)
    if args.rate_limit is not None:
        limiter = getattr(cpprb_ray, "SampleToInsertRatio", None)
        blocking = [name for name in ("add", "sample") if "timeout" not in inspect.signature(
            getattr(cpprb_ray.PrioritizedReplayBuffer, name)).parameters]
        if limiter is None or "rate_limiter" not in parameters or blocking:
            missing.append("--rate-limit: not available in this build (it needs "
                           "cpprb_ray.SampleToInsertRatio, a rate_limiter= argument and a "
                           "timeout= argument of add and sample)")
        else:
            min_size = 10 * BATCH
            # Reverb's error_buffer: how far the sampled/inserted balance may stray from the
            # ratio, in samples; room for 20 learner steps either way.
            error_buffer = 20.0 * BATCH
            features["shared_kwargs"]["rate_limiter"] = limiter(
                args.rate_limit, min_size, error_buffer)
            features["fill_rows"] = min_size
            # Blocked calls give up after a second, so that no side waits past the window
            # for a peer that has stopped.
            features["add_kwargs"] = features["sample_kwargs"] = {"timeout": 1.0}
            features["limiter"] = {"samples_per_insert": args.rate_limit,
                                   "min_size_to_sample": min_size,
                                   "error_buffer": error_buffer}
    if missing:
        for line in missing:
            print(line, file=sys.stderr)
        raise SystemExit(2)
    return features


# ---------------------------------------------------------------------------------------------
# Report


def ratios(results: Dict[str, Dict[str, Any]], way: str) -> Optional[Dict[str, Dict[str, float]]]:
    """(a) / `way` for each rate: of the totals, and of the medians of the per-second rates."""
    if "shared" not in results or way not in results:
        return None
    ours, theirs = results["shared"], results[way]
    out = {}
    for key in RATES:
        per_second = key.replace("_per_s", "_per_second")
        ours_median = statistics.median(ours[per_second])
        theirs_median = statistics.median(theirs[per_second])
        out[key] = {"total": ours[key] / theirs[key] if theirs[key] else float("inf"),
                    "median": ours_median / theirs_median if theirs_median else float("inf")}
    return out


def table(results: Dict[str, Dict[str, Any]]) -> str:
    """One line per way: both rates, and (a)'s rates over it (totals; medians of seconds)."""
    rows = []
    for way in WAYS:
        r = results.get(way)
        if r is None:
            continue
        cells = [LABELS[way], f"{r['rows_added_per_s']:,.0f}", f"{r['learner_steps_per_s']:,.1f}"]
        ratio = ratios(results, way) if way != "shared" else None
        for key in RATES:
            cells.append("-" if ratio is None else
                         f"{ratio[key]['total']:.1f}x ({ratio[key]['median']:.1f}x)")
        rows.append(cells)
    return common.markdown_table(
        ["way", "rows added/s", "learner steps/s", "(a) / this, rows", "(a) / this, steps"],
        rows, "lrrrr")


def summary(results: Dict[str, Dict[str, Any]],
            targets: Optional[Dict[str, float]] = None) -> List[str]:
    """The targets (TARGETS, unless given) against (b), with common.verdict on the ratios."""
    ratio = ratios(results, "replay_actor")
    lines = []
    for key, target in (TARGETS if targets is None else targets).items():
        head = f"target (a) >= {target:g}x (b) in {RATES[key]}"
        if ratio is None:
            lines.append(f"{head}: not measured")
            continue
        r = ratio[key]
        verdict = common.verdict(r["total"] >= target, r["median"] >= target,
                                 "totals and per-second medians")
        lines.append(f"{head}: {verdict} ({r['total']:.1f}x; {r['median']:.1f}x of the "
                     f"per-second medians)")
    return lines


def parse_args(argv=None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, help="timed seconds per way (default 20)")
    parser.add_argument("--actors", type=int, default=2, help="writer actors K (default 2)")
    parser.add_argument("--exponent", type=int, default=20, help="capacity 2**E (default 20)")
    parser.add_argument("--ways", nargs="+", choices=WAYS, default=list(WAYS),
                        help="measure only these")
    parser.add_argument("--quick", action="store_true", help="smoke run: --seconds 3")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--seed", type=int, default=0, help="seed of all random inputs")
    parser.add_argument("--nstep", type=int, default=0, metavar="N",
                        help="N-step staging in every actor (needs a build with Nstep=)")
    parser.add_argument("--rate-limit", type=float, metavar="SPI",
                        help="(a) with a SampleToInsertRatio(SPI, ...) limiter (needs a build "
                             "with it)")
    parser.add_argument("--remote", action="store_true",
                        help="writers on a second Ray node of a two-node cluster this script "
                             "starts on this machine (needs root); ways (a) and (b)")
    args = parser.parse_args(argv)
    if args.remote:
        if "cpprb_mp" in args.ways:
            if argv is not None and "--ways" in argv:
                parser.error("--remote: (c) cpprb_mp cannot cross hosts; leave it out of --ways")
            args.ways = [way for way in args.ways if way != "cpprb_mp"]
        if args.rate_limit is not None:
            parser.error("--remote with --rate-limit: not measured by this script")
    if args.seconds is None:
        args.seconds = 3.0 if args.quick else 20.0
    if args.actors < 1 or args.seconds <= 0 or args.nstep < 0:
        parser.error("--actors and --seconds must be positive, --nstep >= 0")
    if args.nstep == 1:
        parser.error("--nstep 1 is plain 1-step replay; give N >= 2 or leave it out")
    return args


def main(argv=None) -> int:
    """Run every way asked for, print the report, write --json; returns the exit status."""
    args = parse_args(argv)
    features = detect_features(args)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if not args.remote:
        # Before ray is imported (read then): our own single node stays on loopback.
        os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    import ray

    info = common.run_info(args.quick)
    info.update({"ray": ray.__version__, "actors": args.actors, "seconds": args.seconds,
                 "remote": args.remote,
                 "exponent": args.exponent, "add_rows": ADD_ROWS, "batch": BATCH,
                 "in_flight": IN_FLIGHT, "nstep": args.nstep,
                 "limiter": features.get("limiter")})
    print(common.header(info) + f"; ray {ray.__version__}", flush=True)
    # Workers import this file's helpers (_common) and cpprb_ray from this checkout.
    path = os.pathsep.join([common.REPO_ROOT, os.path.dirname(os.path.abspath(__file__))]
                           + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    cluster = None
    if args.remote:
        why_not = _two_nodes.can_unshare()
        if why_not is not None:
            print(f"--remote: {why_not}", file=sys.stderr)
            return 2
        cluster = _two_nodes.TwoNodes(path.split(os.pathsep))
        try:  # stopped (SIGINT: compare.py's timeout) while starting: end the nodes too
            address = cluster.start()
            print(f"two-node cluster at {address} (temp dir {cluster.directory})",
                  file=sys.stderr, flush=True)
            ray.init(address=address, log_to_driver=True, runtime_env={
                "env_vars": {"PYTHONPATH": path, "RAY_USAGE_STATS_ENABLED": "0"}})
            _two_nodes.wait_for_nodes(ray, 2)
        except BaseException:
            ray.shutdown()
            cluster.stop()
            raise
    else:
        # Its own single node stays on loopback (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, set in
        # main() before ray is imported; the two-node cluster above needs it unset).
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=True,
                 _node_ip_address="127.0.0.1",
                 runtime_env={"env_vars": {"PYTHONPATH": path, "RAY_USAGE_STATS_ENABLED": "0"}})
    results: Dict[str, Dict[str, Any]] = {}
    failures: Dict[str, str] = {}
    try:
        classes = make_actor_classes(ray)
        for way in args.ways:
            try:
                results[way] = run_way(way, ray, classes, args, features)
            except Exception as error:
                if way != "cpprb_mp":
                    raise
                # (c) is cpprb's recipe, documented as possibly breaking with new Ray versions.
                failures[way] = f"{type(error).__name__}: {error}"
                print(f"  {LABELS[way]}: did not run with ray {ray.__version__}: "
                      f"{failures[way]}", file=sys.stderr, flush=True)
                continue
            r = results[way]
            print(f"  {LABELS[way]}: {r['rows_added_per_s']:,.0f} rows added/s, "
                  f"{r['learner_steps_per_s']:,.1f} learner steps/s", file=sys.stderr,
                  flush=True)
    finally:
        ray.shutdown()
        if cluster is not None:
            cluster.stop()
    info["load_average_after"] = os.getloadavg()
    settings = f", N-step {args.nstep}" if args.nstep else ""
    if args.remote:
        settings += (", writers on a second Ray node (another mount namespace: remote handles "
                     "for (a)), learner and (b)'s replay actor on the head")
    if args.rate_limit is not None:
        settings += (f", (a) rate-limited to {args.rate_limit:g} samples per insert ((b) and "
                     f"(c) unlimited)")
    print(f"{args.actors} actors adding batches of {ADD_ROWS} with priorities, 1 learner "
          f"sample({BATCH}) + update, capacity 2^{args.exponent}, {args.seconds:g} s per way"
          f"{settings}; ratio = (a) / that way (of the totals; in brackets, of the medians of "
          f"the per-second rates)")
    print(table(results))
    for way, why in failures.items():
        print(f"{LABELS[way]}: not run: {why}")
    lines = summary(results, REMOTE_TARGETS if args.remote else None)
    for line in lines:
        print(line)
    print(f"load average after: {' '.join(f'{x:.2f}' for x in info['load_average_after'])}")
    common.write_json(args.json, {"info": info, "results": results, "failures": failures,
                                  "summary": lines})
    return 0


if __name__ == "__main__":
    sys.exit(main())
