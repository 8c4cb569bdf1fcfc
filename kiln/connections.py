"""The HTTP connection layer under the app: uvicorn's h11 protocol with read deadlines, a
connection bound, errors in the envelope and a drain that does not wait on half-sent requests.

- Headers must arrive within ``--header-timeout-s`` of the connection opening (or of the first
  byte of the next request on a kept-alive connection), a body within ``--body-timeout-s`` of
  its headers; else a 408 in the error envelope, when no response has started, and the
  connection is closed. An idle kept-alive connection is closed after ``--keep-alive-s``
  (uvicorn's own keep-alive timer). No deadline runs while a response is written: streams are
  never cut by these.
- A connection accepted while ``--max-connections`` are open is answered 503
  ``server_overloaded`` with ``Retry-After`` as soon as its headers arrive (or a 408 at the
  header deadline), never reaching the app, and closed. uvicorn's ``limit_concurrency`` does
  the same check but answers in plain text (and counts running tasks too).
- A client that stops reading: once our output waits in the transport's buffer (a stream
  paused by flow control, or a response still unsent when the connection is to close), no
  byte going out for ``--send-timeout-s`` aborts the connection (a stream's engine request is
  then aborted as on any disconnect). A slow reader that takes any byte in that time is not cut.
- Requests h11 cannot parse (malformed chunked encoding, bad request lines) get a 400 and a
  request line plus headers past 16 KiB a 431, in the envelope (uvicorn's answer is plain text).
- On SIGTERM (uvicorn calls ``shutdown`` on each connection) idle connections, ones still
  sending headers and ones still sending a body are closed at once (a body in flight gets a
  503 first); requests received in full are drained by uvicorn as before.

Every response written here ends the connection with a lingering close: the response, then a
half-close, then whatever the client still sends is read and dropped until it closes (at most
``LINGER_S``), so that its unread bytes do not turn our close into a reset that destroys the
response before the client reads it.
"""

from __future__ import annotations

import asyncio
import http
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from kiln import metrics
from kiln.api.errors import ApiError
from kiln.config import ServerConfig
from kiln.drain import DrainingServer

log = logging.getLogger("kiln.connections")

MAX_HEADER_BYTES = 16 * 1024  # request line and headers (h11's own bound for pieces)
LINGER_S = 2.0  # after our response: how long the client's remaining bytes are read and dropped
RETRY_AFTER_S = 1


@dataclass(frozen=True)
class Limits:
    header_timeout_s: float
    body_timeout_s: float
    keep_alive_s: float
    max_connections: int
    send_timeout_s: float = 60.0

    @classmethod
    def of(cls, config: ServerConfig) -> Limits:
        return cls(config.header_timeout_s, config.body_timeout_s, config.keep_alive_s,
                   config.max_connections, config.send_timeout_s)


class KilnH11Protocol(H11Protocol):
    """One HTTP/1.1 connection. Subclassed by ``protocol_class`` with the server's limits."""

    LIMITS: ClassVar[Limits]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.timeout_keep_alive = self.LIMITS.keep_alive_s  # type: ignore[assignment]
        self._deadline: asyncio.TimerHandle | None = None
        self._deadline_kind = ""  # "headers" or "body" while a deadline runs
        self._ended = False  # a response of ours is out; reading and dropping until closed
        self._protocol_error: h11.RemoteProtocolError | None = None
        self._send_watch: asyncio.TimerHandle | None = None
        next_event = self.conn.next_event

        def recording_next_event() -> Any:  # keeps h11's exception for send_400_response
            try:
                return next_event()
            except h11.RemoteProtocolError as exc:
                self._protocol_error = exc
                raise

        self.conn.next_event = recording_next_event  # type: ignore[method-assign]

    # -- connection events ---------------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        metrics.CONNECTIONS.inc()
        if len(self.connections) > self.LIMITS.max_connections:
            self.app = self._overloaded  # its request never reaches the app
        self._arm("headers")

    def connection_lost(self, exc: Exception | None) -> None:
        metrics.CONNECTIONS.dec()
        self._disarm()
        if self._send_watch is not None:
            self._send_watch.cancel()
            self._send_watch = None
        super().connection_lost(exc)

    def pause_writing(self) -> None:
        super().pause_writing()
        self._watch_sending()  # the client stopped reading, or reads slower than we write

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._send_watch is not None:  # it drained to the low-water mark: progress
            self._send_watch.cancel()
            self._send_watch = None

    def _watch_sending(self) -> None:
        if self._send_watch is None:
            size = self.transport.get_write_buffer_size()
            self._send_watch = self.loop.call_later(self.LIMITS.send_timeout_s,
                                                    self._check_sending, size)

    def _check_sending(self, size_then: int) -> None:
        """No byte of our buffered output went out in ``send_timeout_s``: the client is not
        reading; abort (nothing more can be written to it). Any progress re-arms the watch."""
        self._send_watch = None
        size = self.transport.get_write_buffer_size()
        if size == 0:
            return
        if size < size_then:
            self._send_watch = self.loop.call_later(self.LIMITS.send_timeout_s,
                                                    self._check_sending, size)
            return
        metrics.CONNECTIONS_ENDED.labels(reason="send_timeout").inc()
        self.transport.abort()

    def data_received(self, data: bytes) -> None:
        if self._ended:
            return  # lingering close: read and dropped
        if self.conn.their_state is h11.IDLE:
            if self._deadline is None:
                self._arm("headers")  # the first byte of a request on a kept-alive connection
            if self._headers_too_large(data):
                return
        super().data_received(data)

    def _headers_too_large(self, data: bytes) -> bool:
        """h11 bounds only headers that arrive in pieces; this bounds them however they come."""
        pending = self.conn.trailing_data[0] + data
        if len(pending) <= MAX_HEADER_BYTES or b"\r\n\r\n" in pending[:MAX_HEADER_BYTES + 4]:
            return False
        self._end(431, "request_header_fields_too_large",
                  f"the request line and headers are larger than {MAX_HEADER_BYTES} bytes",
                  "bad_request")
        return True

    def handle_events(self) -> None:
        super().handle_events()
        if self._ended:
            return
        state = self.conn.their_state
        if state is h11.IDLE:
            if self._deadline is None and self.conn.trailing_data[0]:
                self._arm("headers")  # a pipelined request's first bytes
        elif state is h11.SEND_BODY:
            if self._deadline_kind != "body":
                self._arm("body")
        else:
            self._disarm()

    def send_400_response(self, msg: str) -> None:
        exc = self._protocol_error
        if exc is not None and exc.error_status_hint == 431:
            self._end(431, "request_header_fields_too_large",
                      f"the request's headers are larger than the limit ({exc})", "bad_request")
        else:
            detail = f": {exc}" if exc is not None else ""
            self._end(400, "invalid_http_request", f"malformed HTTP request{detail}",
                      "bad_request")

    def shutdown(self) -> None:
        if self._ended:
            self.transport.close()
            return
        state = self.conn.their_state
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete and state is h11.SEND_BODY:
            self._end(503, "server_shutting_down",
                      "the server is shutting down; the request's body had not arrived",
                      "draining", retry=True)
        elif cycle is None or cycle.response_complete or state is h11.ERROR:
            metrics.CONNECTIONS_ENDED.labels(reason="draining").inc()
            self._disarm()
            self.transport.close()
        else:
            super().shutdown()  # received in full: uvicorn lets it finish, then closes

    def timeout_keep_alive_handler(self) -> None:
        if not self._ended:
            if self.transport.get_write_buffer_size():
                self._watch_sending()  # close() waits for the buffer: bound that wait too
            super().timeout_keep_alive_handler()

    # -- deadlines -----------------------------------------------------------------------------
    def _arm(self, kind: str) -> None:
        self._disarm()
        seconds = (self.LIMITS.header_timeout_s if kind == "headers"
                   else self.LIMITS.body_timeout_s)
        self._deadline_kind = kind
        self._deadline = self.loop.call_later(seconds, self._expire)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline = None
        self._deadline_kind = ""

    def _expire(self) -> None:
        kind = self._deadline_kind
        self._deadline = None
        self._deadline_kind = ""
        if self.transport.is_closing() or self._ended:
            return
        cycle = self.cycle
        if kind == "headers" and self.conn.their_state is h11.IDLE:
            self._end(408, "request_timeout", "the request's headers did not arrive within "
                      f"{self.LIMITS.header_timeout_s:g} s", "header_timeout")
        elif kind == "body" and self.conn.their_state is h11.SEND_BODY:
            if cycle is not None and not cycle.response_started:
                self._end(408, "request_timeout", "the request's body did not arrive within "
                          f"{self.LIMITS.body_timeout_s:g} s", "body_timeout")
            elif cycle is None or cycle.response_complete:  # answered early (413, 401, ...)
                metrics.CONNECTIONS_ENDED.labels(reason="body_timeout").inc()
                self.transport.close()
            # else a response is being written: never cut it

    # -- our own responses ---------------------------------------------------------------------
    async def _overloaded(self, scope: Any, receive: Any, send: Any) -> None:
        self._end(503, "server_overloaded",
                  f"the server holds its maximum of {self.LIMITS.max_connections} connections; "
                  f"retry after {RETRY_AFTER_S} s", "overloaded", retry=True)

    def _end(self, status: int, code: str, message: str, reason: str,
             retry: bool = False) -> None:
        """Write ``status`` in the envelope (unless a response has started), then close."""
        if self._ended:  # e.g. a 400 for the body went out before the 503 app ran
            return
        metrics.CONNECTIONS_ENDED.labels(reason=reason).inc()
        self._disarm()
        self._unset_keepalive_if_required()
        self._ended = True
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            started = cycle.response_started
            cycle.disconnected = True  # the app, if it runs, sees http.disconnect; its sends drop
            cycle.message_event.set()
            if started:
                self.transport.close()
                return
        if self.transport.is_closing():
            return
        headers = {"retry-after": str(RETRY_AFTER_S)} if retry else {}
        self.transport.write(_response(ApiError(status, code, message, headers=headers)))
        if self.flow is not None:
            self.flow.resume_reading()
        if self.transport.can_write_eof():
            self.transport.write_eof()
            self.loop.call_later(LINGER_S, self._close_lingering)
        else:
            self.transport.close()


    def _close_lingering(self) -> None:
        if self.transport.get_write_buffer_size():
            self._watch_sending()
        self.transport.close()


def _response(err: ApiError) -> bytes:
    body = err.body()
    phrase = http.HTTPStatus(err.status).phrase
    lines = [f"HTTP/1.1 {err.status} {phrase}", "content-type: application/json",
             f"content-length: {len(body)}", "connection: close",
             f"x-request-id: {uuid.uuid4().hex}"]
    lines += [f"{k}: {v}" for k, v in err.headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def protocol_class(limits: Limits) -> type[KilnH11Protocol]:
    return type("BoundKilnH11Protocol", (KilnH11Protocol,), {"LIMITS": limits})


def server_for(app: Any, config: ServerConfig, on_expiry: Callable[[], None]) -> DrainingServer:
    """The uvicorn server `kiln serve` runs: our protocol, limits and drain."""
    return DrainingServer(
        uvicorn.Config(app, host=config.host, port=config.port, log_level=config.log_level,
                       http=protocol_class(Limits.of(config)),
                       # no route is a WebSocket: an upgrade request is an HTTP request like
                       # any other (it had been a bare 403 with no error body), and start-up
                       # no longer imports the websockets package
                       ws="none",
                       timeout_graceful_shutdown=int(config.drain_timeout_s)),
        on_expiry=on_expiry,
    )
