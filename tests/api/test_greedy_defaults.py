"""Greedy means greedy (docs/decisions.md): temperature 0 (any below 1e-5) or top_k 1 takes
penalties only from the request or a preset it names; top_k -1 is vLLM's "off"."""

from __future__ import annotations

from typing import Any

import pytest
from starlette.testclient import TestClient

from tests.api.fake_backend import FakeBackend

CHAT = "/v1/chat/completions"
MSG = [{"role": "user", "content": "hi"}]


def sampled(client: TestClient, backend: FakeBackend, **fields: Any) -> Any:
    r = client.post(CHAT, json={"messages": MSG, **fields})
    assert r.status_code == 200, r.text
    return backend.submitted[-1].sampling


@pytest.mark.parametrize("fields", [{"temperature": 0}, {"top_k": 1}, {"temperature": 0.0, "top_k": 1}])
def test_greedy_without_a_named_preset_has_no_penalties(
    client: TestClient, backend: FakeBackend, fields: dict[str, Any]
) -> None:
    p = sampled(client, backend, **fields)
    assert (p.presence_penalty, p.frequency_penalty, p.repetition_penalty) == (0.0, 0.0, 1.0)
    assert not p.uses_penalties


def test_greedy_keeps_the_penalties_the_request_sets(client: TestClient, backend: FakeBackend) -> None:
    p = sampled(client, backend, temperature=0, presence_penalty=0.7, repetition_penalty=1.1)
    assert (p.presence_penalty, p.frequency_penalty, p.repetition_penalty) == (0.7, 0.0, 1.1)


def test_greedy_keeps_a_named_presets_penalties(client: TestClient, backend: FakeBackend) -> None:
    p = sampled(client, backend, temperature=0, sampling_preset="qwen3-thinking-general")
    assert (p.temperature, p.presence_penalty) == (0.0, 1.5)


# below the samplers' threshold the sampler takes the argmax, so the request is greedy here as
# well (a negative temperature is a 400: tests/api/test_sampling_ranges_fake.py)
@pytest.mark.parametrize("temperature", [0.0, 1e-6])
def test_greedy_ignores_the_models_repetition_penalty(
    client: TestClient, backend: FakeBackend, temperature: float
) -> None:
    backend.generation_config = {"repetition_penalty": 1.05, "temperature": 0.6}
    p = sampled(client, backend, temperature=temperature)
    assert (p.temperature, p.repetition_penalty) == (temperature, 1.0)


@pytest.mark.parametrize("route", [CHAT, "/v1/completions/batch"])
def test_top_k_minus_one_is_off(client: TestClient, backend: FakeBackend, route: str) -> None:
    body: dict[str, Any] = {"messages": MSG} if route == CHAT else {"prompts": [MSG]}
    r = client.post(route, json={**body, "top_k": -1, "temperature": 0.5})
    assert r.status_code == 200, r.text
    assert backend.submitted[-1].sampling.top_k == 0


def test_top_k_below_minus_one_is_a_400(client: TestClient) -> None:
    r = client.post(CHAT, json={"messages": MSG, "top_k": -2})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "top_k"
