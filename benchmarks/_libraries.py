"""The libraries bench_buffer.py's headline compares, behind one small interface each.

Every library gets the same transition (benchmarks/_common.ENV_DICT: obs float32[4], act int64,
rew float32, next_obs float32[4], done float32), alpha 0.6, beta 0.4, the same capacity, and is
filled to capacity with random priorities before anything is timed. An adapter turns the inputs
of bench_buffer.py (numpy rows, float32 priorities) into the library's own input types ONCE,
before timing, and hands out closures that make one call each: ``call()`` runs one operation on
the next input of its pool, the way a program using that library would write it.

What "the same work" means where the APIs differ:

- cpprb_ray and cpprb have the same API (cpprb_ray copies it): the calls are identical.
- tianshou 2.0.1 (`tianshou.data.PrioritizedReplayBuffer(size, alpha, beta)`): one row is a
  `Batch` with its reserved keys (obs, act, rew, terminated, truncated, obs_next; done is
  derived), so its `done` float32 column becomes bool `terminated` (+ `truncated` False) and
  `next_obs` is called `obs_next`. Its `add` stores one transition per call (a batch with
  `buffer_ids` is one row per sub-buffer of a vector buffer), so add(64) is 64 adds, as a
  tianshou collector makes them. Priorities are given by one `update_weight(indices,
  priorities)` after the adds, its only way; `sample(256)` returns ``(batch, indices)`` with
  `batch.weight`. It stores `rew` as float64 (its first add casts it) and keeps no
  stratification (one uniform draw per row).
- TorchRL 0.14.1 (`torchrl.data.PrioritizedReplayBuffer(alpha=, beta=, storage=
  LazyTensorStorage(size))`): rows are TensorDicts of torch tensors with our exact column
  names and dtypes; `add` one row, `extend` a batch (both return the indexes written), a
  priority by `update_priority(index, priority)` after it; `sample(256, return_info=True)`
  returns the rows and ``info`` with "index" and "priority_weight".

Inputs handed to a peer are prebuilt in its own types (a `Batch`, a TensorDict, torch tensors),
so a peer's times leave out the cost of building them: its ratios flatter it, never us.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

if __package__:
    from . import _common as common
else:  # imported by a script run from this folder
    import _common as common

BATCH = 256
POOL = 1024  # inputs per pool, a power of two: call k takes pool[k & (POOL - 1)]
MASK = POOL - 1
FILL_CHUNK = 1 << 16

#: The peers, in column order: (key, module to import, version the tables were made with).
PEERS = (("tianshou", "tianshou", "2.0.1"), ("torchrl", "torchrl", "0.14.1"))

Call = Callable[[], Any]
Row = Dict[str, Any]  # one transition as add(**row) takes it


def cycling(pool: List[Any]) -> Callable[[], Any]:
    """A function returning pool[0], pool[1], ... pool[POOL - 1], pool[0], ..."""
    state = [0]

    def next_item():
        k = state[0]
        state[0] = k + 1
        return pool[k & MASK]
    return next_item


class CpprbApi:
    """cpprb's PrioritizedReplayBuffer API, which cpprb_ray's copies: ours and cpprb's.

    `label` is the report's name for it; `out_supported` says whether its sample() takes
    ``out=`` (a dict of preallocated arrays to fill), found from its signature.
    """

    def __init__(self, label: str, buffer: Any, capacity: int, rng: np.random.Generator):
        self.label = label
        self.buffer = buffer
        common.fill(buffer, capacity, rng)
        try:
            parameters = inspect.signature(buffer.sample).parameters
        except (TypeError, ValueError):  # a compiled method without a signature
            parameters = {}
        self.out_supported = "out" in parameters

    def close(self) -> None:
        """Free the buffer (cpprb_ray's segment; cpprb's memory goes with the object)."""
        close = getattr(self.buffer, "close", None)
        if close is not None:
            close()
        self.buffer = None

    def sample(self, batch: int = BATCH) -> Call:
        """One ``sample(batch, beta)``."""
        sample = self.buffer.sample
        beta = common.BETA
        return lambda: sample(batch, beta)

    def sample_out(self) -> Call:
        """One ``sample(256, beta, out=arrays)``, refilling the same arrays every call."""
        if not self.out_supported:
            raise TypeError(f"{self.label}'s sample() takes no out=")
        sample = self.buffer.sample
        beta = common.BETA
        out = sample(BATCH, beta)  # arrays of every key, shape and dtype the sample returns
        return lambda: sample(BATCH, beta, out=out)

    def learner_step(self, priorities: List[np.ndarray], batch: int = BATCH) -> Call:
        """One sample(batch), then update_priorities of its indexes with fresh priorities
        (`priorities`: arrays of `batch` entries)."""
        sample, update = self.buffer.sample, self.buffer.update_priorities
        beta = common.BETA
        next_priorities = cycling(priorities)
        return lambda: update(sample(batch, beta)["indexes"], next_priorities())

    def update(self, priorities: List[np.ndarray], samples: int, batch: int = BATCH) -> Call:
        """One update_priorities(indexes, priorities): indexes of earlier samples, cycled."""
        indexes = [self.buffer.sample(batch, common.BETA)["indexes"] for _ in range(samples)]
        update = self.buffer.update_priorities
        next_indexes, next_priorities = cycling(_spread(indexes)), cycling(priorities)
        return lambda: update(next_indexes(), next_priorities())

    def add(self, rows: List[Row], priorities: Optional[List[Any]] = None) -> Call:
        """One add(**row), or add(priorities=p, **row): rows as given (any input types)."""
        add = self.buffer.add
        next_row = cycling(rows)
        if priorities is None:
            return lambda: add(**next_row())
        next_priorities = cycling(priorities)
        return lambda: add(priorities=next_priorities(), **next_row())


def _spread(items: List[Any]) -> List[Any]:
    """`items` repeated to POOL entries, so that cycling() can take them."""
    return [items[k % len(items)] for k in range(POOL)]


def make_ours(cpprb_ray: Any, capacity: int, seed: int) -> CpprbApi:
    """cpprb_ray's PrioritizedReplayBuffer, filled."""
    buffer = cpprb_ray.PrioritizedReplayBuffer(
        capacity, common.env_dict(), alpha=common.ALPHA, eps=common.EPS, seed=seed)
    try:
        return CpprbApi("ours", buffer, capacity, np.random.default_rng(seed))
    except BaseException:
        buffer.close()
        raise


def make_cpprb(cpprb: Any, capacity: int, seed: int) -> CpprbApi:
    """cpprb's PrioritizedReplayBuffer, filled with the same rows as ours."""
    buffer = cpprb.PrioritizedReplayBuffer(
        capacity, common.env_dict(), alpha=common.ALPHA, eps=common.EPS)
    return CpprbApi("cpprb", buffer, capacity, np.random.default_rng(seed))


# ---------------------------------------------------------------------------------------------
# tianshou


class TianshouApi:
    """tianshou's PrioritizedReplayBuffer (see the module docstring for the mapping)."""

    label = "tianshou"
    _sources: Dict[Tuple[int, int], Any] = {}

    def __init__(self, tianshou: Any, capacity: int, seed: int):
        from tianshou.data import Batch, PrioritizedReplayBuffer, ReplayBuffer

        self.Batch = Batch
        self.buffer = PrioritizedReplayBuffer(capacity, alpha=common.ALPHA, beta=common.BETA)
        rng = np.random.default_rng(seed)
        # Filling 2**20 rows by single adds would take a minute; tianshou's own bulk path is
        # update(other_buffer), which copies another buffer's rows and gives them the initial
        # weight. Like common.fill, one chunk of rows is reused; the priorities are fresh.
        chunk = min(FILL_CHUNK, capacity)
        rows = common.random_rows(rng, chunk)
        # The source rows depend only on (chunk, seed): made once per process (65,536 single
        # adds take seconds), for buffers of several capacities.
        source = self._sources.get((chunk, seed))
        if source is None:
            source = ReplayBuffer(chunk)
            for index in range(chunk):
                source.add(self._row(rows, index))
            self._sources[(chunk, seed)] = source
        while len(self.buffer) < capacity:
            self.buffer.update(source)
        assert len(self.buffer) == capacity, "tianshou's buffer did not fill"
        everything = np.arange(capacity)
        self.buffer.update_weight(everything, common.random_priorities(rng, capacity))

    def _row(self, rows: Dict[str, np.ndarray], index: int) -> Any:
        """Row `index` of numpy `rows` as tianshou's one-transition Batch."""
        return self.Batch(
            obs=rows["obs"][index], act=int(rows["act"][index]), rew=float(rows["rew"][index]),
            terminated=bool(rows["done"][index]), truncated=False,
            obs_next=rows["next_obs"][index])

    def close(self) -> None:
        """Drop the buffer."""
        self.buffer = None

    def sample(self, batch: int = BATCH) -> Call:
        """One ``sample(batch)`` (beta was set at construction)."""
        sample = self.buffer.sample
        return lambda: sample(batch)

    def learner_step(self, priorities: List[np.ndarray], batch: int = BATCH) -> Call:
        """One sample(batch), then update_weight of its indices with fresh priorities."""
        sample, update = self.buffer.sample, self.buffer.update_weight
        next_priorities = cycling(priorities)
        return lambda: update(sample(batch)[1], next_priorities())

    def update(self, priorities: List[np.ndarray], samples: int, batch: int = BATCH) -> Call:
        """One update_weight(indices, priorities): indices of earlier samples, cycled."""
        indexes = [self.buffer.sample(batch)[1] for _ in range(samples)]
        update = self.buffer.update_weight
        next_indexes, next_priorities = cycling(_spread(indexes)), cycling(priorities)
        return lambda: update(next_indexes(), next_priorities())

    def batches(self, rows: List[Dict[str, np.ndarray]]) -> List[List[Any]]:
        """Each batch of numpy rows as its list of one-transition Batches."""
        return [[self._row(batch, k) for k in range(len(batch["rew"]))] for batch in rows]

    def add(self, batches: List[List[Any]], priorities: Optional[List[np.ndarray]] = None
            ) -> Call:
        """One batch of single adds, then one update_weight of the slots they wrote if
        priorities are given (one call for the batch: the cheapest way tianshou offers)."""
        add, update = self.buffer.add, self.buffer.update_weight
        next_batch = cycling(batches)
        if priorities is None:
            def call():
                for transition in next_batch():
                    add(transition)
            return call
        next_priorities = cycling(priorities)
        concatenate = np.concatenate

        def call_with_priorities():
            written = [add(transition)[0] for transition in next_batch()]
            update(concatenate(written), next_priorities())
        return call_with_priorities


# ---------------------------------------------------------------------------------------------
# TorchRL


class TorchRLApi:
    """TorchRL's PrioritizedReplayBuffer on a LazyTensorStorage (see the module docstring)."""

    label = "TorchRL"

    def __init__(self, torchrl: Any, capacity: int, seed: int):
        import torch
        from tensordict import TensorDict
        from torchrl.data import LazyTensorStorage, PrioritizedReplayBuffer

        self.torch, self.TensorDict = torch, TensorDict
        torch.manual_seed(seed)
        self.buffer = PrioritizedReplayBuffer(
            alpha=common.ALPHA, beta=common.BETA, eps=common.EPS,
            storage=LazyTensorStorage(capacity))
        rng = np.random.default_rng(seed)
        rows = self.tensordict(common.random_rows(rng, min(FILL_CHUNK, capacity)))
        for start in range(0, capacity, FILL_CHUNK):
            count = min(FILL_CHUNK, capacity - start)
            written = self.buffer.extend(rows[:count])
            self.buffer.update_priority(
                written, torch.from_numpy(common.random_priorities(rng, count)))
        assert len(self.buffer) == capacity, "TorchRL's buffer did not fill"

    def tensordict(self, rows: Dict[str, np.ndarray]) -> Any:
        """numpy rows (batch axis first) as a TensorDict of that batch size."""
        tensors = {key: self.torch.from_numpy(np.ascontiguousarray(value))
                   for key, value in rows.items()}
        return self.TensorDict(tensors, batch_size=[len(rows["rew"])])

    def single(self, rows: Dict[str, np.ndarray], index: int) -> Any:
        """Row `index` of numpy `rows` as a TensorDict with no batch dimension."""
        return self.TensorDict(
            {key: self.torch.from_numpy(np.ascontiguousarray(value[index]))
             for key, value in rows.items()}, batch_size=[])

    def tensors(self, arrays: List[np.ndarray]) -> List[Any]:
        """numpy arrays as torch tensors (sharing memory)."""
        return [self.torch.from_numpy(array) for array in arrays]

    def close(self) -> None:
        """Drop the buffer."""
        self.buffer = None

    def sample(self, batch: int = BATCH) -> Call:
        """One ``sample(batch, return_info=True)`` (beta was set at construction)."""
        sample = self.buffer.sample
        return lambda: sample(batch, return_info=True)

    def learner_step(self, priorities: List[Any], batch: int = BATCH) -> Call:
        """One sample(batch), then update_priority of its indexes with fresh priorities."""
        sample, update = self.buffer.sample, self.buffer.update_priority
        next_priorities = cycling(priorities)
        return lambda: update(sample(batch, return_info=True)[1]["index"], next_priorities())

    def update(self, priorities: List[Any], samples: int, batch: int = BATCH) -> Call:
        """One update_priority(index, priorities): indexes of earlier samples, cycled."""
        indexes = [self.buffer.sample(batch, return_info=True)[1]["index"]
                   for _ in range(samples)]
        update = self.buffer.update_priority
        next_indexes, next_priorities = cycling(_spread(indexes)), cycling(priorities)
        return lambda: update(next_indexes(), next_priorities())

    def add(self, items: List[Any], priorities: Optional[List[Any]] = None,
            batched: bool = False) -> Call:
        """One add(row) or extend(rows), then update_priority of what it wrote if given."""
        write = self.buffer.extend if batched else self.buffer.add
        update = self.buffer.update_priority
        next_item = cycling(items)
        if priorities is None:
            return lambda: write(next_item())
        next_priorities = cycling(priorities)
        return lambda: update(write(next_item()), next_priorities())


# ---------------------------------------------------------------------------------------------


def import_peers(wanted: Optional[List[str]] = None) -> Tuple[Dict[str, Any], Dict[str, str]]:
    """({key: module} of the peers importable here, {key: why not} of the others).

    `wanted`: only these peers (None: every peer); the others are skipped as not asked for.
    """
    found: Dict[str, Any] = {}
    skipped: Dict[str, str] = {}
    for key, module_name, _ in PEERS:
        if wanted is not None and key not in wanted:
            skipped[key] = "not asked for (--peers)"
            continue
        try:
            found[key] = importlib.import_module(module_name)
        except Exception as error:  # ImportError, or a broken install raising anything
            skipped[key] = (f"not importable in this interpreter ({type(error).__name__}: "
                            f"{error}); `make bench-peers`, then run this script with "
                            f".venv-{key}/bin/python")
    return found, skipped


def version_notes(found: Dict[str, Any]) -> List[str]:
    """A line for each peer found whose version is not the one the tables were made with."""
    wanted = {key: version for key, _, version in PEERS}
    notes = []
    for key, module in found.items():
        version = getattr(module, "__version__", "unknown")
        if version != wanted[key]:
            notes.append(f"{key} is {version}, not {wanted[key]}: measured all the same")
    return notes


def make_peer(key: str, module: Any, capacity: int, seed: int) -> Any:
    """The adapter of peer `key`, its buffer filled."""
    if key == "tianshou":
        return TianshouApi(module, capacity, seed)
    if key == "torchrl":
        return TorchRLApi(module, capacity, seed)
    raise ValueError(f"unknown peer {key!r}")


def make_cpprb_mp(cpprb: Any, capacity: int, seed: int) -> CpprbApi:
    """cpprb's MPPrioritizedReplayBuffer (its default context and backend), used from this one
    process, filled with the same rows as ours: what its locks cost a caller on their own."""
    buffer = cpprb.MPPrioritizedReplayBuffer(
        capacity, common.env_dict(), alpha=common.ALPHA, eps=common.EPS)
    return CpprbApi("cpprb MP", buffer, capacity, np.random.default_rng(seed))
