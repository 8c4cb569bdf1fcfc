"""Adapter management routes and per-request adapter selection over HTTP (engine test double)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from kiln.api.app import build_app
from kiln.api.contract import contract
from kiln.config import ServerConfig
from tests.api.fake_backend import FakeBackend

CHAT = "/v1/chat/completions"
MSG = [{"role": "user", "content": "hi"}]


@pytest.fixture
def adapter_dir(tmp_path: Path) -> Path:
    root = tmp_path / "adapters"
    for name in ("style", "math", "broken1"):
        folder = root / name
        folder.mkdir(parents=True)
        (folder / "adapter_config.json").write_text(json.dumps({"r": 4, "lora_alpha": 8}))
        (folder / "adapter_model.safetensors").write_bytes(b"\0" * 16)
    (tmp_path / "outside.txt").write_text("keep me")
    return root


@pytest.fixture
def backend(adapter_dir: Path) -> FakeBackend:
    return FakeBackend(adapter_dir=adapter_dir)


@pytest.fixture
def client(backend: FakeBackend) -> Iterator[TestClient]:
    with TestClient(build_app(ServerConfig(), backend), raise_server_exceptions=False) as c:
        yield c


def lora_of(backend: FakeBackend) -> object:
    return getattr(backend.submitted[-1], "lora", ())


def test_list_and_models(client: TestClient) -> None:
    body = client.get("/v1/adapters").json()
    assert contract().first_violation("AdapterList", body) is None
    assert [a["name"] for a in body["available"]] == ["broken1", "math", "style"]
    assert body["active"] is None
    models = client.get("/v1/models").json()
    assert contract().first_violation("ModelList", models) is None
    assert [(m["id"], m["parent"]) for m in models["data"]] == [
        ("fake-model", None), ("broken1", "fake-model"), ("math", "fake-model"),
        ("style", "fake-model"),
    ]


def test_tri_state_selection(client: TestClient, backend: FakeBackend) -> None:
    client.post(CHAT, json={"messages": MSG})
    assert lora_of(backend) == ()
    assert client.post("/v1/adapters/load", json={"name": "style"}).json() == {
        "status": "loaded", "name": "style"}
    r = client.post(CHAT, json={"messages": MSG, "include_performance": True})
    assert lora_of(backend) == (("style", 1.0),)
    assert r.json()["kiln_metadata"]["performance"]["adapter_used"] == "style"
    client.post(CHAT, json={"messages": MSG, "adapter": None})
    assert lora_of(backend) == ()
    client.post(CHAT, json={"messages": MSG, "adapter": ""})
    assert lora_of(backend) == ()
    client.post(CHAT, json={"messages": MSG, "adapter": "math"})
    assert lora_of(backend) == (("math", 1.0),)
    client.post(CHAT, json={"messages": MSG, "adapters": [{"name": "math", "scale": 0.5},
                                                          {"name": "style", "scale": 2}]})
    assert lora_of(backend) == (("math", 0.5), ("style", 2.0))
    # batch selects exactly as chat: missing = the server default, null or "" = base
    batch = "/v1/completions/batch"
    assert client.post(batch, json={"prompts": [MSG]}).status_code == 200
    assert lora_of(backend) == (("style", 1.0),)
    for base in (None, ""):
        assert client.post(batch, json={"prompts": [MSG], "adapter": base}).status_code == 200
        assert lora_of(backend) == ()
    client.post(batch, json={"prompts": [MSG], "adapter": "math"})
    assert lora_of(backend) == (("math", 1.0),)
    client.post(batch, json={"prompts": [MSG], "adapters": [{"name": "math", "scale": 0.5}]})
    assert lora_of(backend) == (("math", 0.5),)
    assert client.post("/v1/adapters/unload").json()["status"] == "unloaded"
    client.post(batch, json={"prompts": [MSG]})
    assert lora_of(backend) == ()
    client.post(CHAT, json={"messages": MSG})
    assert lora_of(backend) == ()


def test_model_naming_an_adapter(client: TestClient, backend: FakeBackend) -> None:
    r = client.post(CHAT, json={"messages": MSG, "model": "math"})
    assert r.status_code == 200 and r.json()["model"] == "math"
    assert lora_of(backend) == (("math", 1.0),)
    r = client.post(CHAT, json={"messages": MSG, "model": "math", "adapter": "style"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_compose_request"


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"adapter": "nope"}, 404, "adapter_not_found"),
        ({"adapters": [{"name": "nope", "scale": 1}]}, 404, "adapter_not_found"),
        ({"adapters": []}, 400, "invalid_compose_request"),
        ({"adapters": [{"name": "math", "scale": 1}] * 17}, 400, "invalid_compose_request"),
        ({"adapter": "../x"}, 400, "invalid_adapter_name"),
        ({"adapter": "broken1"}, 400, "adapter_load_failed"),
    ],
)
def test_selection_errors(client: TestClient, body: dict, status: int, code: str) -> None:
    r = client.post(CHAT, json={"messages": MSG, **body})
    assert r.status_code == status, r.text
    assert r.json()["error"]["code"] == code


BAD_NAMES = ["../x", "/etc/passwd", "a/b", "..", "a\\b", "%2e%2e", "..%2fx", "a%5cb",
             "%2e%2e%2fx", "%2Fetc%2Fpasswd", "a%2fb"]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_bad_names_are_400_and_touch_nothing(
    client: TestClient, adapter_dir: Path, name: str
) -> None:
    before = sorted(p.name for p in adapter_dir.parent.rglob("*"))
    r = client.post("/v1/adapters/load", json={"name": name})
    assert r.status_code == 400, (name, r.text)
    assert r.json()["error"]["code"] == "invalid_adapter_name"
    # fully percent-encoded so the client cannot normalize it away; "%" names stay encoded twice
    quoted = "".join(f"%{b:02X}" for b in name.encode())
    r = client.delete(f"/v1/adapters/{quoted}")
    assert r.status_code == 400, (name, r.status_code, r.text)
    assert r.json()["error"]["code"] == "invalid_adapter_name"
    r = client.post(CHAT, json={"messages": MSG, "adapter": name})
    assert r.status_code == 400
    assert sorted(p.name for p in adapter_dir.parent.rglob("*")) == before


def test_delete(client: TestClient, adapter_dir: Path) -> None:
    client.post("/v1/adapters/load", json={"name": "style"})
    r = client.delete("/v1/adapters/style")
    assert r.status_code == 409 and r.json()["error"]["code"] == "adapter_active"
    r = client.delete("/v1/adapters/math")
    assert r.status_code == 200, r.text
    assert contract().first_violation("AdapterStatusResponse", r.json()) is None
    assert not (adapter_dir / "math").exists()
    assert client.delete("/v1/adapters/math").status_code == 404


def test_no_adapter_dir_means_no_adapters() -> None:
    with TestClient(build_app(ServerConfig(), FakeBackend())) as c:
        assert c.get("/v1/adapters").json() == {"active": None, "available": []}
        r = c.post(CHAT, json={"messages": MSG, "adapter": "x"})
        assert r.status_code == 404 and r.json()["error"]["code"] == "adapter_not_found"


def test_an_adapter_named_like_the_model_is_not_a_second_card(adapter_dir: Path) -> None:
    """`model` with the served id selects the base, so an adapter folder of that name (or an
    alias's) cannot be named; /v1/models had listed two cards with the same id."""
    for name in ("fake-model", "fake-alias"):
        shadow = adapter_dir / name
        shadow.mkdir()
        (shadow / "adapter_config.json").write_text(json.dumps({"r": 4, "lora_alpha": 8}))
    with TestClient(build_app(ServerConfig(), FakeBackend(adapter_dir=adapter_dir))) as c:
        ids = [m["id"] for m in c.get("/v1/models").json()["data"]]
        missing = c.post(CHAT, json={"messages": MSG, "model": "nope"}).json()["error"]
    assert ids == ["fake-model", "broken1", "math", "style"]
    assert missing["message"].endswith("available: fake-model, broken1, math, style")


def test_agent_apis_run_the_adapter_model_names(client: TestClient, backend: FakeBackend) -> None:
    """Responses and Messages run as chat runs: `model` naming an adapter runs under it."""
    r = client.post("/v1/responses", json={"input": "hi", "model": "math"})
    assert r.status_code == 200 and r.json()["model"] == "math"
    assert lora_of(backend) == (("math", 1.0),)
    r = client.post("/v1/messages", json={"model": "style", "max_tokens": 64, "messages": MSG})
    assert r.status_code == 200 and r.json()["model"] == "style"
    assert lora_of(backend) == (("style", 1.0),)
