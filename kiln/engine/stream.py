"""RequestStream: the one async iterator between an engine request and its caller (no torch).

The engine fills a request's queue from its thread; the caller (a handler, a test, a bench)
iterates the stream until the output that is ``finished``. Closing the stream early, even before
iterating, or cancelling a wait for its next output, aborts the request; callbacks added with
``on_close`` (a handler's admission slot) run once, when the stream ends or is closed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from kiln.engine.outputs import RequestOutput

__all__ = ["RequestStream"]


class RequestStream:
    """``next_output`` awaits the request's next output (the engine: its queue's ``get``);
    ``abort`` ends the request early (sync, any thread); ``close_source`` (optional) is awaited
    by ``aclose`` for a source that must be closed itself (an async generator)."""

    def __init__(self, request_id: str, next_output: Callable[[], Awaitable[RequestOutput]],
                 abort: Callable[[str], None] | None = None,
                 close_source: Callable[[], Awaitable[None]] | None = None) -> None:
        self.request_id = request_id
        self._next = next_output
        self._abort = abort
        self._close_source = close_source
        self._finished = False  # the finished output was handed out
        self._closed = False
        self._on_close: list[Callable[[], None]] = []

    @classmethod
    def over_queue(cls, request_id: str, queue: asyncio.Queue[RequestOutput],
                   abort: Callable[[str], None]) -> RequestStream:
        return cls(request_id, queue.get, abort)

    def on_close(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once, when the stream ends or is closed (at once if it is)."""
        if self._closed:
            callback()
        else:
            self._on_close.append(callback)

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> RequestOutput:
        if self._finished or self._closed:
            self.close_now()
            raise StopAsyncIteration
        try:
            out = await self._next()
        except StopAsyncIteration:  # a source that ended without a finished output
            self._finished = True
            self.close_now()
            raise
        except asyncio.CancelledError:  # the caller gave up waiting: nobody reads on
            self.close_now()
            raise
        self._finished = out.finished
        return out

    def close_now(self) -> None:
        """Abort the request unless it finished, and run the close callbacks (idempotent)."""
        if self._closed:
            return
        self._closed = True
        if not self._finished and self._abort is not None:
            self._abort(self.request_id)
        callbacks, self._on_close = self._on_close, []
        for callback in callbacks:
            callback()

    async def aclose(self) -> None:
        self.close_now()
        close, self._close_source = self._close_source, None
        if close is not None:
            await close()
