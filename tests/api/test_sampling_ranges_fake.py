"""Sampling values outside the ranges vLLM accepts (issue 52, 5): a 400 from the contract
naming the field, on chat, batch and completions alike, and the served document states each
range. `temperature: -1` and `top_p: 3` had been accepted."""

from __future__ import annotations

from typing import Any

import pytest
from starlette.testclient import TestClient

from tests.api.fake_backend import FakeBackend

MSG = [{"role": "user", "content": "hi"}]
ROUTES: dict[str, dict[str, Any]] = {"/v1/chat/completions": {"messages": MSG},
                                     "/v1/completions/batch": {"prompts": [MSG]},
                                     "/v1/completions": {"prompt": "hi", "max_tokens": 2}}
REFUSED = [("temperature", -1), ("temperature", -1e-9), ("top_p", 3), ("top_p", 1.0001),
           ("top_p", -0.5), ("min_p", 1.5), ("min_p", -0.1), ("repetition_penalty", 0),
           ("repetition_penalty", -1.2), ("presence_penalty", 2.5),
           ("frequency_penalty", -3), ("top_k", -2)]
# the edges that stay valid: top_p 0 is off (Kiln's), top_k 0 and -1 are off
ACCEPTED = [("temperature", 0), ("temperature", 7.5), ("top_p", 0), ("top_p", 1),
            ("min_p", 0), ("min_p", 1), ("repetition_penalty", 1e-3),
            ("repetition_penalty", 3), ("presence_penalty", -2), ("frequency_penalty", 2),
            ("top_k", -1), ("top_k", 0)]


@pytest.mark.parametrize("route", list(ROUTES))
@pytest.mark.parametrize(("name", "value"), REFUSED)
def test_out_of_range_is_a_400_naming_the_field(client: TestClient, backend: FakeBackend,
                                                route: str, name: str, value: float) -> None:
    r = client.post(route, json={**ROUTES[route], name: value})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == name, r.text
    assert r.json()["error"]["type"] == "invalid_request_error"
    assert backend.submitted == []


@pytest.mark.parametrize("route", list(ROUTES))
@pytest.mark.parametrize(("name", "value"), ACCEPTED)
def test_the_edges_of_each_range_are_accepted(client: TestClient, backend: FakeBackend,
                                              route: str, name: str, value: float) -> None:
    r = client.post(route, json={**ROUTES[route], name: value})
    assert r.status_code == 200, r.text
    assert backend.submitted


def _number_branch(schema: dict[str, Any], doc: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        schema = doc["components"]["schemas"][schema["$ref"].rsplit("/", 1)[-1]]
    return next(b for b in schema["oneOf"] if b.get("type") in ("number", "integer"))


@pytest.mark.parametrize("definition", ["ChatCompletionRequest", "BatchCompletionRequest",
                                        "TextCompletionRequest"])
def test_the_served_document_states_the_ranges(client: TestClient, definition: str) -> None:
    doc = client.get("/openapi.json").json()
    props = doc["components"]["schemas"][definition]["properties"]
    bounds = {name: {k: v for k, v in _number_branch(props[name], doc).items() if k != "type"}
              for name in ("temperature", "top_p", "min_p", "repetition_penalty")}
    assert bounds == {"temperature": {"minimum": 0}, "top_p": {"minimum": 0, "maximum": 1},
                      "min_p": {"minimum": 0, "maximum": 1},
                      "repetition_penalty": {"exclusiveMinimum": 0}}
