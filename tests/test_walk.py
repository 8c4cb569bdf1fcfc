"""docs/architecture.md's walk of a non-streaming chat request matches the code: the files a
profiler sees one warmed-up request run code in, through a live server on the default model
(tests/walk_trace.py), are exactly the files of the document's ``walk`` list, and its moves
between them and the returns among those are the counts the document gives."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kiln.testing import free_port
from tests import HANG_S  # loading the model on a loaded machine too

ROOT = Path(__file__).resolve().parent.parent


def documented_walk() -> list[str]:
    doc = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```walk\n(.*?)```", doc, flags=re.S)
    assert len(blocks) == 1, "docs/architecture.md has one ```walk list"
    return [line.strip() for line in blocks[0].splitlines() if line.strip()]


def documented_counts() -> tuple[int, int]:
    doc = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    found = re.findall(r"makes\s+(\d+)\s+moves\s+between\s+its\s+files,\s+(\d+)\s+of\s+them\s+returns", doc)
    assert len(found) == 1, "docs/architecture.md gives the walk's moves and returns once"
    return int(found[0][0]), int(found[0][1])


def test_the_documented_walk_names_real_files_once() -> None:
    files = documented_walk()
    assert len(files) == len(set(files)) and len(files) > 20
    assert [f for f in files if not (ROOT / f).is_file()] == []


def test_the_documented_walk_is_what_a_request_runs() -> None:
    from kiln_kernels.cpu import available

    if not available():
        pytest.skip("no C compiler: the default model runs the torch path, not the walk's")
    # `kiln serve` runs the default model torch-free (kiln/engine/runner.py over a C model): the walk is
    # the torch-free one.
    out = subprocess.run([sys.executable, "-m", "tests.walk_trace", str(free_port())],
                         cwd=ROOT, capture_output=True, text=True, timeout=HANG_S, check=True)
    walk = json.loads(out.stdout.strip().splitlines()[-1])
    traced, moves, returns = walk["files"], walk["moves"], walk["returns"]
    documented = documented_walk()
    assert sorted(set(traced) - set(documented)) == [], "run but not in docs/architecture.md"
    assert sorted(set(documented) - set(traced)) == [], "in docs/architecture.md but not run"
    assert {f for move in moves for f in move} - set(documented) <= {"kiln/cli.py"}
    # (kiln/cli.py: the bottom of the event loop's thread, below every callback it runs)
    assert (len(moves), len(returns)) == documented_counts(), (
        "the walk's moves and returns changed: update docs/architecture.md", moves, returns)
