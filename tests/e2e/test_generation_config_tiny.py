"""A checkpoint's generation_config.json `max_new_tokens` is the default max_tokens (vLLM's
`--generation-config auto`), read by the loader from a tiny random Qwen3 and applied by every
generating route; `max_length` is not read (docs/sampling-defaults.md)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from starlette.testclient import TestClient

from kiln.api.app import build_app
from kiln.config import ServerConfig
from kiln.model.loader import load_model
from kiln.serving import EngineBackend
from tests.tiny_models import write_tiny_qwen3

MSG = [{"role": "user", "content": "Count to ten."}]
MAX_NEW_TOKENS = 5


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    folder = write_tiny_qwen3(tmp_path_factory.mktemp("gencfg") / "model", seed=2)
    path = folder / "generation_config.json"
    config = json.loads(path.read_text())
    # max_length below the prompt: were it read as a length, nothing could be generated
    path.write_text(json.dumps({**config, "max_new_tokens": MAX_NEW_TOKENS, "max_length": 3}))
    loaded = load_model(str(folder))
    assert loaded.generation_config["max_new_tokens"] == MAX_NEW_TOKENS
    server = ServerConfig(model=str(folder), kv_memory_mb=32)
    with TestClient(build_app(server, EngineBackend(loaded, server))) as c:
        yield c


def generated(client: TestClient, route: str, **fields: Any) -> int:
    """Tokens generated (ignore_eos: the length alone ends the output)."""
    body = {"messages": MSG} if route.endswith("chat/completions") else (
        {"prompts": [MSG]} if route.endswith("batch") else {"prompt": "Once upon a time"})
    r = client.post(route, json={**body, "ignore_eos": True, **fields})
    assert r.status_code == 200, r.text
    return int(r.json()["usage"]["completion_tokens"])


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/completions/batch"])
def test_chat_and_batch_default_to_max_new_tokens(client: TestClient, route: str) -> None:
    assert generated(client, route) == MAX_NEW_TOKENS
    assert generated(client, route, max_tokens=8) == 8  # the request's own wins, above it too


def test_completions_default_is_vllms_bounded_by_max_new_tokens(client: TestClient) -> None:
    route = "/v1/completions"
    assert generated(client, route) == MAX_NEW_TOKENS  # min(16, max_new_tokens)
    assert generated(client, route, max_tokens=None) == MAX_NEW_TOKENS  # not the whole context
    assert generated(client, route, max_tokens=7) == 7


def test_render_shows_the_default(client: TestClient) -> None:
    r = client.post("/v1/chat/completions/render", json={"messages": MSG})
    assert r.status_code == 200, r.text
    assert r.json()["sampling_params"]["max_tokens"] == MAX_NEW_TOKENS
