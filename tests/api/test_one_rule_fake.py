"""One rule where routes had differed (issue 52, 5): the server-default adapter on every
generating route, one request id for the header and the body, and OpenAI's roles only."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from kiln.api.app import build_app
from kiln.config import ServerConfig
from tests.api.fake_backend import FakeBackend

MSG = [{"role": "user", "content": "hi"}]
ROUTES: dict[str, dict[str, Any]] = {"/v1/chat/completions": {"messages": MSG},
          "/v1/completions/batch": {"prompts": [MSG]},
          "/v1/completions": {"prompt": "hi", "max_tokens": 2}}


@pytest.fixture
def adapters(tmp_path: Path) -> Iterator[tuple[TestClient, FakeBackend]]:
    folder = tmp_path / "adapters" / "style"
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text(json.dumps({"r": 4, "lora_alpha": 8}))
    (folder / "adapter_model.safetensors").write_bytes(b"\0" * 16)
    backend = FakeBackend(adapter_dir=tmp_path / "adapters")
    with TestClient(build_app(ServerConfig(), backend), raise_server_exceptions=False) as c:
        yield c, backend


def test_the_server_default_adapter_runs_on_every_generating_route(
        adapters: tuple[TestClient, FakeBackend]) -> None:
    client, backend = adapters
    assert client.post("/v1/adapters/load", json={"name": "style"}).status_code == 200
    for route, body in ROUTES.items():
        r = client.post(route, json=body)
        assert r.status_code == 200, (route, r.text)
        assert getattr(backend.submitted[-1], "lora", ()) == (("style", 1.0),), route
    # scoring keeps its rule: the base model unless `model` names an adapter
    r = client.post("/v1/completions", json={"prompt": "ab cd", "prompt_logprobs": 1,
                                             "max_tokens": 0})
    assert r.status_code == 200 and backend.scored_lora == ()
    assert client.post("/v1/adapters/unload").status_code == 200
    for route, body in ROUTES.items():
        client.post(route, json=body)
        assert getattr(backend.submitted[-1], "lora", ()) == (), route


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_the_header_and_the_body_carry_one_request_id(client: TestClient, route: str) -> None:
    prefix = {"/v1/chat/completions": "chatcmpl", "/v1/completions/batch": "batchcmpl",
              "/v1/completions": "cmpl"}[route]
    r = client.post(route, json={**ROUTES[route], "request_id": "abc-1"})
    assert r.status_code == 200, r.text
    assert r.json()["id"] == f"{prefix}-abc-1" and r.headers["x-request-id"] == "abc-1"
    r = client.post(route, json={**ROUTES[route], "request_id": "abc-2"},
                    headers={"X-Request-Id": "from-header"})
    assert r.json()["id"] == f"{prefix}-from-header"  # the header wins, as in vLLM
    assert r.headers["x-request-id"] == "from-header"
    r = client.post(route, json=ROUTES[route])
    assert r.json()["id"] == f"{prefix}-{r.headers['x-request-id']}"


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/completions/batch"])
def test_an_unknown_role_is_a_400(client: TestClient, backend: FakeBackend, route: str) -> None:
    wizard = [{"role": "wizard", "content": "abracadabra"}]
    body = {"messages": wizard} if route.endswith("chat/completions") else {"prompts": [wizard]}
    r = client.post(route, json=body)
    assert r.status_code == 400, r.text
    assert "role" in (r.json()["error"]["param"] or "")
    assert not backend.submitted
    for role in ("system", "developer", "user"):
        ok = [{"role": role, "content": "x"}]
        body = {"messages": ok} if route.endswith("chat/completions") else {"prompts": [ok]}
        assert client.post(route, json=body).status_code == 200, role
