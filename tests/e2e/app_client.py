"""The in-process app over a loaded model, for e2e tests that drive it through Starlette's
TestClient (no socket): one place builds the config, the backend and the app."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from starlette.testclient import TestClient

from kiln.api.app import build_app
from kiln.config import ServerConfig
from kiln.model import LoadedModel
from kiln.serving import EngineBackend


@contextlib.contextmanager
def app_client(loaded: LoadedModel, model: str | None, **config: Any) -> Iterator[TestClient]:
    """A TestClient of the app serving ``loaded`` (``model``: its path, as `--model` names it,
    None for the default model;
    ``config``: further ServerConfig fields); the engine stops when the block ends."""
    server_config = ServerConfig(model=model, **config)
    with TestClient(build_app(server_config, EngineBackend(loaded, server_config))) as c:
        yield c
