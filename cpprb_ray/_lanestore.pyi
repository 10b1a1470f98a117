"""Type stubs for the lane part of a store (internal; used by cpprb_ray.frames)."""

from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import numpy.typing as npt
from typing_extensions import final

from cpprb_ray._store import ReplayStore

@final
class LaneStore:
    store: ReplayStore
    def __init__(
        self, store: ReplayStore, offset: int, count: int,
        frames: Sequence[Tuple[int, int, int, int, int, int]],
        public: Sequence[Tuple[str, Tuple[int, ...], Any]], rows: int = ...,
    ) -> None: ...
    def lane_owners(self) -> npt.NDArray[np.uint64]: ...
    def lane_next_slots(self) -> npt.NDArray[np.int64]: ...
    def claim_lane(self, pid: int, start: int, token: int, pidns: int, dead: Any) -> int: ...
    def release_lane(self, lane: int, token: int) -> None: ...
    def add_lanes(
        self, lane: int, token: int, count: int, values: List[Any], stacks: List[Any],
        priorities: Any, cache_writes: Any, timeout: Optional[float] = ...,
        incomplete: bool = ..., out_slots: Any = ..., out_generations: Any = ...,
        admit: int = ...,
    ) -> int: ...
    def sample(
        self, batch: int, beta: float, out: Optional[Dict[str, Any]] = ...,
        timeout: Optional[float] = ...,
    ) -> Dict[str, npt.NDArray[Any]]: ...
    def all_rows(self, room: int, with_slots: bool = ...) -> Any: ...
    def complete_lanes(
        self, slots: Any, generations: Any, last_slots: Any, last_generations: Any,
        values: List[Any], priorities: Any = ..., timeout: Optional[float] = ...,
        weights: Any = ...,
    ) -> int: ...
