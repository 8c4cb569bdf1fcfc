"""Drive an ASGI app inside this process, without a server socket.

A Ray Serve replica holds one Kiln app (one engine) and is handed requests as plain records by
the ingress; this bridge runs the app's lifespan once and each request as an async generator
of its response: first a `Head` (status and headers), then the body chunks as they are sent, so
an SSE stream stays a stream across the hop. Closing the generator early (the client went
away, Ray cancelled the call) delivers `http.disconnect` to the app, which aborts the engine
request as it does for a real connection.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]],
                   Awaitable[None]]

DISCONNECT_GRACE_S = 5.0  # how long a handler may take to finish after its client went away


@dataclass(frozen=True)
class Forwarded:
    """One HTTP request as the ingress hands it to a replica."""

    method: str
    path: str
    query: bytes
    headers: tuple[tuple[bytes, bytes], ...]
    body: bytes
    routing_key: str | None = None  # session or prompt-prefix affinity (kiln.scale.routing)


@dataclass(frozen=True)
class Head:
    status: int
    headers: tuple[tuple[bytes, bytes], ...]


class InProcessApp:
    """An ASGI app with its lifespan started once; ``request`` runs one HTTP request."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._lifespan: asyncio.Future[None] | None = None
        self._to_app: asyncio.Queue[Message] = asyncio.Queue()
        self._from_app: asyncio.Queue[Message] = asyncio.Queue()

    async def startup(self) -> None:
        if self._lifespan is not None:
            return
        self._lifespan = asyncio.ensure_future(
            self.app({"type": "lifespan", "asgi": {"version": "3.0"}}, self._to_app.get,
                     self._from_app.put))
        await self._to_app.put({"type": "lifespan.startup"})
        reply = await self._from_app.get()
        if reply["type"] != "lifespan.startup.complete":
            raise RuntimeError(f"the app did not start: {reply.get('message', reply['type'])}")

    async def shutdown(self) -> None:
        if self._lifespan is None:
            return
        await self._to_app.put({"type": "lifespan.shutdown"})
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._from_app.get(), DISCONNECT_GRACE_S * 6)
        self._lifespan = None

    async def request(self, req: Forwarded) -> AsyncIterator[Head | bytes]:
        """The response to ``req``: a Head, then body chunks (possibly empty ones)."""
        sent: asyncio.Queue[Message] = asyncio.Queue()
        gone = asyncio.Event()
        delivered = False

        async def receive() -> Message:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": req.body, "more_body": False}
            await gone.wait()
            return {"type": "http.disconnect"}

        scope: Scope = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
            "method": req.method, "scheme": "http", "path": req.path, "raw_path": req.path.encode(),
            "query_string": req.query, "root_path": "", "headers": list(req.headers),
            "client": ("127.0.0.1", 0), "server": ("127.0.0.1", 0),
        }
        task: asyncio.Future[None] = asyncio.ensure_future(self.app(scope, receive, sent.put))
        finished = False
        try:
            while True:
                getter: asyncio.Future[Any] = asyncio.ensure_future(sent.get())
                waiting: set[asyncio.Future[Any]] = {getter, task}
                done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                if getter not in done:
                    getter.cancel()
                    task.result()  # the app raised: let the caller see it
                    raise RuntimeError("the app returned without a complete response")
                message = getter.result()
                if message["type"] == "http.response.start":
                    yield Head(int(message["status"]),
                               tuple((bytes(k), bytes(v)) for k, v in message.get("headers", ())))
                elif message["type"] == "http.response.body":
                    yield bytes(message.get("body", b""))
                    if not message.get("more_body", False):
                        finished = True
                        return
        finally:
            if not finished:
                gone.set()  # the app sees its client leave and aborts the engine request
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(asyncio.shield(task), DISCONNECT_GRACE_S)
            if not task.done():
                task.cancel()
