"""A live `kiln serve` equivalent (uvicorn on 127.0.0.1, default model) shared by the e2e tests."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
import uvicorn

from kiln.api.app import build_app
from kiln.config import ServerConfig
from kiln.serving import EngineBackend


@dataclass
class LiveServer:
    url: str
    backend: EngineBackend

    def wait_idle(self, timeout: float = 120.0) -> dict[str, float]:
        """Wait until nothing runs or waits and no KV block is held; return the stats."""
        deadline = time.monotonic() + timeout
        stats = self.backend.stats()
        while time.monotonic() < deadline:
            stats = self.backend.stats()
            if stats["running"] == 0 and stats["waiting"] == 0 and stats["kv_blocks_used"] == 0:
                return stats
            time.sleep(0.05)
        return stats


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def live_server() -> Iterator[LiveServer]:
    config = ServerConfig(port=_free_port(), kv_memory_mb=128)
    backend = EngineBackend.from_config(config)  # as `kiln serve` builds it
    app = build_app(config, backend)
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=config.port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{config.port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.1)
    else:
        raise RuntimeError("server did not start")
    yield LiveServer(url, backend)
    server.should_exit = True
    thread.join(timeout=30)
