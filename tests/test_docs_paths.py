"""The documentation names no folder of the machine it was written on.

Reports pasted into the docs used to carry the interpreters and temporary files of one machine
(a worktree under /work, a pyenv under /root, a temporary folder's random name): meaningless to
a reader, and wrong on any other machine. Every Markdown file of the repository (the docs, the
README, the benchmarks' notes) is read here, and each line that names such a folder fails the
test with its file and line. A command that needs a scratch folder makes one (``mktemp -d``);
a folder a user chooses is named by its variable (the Makefile's ``TORCH_WHEELS``)."""

from __future__ import annotations

import os
import re

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: Folders of one machine: (pattern, what it is). Home directories and worktrees; any file in
#: /tmp (a temporary file's name is one run's); pyenv's interpreters; /opt, where a machine
#: keeps what was installed by hand.
MACHINE_PATHS = (
    (re.compile(r"(?<![\w.])/(?:work|root|Users)/"), "a worktree or a home directory"),
    (re.compile(r"(?<![\w.])/home/\w"), "a home directory"),
    (re.compile(r"(?<![\w.])/tmp/\w"), "a file in /tmp"),
    (re.compile(r"\.pyenv/|pyenv/versions/"), "a pyenv interpreter"),
    (re.compile(r"(?<![\w.])/opt/\w"), "a folder under /opt"),
)

#: Folders that are not the repository's own text: environments, builds, reports.
SKIPPED_DIRS = {".git", "build", "dist", "node_modules", "compare-results", ".asv", "_build",
                ".hypothesis", ".pytest_cache", ".mypy_cache", ".ruff_cache"}


def markdown_files():
    for root, dirs, files in os.walk(REPO):
        dirs[:] = [d for d in dirs if d not in SKIPPED_DIRS and not d.startswith(".venv")
                   and not d.endswith(".egg-info")]
        for name in files:
            if name.endswith((".md", ".rst")):
                yield os.path.join(root, name)


def offending_lines(text: str):
    """(line number, line, what) of every line naming a machine's folder.

    >>> [what for _, _, what in offending_lines("ran /work/wt/x/.venv/bin/python\\nok\\n")]
    ['a worktree or a home directory']
    >>> list(offending_lines("run `make bench-peers`; files in /dev/shm\\n"))
    []
    """
    for number, line in enumerate(text.splitlines(), 1):
        for pattern, what in MACHINE_PATHS:
            if pattern.search(line):
                yield number, line.strip(), what
                break


def test_the_check_finds_what_a_pasted_report_carried():
    report = ("- process tianshou (/work/main/.venv-tianshou/bin/python, 35 s)\n"
              "`/root/.pyenv/versions/3.11.7/bin/python x --json /tmp/cpprb_ray_compare_z01q/a`\n"
              "torch 2.13.0 CPU wheel from /opt/wheels\n"
              "the same on a quiet machine\n")
    assert [number for number, _, _ in offending_lines(report)] == [1, 2, 3]


def test_no_markdown_file_names_a_machine_folder():
    files = list(markdown_files())
    assert any(path.endswith(os.path.join("docs", "benchmarks.md")) for path in files)
    found = []
    for path in files:
        with open(path, encoding="utf-8") as handle:
            for number, line, what in offending_lines(handle.read()):
                found.append(f"{os.path.relpath(path, REPO)}:{number}: {what}: {line[:100]}")
    assert not found, "machine-specific paths in the docs:\n" + "\n".join(found)
