"""The served weights' names on the wire: ``weight_version`` on a response and, for a
generation that ran across a keep-mode weight update, its ``weight_versions`` spans (vLLM's).
The engine records which weights made which output token (``kiln.engine.outputs.WeightSpan``);
this is the one place that turns those records into the contract's fields."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kiln.api._generated import wire
from kiln.engine.outputs import WeightSpan


def version_of(spans: Sequence[WeightSpan], ended: str | None, backend: Any) -> str:
    """The weights that made a generation's last token; with no token, those serving when it
    ended (``ended``), else those serving now (``backend.weight_version``, read only then)."""
    if spans:
        return spans[-1].version
    return ended if ended is not None else str(backend.weight_version)


def spans_wire(spans: Sequence[WeightSpan]) -> list[wire.WeightVersionSpan] | None:
    """The spans as the contract has them, or None for a generation made by one set of
    weights (the field is then left out)."""
    if len(spans) < 2:
        return None
    return [wire.WeightVersionSpan(version=s.version, start=s.start, end=s.end) for s in spans]


def spans_json(spans: Sequence[WeightSpan]) -> list[dict[str, Any]]:
    """Every span as plain JSON (the token-in/token-out route reports them always)."""
    return [{"version": s.version, "start": s.start, "end": s.end} for s in spans]
