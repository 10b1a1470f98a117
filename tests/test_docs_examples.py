"""Every ```python block of docs/*.md and README.md runs.

A page's blocks run in order in one namespace (a later block may use what an earlier one made),
in a fresh temporary directory, and every buffer the page made is closed afterwards. Two HTML
comments (invisible on the rendered page) steer a block:

- ``<!-- setup: CODE -->`` right before a block runs CODE first: the inputs a fragment takes
  from a training loop (observations, a Q-function), so that the fragment itself runs as shown.
- ``<!-- not-run: REASON -->`` right before a block skips it; REASON says why and which test
  covers it (e.g. it needs two Ray nodes). They are counted and reported, and kept few.
"""

from __future__ import annotations

import gc
import os
import re
import sys
import warnings
from typing import List, NamedTuple, Optional

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = sorted([os.path.join("docs", name) for name in os.listdir(os.path.join(ROOT, "docs"))
                if name.endswith(".md")] + ["README.md"])
# Blocks that may be skipped, at most: a new one needs a reason and a place here.
MAX_NOT_RUN = 4

_BLOCK = re.compile(r"(?:<!--\s*(setup|not-run):(.*?)-->\s*\n)?```python[^\n]*\n(.*?)^```",
                    re.S | re.M)


class Block(NamedTuple):
    page: str
    line: int
    code: str
    setup: Optional[str]
    not_run: Optional[str]


def blocks_of(page: str) -> List[Block]:
    with open(os.path.join(ROOT, page)) as handle:
        text = handle.read()
    found = []
    for match in _BLOCK.finditer(text):
        kind, note, code = match.group(1), match.group(2), match.group(3)
        line = text.count("\n", 0, match.start(3)) + 1
        found.append(Block(page, line, code, note if kind == "setup" else None,
                           note.strip() if kind == "not-run" else None))
    return found


ALL_BLOCKS = {page: blocks_of(page) for page in PAGES}
PAGES_WITH_CODE = [page for page, blocks in ALL_BLOCKS.items()
                   if any(b.not_run is None for b in blocks)]


def test_the_skipped_blocks_are_few_and_say_why(capsys):
    skipped = [b for blocks in ALL_BLOCKS.values() for b in blocks if b.not_run is not None]
    total = sum(len(blocks) for blocks in ALL_BLOCKS.values())
    with capsys.disabled():
        print(f"\ndocs examples: {total - len(skipped)} of {total} python blocks run; "
              f"not run: " + "; ".join(f"{b.page}:{b.line} ({b.not_run})" for b in skipped))
    assert total > 20, "the extraction found too few blocks: the pattern broke"
    assert len(skipped) <= MAX_NOT_RUN, [f"{b.page}:{b.line}" for b in skipped]
    assert all(len(b.not_run or "") > 20 for b in skipped), "a not-run marker needs a reason"


def _close_buffers(namespace: dict) -> None:
    from cpprb_ray import ReplayBuffer

    for value in list(namespace.values()):
        if isinstance(value, ReplayBuffer):
            value.close()
    namespace.clear()
    gc.collect()   # handles no name refers to any more are freed by their finalizers


@pytest.mark.parametrize("page", PAGES_WITH_CODE)
def test_page_examples_run(page, tmp_path, monkeypatch, request):
    if page == "docs/migrating.md":
        pytest.importorskip("cpprb")   # its examples run cpprb beside cpprb_ray
    if page == "docs/ray.md":
        with warnings.catch_warnings():
            # Ray 2.7.2 (the 3.7 leg) imports pkg_resources, deprecated by setuptools.
            warnings.simplefilter("ignore", DeprecationWarning)
            pytest.importorskip("ray")
        request.getfixturevalue("ray_session")   # the session's one Ray runtime (conftest)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__docs__"}
    ran = 0
    try:
        for block in ALL_BLOCKS[page]:
            if block.not_run is not None:
                continue
            for part, code in (("setup", block.setup), ("block", block.code)):
                if code is None:
                    continue
                try:
                    exec(compile(code, f"{page}:{block.line} ({part})", "exec"), namespace)
                except Exception as error:
                    raise AssertionError(f"{page}, the block at line {block.line} failed: "
                                         f"{type(error).__name__}: {error}") from error
            ran += 1
    finally:
        _close_buffers(namespace)
        sys.stdout.flush()
    assert ran > 0
