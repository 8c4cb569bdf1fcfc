"""Responses encoded with msgspec: the generated structs of the contract (kiln/api/_generated/
wire.py), so that the contract types what leaves as well as what enters."""

from __future__ import annotations

from typing import Any, Literal

import msgspec
from starlette.responses import Response

from kiln.api._generated import wire

_encoder = msgspec.json.Encoder()

Finish = Literal["error", "length", "stop", "tool_calls"]


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(
        _encoder.encode(body), status_code=status, media_type="application/json", headers=headers
    )


def usage(prompt_tokens: int, completion_tokens: int) -> wire.Usage:
    """Token usage, its total the sum (every route's)."""
    return wire.Usage(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                      total_tokens=prompt_tokens + completion_tokens)


def as_wire(value: Any) -> Any:
    """A nested object a lower layer builds in the contract's shape and key order, carried into
    a generated struct's field as it is (msgspec encodes it unchanged; the response tests check
    it against the contract): the thinking-budget record and outcome (kiln/text/thinking.py) and
    the rollout record (kiln/provenance.py), which cannot import the edge's structs."""
    return value


def finish_reason(engine: str | None) -> Finish:
    """The engine's finish reason as the wire tells it: "length", or "stop" (a stop string, a
    stop token, EOS)."""
    return "length" if engine == "length" else "stop"
