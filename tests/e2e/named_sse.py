"""Named SSE events (`event:` then `data:`), as the Responses and Messages streams write them."""

from __future__ import annotations

import json
from typing import Any

from kiln.api.contract import contract


def named_events(text: str) -> list[tuple[str, dict[str, Any]]]:
    out: list[tuple[str, dict[str, Any]]] = []
    name = None
    for line in text.splitlines():
        if line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: "):
            assert name is not None, line
            out.append((name, json.loads(line[6:])))
            name = None
    return out


def check(definition: str, body: Any) -> None:
    violation = contract().first_violation(definition, body)
    assert violation is None, (violation, body)
