"""Soak: K writer processes and one learner on one buffer, one of them SIGKILLed and restarted
every few seconds, for a given time; then check that nothing was torn, lost, leaked or hung.

Every row says who wrote it and which it was: a writer id, a serial (per writer, counting up),
a payload and a check word derived from both. A row whose fields come from two different writes
(torn) fails the check. Each writer publishes, after every add returns, the last serial it has
committed; the rows of a killed writer's last committed add must still be there after the kill
(the ring is sized so that nothing committed in the last seconds can have been overwritten yet).
The learner samples (checking every sampled row) and updates priorities with generations.

Kills alternate: a writer (chosen at random), then the learner. After each kill, and at the end:
every stored row is whole, every writer's last committed add is present, and the priority tree is
exact (its root is the sum and the min of its leaves). Every wait is bounded (lock_timeout), and
a process that makes no progress for --hang-seconds is reported as hung. At the end the segment
must be gone and no other segment of ours left behind.

    python benchmarks/soak.py --seconds 60                  # CI size (tests/test_soak.py)
    python benchmarks/soak.py --seconds 3600 --writers 4    # by hand

Prints what was done and exits non-zero on any problem.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import signal
import sys
import time
from typing import Any, Dict, List, Optional

import numpy as np

import cpprb_ray
from cpprb_ray import _segment, _store

PAYLOAD = 16
ENV = {"writer": {"dtype": "int32"}, "serial": {"dtype": "int64"},
       "payload": {"shape": PAYLOAD, "dtype": "uint32"}, "check": {"dtype": "uint64"}}
LOCK_TIMEOUT_S = 20.0
SAMPLE_BATCH = 64


def payload_of(writer: np.ndarray, serial: np.ndarray) -> np.ndarray:
    """The payload a row (writer, serial) must carry, (n, PAYLOAD) uint32."""
    base = (serial.astype(np.uint64) * np.uint64(2654435761)
            + writer.astype(np.uint64) * np.uint64(40503))
    return ((base[:, None] + np.arange(PAYLOAD, dtype=np.uint64) * np.uint64(97))
            & np.uint64(0xFFFFFFFF)).astype(np.uint32)


def check_of(writer: np.ndarray, serial: np.ndarray) -> np.ndarray:
    return serial.astype(np.uint64) ^ (writer.astype(np.uint64) << np.uint64(48))


def rows_for(writer: int, first: int, count: int) -> Dict[str, np.ndarray]:
    serial = np.arange(first, first + count, dtype=np.int64)
    writers = np.full(count, writer, dtype=np.int32)
    return {"writer": writers, "serial": serial, "payload": payload_of(writers, serial),
            "check": check_of(writers, serial)}


def bad_rows(rows: Dict[str, np.ndarray]) -> int:
    """How many rows are not whole: payload or check not those of their (writer, serial)."""
    writer = rows["writer"].reshape(-1)
    serial = rows["serial"].reshape(-1)
    whole = ((rows["payload"] == payload_of(writer, serial)).all(axis=1)
             & (rows["check"].reshape(-1) == check_of(writer, serial)))
    return int((~whole).sum())


# -- the processes ------------------------------------------------------------------------------

def wait_while_paused(shared: Any, slot: int) -> None:
    while shared.pause.value and not shared.stop.value:
        shared.paused[slot] = 1
        time.sleep(0.002)
    shared.paused[slot] = 0


def writer_main(name: str, writer: int, first: int, shared: Any, seed: int) -> None:
    rb = cpprb_ray.attach(name, lock_timeout=LOCK_TIMEOUT_S)
    rng = random.Random(seed)
    serial = first
    if shared.sequence[writer] % 2:   # the writer before us was killed between the two stores
        shared.sequence[writer] += 1
    while not shared.stop.value:
        wait_while_paused(shared, writer)
        count = rng.choice([1, 4, 32, 256, 512])
        # Rows added before this add started: its rows go at or after that position of the
        # ring, so they are overwritten only once `capacity` more rows have been added.
        before = rb._store.rows_added
        rb.add(**rows_for(writer, serial, count))
        serial += count
        # After add returned: committed. A seqlock, so that a kill between the two stores is
        # seen (odd sequence) and that pair is not checked.
        shared.sequence[writer] += 1
        shared.base[writer] = before
        shared.committed[writer] = serial - 1
        shared.sequence[writer] += 1
        shared.progress[writer] += count
    rb.close()


def learner_main(name: str, shared: Any, slot: int, seed: int) -> None:
    rb = cpprb_ray.attach(name, lock_timeout=LOCK_TIMEOUT_S, seed=seed)
    rng = np.random.default_rng(seed)
    progress, torn, stop = shared.progress, shared.torn, shared.stop
    while not stop.value:
        wait_while_paused(shared, slot)
        if rb.get_stored_size() == 0:
            time.sleep(0.01)
            continue
        batch = rb.sample(SAMPLE_BATCH, beta=0.4)
        torn.value += bad_rows(batch)
        rb.update_priorities(batch["indexes"], rng.random(SAMPLE_BATCH) * 2 + 0.01,
                             batch["generations"])
        progress[slot] += 1
    rb.close()


# -- the soak -----------------------------------------------------------------------------------

class Shared:
    """What the processes share, all lock-free (a SIGKILL must never leave a lock held)."""

    def __init__(self, context: Any, writers: int) -> None:
        self.committed = context.RawArray("q", [-1] * writers)  # last committed serial
        self.base = context.RawArray("q", writers)       # rows_added before that add began
        self.sequence = context.RawArray("q", writers)   # odd while the two above change
        self.progress = context.RawArray("q", writers + 1)   # rows added / learner batches
        self.paused = context.RawArray("b", writers + 1)
        self.torn = context.RawValue("q", 0)
        self.stop = context.RawValue("b", 0)
        self.pause = context.RawValue("b", 0)

class Soak:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.context = multiprocessing.get_context("spawn")
        self.rb = cpprb_ray.PrioritizedReplayBuffer(args.capacity, ENV, backend=args.backend,
                                                    lock_timeout=LOCK_TIMEOUT_S, seed=args.seed)
        self.name = self.rb.name
        self.rng = random.Random(args.seed)
        # Lock-free shared state (a SIGKILL must never leave a lock held): slot k < writers is
        # writer k, slot `writers` the learner.
        self.shared = Shared(self.context, args.writers)
        self.committed = self.shared.committed
        self.progress = self.shared.progress
        self.torn = self.shared.torn
        self.stop = self.shared.stop
        self.processes: Dict[int, Any] = {}
        self.restarts = 0
        self.kills = {"writer": 0, "learner": 0}
        self.problems: List[str] = []
        self.lost = 0
        self.checks = 0
        self.unchecked = 0
        self.kills_in_lock = 0
        self.last_progress = [0] * (args.writers + 1)
        self.last_progress_at = [time.monotonic()] * (args.writers + 1)

    def start(self, slot: int) -> None:
        seed = self.rng.getrandbits(32)
        if slot < self.args.writers:
            target, arguments = writer_main, (self.name, slot, self.committed[slot] + 1,
                                              self.shared, seed)
        else:
            target, arguments = learner_main, (self.name, self.shared, slot, seed)
        process = self.context.Process(target=target, args=arguments, daemon=True)
        process.start()
        self.processes[slot] = process
        self.last_progress_at[slot] = time.monotonic()

    def kill(self, slot: int, in_the_lock: bool = False) -> None:
        """SIGKILL the process in `slot`; `in_the_lock`: wait (up to 0.5 s) until it holds the
        buffer's lock first, so that the kill lands mid-operation and the next locker repairs."""
        process = self.processes[slot]
        if in_the_lock:
            deadline = time.monotonic() + 0.5
            while (self.rb._store.lock_owner() != process.pid
                   and time.monotonic() < deadline):
                pass
            if self.rb._store.lock_owner() == process.pid:
                self.kills_in_lock += 1
        os.kill(process.pid, signal.SIGKILL)
        process.join(30)
        self.kills["writer" if slot < self.args.writers else "learner"] += 1

    def pause(self) -> None:
        """Hold every live process between two operations (so the ring stands still while it
        is checked)."""
        self.shared.pause.value = 1
        deadline = time.monotonic() + self.args.hang_seconds
        for slot, process in self.processes.items():
            while process.is_alive() and not self.shared.paused[slot]:
                if time.monotonic() > deadline:
                    self.problems.append(f"process {slot} did not pause within "
                                         f"{self.args.hang_seconds} s: hung")
                    break
                time.sleep(0.002)

    def resume(self) -> None:
        self.shared.pause.value = 0

    def check(self, when: str) -> None:
        """Every stored row whole, every writer's last committed add present (unless `capacity`
        rows were added since it began), the tree exact. The processes are paused."""
        self.checks += 1
        sequence = list(self.shared.sequence)
        committed = list(self.committed)
        base = list(self.shared.base)
        if list(self.shared.sequence) != sequence:
            self.problems.append(f"{when}: a writer published while paused")
        rows = self.rb.get_all_transitions()
        added = self.rb._store.rows_added
        torn = bad_rows(rows)
        if torn:
            self.problems.append(f"{when}: {torn} stored rows are torn")
        for writer, last in enumerate(committed):
            # Nothing committed yet, a kill between the seqlock's stores, or overwritable.
            if last < 0 or sequence[writer] % 2 or added - base[writer] >= self.args.capacity:
                self.unchecked += 1
                continue
            mine = rows["serial"].reshape(-1)[rows["writer"].reshape(-1) == writer]
            # The last committed row of the add: it is in the ring unless overwritten.
            wanted = np.array([last])
            missing = np.setdiff1d(wanted, mine)
            if missing.size:
                self.lost += int(missing.size)
                self.problems.append(f"{when}: writer {writer} committed up to serial {last}, "
                                     f"but serials {missing.tolist()} are missing")
        problems = _store.tree_problems(self.rb._store.check_tree())
        if problems:
            self.problems.append(f"{when}: tree not exact: {problems}")

    def watch(self) -> None:
        """A process alive but without progress for --hang-seconds is hung."""
        now = time.monotonic()
        for slot, process in self.processes.items():
            value = self.progress[slot]
            if value != self.last_progress[slot]:
                self.last_progress[slot] = value
                self.last_progress_at[slot] = now
            elif now - self.last_progress_at[slot] > self.args.hang_seconds:
                role = "learner" if slot == self.args.writers else f"writer {slot}"
                alive = process.is_alive()
                self.problems.append(f"{role} made no progress for {self.args.hang_seconds} s "
                                     f"({'alive: hung' if alive else f'exit {process.exitcode}'})")
                if alive:
                    self.kill(slot)
                self.start(slot)
            elif not process.is_alive():
                role = "learner" if slot == self.args.writers else f"writer {slot}"
                self.problems.append(f"{role} died on its own (exit {process.exitcode})")
                self.start(slot)

    def run(self) -> Dict[str, Any]:
        args = self.args
        start = time.monotonic()
        for slot in range(args.writers + 1):
            self.start(slot)
        next_kill = start + args.kill_every
        victim_is_writer = True
        end = start + args.seconds
        while time.monotonic() < end:
            time.sleep(0.05)
            self.watch()
            if time.monotonic() >= next_kill:
                # A random moment inside the victim's work: most of it is under the lock.
                slot = (self.rng.randrange(args.writers) if victim_is_writer else args.writers)
                self.kill(slot, in_the_lock=self.rng.random() < 0.7)
                self.pause()
                self.check(f"after kill {sum(self.kills.values())}")
                self.start(slot)
                self.resume()
                self.restarts += 1
                victim_is_writer = not victim_is_writer
                next_kill = time.monotonic() + args.kill_every * self.rng.uniform(0.5, 1.5)
        self.pause()
        self.check("at the end, running")
        self.stop.value = 1
        for slot, process in self.processes.items():
            process.join(LOCK_TIMEOUT_S + 10)
            if process.is_alive():
                self.problems.append(f"process {slot} did not stop within "
                                     f"{LOCK_TIMEOUT_S + 10} s: hung")
                process.kill()
                process.join(10)
        self.check("at the end, stopped")
        counters = self.rb._store.counters()
        torn_sampled = self.torn.value
        if torn_sampled:
            self.problems.append(f"the learner sampled {torn_sampled} torn rows")
        elapsed = time.monotonic() - start
        self.rb.close()
        leaked = leaked_segments(self.name, args.backend)
        if leaked:
            self.problems.append(f"segments left behind: {leaked}")
        return {"seconds": round(elapsed, 1), "writers": args.writers,
                "capacity": args.capacity, "backend": args.backend,
                "rows_added": int(counters["inserts"]),
                "rows_added_per_s": round(counters["inserts"] / elapsed),
                "learner_batches": int(self.progress[args.writers]),
                "rows_sampled": int(counters["samples"]), "priorities_updated":
                int(counters["updates"]), "kills": dict(self.kills),
                "kills_holding_the_lock": self.kills_in_lock,
                "repairs": int(counters["repairs"]), "checks": self.checks,
                "writer_checks_skipped": self.unchecked,
                "lost_rows": self.lost, "torn_rows_sampled": int(torn_sampled),
                "problems": self.problems}


def leaked_segments(name: str, backend: str) -> List[str]:
    """Our segment if it is still there, and any cpprb_ray segment made by this process or its
    children (owner_pid / owner_parent_pid in the layout)."""
    import tempfile

    from cpprb_ray import _memory
    left = []
    location = name if backend == "mmap" else os.path.join("/dev/shm", name)
    if os.path.exists(location):
        left.append(location)
    for directory in ("/dev/shm", tempfile.gettempdir()):
        try:
            names = os.listdir(directory)
        except OSError:
            continue
        for entry in names:
            if not entry.startswith("cpprb_ray"):
                continue
            path = os.path.join(directory, entry)
            try:
                with open(path, "rb") as handle:
                    header = _segment.read_header(bytearray(handle.read(_segment.HEADER_NBYTES)))
                    handle.seek(header["layout_offset"])
                    meta = json.loads(handle.read(header["layout_length"]))["meta"]
            except (OSError, ValueError, KeyError, TypeError):
                continue
            if os.getpid() in (meta.get("owner_pid"), meta.get("owner_parent_pid")):
                left.append(path)
    del _memory
    return sorted(set(left))


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--writers", type=int, default=3)
    parser.add_argument("--capacity", type=int, default=1 << 16)
    parser.add_argument("--kill-every", type=float, default=2.0,
                        help="seconds between two kills (each 0.5x to 1.5x of this)")
    parser.add_argument("--hang-seconds", type=float, default=LOCK_TIMEOUT_S + 20,
                        help="a process without progress this long is hung")
    parser.add_argument("--backend", default="shm" if sys.version_info >= (3, 8) else "mmap")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args(argv)
    result = Soak(args).run()
    print(f"soak: {result['seconds']} s, {args.writers} writers + 1 learner, capacity "
          f"{args.capacity}, {args.backend}")
    print(f"  done: {result['rows_added']} rows added ({result['rows_added_per_s']}/s), "
          f"{result['learner_batches']} learner batches ({result['rows_sampled']} rows sampled, "
          f"{result['priorities_updated']} priorities updated)")
    print(f"  kills survived: {result['kills']['writer']} writers, {result['kills']['learner']} "
          f"learners ({result['kills_holding_the_lock']} while holding the lock); repairs: "
          f"{result['repairs']}; checks: {result['checks']} ({result['writer_checks_skipped']} "
          f"writer checks skipped: nothing committed yet, or `capacity` rows added since, as "
          f"while a restarted writer starts up)")
    print(f"  lost: {result['lost_rows']} committed rows missing; torn: "
          f"{result['torn_rows_sampled']} sampled rows; problems: {len(result['problems'])}")
    for problem in result["problems"]:
        print("  PROBLEM:", problem)
    if args.json:
        with open(args.json, "w") as out:
            json.dump(result, out, indent=1)
    return 1 if result["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
