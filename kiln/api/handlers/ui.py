"""GET /ui and GET /ui/{asset}: the web playground's page and its files (kiln/ui), served by the
server itself. The page talks to this server only: its Content-Security-Policy allows nothing
else (no CDN, no inline script)."""

from __future__ import annotations

from urllib.parse import unquote

from starlette.requests import Request
from starlette.responses import Response

from kiln.api.errors import ApiError
from kiln.ui import INDEX, asset

HEADERS = {
    "content-security-policy": "default-src 'self'; img-src 'self' data:; object-src 'none'; "
                               "base-uri 'none'; frame-ancestors 'none'",
    "x-content-type-options": "nosniff",
    "cache-control": "no-cache",
}


def _serve(name: str) -> Response:
    found = asset(name)
    if found is None:
        raise ApiError(404, "not_found", f"the page has no file {name[:80]!r}", param="asset")
    body, media = found
    return Response(body, media_type=media, headers=HEADERS)


async def page(request: Request) -> Response:
    return _serve(INDEX)


async def file(request: Request) -> Response:
    name = unquote(str(request.path_params.get("asset", "")))
    if name == INDEX:  # the page itself is /ui
        raise ApiError(404, "not_found", "the page is served at /ui", param="asset")
    return _serve(name)
