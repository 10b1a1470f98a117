"""Type stubs for checkpoint images of a store (internal; used by cpprb_ray.checkpoint)."""

from typing import Any, Dict, Tuple

import numpy as np
import numpy.typing as npt

from cpprb_ray._store import ReplayStore

def dump(
    store: ReplayStore,
) -> Tuple[Dict[str, Any], npt.NDArray[np.uint8], npt.NDArray[np.uint64],
           npt.NDArray[np.float64]]: ...
def restore(
    store: ReplayStore, rows: Any, tail_generations: Any, leaves: Any, next_index: int,
    max_priority: float, rows_added: int, limiter_inserts: int = ...,
    limiter_samples: int = ...,
) -> None: ...

class StoreImage:
    store: ReplayStore
    def __init__(self, store: ReplayStore) -> None: ...
    def dump(
        self,
    ) -> Tuple[Dict[str, Any], npt.NDArray[np.uint8], npt.NDArray[np.uint64],
               npt.NDArray[np.float64]]: ...
    def restore(self, *arguments: Any) -> None: ...

def dump_lanes(
    store: ReplayStore,
) -> Tuple[Dict[str, Any], npt.NDArray[np.uint8], npt.NDArray[np.float64],
           npt.NDArray[np.uint8]]: ...
def restore_lanes(
    store: ReplayStore, rows: Any, leaves: Any, lanes: Any, next_index: int,
    max_priority: float, rows_added: int, limiter_inserts: int = ...,
    limiter_samples: int = ...,
) -> int: ...

class LaneImage:
    store: ReplayStore
    def __init__(self, store: ReplayStore) -> None: ...
    def dump(
        self,
    ) -> Tuple[Dict[str, Any], npt.NDArray[np.uint8], npt.NDArray[np.float64],
               npt.NDArray[np.uint8]]: ...
    def restore(self, *arguments: Any) -> int: ...
