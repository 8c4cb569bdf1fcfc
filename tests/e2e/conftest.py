"""A live `kiln serve` equivalent (uvicorn on 127.0.0.1, default model) shared by the e2e tests.

It runs in this process, not as `kiln.testing.running_server`'s subprocess, because these tests
also read the engine's own state (KV blocks held, its tokenizer and vocabulary); its port and
its wait for /health are kiln.testing's."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import uvicorn

from kiln.api.app import build_app
from kiln.config import ServerConfig
from kiln.serving import EngineBackend
from kiln.testing import free_port, wait_healthy


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


@pytest.fixture(scope="session")
def live_server() -> Iterator[LiveServer]:
    config = ServerConfig(port=free_port(), kv_memory_mb=128)
    backend = EngineBackend.from_config(config)  # as `kiln serve` builds it
    app = build_app(config, backend)
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=config.port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{config.port}"
    wait_healthy(url, alive=thread.is_alive)
    yield LiveServer(url, backend)
    server.should_exit = True
    thread.join(timeout=30)
