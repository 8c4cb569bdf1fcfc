"""Server-sent events: framing, keep-alives, `[DONE]`, and abort on disconnect."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import msgspec
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from kiln.api._generated import wire
from kiln.api.errors import ApiError

DONE = b"data: [DONE]\n\n"
KEEPALIVE = b": keep-alive\n\n"
_encoder = msgspec.json.Encoder()


def event(payload: Any) -> bytes:
    return b"data: " + _encoder.encode(payload) + b"\n\n"


def generation_error(message: str, fault: ApiError | None = None) -> bytes:
    """The event that ends a stream whose generation failed (then `[DONE]`): the error
    envelope, since the status line has already gone out as 200; ``fault``: the request's own
    (``kiln.api.submission.request_fault``), sent as it is."""
    if fault is not None:
        return b"data: " + fault.body() + b"\n\n"
    return event(wire.ErrorResponse(error=wire.ErrorDetail(
        message=message, type="server_error", param=None, code="generation_error")))


async def with_keepalive(
    source: AsyncIterator[bytes], interval: float = 15.0
) -> AsyncIterator[bytes]:
    """Yield `source`'s frames, and a comment frame whenever it is quiet for `interval` s.

    The source runs in one pump task that appends to a deque; this side waits on one future
    (and one timer) only when the deque is empty, so a frame costs no task of its own.
    """
    loop = asyncio.get_running_loop()
    items: deque[bytes] = deque()
    waiter: asyncio.Future[None] | None = None
    finished = False
    failure: BaseException | None = None

    def wake() -> None:
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def pump() -> None:
        nonlocal finished, failure
        try:
            async for frame in source:
                items.append(frame)
                wake()
        except asyncio.CancelledError:
            raise
        except Exception as e:  # handed to the consumer, raised there
            failure = e
        finally:
            finished = True
            wake()

    task = loop.create_task(pump())
    try:
        while True:
            if items:
                yield items.popleft()
                continue
            if finished:
                if failure is not None:
                    raise failure
                return
            waiter = loop.create_future()
            timer = loop.call_later(interval, wake)
            try:
                await waiter
            finally:
                timer.cancel()
                waiter = None
            if not items and not finished:
                yield KEEPALIVE
    finally:
        task.cancel()
        await asyncio.wait({task})  # the pump leaves the source before it is closed
        if not task.cancelled():
            task.exception()  # retrieved, so it is never reported as unhandled
        aclose = getattr(source, "aclose", None)
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
