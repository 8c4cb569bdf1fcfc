"""Read deadlines, the connection bound, protocol errors and the drain, over real sockets against
a live uvicorn (kiln's protocol and server) on 127.0.0.1 with the fake backend.

Deadlines are short (0.5 s) and every wait for an outcome is a hang bound (tests.HANG_S); no test
asserts that anything happened fast, only that it happened and what was sent."""

from __future__ import annotations

import json
import logging
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from kiln import metrics
from kiln.api.app import build_app
from kiln.config import ServerConfig
from kiln.connections import MAX_HEADER_BYTES, server_for
from kiln.drain import DrainingServer
from kiln.startup import bind_listener
from tests import HANG_S
from tests.api.fake_backend import FakeBackend

CHAT = b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
HEALTH = b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n"


class Live:
    def __init__(self, server: DrainingServer, port: int, thread: threading.Thread) -> None:
        self.server = server
        self.port = port
        self.thread = thread

    def connect(self) -> socket.socket:
        s = socket.create_connection(("127.0.0.1", self.port), timeout=HANG_S)
        s.settimeout(HANG_S)
        return s


@contextmanager
def live(backend: FakeBackend | None = None, **overrides: object) -> Iterator[Live]:
    settings: dict[str, object] = {"header_timeout_s": 0.5, "body_timeout_s": 0.5,
                                   "keep_alive_s": 0.5, "log_level": "warning"}
    settings.update(overrides)
    sock = bind_listener("127.0.0.1", 0)
    port = sock.getsockname()[1]
    config = ServerConfig(port=port, **settings)  # type: ignore[arg-type]
    app = build_app(config, backend or FakeBackend())
    server = server_for(app, config, on_expiry=lambda: None)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "server did not start"
        time.sleep(0.02)
    try:
        yield Live(server, port, thread)
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def read_to_close(s: socket.socket) -> bytes:
    """Everything the server sends until it closes (a timeout here fails the test)."""
    out = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            return out
        out += chunk


def parse(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers, body


def assert_envelope(raw: bytes, status: int, code: str) -> dict[str, str]:
    got, headers, body = parse(raw)
    assert got == status, raw
    assert headers["content-type"] == "application/json"
    error = json.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == code and error["message"]
    assert headers["connection"] == "close"
    return headers


def test_headers_that_never_arrive_get_408_and_the_connection_closes() -> None:
    with live() as srv:
        silent = srv.connect()  # sends nothing at all
        partial = srv.connect()
        partial.sendall(CHAT)  # no blank line: the headers never end
        assert_envelope(read_to_close(silent), 408, "request_timeout")
        assert_envelope(read_to_close(partial), 408, "request_timeout")


def test_headers_sent_a_byte_at_a_time_still_meet_the_deadline() -> None:
    """The deadline is for the whole header block, not between bytes."""
    with live() as srv:
        s = srv.connect()
        got = b""
        for byte in CHAT * 20:  # bounded: ~1,600 bytes, far longer than the deadline
            try:
                s.sendall(bytes([byte]))
            except OSError:  # closed under us: the answer is already waiting
                break
            time.sleep(0.005)
        got = read_to_close(s)
        assert_envelope(got, 408, "request_timeout")


def test_a_body_that_never_arrives_gets_408_and_the_connection_closes() -> None:
    with live(header_timeout_s=30.0) as srv:
        stalled = srv.connect()
        stalled.sendall(CHAT + b"Content-Length: 100000\r\n\r\n{")
        trickle = srv.connect()
        trickle.sendall(CHAT + b"Content-Length: 100000\r\n\r\n")
        for _ in range(40):  # a byte every 50 ms: each arrives in time, the body never does
            try:
                trickle.sendall(b" ")
            except OSError:
                break
            time.sleep(0.05)
        assert_envelope(read_to_close(stalled), 408, "request_timeout")
        assert_envelope(read_to_close(trickle), 408, "request_timeout")


def test_a_complete_request_is_answered_then_the_idle_connection_closes() -> None:
    with live(header_timeout_s=30.0) as srv:
        s = srv.connect()
        s.sendall(HEALTH)
        raw = read_to_close(s)  # the keep-alive timer ends it; no second response follows
        status, _, body = parse(raw)
        assert status == 200 and json.loads(body)["status"] == "ok"
        assert raw.count(b"HTTP/1.1") == 1


def test_a_stream_outlives_every_deadline() -> None:
    backend = FakeBackend()
    backend.delay = 0.1  # ~2.7 s of stream against 0.5 s deadlines
    with live(backend) as srv:
        s = srv.connect()
        body = json.dumps({"messages": [{"role": "user", "content": "hi"}],
                           "stream": True}).encode()
        s.sendall(CHAT + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        raw = read_to_close(s)
        status, headers, rest = parse(raw)
        assert status == 200 and headers["content-type"].startswith("text/event-stream")
        assert b"data: [DONE]" in rest
        assert b'"finish_reason":"stop"' in rest


def test_past_max_connections_a_connection_gets_503_with_retry_after() -> None:
    with live(header_timeout_s=30.0, max_connections=2) as srv:
        held = [srv.connect(), srv.connect()]
        deadline = time.monotonic() + 120
        while open_connections() < 2:  # the server accepted both before the third arrives
            assert time.monotonic() < deadline, "the two connections were never accepted"
            time.sleep(0.02)
        extra = srv.connect()
        extra.sendall(HEALTH)
        headers = assert_envelope(read_to_close(extra), 503, "server_overloaded")
        assert headers["retry-after"] == "1"
        for s in held:
            s.close()
        deadline = time.monotonic() + HANG_S
        while True:  # once the held ones are gone, a new connection is served
            again = srv.connect()
            again.sendall(HEALTH)
            if parse(read_to_close(again))[0] == 200:
                break
            assert time.monotonic() < deadline, "never served again after the bound freed"
            time.sleep(0.1)


@pytest.mark.parametrize("send", [
    lambda s: s.sendall(CHAT + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n"),
    lambda s: s.sendall(CHAT + b"Transfer-Encoding: chunked\r\n\r\n5\r\n{}{}{}\r\n"),
    lambda s: s.sendall(b"NOT HTTP AT ALL\r\n\r\n"),
], ids=["bad-chunk-size", "chunk-longer-than-its-size", "garbage-request-line"])
def test_malformed_requests_get_400_in_the_envelope(send: Callable[[socket.socket], None]) -> None:
    with live(header_timeout_s=30.0, body_timeout_s=30.0) as srv:
        s = srv.connect()
        send(s)
        assert_envelope(read_to_close(s), 400, "invalid_http_request")


@pytest.mark.parametrize("pieces", [1, 8], ids=["one-piece", "in-pieces"])
def test_oversized_headers_get_431(pieces: int) -> None:
    with live(header_timeout_s=30.0) as srv:
        s = srv.connect()
        request = b"GET /health HTTP/1.1\r\nHost: t\r\nX-Big: " + b"a" * MAX_HEADER_BYTES + b"\r\n\r\n"
        step = len(request) // pieces + 1
        for i in range(0, len(request), step):
            try:
                s.sendall(request[i:i + step])
            except OSError:
                break
            time.sleep(0.02)
        assert_envelope(read_to_close(s), 431, "request_header_fields_too_large")


def test_headers_just_under_the_bound_are_served() -> None:
    with live(header_timeout_s=30.0) as srv:
        s = srv.connect()
        head = b"GET /health HTTP/1.1\r\nHost: t\r\nX-Big: "
        s.sendall(head + b"a" * (MAX_HEADER_BYTES - len(head) - 8) + b"\r\n\r\n")
        assert parse(read_to_close(s))[0] == 200


def test_drain_closes_idle_and_half_received_connections_at_once() -> None:
    backend = FakeBackend()
    backend.delay = 0.05
    with live(backend, header_timeout_s=60.0, body_timeout_s=60.0, keep_alive_s=60.0,
              drain_timeout_s=60.0) as srv:
        idle = srv.connect()
        headers = srv.connect()
        headers.sendall(CHAT)
        body = srv.connect()
        body.sendall(CHAT + b"Content-Length: 100000\r\n\r\n{")
        kept = srv.connect()
        kept.sendall(HEALTH)
        full = srv.connect()  # received in full: drained to its end
        chat = json.dumps({"messages": [{"role": "user", "content": "hi"}]}).encode()
        full.sendall(CHAT + f"Content-Length: {len(chat)}\r\n\r\n".encode() + chat)
        deadline = time.monotonic() + 120  # however loaded the machine: both were received
        while not (backend.submitted and select.select([kept], [], [], 0)[0]):
            assert time.monotonic() < deadline, "the complete requests never reached the app"
            time.sleep(0.02)
        started = time.monotonic()
        srv.server.should_exit = True  # what SIGTERM sets
        assert read_to_close(idle) == b""
        assert read_to_close(headers) == b""
        assert_envelope(read_to_close(body), 503, "server_shutting_down")
        assert parse(read_to_close(kept))[0] == 200
        status, _, reply = parse(read_to_close(full))
        assert status == 200 and json.loads(reply)["choices"][0]["finish_reason"] == "stop"
        srv.thread.join(timeout=45)
        assert not srv.thread.is_alive()
        # not held until the 60 s drain deadline by the half-sent requests
        assert time.monotonic() - started < 45


def open_connections() -> float:
    return metrics.REGISTRY.get_sample_value("kiln_http_connections") or 0.0


def ended(reason: str) -> float:
    value = metrics.REGISTRY.get_sample_value("kiln_http_connections_ended_total",
                                              {"reason": reason})
    return value or 0.0


def stream_request(tokens: int) -> bytes:
    body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "stream": True,
                       "max_tokens": tokens}).encode()
    return CHAT + f"Content-Length: {len(body)}\r\n\r\n".encode() + body


def small_window_socket(port: int) -> socket.socket:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.settimeout(HANG_S)
    s.connect(("127.0.0.1", port))
    return s


def test_a_client_that_stops_reading_a_stream_is_aborted() -> None:
    backend = FakeBackend(reply="x" * 20_000)
    backend.max_model_len = 100_000  # ~20,000 chunks: far more than the socket buffers hold
    before = ended("send_timeout")
    with live(backend, send_timeout_s=0.5, header_timeout_s=30.0) as srv:
        s = small_window_socket(srv.port)
        s.sendall(stream_request(20_000))
        deadline = time.monotonic() + 60
        while ended("send_timeout") == before:  # never reading a byte meanwhile
            assert time.monotonic() < deadline, "the stalled stream was never ended"
            time.sleep(0.1)
        data = b""
        try:
            while chunk := s.recv(65536):
                data += chunk
        except ConnectionResetError:
            pass
        assert data.startswith(b"HTTP/1.1 200 ") and b"data: [DONE]" not in data
        while not backend.aborted:  # the engine request was aborted, as on a disconnect
            assert time.monotonic() < deadline, "the engine request was not aborted"
            time.sleep(0.05)


def test_a_slow_reader_is_not_cut() -> None:
    backend = FakeBackend(reply="x" * 3_000)
    before = ended("send_timeout")
    with live(backend, send_timeout_s=3.0, header_timeout_s=30.0) as srv:
        s = small_window_socket(srv.port)
        s.sendall(stream_request(3_000))
        data = b""
        while chunk := s.recv(8192):  # bounded by the stream's end (or the socket's timeout)
            data += chunk
            time.sleep(0.02)
        assert b"data: [DONE]" in data
        assert ended("send_timeout") == before


class Errors(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_a_malformed_request_past_the_bound_gets_one_answer() -> None:
    """Its 503 app ran after h11 had failed on its body and a 400 had gone out: a write after
    the half-close had raised inside the app ("Exception in ASGI application")."""
    errors = Errors()
    try:
        with live(header_timeout_s=30.0, max_connections=1) as srv:
            logging.getLogger("uvicorn.error").addHandler(errors)  # after uvicorn's dictConfig
            held = srv.connect()
            time.sleep(0.2)
            s = srv.connect()
            s.sendall(CHAT + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n")
            raw = read_to_close(s)
            assert raw.count(b"HTTP/1.1 ") == 1, raw
            assert parse(raw)[0] in (400, 503)
            held.close()
    finally:
        logging.getLogger("uvicorn.error").removeHandler(errors)
    assert not errors.records, [r.getMessage() for r in errors.records]


def test_a_websocket_upgrade_is_answered_as_plain_http() -> None:
    """No route is a WebSocket: the upgrade headers are ignored and the request is served."""
    with live(header_timeout_s=30.0) as srv:
        s = srv.connect()
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
                  b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                  b"Sec-WebSocket-Version: 13\r\n\r\n")
        status, _, body = parse(read_to_close(s))
        assert status == 200 and json.loads(body)["status"] == "ok"
