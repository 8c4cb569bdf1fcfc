"""The training loop's routes on the default model: a request kept through a pause finishes
with the tokens it would have had unpaused; abort ends it with an error; a request sent during a
pause runs after resume; after reset_prefix_cache a repeated prompt reuses no block."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from starlette.testclient import TestClient

from kiln.model.loader import load_model
from kiln.testing import map_resident_bytes
from tests.e2e.app_client import app_client

BODY: dict[str, Any] = {"messages": [{"role": "user", "content": "Count to twenty."}],
                        "max_tokens": 40, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with app_client(load_model(None), None, kv_memory_mb=64, enable_weight_updates=True) as c:
        yield c


def chat(c: TestClient, out: list[Any]) -> None:
    out.append(c.post("/v1/chat/completions", json=BODY))


def test_keep_and_resume_give_the_unpaused_tokens(client: TestClient) -> None:
    want = client.post("/v1/chat/completions", json=BODY).json()["choices"][0]["message"]
    assert client.post("/pause?mode=keep").json()["paused"] is True
    got: list[Any] = []
    sent = threading.Thread(target=chat, args=(client, got))
    sent.start()
    sent.join(timeout=1.0)  # it waits: nothing is scheduled while paused
    assert sent.is_alive() and client.get("/is_paused").json() == {"is_paused": True}
    assert client.get("/health").json()["scheduler"] == "paused"
    assert 'name="paused"} 1.0' in client.get("/metrics").text
    assert client.post("/resume").json()["paused"] is False
    assert client.get("/health").json()["scheduler"] == "serving"
    sent.join()
    assert got[0].status_code == 200
    assert got[0].json()["choices"][0]["message"] == want


def test_abort_ends_requests_with_an_error(client: TestClient) -> None:
    client.post("/pause?mode=keep")  # the request is held in the queue, where abort finds it
    got: list[Any] = []
    sent = threading.Thread(target=chat, args=(client, got))
    sent.start()
    stats = client.app.state.kiln.backend.stats  # type: ignore[attr-defined]
    for _ in range(6000):  # a hang bound, never a verdict: until the engine holds it
        if stats()["waiting"] >= 1:
            break
        sent.join(timeout=0.01)
    assert client.post("/pause?mode=abort").json()["aborted"] == 1
    client.post("/resume")
    sent.join()
    assert got[0].status_code >= 400 and "paused" in got[0].text


def test_reset_prefix_cache(client: TestClient) -> None:
    first = client.post("/v1/chat/completions", json=BODY).json()
    again = client.post("/v1/chat/completions", json=BODY).json()
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    assert client.post("/reset_prefix_cache").json()["forgotten_blocks"] > 0
    third = client.post("/v1/chat/completions", json=BODY).json()
    assert third["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert third["choices"][0]["message"] == first["choices"][0]["message"]


def test_sleep_on_the_torch_free_engine() -> None:
    """`kiln serve`'s own start (the runner over the default GGUF as a C model, no torch)."""
    from kiln.api.app import build_app
    from kiln.config import ServerConfig
    from kiln.serving import EngineBackend

    config = ServerConfig(kv_memory_mb=64, enable_weight_updates=True)
    with TestClient(build_app(config, EngineBackend.from_config(config))) as c:
        assert c.app.state.kiln.backend.engine.executor.program is not None  # type: ignore[attr-defined]
        test_sleep_gives_the_kv_cache_back_and_wake_serves_the_same(c)


def test_sleep_gives_the_kv_cache_back_and_wake_serves_the_same(client: TestClient) -> None:
    from kiln.model.native.c_model import map_of

    engine = client.app.state.kiln.backend.engine  # type: ignore[attr-defined]
    kv = engine.executor.kv  # a torch model's KVCache, or a C model's arrays
    maps = kv.maps if hasattr(kv, "maps") else [m for m in (map_of(a) for a in kv.k + kv.v)
                                                if m is not None]
    assert maps
    long = {**BODY, "messages": [{"role": "user", "content": "Tell me a story. " * 120}]}
    want = client.post("/v1/chat/completions", json=long).json()["choices"][0]["message"]
    before = map_resident_bytes(maps)
    assert before > 0
    r = client.post("/sleep").json()
    assert r["sleeping"] is True and r["released_bytes"] == sum(len(m) for m in maps)
    after = map_resident_bytes(maps)
    assert after <= before // 10, (before, after)  # the drop is the cache's resident size
    assert client.get("/is_sleeping").json() == {"is_sleeping": True}
    assert client.get("/health").json()["scheduler"] == "sleeping"
    assert client.post("/resume").status_code == 409
    got: list[Any] = []
    sent = threading.Thread(target=lambda: got.append(
        client.post("/v1/chat/completions", json=long)))
    sent.start()
    sent.join(timeout=1.0)
    assert sent.is_alive()  # held while asleep
    assert client.post("/wake_up").json()["sleeping"] is False
    sent.join()
    assert got[0].status_code == 200
    assert got[0].json()["choices"][0]["message"] == want
    assert got[0].json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
