"""JSON responses encoded with msgspec (structs, dicts and lists alike)."""

from __future__ import annotations

from typing import Any

import msgspec
from starlette.responses import Response

_encoder = msgspec.json.Encoder()


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(
        _encoder.encode(body), status_code=status, media_type="application/json", headers=headers
    )
