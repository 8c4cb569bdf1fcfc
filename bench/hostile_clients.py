"""The attackers of bench/bench_hostile.py, run in their own process (their event loop and GIL
apart from the measuring probe's): raw asyncio sockets to 127.0.0.1 only, every loop bounded by
the attack's end and a maximum count. Each kind records how its connections ended."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

HOST = "127.0.0.1"
CHAT_HEAD = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
             b"Content-Type: application/json\r\n")
MAX_ROUNDS = 10_000  # per attacking task: reconnects (or requests) at most this many times
READ_LIMIT = 1 << 20  # bytes read back per connection at most
BURST_READ_S = 8.0  # the burst's answers are read this long (its own connections close by then)


@dataclass(frozen=True)
class Attack:
    port: int
    max_seconds: float  # the attack ends at this at the latest (or when the parent says stop)
    idle: int = 300  # connections that send nothing
    slow_headers: int = 150  # a header line every 0.5 s, never the blank line
    slow_bodies: int = 150  # Content-Length 100000, a byte every 0.5 s
    stalled_streams: int = 8  # streaming chats whose responses are never read
    stream_tokens: int = 48
    malformed: int = 2  # tasks sending bad chunked encoding, one request each 0.2 s
    oversized: int = 2  # tasks sending 20 KiB of headers, one request each 0.2 s
    burst: int = 0  # extra connections opened at once when the parent says (past the bound)


class Window:
    """The attack's time left; the parent's stop event ends it early."""

    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()

    async def watch(self, stop: Any) -> None:
        while self.left() > 0:
            if stop.is_set():
                self.end = time.monotonic()
                return
            await asyncio.sleep(0.1)


def _status(data: bytes) -> str:
    if not data:
        return "closed-without-response"
    parts = data.split(b" ", 2)
    return parts[1].decode("latin-1", "replace") if len(parts) > 1 else "garbage"


async def _drain(reader: asyncio.StreamReader, w: Window, seconds: float) -> bytes:
    """What the server sends until it closes, ``seconds`` pass or the attack ends (at most
    READ_LIMIT bytes)."""
    out = b""
    until = time.monotonic() + seconds
    while len(out) < READ_LIMIT:
        left = min(until - time.monotonic(), w.left())
        if left <= 0:
            return out
        try:
            chunk = await asyncio.wait_for(reader.read(65536), timeout=left)
        except (TimeoutError, ConnectionError, OSError):
            return out
        if not chunk:
            return out
        out += chunk
    return out


async def _connect(port: int, rcvbuf: int | None = None
                   ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    if rcvbuf is None:
        return await asyncio.open_connection(HOST, port)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, (HOST, port))
    return await asyncio.open_connection(sock=sock)


def _close(writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(Exception):
        writer.transport.abort()


async def _holder(kind: str, attack: Attack, w: Window, seen: Counter[str],
                  first: bytes = b"", drip: bytes = b"", every_s: float = 0.5) -> None:
    """Open a connection, send ``first``, then ``drip`` every ``every_s`` s; reconnect whenever
    the server closes it, until the attack ends."""
    for _ in range(MAX_ROUNDS):
        if w.left() <= 0:
            return
        try:
            reader, writer = await _connect(attack.port)
        except OSError:
            seen[f"{kind}:connect-failed"] += 1
            await asyncio.sleep(0.1)
            continue
        try:
            writer.write(first)
            data, ended = b"", False
            while w.left() > 0:
                try:
                    chunk = await asyncio.wait_for(reader.read(65536), timeout=every_s)
                except TimeoutError:
                    if drip and not writer.transport.is_closing():
                        writer.write(drip)
                    continue
                if chunk:
                    data = chunk + await _drain(reader, w, 5)
                ended = True
                break
            seen[f"{kind}:{_status(data) if ended else 'held-to-the-end'}"] += 1
        except (ConnectionError, OSError):
            seen[f"{kind}:reset"] += 1
        finally:
            _close(writer)


async def _stalled_stream(attack: Attack, w: Window, seen: Counter[str]) -> None:
    body = (b'{"messages":[{"role":"user","content":"Write a long essay about the sea."}],'
            b'"stream":true,"include_performance":true,"temperature":0,"ignore_eos":true,'
            b'"max_tokens":%d}' % attack.stream_tokens)
    _reader, writer = await _connect(attack.port, rcvbuf=4096)
    writer.write(CHAT_HEAD + b"Content-Length: %d\r\n\r\n" % len(body) + body)
    while w.left() > 0:  # never reads a byte
        await asyncio.sleep(min(0.5, max(0.0, w.left())))
    seen["stalled_stream:held-to-the-end"] += 1
    _close(writer)


async def _requests(kind: str, attack: Attack, w: Window, seen: Counter[str],
                    request: bytes) -> None:
    for _ in range(MAX_ROUNDS):
        if w.left() <= 0:
            return
        try:
            reader, writer = await _connect(attack.port)
            writer.write(request)
            seen[f"{kind}:{_status(await _drain(reader, w, 10))}"] += 1
            _close(writer)
        except (ConnectionError, OSError):
            seen[f"{kind}:reset"] += 1
        await asyncio.sleep(0.2)


async def _burst(attack: Attack, w: Window, seen: Counter[str], go: Any) -> None:
    """When the parent says: ``attack.burst`` connections at once, each asking /health; their
    answers are read for BURST_READ_S whatever the attack's window says."""
    while not go.is_set():
        if w.left() <= 0:
            return
        await asyncio.sleep(0.1)
    opened = await asyncio.gather(*(_connect(attack.port) for _ in range(attack.burst)),
                                  return_exceptions=True)
    writers = [c for c in opened if not isinstance(c, BaseException)]
    seen["burst:connect-failed"] += len(opened) - len(writers)
    own = Window(BURST_READ_S)
    for _reader, writer in writers:
        writer.write(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    answers = await asyncio.gather(*(_drain(r, own, BURST_READ_S) for r, _ in writers))
    for data in answers:
        seen[f"burst:{_status(data)}"] += 1
    for _reader, writer in writers:
        _close(writer)


async def _attack(attack: Attack, stop: Any, burst: Any) -> Counter[str]:
    w = Window(attack.max_seconds)
    watcher = asyncio.create_task(w.watch(stop))
    seen: Counter[str] = Counter()
    chunked = CHAT_HEAD + b"Transfer-Encoding: chunked\r\n\r\nnot-a-size\r\n{}\r\n0\r\n\r\n"
    big = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * 20_000 + b"\r\n\r\n"
    tasks = [_holder("idle", attack, w, seen) for _ in range(attack.idle)]
    tasks += [_holder("slow_headers", attack, w, seen, CHAT_HEAD, b"X-Slow: 1\r\n")
              for _ in range(attack.slow_headers)]
    tasks += [_holder("slow_body", attack, w, seen,
                      CHAT_HEAD + b"Content-Length: 100000\r\n\r\n{", b" ")
              for _ in range(attack.slow_bodies)]
    tasks += [_stalled_stream(attack, w, seen) for _ in range(attack.stalled_streams)]
    tasks += [_requests("malformed_chunked", attack, w, seen, chunked)
              for _ in range(attack.malformed)]
    tasks += [_requests("oversized_headers", attack, w, seen, big)
              for _ in range(attack.oversized)]
    if attack.burst:
        tasks.append(_burst(attack, w, seen, burst))
    results = await asyncio.gather(*tasks, return_exceptions=True)
    for r in results:
        if isinstance(r, BaseException):
            seen[f"attacker-error:{type(r).__name__}"] += 1
    watcher.cancel()
    return seen


def run_attack(attack: Attack, stop: Any, burst: Any, out: Any) -> None:
    """Process entry point: attack until ``stop`` is set (or ``max_seconds``), open the burst
    when ``burst`` is set, then put the outcome counts on ``out`` (a queue).

    The attacker runs at the lowest CPU priority: a real attacker spends its own machine's CPU,
    not the server's, and on a 2-core test machine an attacker at normal priority takes a core
    from the server (what the probe would then measure is the attacker's own cost)."""
    os.nice(19)
    out.put(dict(asyncio.run(_attack(attack, stop, burst))))
