"""Type stubs for the segment format (internal): offsets, magic, header read and layout."""

from typing import Any, Dict, Optional, Tuple

MAGIC: bytes
HEADER_NBYTES: int
MUTEX_OFFSET: int
LIMITER_OFFSET: int
LAYOUT_OFFSET: int
LAYOUT_VERSION: int
LANE_NBYTES: int
HEADER_FIELDS: Tuple[str, ...]

def tree_nbytes(capacity: int) -> int: ...
def read_header(memory: Any) -> Dict[str, Any]: ...
def initialize_segment(
    memory: Any, *, total_size: int, capacity: int, prioritized: bool, alpha: float, eps: float,
    owner_pid: int, layout_json: bytes, data_offset: int, tree_offset: int,
    row_stride: int, created_ns: int,
    limiter: Optional[Tuple[int, float, int, float, float]] = ...,
) -> None: ...
