"""Command line: ``python -m cpprb_ray ls [--prefix P]``,
``python -m cpprb_ray rm NAME | --orphans [--prefix P]`` and
``python -m cpprb_ray top [--once] [--json] [--interval S] [--prefix P]`` (:mod:`cpprb_ray._top`).

Errors are messages on stderr with a nonzero exit status, never tracebacks.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import List, Optional

from cpprb_ray import _top
from cpprb_ray._orphans import UNKNOWN, check_prefix, list_buffers, remove_buffer, sweep_orphans

_OWNER_TEXT = {"alive": "yes", "dead": "no", UNKNOWN: "unknown"}


def _human(size: int) -> str:
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{size} B"  # pragma: no cover


def main(argv: Optional[List[str]] = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:
        # The reader went away (`ls | head`): no traceback, and the interpreter's last flush
        # of stdout must not fail again.
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError, AttributeError):
            pass
        return 1


def _main(argv: Optional[List[str]]) -> int:
    parser = argparse.ArgumentParser(prog="python -m cpprb_ray",
                                     description="List, watch and remove cpprb_ray buffers.")
    commands = parser.add_subparsers(dest="command", required=True)
    listing = commands.add_parser("ls", help="list this user's buffers")
    listing.add_argument("--prefix", help="only buffers whose name starts with PREFIX")
    remove = commands.add_parser("rm", help="remove buffers by name, or every orphan")
    remove.add_argument("names", nargs="*", help="buffer names (shm) or paths (mmap)")
    remove.add_argument("--orphans", action="store_true",
                        help="remove every buffer whose owner process is gone")
    remove.add_argument("--force", action="store_true",
                        help="with --orphans, also remove buffers whose owner cannot be seen "
                             "from here (another pid namespace or boot: another container)")
    remove.add_argument("--prefix",
                        help="with --orphans, only buffers whose name (an mmap file's name, "
                             "without its directory) starts with PREFIX")
    top = commands.add_parser("top", help="a live view of this user's buffers (rates, "
                                          "limiter, lock waits, lanes)")
    top.add_argument("--once", action="store_true",
                     help="print one reading (two snapshots INTERVAL apart) and exit")
    top.add_argument("--json", action="store_true", help="with --once, as one JSON object")
    top.add_argument("--interval", type=float, default=1.0,
                     help="seconds between refreshes (default 1)")
    top.add_argument("--prefix", help="only buffers whose name starts with PREFIX")
    args = parser.parse_args(argv)

    if args.command == "top":
        if args.json and not args.once:
            parser.error("--json goes with --once (one snapshot for scripts)")
        if not 0 < args.interval <= 3600:
            parser.error(f"--interval must be > 0 and <= 3600 seconds; got {args.interval:g}")
        try:
            check_prefix(args.prefix)
        except ValueError as error:
            parser.error(str(error))
        return _top.run(args.prefix, args.interval, args.once, args.json)

    if args.command == "ls":
        try:
            rows = list_buffers(args.prefix)
        except ValueError as error:
            parser.error(str(error))
        print(f"{'NAME':<40} {'BACKEND':<7} {'SIZE':>10} {'ROWS':>15} {'OWNER PID':>9} OWNER ALIVE")
        for row in rows:
            rows_text = f"{row['stored']}/{row['capacity']}"
            print(f"{row['name']:<40} {row['backend']:<7} {_human(row['size']):>10} "
                  f"{rows_text:>15} {row['owner_pid']:>9} {_OWNER_TEXT[row['owner_status']]}")
        for row in rows:
            if row["owner_status"] == UNKNOWN:
                print(f"{row['name']}: owner unknown: {row['owner_why']}", file=sys.stderr)
        return 0

    if not args.names and not args.orphans:
        parser.error("rm needs NAME ... or --orphans")
    if args.force and not args.orphans:
        parser.error("--force goes with --orphans (rm NAME removes NAME whatever its owner)")
    if args.prefix is not None and not args.orphans:
        parser.error("--prefix goes with --orphans (rm NAME names its buffers itself)")
    try:
        check_prefix(args.prefix)
    except ValueError as error:
        parser.error(str(error))
    status = 0
    for name in args.names:
        try:
            removed = remove_buffer(name)
        except (OSError, ValueError, TypeError) as error:
            print(f"refused {name}: {error}", file=sys.stderr)
            status = 1
            continue
        if removed:
            print(f"removed {name}")
        else:
            print(f"no such buffer: {name}", file=sys.stderr)
            status = 1
    if args.orphans:
        removed_orphans, skipped = sweep_orphans(force=args.force, prefix=args.prefix)
        for name in removed_orphans:
            print(f"removed orphan {name}")
        for name, why in skipped:
            print(f"skipped {name}: {why}; its owner may be alive. Remove it with "
                  f"`rm --orphans --force` or `rm {name}` once you know it is not.",
                  file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
