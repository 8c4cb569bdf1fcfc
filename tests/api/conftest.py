from __future__ import annotations

from collections.abc import Iterator

import pytest
from starlette.testclient import TestClient

from kiln.api.app import build_app
from kiln.config import ServerConfig
from tests.api.fake_backend import FakeBackend


@pytest.fixture
def backend() -> FakeBackend:
    return FakeBackend()


@pytest.fixture
def client(backend: FakeBackend) -> Iterator[TestClient]:
    app = build_app(ServerConfig(max_body_bytes=64 * 1024), backend)
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c
