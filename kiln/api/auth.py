"""Optional API-key authentication (`--api-key` / KILN_API_KEY; several keys allowed).

A missing or wrong key gets 401 on every /v1 route (and on /metrics when configured); /health
stays public. Keys are compared in constant time and never logged.
"""

from __future__ import annotations

import hmac

from starlette.types import ASGIApp, Receive, Scope, Send

from kiln.api.errors import ApiError


def _presented_key(scope: Scope) -> str | None:
    headers: list[tuple[bytes, bytes]] = scope.get("headers", [])
    for key, value in headers:
        if key == b"authorization":
            text = value.decode("latin-1")
            scheme, _, token = text.partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
        elif key == b"x-api-key":
            return value.decode("latin-1").strip() or None
    return None


# vLLM's tokenizer routes sit outside /v1; they run the tokenizer, so the key guards them too.
TOKENIZER_ROUTES = frozenset({"/tokenize", "/detokenize", "/tokenizer_info"})
# a training loop's routes (vLLM's names) change what every client gets: guarded as well
TRAINING_ROUTES = frozenset({"/pause", "/resume", "/is_paused", "/reset_prefix_cache", "/sleep",
                             "/wake_up", "/is_sleeping", "/update_weights_from_disk",
                             "/inference/v1/generate"})


class ApiKeyMiddleware:
    def __init__(self, app: ASGIApp, keys: tuple[str, ...], protect_metrics: bool) -> None:
        self.app = app
        self.keys = tuple(k.encode() for k in keys)
        self.protect_metrics = protect_metrics

    def protects(self, path: str) -> bool:
        return path.startswith("/v1/") or path == "/v1" or path in TOKENIZER_ROUTES or \
            path in TRAINING_ROUTES or (
            self.protect_metrics and path == "/metrics"
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.keys or not self.protects(scope.get("path", "")):
            await self.app(scope, receive, send)
            return
        presented = _presented_key(scope)
        if presented is None:
            error = ApiError(
                401, "missing_api_key", "an API key is required (Authorization: Bearer <key>)"
            )
        elif not any(hmac.compare_digest(presented.encode(), k) for k in self.keys):
            error = ApiError(401, "invalid_api_key", "the API key is not valid")
        else:
            await self.app(scope, receive, send)
            return
        body = error.body_for(scope.get("path", ""))
        await send({
            "type": "http.response.start",
            "status": 401,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"www-authenticate", b"Bearer"),
            ],
        })
        await send({"type": "http.response.body", "body": body})
