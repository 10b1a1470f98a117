"""Type stubs for the column table (internal; used by cpprb_ray._store)."""

from typing import Any, Sequence, Tuple

import numpy as np
from typing_extensions import final

@final
class ColumnTable:
    count: int
    names: Tuple[str, ...]
    dtypes: Tuple[np.dtype[Any], ...]
    shapes: Tuple[Tuple[int, ...], ...]
    def __init__(self, columns: Sequence[Any]) -> None: ...
