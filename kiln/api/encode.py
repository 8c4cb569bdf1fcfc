"""Responses encoded with msgspec: the generated structs of the contract (kiln/api/_generated/
wire.py), so that the contract types what leaves as well as what enters."""

from __future__ import annotations

from typing import Any, Literal

import msgspec
from starlette.responses import Response

_encoder = msgspec.json.Encoder()

Finish = Literal["error", "length", "stop", "tool_calls"]


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(
        _encoder.encode(body), status_code=status, media_type="application/json", headers=headers
    )


def as_wire(value: Any) -> Any:
    """A nested object another stage already builds in the contract's shape and key order (the
    thinking-budget record and outcome, performance metadata, a rollout record, logprob
    entries), carried into a generated struct's field as it is: msgspec encodes it unchanged,
    and the response tests check it against the contract."""
    return value


def finish_reason(engine: str | None) -> Finish:
    """The engine's finish reason as the wire tells it: "length", or "stop" (a stop string, a
    stop token, EOS)."""
    return "length" if engine == "length" else "stop"
