"""DeepMind Reverb as a peer: its table, its server in two placements, and the calls a program
makes, the way Reverb's documentation and Acme use them.

Reverb (dm-reverb 0.14.0, TensorFlow 2.15, Python 3.11: ``make bench-peers`` builds
``.venv-reverb``) keeps its items in a table served over gRPC. Every call here is Reverb's own
recommended path:

- the table: ``reverb.Table(sampler=reverb.selectors.Prioritized(0.6), remover=
  reverb.selectors.Fifo(), max_size=capacity, rate_limiter=reverb.rate_limiters.MinSize(1),
  signature=...)``: prioritized sampling with priority exponent alpha = 0.6, the oldest item
  removed when the table is full (a ring, as every other buffer here), a signature of the
  transition's columns (what ``TrajectoryDataset.from_table_signature`` reads);
- an add (one transition and its priority, as an Acme adder writes each environment step):
  ``writer.append(step)`` hands the step's columns to the trajectory writer, which chunks
  them; ``writer.create_item(table, priority, trajectory)`` makes an item of one step
  (``writer.history[column][-1:]``: a trajectory of length 1) with its priority;
  ``writer.flush()`` blocks until the server has confirmed every item, so that when the call
  returns the rows can be sampled, as with every other library here (an Acme actor does not
  wait: ``add(1) x1024 streamed`` times that way, one flush per 1024 adds);
- a sample of 256 with importance weights: the next batch of a
  ``reverb.TrajectoryDataset.from_table_signature(address, table,
  max_in_flight_samples_per_worker=2 * 256).batch(256, drop_remainder=True).prefetch(4)``
  iterated as numpy (Acme's ``make_reverb_dataset`` with its DQN defaults, without its 12
  interleaved datasets, which a 2-core machine cannot feed), then the weights from the
  sample's ``info.probability`` and ``info.table_size``: ``(table_size * probability) **
  -beta`` over their maximum (Acme's ``(1 / probability) ** beta`` over its maximum: the same
  numbers). The dataset's worker threads keep up to 512 samples in flight and the prefetch 4
  batches ahead: that work runs in the background, between and during other calls;
- an update of 256 priorities: ``client.mutate_priorities(table, dict(zip(keys,
  priorities)))``, as Acme's learner does (Acme runs it on a thread of its own; here the call
  returns when the server has applied it).

Placements: ``inprocess``: the server in the benchmark's process, reached through
``server.localhost_client()``; the dataset's sampler, finding the table in its own process,
reads it directly without gRPC (Reverb's ``Client::NewSampler``), while the trajectory writer
and ``mutate_priorities`` still send their protos over the loopback (0.14.0 has no in-process
channel for them: ``Server.in_process_client`` came after it): Reverb's fastest
arrangement. ``grpc``: the server in a process of its own (``python benchmarks/_reverb.py
serve``), every call a gRPC client on the loopback, as Acme runs a learner, its actors and the
replay server.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any, Callable, Dict, List, Optional

import numpy as np

if __package__:
    from . import _common as common
else:  # imported by a script run from this folder
    import _common as common

TABLE = "replay"
BATCH = 256
POOL = 1024
MASK = POOL - 1
FILL_FLUSH = 4096  # a fill waits for the server's confirmations every this many items
PLACEMENTS = ("inprocess", "grpc")
VERSION = "0.14.0"


def import_reverb() -> Any:
    """The reverb module (imports TensorFlow); raises ImportError with how to get it."""
    try:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        import reverb  # noqa: F401
    except ImportError as error:
        raise ImportError(
            f"{error}: Reverb runs from .venv-reverb (`make bench-peers` makes it: Python 3.11 "
            f"with dm-reverb=={VERSION}, tensorflow-cpu==2.15.0, numpy<2)") from error
    return reverb


def signature() -> Dict[str, Any]:
    """The table's signature: one step of benchmarks/_common.ENV_DICT, with a time axis of 1
    (a one-step trajectory, as the fill's writer and the trajectory writer's slice
    ``history[column][-1:]`` both make it)."""
    import tensorflow as tf

    out = {}
    for key, spec in common.ENV_DICT.items():
        shape = spec.get("shape", ())
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        out[key] = tf.TensorSpec((1,) + shape, tf.as_dtype(spec["dtype"]))
    return out


def make_table(reverb: Any, capacity: int) -> Any:
    """A prioritized FIFO table of `capacity` items (see the module docstring)."""
    return reverb.Table(
        name=TABLE, sampler=reverb.selectors.Prioritized(priority_exponent=common.ALPHA),
        remover=reverb.selectors.Fifo(), max_size=capacity,
        rate_limiter=reverb.rate_limiters.MinSize(1), signature=signature())


def steps(rows: Dict[str, np.ndarray]) -> List[Dict[str, Any]]:
    """numpy rows (batch axis first) as the steps a writer appends: one dict per row."""
    count = len(rows["rew"])
    return [{key: value[k] for key, value in rows.items()} for k in range(count)]


class Writer:
    """A trajectory writer and the one-step items it makes (the module docstring's add)."""

    def __init__(self, client: Any):
        self.writer = client.trajectory_writer(num_keep_alive_refs=1)
        self.keys = list(common.ENV_DICT)

    def put(self, step: Dict[str, Any], priority: float) -> None:
        """One step appended and its item created (not waited for)."""
        writer = self.writer
        writer.append(step)
        history = writer.history
        writer.create_item(TABLE, float(priority),
                           {key: history[key][-1:] for key in self.keys})

    def add(self, batch: List[Dict[str, Any]], priorities: Any) -> None:
        """Every step of `batch` with its priority, then wait until the server has them."""
        for step, priority in zip(batch, priorities):
            self.put(step, priority)
        self.writer.flush()

    def close(self) -> None:
        """Flush and close the writer."""
        if self.writer is not None:
            self.writer.close()
            self.writer = None


def fill(client: Any, capacity: int, rng: np.random.Generator) -> None:
    """Insert `capacity` items with random priorities, as benchmarks/_common.fill does for the
    other buffers (one chunk of rows reused, fresh priorities).

    The fill goes through Reverb's older ``client.writer(max_sequence_length=1)`` (``append``,
    then ``create_item(table, 1, priority)``), waiting for the server every FILL_FLUSH items:
    it makes the same one-step items as the trajectory writer in a quarter of its Python time
    (216 against 876 µs an item in one loaded measurement here), and a fill is not timed.
    """
    chunk = steps(common.random_rows(rng, min(capacity, 1 << 14)))
    with client.writer(max_sequence_length=1) as writer:
        added = 0
        while added < capacity:
            count = min(FILL_FLUSH, capacity - added)
            priorities = common.random_priorities(rng, count).tolist()
            for k in range(count):
                writer.append(chunk[(added + k) % len(chunk)])
                writer.create_item(TABLE, 1, priorities[k])
            writer.flush()
            added += count


def table_size(client: Any) -> int:
    """Items in the table, as the server reports them."""
    return int(client.server_info()[TABLE].current_size)


# ---------------------------------------------------------------------------------------------
# The server in a process of its own


def serve(capacity: int, seed: int, table: Any = None) -> int:
    """``_reverb.py serve``: a server with the table, filled; prints ``ready PORT`` and serves
    until its standard input closes (the benchmark that started it exits or closes it).
    `table`: another table, served empty (its caller fills it over gRPC)."""
    reverb = import_reverb()
    server = reverb.Server(tables=[make_table(reverb, capacity) if table is None else table])
    if table is None:
        fill(reverb.Client(f"localhost:{server.port}"), capacity, np.random.default_rng(seed))
    print(f"ready {server.port}", flush=True)
    sys.stdin.read()  # until EOF
    server.stop()
    return 0


class ServerProcess:
    """``python benchmarks/_reverb.py serve`` as a child process: ``address`` once filled.
    `command`: another server's command line, which says ``ready PORT`` as serve() does."""

    def __init__(self, capacity: int, seed: int, timeout_s: float = 900.0,
                 command: Optional[List[str]] = None):
        here = os.path.abspath(__file__)
        self.process = subprocess.Popen(
            command or [sys.executable, here, "serve", str(capacity), str(seed)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.process.stdout is not None
        deadline = time.monotonic() + timeout_s
        line = ""
        while time.monotonic() < deadline:
            line = self.process.stdout.readline()
            if not line or line.startswith("ready "):
                break
        if not line.startswith("ready "):
            self.close()
            raise RuntimeError(f"the Reverb server process did not start (it said {line!r})")
        self.address = f"localhost:{int(line.split()[1])}"

    def close(self) -> None:
        """Close its standard input (it stops), then wait; kill it if it does not stop."""
        process = self.process
        if process is None:
            return
        self.process = None
        try:
            if process.stdin is not None:
                process.stdin.close()
            process.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            process.kill()
            process.wait()


# ---------------------------------------------------------------------------------------------
# The adapter compare.py's worker drives (benchmarks/_workloads.py)


def cycling(pool: List[Any]) -> Callable[[], Any]:
    """pool[0], pool[1], ... pool[POOL - 1], pool[0], ..."""
    state = [0]

    def next_item():
        k = state[0]
        state[0] = k + 1
        return pool[k & MASK]
    return next_item


def importance_weights(info: Any, beta: float) -> np.ndarray:
    """A sample's importance weights from its info: (N P(i)) ** -beta over their maximum."""
    weights = (info.table_size * info.probability) ** -beta
    return weights / weights.max()


class ReverbApi:
    """Reverb in one placement, filled to `capacity` (see the module docstring)."""

    def __init__(self, reverb: Any, capacity: int, seed: int, placement: str,
                 table: Any = None, command: Optional[List[str]] = None):
        """`table` (in process) or `command` (grpc: the command line of a server process that
        says ``ready PORT`` as serve() does): a table named TABLE of the caller's, served
        instead of the transitions' and left empty for the caller to fill through ``client``
        (bench_sequences.py's sequence items)."""
        if placement not in PLACEMENTS:
            raise ValueError(f"placement must be one of {PLACEMENTS}; got {placement!r}")
        if (table, command)[placement == "inprocess"] is not None:
            right, wrong = ("table", "command") if placement == "inprocess" else ("command",
                                                                                 "table")
            raise ValueError(f"placement {placement!r} serves a table of the caller's through "
                             f"{right}=, not {wrong}=")
        self.reverb, self.placement = reverb, placement
        self.label = f"Reverb ({placement})"
        self.server: Any = None
        self.child: Optional[ServerProcess] = None
        self._iterators: Dict[int, Any] = {}
        self._writer: Optional[Writer] = None
        if placement == "inprocess":
            served = make_table(reverb, capacity) if table is None else table
            self.server = reverb.Server(tables=[served])
            self.client = self.server.localhost_client()
            self.address = f"localhost:{self.server.port}"
            if table is None:
                fill(self.client, capacity, np.random.default_rng(seed))
        else:
            self.child = ServerProcess(capacity, seed, command=command)
            self.address = self.child.address
            self.client = reverb.Client(self.address)
        if table is None and command is None:
            assert table_size(self.client) == capacity, "Reverb's table did not fill"

    def close(self) -> None:
        """Stop the datasets, the writer and the server."""
        self._iterators.clear()
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        self.client = None
        if self.server is not None:
            self.server.stop()
            self.server = None
        if self.child is not None:
            self.child.close()
            self.child = None

    def writer(self) -> Writer:
        """The one trajectory writer of this adapter's adds."""
        if self._writer is None:
            self._writer = Writer(self.client)
        return self._writer

    def iterator(self, batch: int) -> Any:
        """The numpy iterator of a prefetching dataset of batches of `batch` items."""
        if batch not in self._iterators:
            dataset = self.reverb.TrajectoryDataset.from_table_signature(
                server_address=self.address, table=TABLE,
                max_in_flight_samples_per_worker=2 * batch)
            dataset = dataset.batch(batch, drop_remainder=True).prefetch(4)
            self._iterators[batch] = dataset.as_numpy_iterator()
        return self._iterators[batch]

    def sample(self, batch: int = BATCH) -> Callable[[], Any]:
        """One batch from the dataset, with its importance weights."""
        iterator = self.iterator(batch)
        beta = common.BETA

        def call():
            sample = next(iterator)
            return sample, importance_weights(sample.info, beta)
        return call

    def learner_step(self, priorities: List[np.ndarray], batch: int = BATCH
                     ) -> Callable[[], Any]:
        """One batch with its weights, then mutate_priorities of its keys."""
        iterator = self.iterator(batch)
        mutate = self.client.mutate_priorities
        next_priorities = cycling(priorities)
        beta = common.BETA

        def call():
            sample = next(iterator)
            importance_weights(sample.info, beta)
            mutate(TABLE, dict(zip(sample.info.key, next_priorities())))
        return call

    def update(self, priorities: List[np.ndarray], samples: int, batch: int = BATCH
               ) -> Callable[[], Any]:
        """One mutate_priorities: keys of earlier samples, cycled, fresh priorities."""
        iterator = self.iterator(batch)
        keys = [next(iterator).info.key for _ in range(samples)]
        mutate = self.client.mutate_priorities
        next_keys = cycling([keys[k % len(keys)] for k in range(POOL)])
        next_priorities = cycling(priorities)
        return lambda: mutate(TABLE, dict(zip(next_keys(), next_priorities())))

    def add(self, batches: List[List[Dict[str, Any]]], priorities: List[Any]
            ) -> Callable[[], Any]:
        """One add of a batch of steps (1 or 64) with their priorities, waited for."""
        writer = self.writer()
        next_batch, next_priorities = cycling(batches), cycling(priorities)
        return lambda: writer.add(next_batch(), next_priorities())

    def streamed(self, singles: List[Dict[str, Any]], priorities: List[float], count: int
                 ) -> Callable[[], Any]:
        """`count` single adds that do not wait, then one flush (an actor's pace)."""
        writer = self.writer()
        next_step, next_priority = cycling(singles), cycling(priorities)
        put, flush = writer.put, writer.writer.flush

        def call():
            for _ in range(count):
                put(next_step(), next_priority())
            flush()
        return call


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "serve":
        sys.exit(serve(int(sys.argv[2]), int(sys.argv[3])))
    print("usage: _reverb.py serve CAPACITY SEED", file=sys.stderr)
    sys.exit(2)
