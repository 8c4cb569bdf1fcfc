"""vLLM's render routes on the engine double: the prompt token ids, text and sampling a request
would run, exactly what its generating route submits, and nothing generated."""

from __future__ import annotations

import dataclasses
from typing import Any

import msgspec
import pytest
from starlette.testclient import TestClient

from kiln.api.app import build_app
from kiln.api.contract import contract
from kiln.api.handlers.render import sampling
from kiln.config import ServerConfig
from kiln.engine.request import Request, SamplingParams
from tests.api.fake_backend import FakeBackend

MSG = [{"role": "user", "content": "hi"}]


def ran_with(request: Request) -> Any:
    """What render should show for an engine request, as JSON reads it back."""
    shown = sampling(request.sampling, request.priority, request.cache_salt)
    return msgspec.json.decode(msgspec.json.encode(shown))


def render(client: TestClient, route: str, body: dict[str, Any], schema: str) -> Any:
    r = client.post(route + "/render", json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    assert contract().first_violation(schema, out) is None, out
    return out


@pytest.mark.parametrize("body", [
    {"messages": MSG},
    {"messages": MSG, "temperature": 0.3, "max_tokens": 7, "stop": ["x"], "seed": 3,
     "logprobs": True, "top_logprobs": 2, "chat_template_kwargs": {"enable_thinking": True}},
    {"messages": [*MSG, {"role": "assistant", "content": "Once"}],
     "add_generation_prompt": False, "continue_final_message": True},
])
def test_chat_render_is_what_chat_runs(client: TestClient, backend: FakeBackend,
                                       body: dict[str, Any]) -> None:
    out = render(client, "/v1/chat/completions", body, "RenderedPrompt")
    assert backend.submitted == []  # nothing generated
    assert client.post("/v1/chat/completions", json=body).status_code == 200
    (ran,) = backend.submitted
    assert out["token_ids"] == ran.prompt_token_ids
    assert backend.tokenizer.encode(out["prompt"]) == ran.prompt_token_ids
    assert out["sampling_params"] == ran_with(ran)
    assert out["model"] == "fake-model"


@pytest.mark.parametrize("body", [
    {"prompt": "Once upon"},
    {"prompt": ["ab", "cde"], "n": 2, "max_tokens": 5, "seed": 9, "logprobs": 1},
    {"prompt": [[10, 11, 12], [13]], "max_tokens": 2},
    {"prompt": "abcdefgh", "truncate_prompt_tokens": 3, "max_tokens": 2},
])
def test_completion_render_is_what_completions_run(client: TestClient, backend: FakeBackend,
                                                   body: dict[str, Any]) -> None:
    out = render(client, "/v1/completions", body, "CompletionRenderResponse")
    assert backend.submitted == []
    assert client.post("/v1/completions", json=body).status_code == 200
    n = body.get("n", 1)
    assert len(out) * n == len(backend.submitted)
    for i, entry in enumerate(out):
        ran = backend.submitted[i * n]
        assert entry["token_ids"] == ran.prompt_token_ids
        assert entry["sampling_params"] == ran_with(ran)


NEWEST: dict[str, Any] = {
    "max_tokens": 16, "temperature": 0.5, "top_k": -1, "seed": 4, "logprobs": True,
    "logprob_token_ids": [9, 7], "repetition_detection": {"max_pattern_size": 3, "min_count": 2},
    "bad_words": ["q"], "logit_bias": {"12": 250, "5": -1}, "min_tokens": 2,
    "stop_token_ids": [11], "ignore_eos": True, "skip_special_tokens": False,
}


@pytest.mark.parametrize(("route", "body"), [
    ("/v1/chat/completions", {"messages": MSG, **NEWEST, "thinking_budget_tokens": 3,
                              "chat_template_kwargs": {"enable_thinking": True},
                              "priority": 4, "cache_salt": "room"}),
    ("/v1/completions", {"prompt": "Why?<think>", **NEWEST, "logprobs": 1,
                         "thinking_token_budget": 3, "priority": -2, "cache_salt": "tenant",
                         "allowed_token_ids": [7, 9, 11, 12, 13, 14, 15]}),
])
def test_render_shows_every_sampling_field(client: TestClient, backend: FakeBackend,
                                           route: str, body: dict[str, Any]) -> None:
    """Every field of the engine's SamplingParams (one mapping, so none can be left out), the
    newest included, with the values the generating route hands the engine."""
    schema = "RenderedPrompt" if route.startswith("/v1/chat") else "CompletionRenderResponse"
    out = render(client, route, body, schema)
    shown = out if isinstance(out, dict) else out[0]
    params = shown["sampling_params"]
    assert set(params) == {f.name for f in dataclasses.fields(SamplingParams)} | {
        "priority", "cache_salt"}
    assert client.post(route, json=body).status_code == 200
    (ran,) = backend.submitted
    assert params == ran_with(ran)
    assert params["logprob_token_ids"] == [9, 7]
    assert params["repetition_detection"] == {"max_pattern_size": 3, "min_count": 2,
                                              "min_pattern_size": 1}
    assert params["logit_bias"] == [[5, -1.0], [12, 100.0]]  # sorted, clamped to +/-100
    assert params["bad_words_ids"] == [[ord("q") + 3]]
    assert params["thinking"]["max_tokens"] == 3
    assert (params["min_tokens"], params["stop_token_ids"], params["top_k"]) == (2, [11], 0)
    assert params["skip_special_tokens"] is False
    chat = route.startswith("/v1/chat")
    assert (params["priority"], params["cache_salt"]) == ((4, "room") if chat else (-2, "tenant"))
    assert (ran.priority, ran.cache_salt) == (params["priority"], params["cache_salt"])
    assert params["allowed_token_ids"] == (None if chat else [7, 9, 11, 12, 13, 14, 15])


def test_completion_render_of_a_scoring_request(client: TestClient) -> None:
    (entry,) = render(client, "/v1/completions", {"prompt": "ab", "prompt_logprobs": 3},
                      "CompletionRenderResponse")
    assert entry["token_ids"] == [1, ord("a") + 3, ord("b") + 3]
    assert entry["prompt"] == "ab" and entry["sampling_params"]["max_tokens"] == 0


@pytest.mark.parametrize(("route", "body", "param"), [
    ("/v1/chat/completions", {"messages": []}, "messages"),
    ("/v1/chat/completions", {"messages": MSG, "model": "nope"}, "model"),
    ("/v1/completions", {"prompt": [5000]}, "prompt"),
    ("/v1/completions", {"prompt": "a", "suffix": "x"}, "suffix"),
])
def test_render_refuses_what_the_route_refuses(client: TestClient, route: str,
                                               body: dict[str, Any], param: str) -> None:
    for path in (route, route + "/render"):
        r = client.post(path, json=body)
        assert r.status_code in (400, 404), r.text
        assert r.json()["error"]["param"] == param


def test_render_needs_the_api_key(backend: FakeBackend) -> None:
    app = build_app(ServerConfig(api_keys=("sekret",)), backend)
    with TestClient(app) as c:
        for route, body in (("/v1/chat/completions/render", {"messages": MSG}),
                            ("/v1/completions/render", {"prompt": "a"})):
            assert c.post(route, json=body).status_code == 401
            ok = c.post(route, json=body, headers={"authorization": "Bearer sekret"})
            assert ok.status_code == 200
