"""Type stubs for the sequence part of a store (internal; used by cpprb_ray.sequences)."""

from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import numpy.typing as npt
from typing_extensions import final

from cpprb_ray._store import ReplayStore

MAX_LENGTH: int
OPEN_LINK: int

@final
class Stream:
    def __new__(cls, room: int) -> Stream: ...
    def reset(self) -> None: ...
    @property
    def position(self) -> int: ...
    @property
    def open(self) -> int: ...

@final
class SequenceStore:
    lanes: Any
    store: ReplayStore
    length: int
    period: int
    eta: float
    limited: bool
    def __init__(
        self, lanes: Any, length: int, period: int, eta: float,
        public: Sequence[Tuple[str, Tuple[int, ...], Any]],
    ) -> None: ...
    def new_stream(self) -> Stream: ...
    def add(
        self, lane: int, token: int, count: int, values: List[Any], priorities: Any, ends: Any,
        end_after: bool, stream: Stream, timeout: Optional[float] = ...,
    ) -> int: ...
    def sample(
        self, batch: int, beta: float, out: Optional[Dict[str, Any]] = ...,
        timeout: Optional[float] = ...,
    ) -> Dict[str, npt.NDArray[Any]]: ...
    def all_rows(
        self, room: int, with_slots: bool = ...,
    ) -> Union[Dict[str, npt.NDArray[Any]],
               Tuple[Dict[str, npt.NDArray[Any]], npt.NDArray[np.int64]]]: ...
