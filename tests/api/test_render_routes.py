"""vLLM's render routes on the engine double: the prompt token ids, text and sampling a request
would run, exactly what its generating route submits, and nothing generated."""

from __future__ import annotations

from typing import Any

import pytest
from starlette.testclient import TestClient

from kiln.api.app import build_app
from kiln.api.contract import contract
from kiln.api.handlers.render import sampling
from kiln.config import ServerConfig
from tests.api.fake_backend import FakeBackend

MSG = [{"role": "user", "content": "hi"}]


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
    assert out["sampling_params"] == sampling(ran.sampling)
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
        assert entry["sampling_params"] == sampling(ran.sampling)


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
