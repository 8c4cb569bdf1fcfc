"""GET /health, GET /metrics, GET /openapi.json."""

from __future__ import annotations

from importlib import resources

from starlette.requests import Request
from starlette.responses import Response

from kiln import metrics
from kiln.api import _generated
from kiln.api.encode import json_response
from kiln.api.state import app_state

_OPENAPI: bytes | None = None


async def health(request: Request) -> Response:
    state = app_state(request)
    backend = state.backend
    ready = backend.ready()
    body = {"status": "ok" if ready else "loading", "model": backend.model_id}
    return json_response(body, status=200 if ready else 503)


async def prometheus(request: Request) -> Response:
    state = app_state(request)
    metrics.observe_engine(state.backend.stats())
    payload, content_type = metrics.render()
    return Response(payload, media_type=content_type)


async def openapi(request: Request) -> Response:
    global _OPENAPI
    if _OPENAPI is None:
        _OPENAPI = resources.files(_generated).joinpath("openapi.json").read_bytes()
    return Response(_OPENAPI, media_type="application/json")
