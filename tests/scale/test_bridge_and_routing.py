"""The in-process ASGI bridge (Kiln's app on the fake backend) and the routing key."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator

from kiln.api.app import build_app
from kiln.config import ServerConfig
from kiln.scale.asgi_bridge import Forwarded, Head, InProcessApp
from kiln.scale.routing import PREFIX_CHARS, rendezvous, routing_key
from tests.api.fake_backend import FakeBackend

CHAT = "/v1/chat/completions"
JSON = ((b"content-type", b"application/json"),)


def _chat(body: dict[str, object]) -> Forwarded:
    return Forwarded("POST", CHAT, b"", JSON, json.dumps(body).encode())


async def _collect(app: InProcessApp, req: Forwarded) -> tuple[Head, bytes]:
    parts = [p async for p in app.request(req)]
    head = parts[0]
    assert isinstance(head, Head)
    assert all(isinstance(p, bytes) for p in parts[1:])
    return head, b"".join(p for p in parts[1:] if isinstance(p, bytes))


def test_bridge_runs_json_sse_and_errors() -> None:
    backend = FakeBackend()
    app = InProcessApp(build_app(ServerConfig(), backend))
    msg = [{"role": "user", "content": "hi"}]

    async def main() -> None:
        await app.startup()
        head, body = await _collect(app, _chat({"messages": msg}))
        assert head.status == 200
        assert json.loads(body)["choices"][0]["message"]["content"] == backend.reply
        head, body = await _collect(app, _chat({"messages": msg, "stream": True}))
        assert head.status == 200
        assert dict(head.headers)[b"content-type"].startswith(b"text/event-stream")
        events = [ln for ln in body.decode().splitlines() if ln.startswith("data: ")]
        assert events[-1] == "data: [DONE]" and len(events) > 3
        head, body = await _collect(app, _chat({"messages": []}))
        assert head.status == 400 and json.loads(body)["error"]["code"] == "empty_array"
        head, body = await _collect(app, Forwarded("GET", "/health", b"", (), b""))
        assert head.status == 200
        await app.shutdown()

    asyncio.run(main())


def test_closing_a_stream_early_aborts_the_engine_request() -> None:
    backend = FakeBackend()
    backend.delay = 0.05  # ~28 tokens: the stream is still running when the client leaves
    app = InProcessApp(build_app(ServerConfig(), backend))
    body = {"messages": [{"role": "user", "content": "hi"}], "stream": True}

    async def main() -> None:
        await app.startup()
        parts = app.request(_chat(body))
        assert isinstance(parts, AsyncGenerator)  # closed below, as a leaving client does
        assert isinstance(await parts.__anext__(), Head)
        await parts.__anext__()  # the first chunk
        await parts.aclose()  # the client went away
        await app.shutdown()

    asyncio.run(main())
    assert len(backend.submitted) == 1
    assert backend.aborted == [backend.submitted[0].request_id]


def test_routing_key_prefers_session_then_prompt_prefix() -> None:
    msgs = [{"role": "user", "content": "x" * 10}]
    body = json.dumps({"messages": msgs}).encode()
    key = routing_key(CHAT, JSON, body)
    assert key is not None and key.startswith("prefix:")
    assert routing_key(CHAT, JSON, json.dumps({"messages": msgs, "max_tokens": 3}).encode()) == key
    other = json.dumps({"messages": [{"role": "user", "content": "y" * 10}]}).encode()
    assert routing_key(CHAT, JSON, other) != key
    adapter = json.dumps({"messages": msgs, "adapter": "a1"}).encode()
    assert routing_key(CHAT, JSON, adapter) != key  # the adapter's slot is part of the affinity
    long_a = [{"role": "user", "content": "z" * PREFIX_CHARS + "tail one"}]
    long_b = [{"role": "user", "content": "z" * PREFIX_CHARS + "tail two"}]
    assert (routing_key(CHAT, JSON, json.dumps({"messages": long_a}).encode())
            == routing_key(CHAT, JSON, json.dumps({"messages": long_b}).encode()))
    assert routing_key(CHAT, JSON, json.dumps({"messages": msgs, "session_id": "s"}).encode()) \
        == "session:s"
    assert routing_key("/metrics", ((b"x-session-id", b"s"),), b"") == "session:s"
    assert routing_key("/health", (), b"") is None
    assert routing_key(CHAT, JSON, b"{not json") is None


def test_rendezvous_moves_only_the_keys_of_a_leaving_replica() -> None:
    keys = [f"k{i}" for i in range(400)]
    three = ["r1", "r2", "r3"]
    before = {k: rendezvous(k, three) for k in keys}
    assert {before[k] for k in keys} == set(three)  # every replica gets keys
    after = {k: rendezvous(k, ["r1", "r3"]) for k in keys}
    assert all(after[k] == before[k] for k in keys if before[k] != "r2")
