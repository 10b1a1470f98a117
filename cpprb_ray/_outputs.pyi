"""Type stubs for a sample's output arrays (internal)."""

from typing import Any, Dict, List, Sequence

import numpy.typing as npt
from typing_extensions import final

@final
class SampleOutputs:
    names: tuple[str, ...]
    count: int
    index_at: int
    weights_at: int
    generations_at: int
    def __init__(
        self, names: Sequence[str], shapes: Sequence[Any], dtypes: Sequence[Any], *,
        weights: bool = ...,
    ) -> None: ...
    def fresh(self, batch: int) -> Dict[str, npt.NDArray[Any]]: ...
    def out_arrays(self, out: Any, batch: int) -> List[npt.NDArray[Any]]: ...
