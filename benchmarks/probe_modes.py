"""The cold learner step's two speeds: what differs between a fast process and a slow one.

Run from the repository root (cpprb_ray built in place, e.g. by ``make venv``)::

    .venv/bin/python benchmarks/probe_modes.py --processes 10     # about 12 minutes
    .venv/bin/python benchmarks/probe_modes.py --processes 2 --rounds 40   # a smoke run

The same cold learner step (a 64 MiB in-place sweep, untimed, then sample(256) and an update of
its indexes, at 2^20 rows), ours interleaved call by call with cpprb's as the headline does,
gives a steady figure within a process and one of two figures between processes. This script
starts ``--processes`` processes one after another; each measures, in phases of ``--rounds``
rounds:

- ``first``: the buffers as made, the sweep array as made;
- ``new buffer``: a second buffer of ours (a new segment: new physical pages) in place of the
  first, the same cpprb buffer and sweep;
- ``new sweep``: a new 64 MiB sweep array (new pages for the sweep), the second buffer;
- ``cpu 0``, ``cpu 1``: the process pinned to one CPU, then the other (``sched_setaffinity``):
  whether a mode follows the CPU the process runs on;
- ``sweep 256 MiB``: a sweep of 8 times the 32 MiB L3 instead of 2 times: whether what a
  64 MiB sweep leaves in the L3 decides the mode (after 256 MiB nothing of ours is left).

and records, for each phase, what the memory looked like (``/proc/self/smaps``): how much of the
segment is mapped with 2 MiB pages (``FilePmdMapped``: our segment is a /dev/shm file), how much
of the sweep array and of the mapping that holds a sample's output arrays is in 2 MiB pages
(``AnonHugePages``), where the segment lies in physical memory (``/proc/self/pagemap``, root
only: the physical frame of each 2 MiB unit's first page, summarized as the lowest and highest
GiB and whether each unit is physically contiguous), the CPUs the process ran on during the
phase, and DAMON's counters when the kernel runs it (``/sys/kernel/mm/damon``: what its schemes
tried and applied during the phase). The table at the end puts the processes side by side;
``--json PATH`` keeps everything.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional

import numpy as np

if __package__:
    from . import _common as common
else:  # run as a script: this file's folder is sys.path[0]
    import _common as common

SWEEP_BYTES = 64 << 20
HUGE = 2 << 20
PAGE = os.sysconf("SC_PAGE_SIZE")
CAPACITY = 1 << 20
DAMON = "/sys/kernel/mm/damon/admin/kdamonds"


# ---------------------------------------------------------------------------------------------
# What the memory looks like


def smaps() -> List[Dict[str, Any]]:
    """This process's mappings with their smaps fields (kB values as ints)."""
    out: List[Dict[str, Any]] = []
    with open("/proc/self/smaps") as handle:
        for line in handle:
            head, _, rest = line.partition(" ")
            if "-" in head and ":" not in head:
                start, end = (int(x, 16) for x in head.split("-"))
                fields = rest.split()
                out.append({"start": start, "end": end,
                            "path": fields[4] if len(fields) > 4 else ""})
            elif head.endswith(":") and out:
                value = rest.split()
                if value and value[0].isdigit():
                    out[-1][head[:-1]] = int(value[0])
    return out


def mappings_over(maps: List[Dict[str, Any]], start: int, length: int
                  ) -> List[Dict[str, Any]]:
    """The mappings that [start, start + length) overlaps (an array's allocation is often two:
    numpy's MADV_HUGEPAGE covers only its 2 MiB-aligned part, which splits the mapping)."""
    return [m for m in maps if m["start"] < start + length and start < m["end"]]


def huge_kib(mappings: List[Dict[str, Any]]) -> Dict[str, int]:
    """Size, Rss and the 2 MiB-mapped part of mappings, in KiB."""
    return {"size": sum(m.get("Size", 0) for m in mappings),
            "rss": sum(m.get("Rss", 0) for m in mappings),
            "huge": sum(m.get("AnonHugePages", 0) + m.get("FilePmdMapped", 0)
                        + m.get("ShmemPmdMapped", 0) for m in mappings)}


def physical(start: int, length: int) -> Dict[str, Any]:
    """Where [start, start + length) lies in physical memory: per 2 MiB unit, its first page's
    frame; whether the unit is contiguous (its last page's frame follows by 511); the lowest
    and highest GiB. Needs root (pagemap shows frames only to CAP_SYS_ADMIN)."""
    frames: List[int] = []
    contiguous = 0
    try:
        with open("/proc/self/pagemap", "rb") as handle:
            for unit in range(start, start + length - HUGE + 1, HUGE):
                first = _frame(handle, unit)
                last = _frame(handle, unit + HUGE - PAGE)
                if first:
                    frames.append(first)
                    contiguous += int(last == first + HUGE // PAGE - 1)
    except OSError as error:
        return {"error": str(error)}
    if not frames:
        return {"error": "no frames (not root, or nothing mapped)"}
    gib = [frame * PAGE / 2**30 for frame in frames]
    return {"units": len(frames), "contiguous_units": contiguous,
            "aligned_units": sum(frame % (HUGE // PAGE) == 0 for frame in frames),
            "lowest_gib": round(min(gib), 3), "highest_gib": round(max(gib), 3),
            "median_gib": round(statistics.median(gib), 3)}


def _frame(handle, address: int) -> int:
    handle.seek(address // PAGE * 8)
    entry = int.from_bytes(handle.read(8), "little")
    return entry & ((1 << 55) - 1) if entry >> 63 else 0


def damon_counters() -> Dict[str, int]:
    """Every DAMON scheme's counters (tried and applied regions and bytes), where it runs."""
    out: Dict[str, int] = {}
    if not os.path.isdir(DAMON):
        return out
    for root, _, files in os.walk(DAMON):
        if root.endswith("/stats"):
            for name in files:
                try:
                    with open(os.path.join(root, name)) as handle:
                        out[os.path.relpath(os.path.join(root, name), DAMON)] = int(
                            handle.read())
                except (OSError, ValueError):
                    continue
    return out


def current_cpu() -> int:
    """The CPU this process last ran on (/proc/self/stat, field 39)."""
    with open("/proc/self/stat") as handle:
        return int(handle.read().rsplit(")", 1)[1].split()[36])


# ---------------------------------------------------------------------------------------------
# One process


def filled_ours(seed: int) -> Any:
    cpprb_ray = common.import_cpprb_ray()
    buffer = cpprb_ray.PrioritizedReplayBuffer(CAPACITY, common.env_dict(), alpha=common.ALPHA,
                                               eps=common.EPS, seed=seed)
    common.fill(buffer, CAPACITY, np.random.default_rng(seed))
    return buffer


def _step(buffer: Any, priorities: List[np.ndarray]) -> Any:
    """A learner step of `buffer`: sample(256), then an update of its indexes."""
    sample, update = buffer.sample, buffer.update_priorities
    count = [0]

    def step() -> None:
        count[0] += 1
        update(sample(256, common.BETA)["indexes"], priorities[count[0] & 63])
    return step


def measure(ours: Any, cpprb: Any, sweep_array: np.ndarray, rounds: int, seed: int
            ) -> Dict[str, Any]:
    """Cold learner steps, ours and cpprb's rotated call by call: medians and CPUs seen."""
    rng = np.random.default_rng(seed)
    priorities = [common.random_priorities(rng, 256) for _ in range(64)]
    calls = {key: _step(buffer, priorities) for key, buffer in (("ours", ours),
                                                                 ("cpprb", cpprb))}
    times: Dict[str, List[float]] = {key: [] for key in calls}
    cpus: Dict[int, int] = {}
    clock = time.perf_counter_ns
    gc.collect()
    gc.disable()
    try:
        for round_number in range(rounds + 5):
            order = list(calls) if round_number % 2 == 0 else list(calls)[::-1]
            for key in order:
                np.add(sweep_array, 1, out=sweep_array)
                start = clock()
                calls[key]()
                if round_number >= 5:  # the first five are a warm-up
                    times[key].append((clock() - start) / 1000.0)
            cpu = current_cpu()
            cpus[cpu] = cpus.get(cpu, 0) + 1
    finally:
        gc.enable()
    out = {key: {"median_us": float(np.median(series)),
                 "p25_us": float(np.quantile(series, 0.25)),
                 "min_us": float(np.min(series))} for key, series in times.items()}
    out["ratio"] = out["cpprb"]["median_us"] / out["ours"]["median_us"]
    out["cpus"] = cpus
    return out


def memory_facts(ours: Any, sweep_array: np.ndarray) -> Dict[str, Any]:
    maps = smaps()
    segment = next((m for m in maps if m["path"].endswith(ours.name.lstrip("/"))), None)
    batch = ours.sample(256, common.BETA)
    facts = {"segment": huge_kib([segment] if segment else []),
             "sweep": huge_kib(mappings_over(maps, sweep_array.ctypes.data,
                                             sweep_array.nbytes)),
             "sample_outputs": huge_kib(mappings_over(maps, batch["obs"].ctypes.data,
                                                      batch["obs"].nbytes)),
             "huge_page_bytes_reported": ours.stats()["huge_page_bytes"]}
    if segment is not None:
        facts["segment_physical"] = physical(segment["start"], segment["end"] - segment["start"])
    facts["sweep_physical"] = physical(sweep_array.ctypes.data - sweep_array.ctypes.data % HUGE
                                       + HUGE, sweep_array.nbytes - HUGE)
    return facts


def one_process(rounds: int, seed: int) -> Dict[str, Any]:
    """Every phase of one process (see the module docstring)."""
    import cpprb

    ours = filled_ours(seed)
    theirs = cpprb.PrioritizedReplayBuffer(CAPACITY, common.env_dict(), alpha=common.ALPHA,
                                           eps=common.EPS)
    common.fill(theirs, CAPACITY, np.random.default_rng(seed))
    sweep_array = np.ones(SWEEP_BYTES // 8, np.int64)
    phases: List[Dict[str, Any]] = []
    allowed = sorted(os.sched_getaffinity(0))

    def phase(name: str) -> None:
        before = damon_counters()
        record = {"phase": name, "load_average_1": os.getloadavg()[0]}
        record.update(measure(ours, theirs, sweep_array, rounds, seed))
        record["memory"] = memory_facts(ours, sweep_array)
        after = damon_counters()
        record["damon_delta"] = {k: after[k] - before.get(k, 0) for k in after
                                 if after[k] != before.get(k, 0)}
        phases.append(record)

    try:
        phase("first")
        second = filled_ours(seed + 1)
        ours.close()
        ours = second
        phase("new buffer")
        sweep_array = np.ones(SWEEP_BYTES // 8, np.int64)
        phase("new sweep")
        for cpu in allowed[:2]:
            os.sched_setaffinity(0, {cpu})
            phase(f"cpu {cpu}")
        os.sched_setaffinity(0, allowed)
        sweep_array = np.ones(4 * SWEEP_BYTES // 8, np.int64)
        phase("sweep 256 MiB")
    finally:
        ours.close()
    return {"pid": os.getpid(), "phases": phases}


# ---------------------------------------------------------------------------------------------
# The driver


def row(index: int, record: Dict[str, Any]) -> List[str]:
    cells = [str(index)]
    for phase in record["phases"]:
        cells.append(f"{phase['ours']['median_us']:.0f} ({phase['ratio']:.1f}x)")
    first = record["phases"][0]["memory"]
    segment_huge = first["segment"].get("huge", 0) // 1024
    sweep = first["sweep"]
    physical_units = first.get("segment_physical", {})
    cells += [f"{segment_huge} / {first['segment'].get('size', 0) // 1024}",
              f"{sweep.get('huge', 0) // 1024} / {sweep.get('size', 0) // 1024}",
              f"{first['sample_outputs'].get('huge', 0) // 1024}",
              f"{physical_units.get('lowest_gib', '-')}–{physical_units.get('highest_gib', '-')}"]
    return cells


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=200, help="rounds per phase")
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(one_process(args.rounds, args.seed)))
        return 0
    records = []
    for index in range(args.processes):
        done = subprocess.run([sys.executable, os.path.abspath(__file__), "--child",
                               "--rounds", str(args.rounds), "--seed", str(args.seed)],
                              capture_output=True, text=True, check=True)
        record = json.loads(done.stdout.strip().splitlines()[-1])
        records.append(record)
        phases = ", ".join(f"{p['phase']} {p['ours']['median_us']:.0f} µs ({p['ratio']:.1f}x, "
                           f"cpus {p['cpus']})" for p in record["phases"])
        print(f"process {index + 1}: {phases}; load {os.getloadavg()[0]:.2f}", file=sys.stderr,
              flush=True)
    names = [p["phase"] for p in records[0]["phases"]]
    head = (["process"] + [f"{name}: ours µs (cpprb / ours)" for name in names] +
            ["segment MiB in 2 MiB pages / MiB", "sweep MiB huge / MiB",
             "outputs' mapping MiB huge", "segment physical GiB"])
    print(common.markdown_table(head, [row(k + 1, r) for k, r in enumerate(records)],
                                "r" * len(head)))
    firsts = [r["phases"][0]["ours"]["median_us"] for r in records]
    print(f"\nfirst phase, ours: {min(firsts):.0f} to {max(firsts):.0f} µs over "
          f"{len(firsts)} processes (max / min {max(firsts) / min(firsts):.2f})")
    common.write_json(args.json, {"command": " ".join(["python"] + sys.argv),
                                  "machine": common.machine(), "records": records})
    return 0


if __name__ == "__main__":
    sys.exit(main())
