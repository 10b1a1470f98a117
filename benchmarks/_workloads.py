"""The microbenchmark workloads of compare.py and of the asv suite, defined once.

A case is one operation at one capacity, batch size and warmth:

- operations: ``sample`` (a batch), ``update`` (a batch of priorities, indexes of earlier
  samples), ``add(1)``, ``add(64)`` (plain adds into the full buffer, overwriting the oldest
  rows), ``add(1) with a priority`` and ``add(64) with priorities`` (an actor's add with its
  own TD errors: a Python float, a float32 array), ``add(1) x1024 streamed`` (1024 adds with
  a priority, one call; Reverb's writer does not wait between them, only at the end: Reverb's
  group only) and ``learner step`` (a sample, then an update of its indexes with fresh
  priorities);
- capacities 2^10 to 2^22 (every second power), each buffer filled to capacity with random
  priorities before anything is timed (benchmarks/_common.fill and the adapters);
- batches 32, 256 and 4096 (sample, update and learner step; adds do not take one);
- warm (calls of the libraries interleaved one by one, nothing else between them) or cold (a
  64 MiB memory sweep, untimed, before every call, as a learner's network step leaves the
  cache).

The libraries (benchmarks/_libraries.py and _tree_libraries.py say how each API is driven):
buffers (cpprb_ray, cpprb's PrioritizedReplayBuffer and MPPrioritizedReplayBuffer, tianshou's
PrioritizedReplayBuffer, TorchRL's PrioritizedReplayBuffer on a LazyTensorStorage, Reverb's
prioritized table with its server in the process and in a process of its own:
benchmarks/_reverb.py) and segment trees (cpprb_ray's, RLlib's, TorchRL's C++ one). A tree's
reference is cpprb_ray's tree, a buffer's is cpprb_ray's buffer. GROUPS says which libraries
share a process: a peer's group holds its reference too, so that its ratio is measured in the
same process and rounds.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence

import numpy as np

if __package__:
    from . import _common as common
    from . import _headline as headline
    from . import _libraries as libraries
    from . import _reverb as reverb_lib
    from . import _tree_libraries as trees
else:  # imported by a script run from this folder
    import _common as common
    import _headline as headline
    import _libraries as libraries
    import _reverb as reverb_lib
    import _tree_libraries as trees

OPERATIONS = ("sample", "update", "add(1)", "add(1) with a priority", "add(64)",
              "add(64) with priorities", "add(1) x1024 streamed", "learner step")
STREAMED = 1024  # adds per call of "add(1) x1024 streamed"
BATCHED = ("sample", "update", "learner step")
EXPONENTS = (10, 12, 14, 16, 18, 20, 22)
BATCHES = (32, 256, 4096)
WARMTHS = ("warm", "cold")
UPDATE_SAMPLES = 64  # distinct earlier samples whose indexes an update cycles through

QUICK_EXPONENTS = (10, 16, 20)
QUICK_BATCHES = (256,)


class Library(NamedTuple):
    """A measured library: its report label, "buffer" or "tree", and its reference's key."""

    label: str
    kind: str
    reference: Optional[str]


LIBRARIES: Dict[str, Library] = {
    "cpprb_ray": Library("cpprb_ray", "buffer", None),
    "cpprb": Library("cpprb", "buffer", "cpprb_ray"),
    "cpprb_mp": Library("cpprb MP", "buffer", "cpprb_ray"),
    "tianshou": Library("tianshou", "buffer", "cpprb_ray"),
    "torchrl": Library("TorchRL", "buffer", "cpprb_ray"),
    "reverb": Library("Reverb, server in process", "buffer", "cpprb_ray"),
    "reverb_grpc": Library("Reverb, gRPC server process", "buffer", "cpprb_ray"),
    "cpprb_ray_tree": Library("cpprb_ray tree", "tree", None),
    "rllib_tree": Library("RLlib tree", "tree", "cpprb_ray_tree"),
    "torchrl_tree": Library("TorchRL C++ tree", "tree", "cpprb_ray_tree"),
}

#: Process groups: name -> libraries measured together in one process (references first).
#: cpprb_ray's own figures are those of the "cpprb" and "rllib" groups.
GROUPS: Dict[str, Sequence[str]] = {
    "cpprb": ("cpprb_ray", "cpprb", "cpprb_mp"),
    "rllib": ("cpprb_ray_tree", "rllib_tree"),
    "tianshou": ("cpprb_ray", "tianshou"),
    "torchrl": ("cpprb_ray", "cpprb_ray_tree", "torchrl", "torchrl_tree"),
    "reverb": ("cpprb_ray", "reverb", "reverb_grpc"),
}

#: What each peer group needs and how to get it (a skipped group's reason says it).
GET_GROUP = {
    "tianshou": "`make bench-peers` makes .venv-tianshou (tianshou 2.0.1 on CPU torch 2.13.0)",
    "torchrl": "`make bench-peers` makes .venv-torchrl (TorchRL 0.14.1 on torch 2.14.1)",
    "reverb": "`make bench-peers` makes .venv-reverb (dm-reverb 0.14.0, tensorflow-cpu 2.15.0)",
    "cpprb": "`pip install cpprb` (`make venv` installs it in .venv)",
    "rllib": "`pip install ray` (`make venv` installs it in .venv)",
}

#: Libraries whose buffer is filled through a slow path: the largest capacity filled, per
#: plan kind, and why (Reverb makes one item per row through Python: 2^20 rows take about two
#: minutes on a quiet 2-core machine, each placement).
FILL_LIMITS = {"reverb": {"quick": 16, "full": 20}, "reverb_grpc": {"quick": 16, "full": 20}}

#: The process whose cpprb_ray figures the report shows (measured even with no peer there).
HOME_GROUP = {"cpprb_ray": "cpprb", "cpprb_ray_tree": "rllib"}


class Case(NamedTuple):
    """One measurement: an operation at 2**exponent rows, a batch (0: none) and a warmth."""

    operation: str
    exponent: int
    batch: int
    warmth: str

    @property
    def label(self) -> str:
        """The operation as the tables name it, e.g. ``sample(256)``, ``add(64)``.

        >>> Case("learner step", 10, 32, "cold").label, Case("add(1)", 10, 0, "warm").label
        ('learner step(32)', 'add(1)')
        """
        return f"{self.operation}({self.batch})" if self.batch else self.operation


def grid(exponents: Sequence[int] = EXPONENTS, batches: Sequence[int] = BATCHES,
         warmths: Sequence[str] = WARMTHS, operations: Sequence[str] = OPERATIONS,
         cold_operations: Optional[Sequence[str]] = None) -> List[Case]:
    """Every case of these axes, capacity first (one fill per capacity and process).

    `cold_operations`: the operations measured cold too (default: every one).

    >>> [case.label for case in grid((10,), (32, 256), ("warm",), ("sample", "add(1)"))]
    ['sample(32)', 'sample(256)', 'add(1)']
    """
    cases = []
    for exponent in exponents:
        for warmth in warmths:
            for operation in operations:
                if warmth == "cold" and cold_operations is not None and (
                        operation not in cold_operations):
                    continue
                for batch in (batches if operation in BATCHED else (0,)):
                    cases.append(Case(operation, exponent, batch, warmth))
    return cases


def full_grid() -> List[Case]:
    """The full run: every operation, capacity, batch and warmth."""
    return grid()


def quick_grid() -> List[Case]:
    """--quick: 2^10, 2^16, 2^20, batch 256, every operation warm and the learner step
    cold."""
    return grid(QUICK_EXPONENTS, QUICK_BATCHES, WARMTHS, OPERATIONS, ("learner step",))


# ---------------------------------------------------------------------------------------------
# Libraries


def import_library(key: str, cpprb_ray: Any = None) -> Any:
    """The module adapter `key` is built from; raises what the import raises.

    `cpprb_ray`: the cpprb_ray package to measure (default: common.import_cpprb_ray(), which
    prefers a build in place in this checkout).
    """
    if key in ("cpprb_ray", "cpprb_ray_tree"):
        package = cpprb_ray if cpprb_ray is not None else common.import_cpprb_ray()
        return package if key == "cpprb_ray" else importlib.import_module(
            package.__name__ + "._segtree")
    if key in ("cpprb", "cpprb_mp"):
        return importlib.import_module("cpprb")
    if key in ("tianshou", "torchrl"):
        return importlib.import_module(key)
    if key in ("reverb", "reverb_grpc"):
        return reverb_lib.import_reverb()
    if key == "rllib_tree":
        return trees.load_rllib()
    if key == "torchrl_tree":
        return importlib.import_module("torchrl._torchrl")
    raise ValueError(f"unknown library {key!r}; expected one of {sorted(LIBRARIES)}")


def make(key: str, module: Any, capacity: int, seed: int) -> Any:
    """Library `key`'s adapter at `capacity`, filled; ``close()`` frees it."""
    if key == "cpprb_ray":
        return libraries.make_ours(module, capacity, seed)
    if key == "cpprb":
        return libraries.make_cpprb(module, capacity, seed)
    if key == "cpprb_mp":
        return libraries.make_cpprb_mp(module, capacity, seed)
    if key in ("tianshou", "torchrl"):
        return libraries.make_peer(key, module, capacity, seed)
    if key in ("reverb", "reverb_grpc"):
        return reverb_lib.ReverbApi(module, capacity, seed,
                                    "inprocess" if key == "reverb" else "grpc")
    if key == "cpprb_ray_tree":
        return trees.OursTree(module, capacity, seed)
    if key == "rllib_tree":
        return trees.RLlibTree(module, capacity, seed)
    if key == "torchrl_tree":
        return trees.TorchRLTree(module, capacity, seed)
    raise ValueError(f"unknown library {key!r}; expected one of {sorted(LIBRARIES)}")


def supports(key: str, case: Case) -> bool:
    """Whether library `key` has `case`'s operation: trees have no add, Reverb has no add
    without a priority, and only Reverb's group streams adds (the reference measures whatever
    a peer of its process has).

    >>> supports("rllib_tree", Case("add(1)", 10, 0, "warm")), supports("cpprb", Case(
    ...     "add(1)", 10, 0, "warm")), supports("reverb", Case("add(1)", 10, 0, "warm"))
    (False, True, False)
    """
    operation = case.operation
    if LIBRARIES[key].kind == "tree":
        return operation in BATCHED
    if key in ("reverb", "reverb_grpc"):
        return operation not in ("add(1)", "add(64)")
    if operation == "add(1) x1024 streamed":
        return key == "cpprb_ray"
    return True


class Inputs:
    """Pools of inputs drawn before timing, in each adapter's own types, made once each."""

    def __init__(self, seed: int):
        self.seed = seed
        self.rows = headline.Inputs(seed)  # single rows and batches of 64, in numpy form
        self._priorities: Dict[int, List[np.ndarray]] = {}
        self._own: Dict[Any, Any] = {}

    def priorities(self, batch: int) -> List[np.ndarray]:
        """libraries.POOL float32 arrays of `batch` fresh priorities."""
        if batch not in self._priorities:
            rng = np.random.default_rng(self.seed + batch)
            self._priorities[batch] = [common.random_priorities(rng, batch)
                                       for _ in range(libraries.POOL)]
        return self._priorities[batch]

    def own_priorities(self, key: str, adapter: Any, batch: int) -> List[Any]:
        """priorities(batch) as library `key` takes them (tensors, lists or arrays)."""
        cache_key = (key, batch)
        if cache_key not in self._own:
            arrays = self.priorities(batch)
            if key == "torchrl":
                self._own[cache_key] = adapter.tensors(arrays)
            elif key == "rllib_tree":
                self._own[cache_key] = [array.tolist() for array in arrays]
            else:
                self._own[cache_key] = arrays
        return self._own[cache_key]

    def adds(self, key: str, adapter: Any, rows: int, with_priorities: bool = False
             ) -> Callable[[], Any]:
        """One add of `rows` rows (1 or 64) to `adapter`, with their priorities or not, in its
        library's own input types.

        A peer's converted rows (65,536 tianshou Batches, TensorDicts) do not depend on its
        buffer, so they are made once and kept for every capacity.
        """
        inputs = self.rows
        if rows == 1:
            pool, priorities = inputs.singles, inputs.single_priorities
        else:
            pool, priorities = inputs.batches, inputs.batch_priorities
        if key in ("tianshou", "torchrl"):
            bench = self._own.get(("bench", key))
            if bench is None:
                bench = headline.Bench(None, None, {key: adapter}, inputs)
                self._own[("bench", key)] = bench
            bench.peers[key] = adapter
            return bench.peer_add(key, rows, with_priorities)
        if key in ("reverb", "reverb_grpc"):
            steps = self._own.get(("steps", rows))
            if steps is None:  # Reverb's writer takes one step (a dict of arrays) at a time
                steps = ([[step] for step in reverb_lib.steps(inputs.single_rows)] if rows == 1
                         else [reverb_lib.steps(batch) for batch in inputs.batches])
                self._own[("steps", rows)] = steps
            return adapter.add(steps, [[p] for p in priorities] if rows == 1 else priorities)
        return adapter.add(pool, priorities if with_priorities else None)

    def streamed(self, key: str, adapter: Any) -> Callable[[], Any]:
        """STREAMED single adds with a priority each, as one call."""
        inputs = self.rows
        if key in ("reverb", "reverb_grpc"):
            steps = reverb_lib.steps(inputs.single_rows)
            return adapter.streamed(steps, inputs.single_priorities, STREAMED)
        add = adapter.add(inputs.singles, inputs.single_priorities)

        def call():
            for _ in range(STREAMED):
                add()
        return call


def call(key: str, adapter: Any, case: Case, inputs: Inputs) -> Callable[[], Any]:
    """A closure making ONE call of `case`'s operation on `adapter` (library `key`)."""
    operation, batch = case.operation, case.batch
    if operation == "sample":
        return adapter.sample(batch)
    if operation == "update":
        return adapter.update(inputs.own_priorities(key, adapter, batch), UPDATE_SAMPLES, batch)
    if operation == "learner step":
        return adapter.learner_step(inputs.own_priorities(key, adapter, batch), batch)
    if operation == "add(1) x1024 streamed":
        return inputs.streamed(key, adapter)
    if operation.startswith("add("):
        return inputs.adds(key, adapter, 1 if operation.startswith("add(1)") else 64,
                           "priorit" in operation)
    raise ValueError(f"unknown operation {operation!r}; expected one of {OPERATIONS}")


def sweeper() -> Callable[[], None]:
    """The cold cases' cache sweep: write 64 MiB (headline.SWEEP_BYTES), as the headline does."""
    sweep_array = np.ones(headline.SWEEP_BYTES // 8, np.int64)

    def sweep() -> None:
        np.add(sweep_array, 1, out=sweep_array)
    return sweep
