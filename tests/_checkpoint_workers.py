"""Children of tests/test_checkpoint*.py (multiprocessing targets, imported by name).

Every row derives from one serial number (``_workers.rows_of``), in a framed buffer from its
act (``_frame_streams``), in a sequence buffer from its (stream, episode, step)
(``_sequence_streams``), so what a loaded checkpoint holds is checked from its contents alone.
"""

from __future__ import annotations

import signal

import _sequence_streams
import numpy as np
from _frame_streams import Stream
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


def report(conn, target, *args) -> None:
    """Send "ok", or the type and text of what `target(*args)` raised."""
    try:
        target(*args)
        conn.send("ok")
    except Exception as error:   # noqa: BLE001 - reported to the parent, which checks it
        conn.send((type(error).__name__, str(error)))


def load_checkpoint(file: str) -> None:
    cpprb_ray.ReplayBuffer.load(file).close()


def load_transitions(file: str) -> None:
    with cpprb_ray.ReplayBuffer(8, ENV) as rb:
        rb.load_transitions(file)


def save_transitions(file: str) -> None:
    with cpprb_ray.ReplayBuffer(8, ENV) as rb:
        rb.add(**rows(0, 2))
        rb.save_transitions(file)


def stream_adds(stream: int, seed: int):
    """The adds a stream writer of tests/test_checkpoint_lanes.py makes, in order, for ever:
    (rows, priorities) of one to three transitions of _frame_streams.Stream(stream, seed).
    The parent replays it to tell where each add ended."""
    source = Stream(stream, seed)
    while True:
        count = int(source.random.integers(1, 4))
        rows = source.transitions(count)
        yield rows, source.random.random(count) + 0.1


def add_stream_forever(rb, stream: int, seed: int, ready, pad: int = 0) -> None:
    """Add `stream`'s transitions to `rb` (a laned buffer: this handle takes a lane) until
    killed, with a column "pad" of `pad` floats (each act % 1000) if `pad`; `ready` is set
    after the first add."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    for count, (batch, priorities) in enumerate(stream_adds(stream, seed)):
        if pad:
            batch["pad"] = np.repeat((batch["act"] % 1000).astype(np.float32)[:, None], pad, 1)
        rb.add(priorities=priorities, **batch)
        if count == 0:
            ready.set()


def sequence_adds(stream: int):
    """The adds a sequence writer of tests/test_checkpoint_sequences.py makes, in order, for
    ever: (values, priorities, whether on_episode_end follows, [(episode, t)] of its steps) of
    _sequence_streams.Stream(stream); the parent replays it to tell where each add ended."""
    source = _sequence_streams.Stream(stream, _sequence_streams.seed_of_stream(stream))
    random = np.random.default_rng(stream)
    for values, truncated, names in source.chunks():
        yield values, random.random(len(names)) + 0.1, truncated, names


def add_sequences_forever(rb, stream: int, ready, pad: int) -> None:
    """Add `stream`'s steps to `rb` (a sequence buffer: this handle takes a lane) until killed,
    with a column "pad" of `pad` floats (each the step's obs[3]); `ready` is set after the
    first add."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    for count, (values, priorities, truncated, _) in enumerate(sequence_adds(stream)):
        values["pad"] = np.repeat(values["obs"][:, 3:4], pad, 1)
        rb.add(priorities=priorities, **values)
        if truncated:
            rb.on_episode_end()
        if count == 0:
            ready.set()
