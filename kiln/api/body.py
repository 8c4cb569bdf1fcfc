"""Reading a request body: content type (415), size limit (413), bytes out."""

from __future__ import annotations

from starlette.requests import ClientDisconnect, Request

from kiln.api.errors import ApiError

JSON_TYPES = ("application/json",)


def _media_type(request: Request) -> str:
    raw = request.headers.get("content-type", "")
    return raw.split(";", 1)[0].strip().lower()


async def read_json_body(request: Request, limit: int) -> bytes:
    media = _media_type(request)
    if media not in JSON_TYPES and not media.endswith("+json"):
        shown = media or "none"
        raise ApiError(
            415,
            "unsupported_media_type",
            f"Content-Type must be application/json (got {shown})",
        )
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise _too_large(limit)
            chunks.append(chunk)
    except ClientDisconnect:  # gone mid-upload: counted as 499 like any disconnect, not a 500
        raise ApiError(499, "client_disconnected", "client closed the connection") from None
    body = b"".join(chunks)
    if not body.strip():
        raise ApiError(400, "invalid_json", "request body is empty; a JSON object is required")
    return body


def _too_large(limit: int) -> ApiError:
    return ApiError(413, "request_too_large", f"request body exceeds the limit of {limit} bytes")
