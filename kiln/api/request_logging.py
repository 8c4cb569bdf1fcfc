"""The edge's half of the request log (kiln/request_log.py): a middleware that keeps a copy of
each inference request's body and of its response (JSON, or the whole event stream) and, when
the response has ended (or the client went away), hands both to the log with the request's
facts. Installed only with ``--request-log``; the log's writer thread does the rest."""

from __future__ import annotations

import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kiln.request_log import Captured, RequestLog

# the routes that run the model: what a dataset is made of
LOGGED = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/completions/batch",
                    "/v1/responses", "/v1/messages", "/inference/v1/generate"})


class RequestLogMiddleware:
    def __init__(self, app: ASGIApp, log: RequestLog) -> None:
        self.app = app
        self.log = log

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or scope.get("method") != "POST" or path not in LOGGED:
            await self.app(scope, receive, send)
            return
        began, wall = time.perf_counter(), time.time()
        request: list[bytes] = []
        response: list[bytes] = []
        status, media = 500, ""

        async def receive_copy() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                request.append(message.get("body", b""))
            return message

        async def send_copy(message: Message) -> None:
            nonlocal status, media
            if message["type"] == "http.response.start":
                status = int(message["status"])
                for key, value in message.get("headers", []):
                    if key == b"content-type":
                        media = value.decode("latin-1").split(";", 1)[0].strip()
            elif message["type"] == "http.response.body":
                response.append(message.get("body", b""))
            await send(message)

        try:
            await self.app(scope, receive_copy, send_copy)
        finally:
            state = scope.get("state", {})
            self.log.record(Captured(
                time=wall, request_id=str(state.get("request_id", "")),
                method="POST", route=path, status=status,
                duration_ms=(time.perf_counter() - began) * 1000,
                request_body=b"".join(request), response_body=b"".join(response),
                response_type=media))
