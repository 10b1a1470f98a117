"""``python -m cpprb_ray top``: a live view of this user's buffers on this host.

Every refresh lists the buffers (:func:`cpprb_ray._orphans.list_buffers`), opens each one's
store as a view for one ``counters()`` snapshot (the lock held for one copy of the counters,
or none when it does not come within 50 ms), reads its lane table without the lock, and
closes it: nothing is written, no lane is claimed, no huge pages are asked for. Rates are the
differences of two snapshots over the time between them.

Examples
--------
>>> import numpy as np
>>> from cpprb_ray import ReplayBuffer
>>> from cpprb_ray import _top
>>> with ReplayBuffer(64, {"obs": {}}, name="cpprb_ray_doctop_x1") as rb:
...     _ = rb.add(obs=np.zeros(10))
...     first = _top.read_buffers("cpprb_ray_doctop_")
...     _ = rb.sample(5)
...     rows = _top.with_rates(_top.read_buffers("cpprb_ray_doctop_"), first, 1.0)
>>> row = rows[0]
>>> name = row["name"].rsplit("/", 1)[-1]   # an mmap buffer's name is its path (Python 3.7)
>>> name, row["kind"], row["stored"], row["capacity"], row["sampled_per_s"]
('cpprb_ray_doctop_x1', 'plain', 10, 64, 5.0)
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any, Dict, List, Optional, TextIO

from cpprb_ray import _open, _orphans, frames

COUNTS = (("inserts", "added_per_s"), ("samples", "sampled_per_s"),
          ("updates", "updated_per_s"), ("lock_waits", "lock_waits_per_s"))


def _kind(layout: Any) -> str:
    meta = layout.meta
    if any(key.startswith("sequence") for key in meta):
        return "sequence"
    if meta.get("lanes"):
        return "laned"
    return "prioritized" if layout.prioritized else "plain"


def _read_one(entry: Dict[str, Any]) -> Dict[str, Any]:
    row: Dict[str, Any] = {
        "name": entry["name"], "backend": entry["backend"], "owner_pid": entry["owner_pid"],
        "owner": entry["owner_status"], "capacity": entry["capacity"],
        "stored": entry["stored"], "prioritized": entry["prioritized"], "kind": None,
        "inserts": None, "samples": None, "updates": None, "lock_waits": None,
        "repairs": None, "lanes": None, "lanes_in_use": None, "rate_limiter": None,
        "waiting": [], "snapshot": None, "problem": entry.get("problem", "")}
    if not entry["valid"]:
        return row
    location = entry["name"] if entry["backend"] == "shm" else entry["path"]
    segment, layout = _open.open_segment(entry["backend"], location)
    try:
        store = _open.open_store(segment, layout, prioritized=layout.prioritized,
                                 lock_timeout=1.0, view=True)
        try:
            counters = store.counters()
            row["kind"] = _kind(layout)
            lane_config = frames.LaneConfig.from_meta(layout.meta, layout.columns, location)
            if lane_config is not None:
                owners = frames.lane_store(store, layout, lane_config, location).lane_owners()
                row["lanes"] = int(owners.shape[0])
                row["lanes_in_use"] = int((owners[:, 0] != 0).sum())
        finally:
            store.release()
    finally:
        segment.close()
    for key in ("inserts", "samples", "updates", "lock_waits", "repairs", "stored", "capacity",
                "snapshot"):
        row[key] = counters[key]
    limiter = counters["rate_limiter"]
    if limiter is not None:
        row["rate_limiter"] = limiter
        row["waiting"] = [side for side in ("insert", "sample")
                          if limiter[f"{side}_waiting"] and not limiter[f"can_{side}"]]
    return row


def read_buffers(prefix: Optional[str] = None) -> List[Dict[str, Any]]:
    """One reading of every buffer of this user on this host (given `prefix`, of those whose
    file name starts with it), by name. A buffer that vanished between the listing and the
    reading is left out; one that cannot be opened is listed with its ``problem``."""
    rows = []
    for entry in sorted(_orphans.list_buffers(prefix), key=lambda entry: entry["name"]):
        try:
            rows.append(_read_one(entry))
        except FileNotFoundError:
            continue
        except (OSError, ValueError, TimeoutError) as error:
            entry = dict(entry, valid=False, problem=str(error))
            rows.append(_read_one(entry))
    return rows


def with_rates(rows: List[Dict[str, Any]], before: List[Dict[str, Any]],
               seconds: float) -> List[Dict[str, Any]]:
    """`rows` with ``added_per_s``, ``sampled_per_s``, ``updated_per_s`` and
    ``lock_waits_per_s``: the differences from the reading `seconds` earlier (None for a buffer
    it did not have, or after a clear or a restore made a count go back)."""
    earlier = {row["name"]: row for row in before}
    for row in rows:
        old = earlier.get(row["name"])
        for count, rate in COUNTS:
            if (old is None or row[count] is None or old[count] is None
                    or row[count] < old[count] or seconds <= 0):
                row[rate] = None
            else:
                row[rate] = (row[count] - old[count]) / seconds
    return rows


def _rate(value: Optional[float]) -> str:
    if value is None:
        return "-"
    if value >= 1e6:
        return f"{value / 1e6:.1f}M"
    if value >= 1e4:
        return f"{value / 1e3:.0f}k"
    return f"{value:.0f}"


def _limiter_text(row: Dict[str, Any]) -> str:
    limiter = row["rate_limiter"]
    if limiter is None:
        return "-"
    kind = "ratio" if limiter["kind"] == "SampleToInsertRatio" else "minsize"
    text = f"{kind} diff={limiter['diff']:g}"
    if row["waiting"]:
        text += " waiting:" + ",".join(row["waiting"])
    return text


HEADER = (f"{'NAME':<32} {'OWNER':<12} {'KIND':<11} {'ROWS':>17} {'ADD/s':>7} {'SAMPLE/s':>8} "
          f"{'UPD/s':>7} {'LOCKW/s':>7} {'REPAIRS':>7} {'LANES':>5}  LIMITER")


def render(rows: List[Dict[str, Any]], now: Optional[float] = None) -> str:
    """The table one refresh prints."""
    stamp = time.strftime("%H:%M:%S", time.localtime(now))
    lines = [f"cpprb_ray top: {len(rows)} buffer{'s' if len(rows) != 1 else ''}  {stamp}",
             HEADER]
    for row in rows:
        owner = f"{row['owner_pid']} {row['owner']}"
        stored = f"{row['stored']}/{row['capacity']}"
        lanes = "-" if row["lanes"] is None else f"{row['lanes_in_use']}/{row['lanes']}"
        name = row["name"] if len(row["name"]) <= 32 else "..." + row["name"][-29:]
        if row["kind"] is None:
            lines.append(f"{name:<32} {owner:<12} {'?':<11} {stored:>17}  "
                         f"unreadable: {row['problem'][:60]}")
            continue
        lines.append(
            f"{name:<32} {owner:<12} {row['kind']:<11} {stored:>17} "
            f"{_rate(row.get('added_per_s')):>7} {_rate(row.get('sampled_per_s')):>8} "
            f"{_rate(row.get('updated_per_s')):>7} {_rate(row.get('lock_waits_per_s')):>7} "
            f"{row['repairs']:>7} {lanes:>5}  {_limiter_text(row)}")
    return "\n".join(lines)


def run(prefix: Optional[str], interval: float, once: bool, as_json: bool,
        iterations: Optional[int] = None, stream: TextIO = sys.stdout) -> int:
    """The command: with `once`, two readings `interval` seconds apart, printed once (a table,
    or JSON: ``{"time": ..., "interval_s": ..., "buffers": [...]}``); else a table refreshed
    every `interval` seconds (the screen cleared between) until Ctrl-C, or `iterations`
    refreshes."""
    before = read_buffers(prefix)
    started = time.monotonic()
    shown = 0
    try:
        while True:
            time.sleep(interval)
            rows = read_buffers(prefix)
            now = time.monotonic()
            rows = with_rates(rows, before, now - started)
            before, started = rows, now
            if once and as_json:
                json.dump({"time": time.time(), "interval_s": interval, "buffers": rows},
                          stream, default=str)
                stream.write("\n")
                return 0
            if not once and stream.isatty():
                stream.write("\x1b[H\x1b[2J")
            stream.write(render(rows) + "\n")
            stream.flush()
            shown += 1
            if once or (iterations is not None and shown >= iterations):
                return 0
    except KeyboardInterrupt:
        return 0
