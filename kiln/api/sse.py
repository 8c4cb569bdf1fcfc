"""Server-sent events: framing, keep-alives, `[DONE]`, and abort on disconnect."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import msgspec
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

DONE = b"data: [DONE]\n\n"
KEEPALIVE = b": keep-alive\n\n"
_encoder = msgspec.json.Encoder()


def event(payload: Any) -> bytes:
    return b"data: " + _encoder.encode(payload) + b"\n\n"


async def with_keepalive(
    source: AsyncIterator[bytes], interval: float = 15.0
) -> AsyncIterator[bytes]:
    """Yield `source`'s frames, and a comment frame whenever it is quiet for `interval` s."""
    iterator = source.__aiter__()
    pending: asyncio.Task[bytes] | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(iterator.__anext__())
            done, _ = await asyncio.wait({pending}, timeout=interval)
            if not done:
                yield KEEPALIVE
                continue
            try:
                frame = pending.result()
            except StopAsyncIteration:
                return
            finally:
                if done:
                    pending = None
            yield frame
    finally:
        if pending is not None:
            pending.cancel()
            # let the cancelled __anext__ leave the generator before closing it
            await asyncio.wait({pending})
            if not pending.cancelled():
                pending.exception()  # retrieve it, so it is never reported as unhandled
        aclose = getattr(iterator, "aclose", None)
        if aclose is not None:
            await aclose()


class EventStream(StreamingResponse):
    """A text/event-stream response; the source generator is closed (aborting the engine request)
    when the client disconnects."""

    def __init__(
        self,
        source: AsyncIterator[bytes],
        headers: dict[str, str] | None = None,
        on_close: Callable[[], Awaitable[None]] | None = None,
    ):
        self.on_close = on_close
        super().__init__(
            with_keepalive(source),
            media_type="text/event-stream",
            headers={"cache-control": "no-cache", "x-accel-buffering": "no", **(headers or {})},
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                await aclose()
            if self.on_close is not None:  # even if the body never started
                await self.on_close()
