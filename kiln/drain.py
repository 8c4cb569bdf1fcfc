"""uvicorn's server with one addition for SIGTERM: shortly before the drain window
(``--drain-timeout-s``) runs out, every engine request still in flight is ended with an error,
so that its handler answers it (non-streaming: 503 ``engine_not_running`` in the envelope;
a stream: an error event and ``[DONE]``). Without it uvicorn cancels the handlers' tasks at the
deadline: a plain-text 500 for a non-streaming request, a stream cut with no error event."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable

import uvicorn

DRAIN_MARGIN_S = 0.5  # before uvicorn's own cancel: time for the handlers to answer
DRAIN_MESSAGE = "the server is shutting down and its drain time ran out before this request ended"


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, on_expiry: Callable[[], None]) -> None:
        super().__init__(config)
        self._on_expiry = on_expiry

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        grace = self.config.timeout_graceful_shutdown
        handle = None
        if grace is not None:
            handle = asyncio.get_running_loop().call_later(
                max(0.0, grace - DRAIN_MARGIN_S), self._on_expiry)
        try:
            await super().shutdown(sockets)
        finally:
            if handle is not None:
                handle.cancel()
