"""SIGTERM's drain window running out: the requests still in flight are answered with errors
(uvicorn would cancel their handlers: a plain-text 500, a stream cut without an error event)."""

from __future__ import annotations

import asyncio
import json

import httpx
import uvicorn

from kiln.api.app import build_app
from kiln.config import ServerConfig
from kiln.drain import DRAIN_MESSAGE, DrainingServer
from kiln.testing import free_port
from tests import HANG_S
from tests.api.fake_backend import FakeBackend

MSG = {"messages": [{"role": "user", "content": "hi"}]}


def test_requests_left_when_the_drain_runs_out_get_errors() -> None:
    backend = FakeBackend()
    backend.delay = 0.1  # ~28 tokens: ~2.8 s, against a 1 s drain
    port = free_port()
    config = uvicorn.Config(build_app(ServerConfig(), backend), host="127.0.0.1", port=port,
                            log_level="warning", timeout_graceful_shutdown=1)
    server = DrainingServer(config, on_expiry=lambda: backend.abort_all(DRAIN_MESSAGE))

    async def main() -> tuple[httpx.Response, str]:
        serving = asyncio.create_task(server.serve())
        while not server.started:
            await asyncio.sleep(0.02)
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        async with httpx.AsyncClient(timeout=HANG_S) as client:
            plain = asyncio.create_task(client.post(url, json=MSG))

            async def stream() -> str:
                async with client.stream("POST", url, json={**MSG, "stream": True}) as r:
                    return "".join([line + "\n" async for line in r.aiter_lines()])

            streamed = asyncio.create_task(stream())
            for _ in range(6000):  # both reached the engine (however slow CI is; <= 120 s)
                if len(backend.submitted) == 2:
                    break
                await asyncio.sleep(0.02)
            server.should_exit = True  # what SIGTERM does
            out = await plain, await streamed
        await serving
        return out

    plain, streamed = asyncio.run(main())
    assert plain.status_code == 503, plain.text
    err = plain.json()["error"]
    assert err["code"] == "engine_not_running" and err["message"] == DRAIN_MESSAGE
    events = [line[6:] for line in streamed.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["error"]["message"] == DRAIN_MESSAGE
