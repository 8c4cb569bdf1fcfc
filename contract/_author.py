"""Author the Kiln contract files from the published field tables.

The JSON files next to this script are the artifact and the single source of truth; this script is
how they were written, kept for maintainers. It builds every definition field by field from the
tables of the seed documentation page (``kiln-inference-contract-v1.md``), copies its composition
rules and ``x-kiln-*`` annotations verbatim, applies the fixes listed in ``CHANGELOG.md``, and
dumps deterministic JSON (``indent=2``, definition order kept, exact integers).

The tables live in the ``authoring`` package next to this script, one module per group of
definitions; ``authoring.build`` assembles them.

Usage::

    python contract/_author.py          # rewrite the JSON files
    python contract/_author.py --check  # exit 1 when a file differs from what this script writes
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from authoring.build import (  # noqa: E402
    inference_defs,
    inference_schema,
    outputs,
    render,
    routes,
    thinking_budget_schema,
)

__all__ = [
    "inference_defs",
    "inference_schema",
    "main",
    "outputs",
    "render",
    "routes",
    "thinking_budget_schema",
]


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = []
    for name, text in outputs().items():
        path = HERE / name
        if check:
            if not path.is_file() or path.read_text(encoding="utf-8") != text:
                stale.append(name)
        else:
            path.write_text(text, encoding="utf-8")
    if stale:
        print("out of date: " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
