"""Children of tests/test_checkpoint.py (multiprocessing targets, imported by name).

Every row derives from one serial number (``_workers.rows_of``), so what a loaded checkpoint
holds is checked from its contents alone.
"""

from __future__ import annotations

import numpy as np
from _workers import ENV, rows

import cpprb_ray
from cpprb_ray import _atomic

SAVE_BATCH = 4096


def saved_state(capacity: int, rows_added: int) -> np.ndarray:
    """The serial each slot holds after `rows_added` rows of serials 0, 1, ... were added to an
    empty buffer of `capacity` slots (what the saver below saves)."""
    stored = min(rows_added, capacity)
    serials = np.arange(rows_added - stored, rows_added, dtype=np.int64)
    slots = np.empty(stored, dtype=np.int64)
    slots[serials % capacity] = serials
    return slots


def save_forever(conn, file: str, capacity: int, anonymous: bool, saves) -> None:
    """Add SAVE_BATCH rows, save to `file`, count the save in `saves`, and again, until killed.

    `anonymous`=False forces the named temporary file that filesystems without O_TMPFILE get.
    """
    _atomic._ANONYMOUS_TEMPORARY = anonymous
    rb = cpprb_ray.PrioritizedReplayBuffer(capacity, ENV, seed=0)
    conn.send((rb.backend, rb.name))   # the parent removes the segment after the kill
    added = 0
    while True:
        batch = rows(added, SAVE_BATCH)
        rb.add(priorities=(batch["act"] % 7).astype(np.float64), **batch)
        added += SAVE_BATCH
        rb.save(file)
        saves.value += 1
