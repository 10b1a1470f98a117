"""Read the AddressSanitizer / UBSan / LeakSanitizer logs of `make test-asan` and fail on what is
ours: any invalid access, any undefined behaviour, and any leak with a cpprb_ray frame in its
allocation stack. Leaks whose stacks never pass through cpprb_ray (CPython's and numpy's objects
that live until exit) are counted, not failed: LSan suppressions match a pattern against ANY
frame, so suppressing "python" would also hide a leak made by our code called from Python; the
suppressions file (.ci/lsan-suppressions.txt) keeps only interpreter start-up paths, and this
script draws the line exactly.

    python .ci/asan_report.py LOG_DIR
"""

from __future__ import annotations

import glob
import os
import re
import sys

OURS = re.compile(r"cpprb_ray[/.]_\w+|__pyx_\w*cpprb_ray")
LEAK = re.compile(r"^(Direct|Indirect) leak of (\d+) byte")


def classify(text: str):
    """(errors, our_leaks, other_leaks): each error a short excerpt."""
    errors, ours, others = [], [], 0
    for match in re.finditer(r"^.*(ERROR: AddressSanitizer|runtime error:).*$", text, re.M):
        start = match.start()
        errors.append(text[start:start + 3000])
    blocks = re.split(r"\n(?=(?:Direct|Indirect) leak of )", text)
    for block in blocks:
        if not LEAK.match(block):
            continue
        stack = block.split("\n\n")[0]
        if OURS.search(stack):
            ours.append(stack[:3000])
        else:
            others += 1
    return errors, ours, others


def main(directory: str) -> int:
    logs = sorted(glob.glob(os.path.join(directory, "*")))
    errors, ours, others = [], [], 0
    for path in logs:
        with open(path, errors="replace") as log:
            e, o, n = classify(log.read())
        errors += [f"{os.path.basename(path)}:\n{x}" for x in e]
        ours += [f"{os.path.basename(path)}:\n{x}" for x in o]
        others += n
    for item in errors:
        print("SANITIZER ERROR in", item, "\n")
    for item in ours:
        print("LEAK IN CPPRB_RAY in", item, "\n")
    print(f"asan_report: {len(logs)} sanitizer logs; {len(errors)} errors (invalid access or "
          f"undefined behaviour), {len(ours)} leaks with a cpprb_ray frame, {others} leak "
          f"records of CPython/numpy alone (not ours, not failed)")
    return 1 if errors or ours else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
