"""Fields that were accepted and not honoured (issue 52, 4): each is now honoured or a 400
naming it, on the engine double (with the tiny test tokenizer where a grammar must compile)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import llguidance
import pytest
from starlette.testclient import TestClient

from kiln.api.app import build_app
from kiln.api.contract import contract
from kiln.api.structured.constraints import from_response_format
from kiln.config import ServerConfig
from kiln.text.tokenizer import Tokenizer
from tests.api.fake_backend import FakeBackend
from tests.tiny_models import tiny_tokenizer

CHAT = "/v1/chat/completions"
MSG = [{"role": "user", "content": "hi"}]


@pytest.fixture
def tiny_client() -> Iterator[tuple[TestClient, FakeBackend]]:
    """The engine double with a tokenizer that can drive a grammar."""
    backend = FakeBackend()
    tiny = tiny_tokenizer()
    eos = tiny.token_to_id("<|im_end|>")
    assert eos is not None
    backend.tokenizer = Tokenizer(tiny, eos_token_ids=[eos])  # type: ignore[assignment]
    with TestClient(build_app(ServerConfig(), backend), raise_server_exceptions=False) as c:
        yield c, backend


def _accepts(grammar: str, text: str) -> bool:
    tiny = tiny_tokenizer()
    tok = llguidance.LLTokenizer(tiny.to_str(), eos_token=tiny.token_to_id("<|im_end|>"))
    m = llguidance.LLMatcher(tok, grammar, log_level=0)
    assert not m.is_error(), m.get_error()
    return m.consume_tokens(tok.tokenize_str(text)) and m.is_accepting()


def test_json_object_with_a_schema_is_that_schema(
        tiny_client: tuple[TestClient, FakeBackend]) -> None:
    """llama-server's ``{"type": "json_object", "schema": {...}}``: the schema is enforced (it
    had been any JSON object)."""
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    built = from_response_format({"type": "json_object", "schema": schema})
    assert built is not None and built[1] == "response_format.schema"
    assert _accepts(built[0], '{"a": 1}')
    assert not _accepts(built[0], '{"a": "x"}') and not _accepts(built[0], '{"b": 1}')
    client, backend = tiny_client
    r = client.post(CHAT, json={"messages": MSG, "response_format": {
        "type": "json_object", "schema": schema}})
    assert r.status_code == 200, r.text
    spec = backend.submitted[-1].sampling.grammar
    assert spec is not None and spec.grammar == built[0]


@pytest.mark.parametrize(("name", "value"), [
    ("modalities", ["text", "audio"]), ("audio", {"voice": "alloy", "format": "wav"}),
    ("prediction", {"type": "content", "content": "x"}), ("web_search_options", {}),
    ("service_tier", "flex"), ("store", True), ("verbosity", "low"),
])
def test_openai_fields_that_ask_for_behaviour_are_refused(client: TestClient, name: str,
                                                           value: Any) -> None:
    r = client.post(CHAT, json={"messages": MSG, name: value})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == name and error["code"] == "unsupported_parameter"


def test_openai_labels_and_defaults_are_accepted(client: TestClient) -> None:
    r = client.post(CHAT, json={
        "messages": MSG, "user": "u-1", "safety_identifier": "s", "prompt_cache_key": "k",
        "metadata": {"run": "7"}, "modalities": ["text"], "audio": None, "store": False,
        "service_tier": "auto", "verbosity": "medium", "prediction": None})
    assert r.status_code == 200, r.text


def _events(text: str) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in text.splitlines()
            if line.startswith("data: {")]


@pytest.mark.parametrize("route", [CHAT, "/v1/completions"])
def test_continuous_usage_stats_puts_the_usage_on_every_chunk(client: TestClient,
                                                              backend: FakeBackend,
                                                              route: str) -> None:
    backend.reply = "abc"
    body: dict[str, Any] = {"messages": MSG} if route == CHAT else {"prompt": "hi"}
    options = {"include_usage": True, "continuous_usage_stats": True}
    events = _events(client.post(route, json={**body, "stream": True,
                                             "stream_options": options}).text)
    assert events and all("usage" in e for e in events)
    counts = [e["usage"]["completion_tokens"] for e in events]
    assert counts == sorted(counts) and counts[-1] >= 3
    for e in events:
        u = e["usage"]
        assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]
    plain = _events(client.post(route, json={**body, "stream": True, "stream_options": {
        "include_usage": True}}).text)
    assert [("usage" in e) for e in plain] == [False] * (len(plain) - 1) + [True]


def test_llama_server_grammar_fields_go_through_the_grammar_stage(
        tiny_client: tuple[TestClient, FakeBackend]) -> None:
    client, backend = tiny_client
    r = client.post(CHAT, json={"messages": MSG, "grammar": 'root ::= "yes" | "no"'})
    assert r.status_code == 200, r.text
    spec = backend.submitted[-1].sampling.grammar
    assert spec is not None and spec.param == "grammar"
    assert _accepts(spec.grammar, "yes") and not _accepts(spec.grammar, "maybe")
    r = client.post(CHAT, json={"messages": MSG, "json_schema": {"type": "integer"}})
    assert r.status_code == 200, r.text
    spec = backend.submitted[-1].sampling.grammar
    assert spec is not None and spec.param == "json_schema"
    assert _accepts(spec.grammar, "12") and not _accepts(spec.grammar, '"12"')
    for extra in ({"grammar": 'root ::= "a"'}, {"response_format": {"type": "json_object"}}):
        r = client.post(CHAT, json={"messages": MSG, "json_schema": {"type": "integer"},
                                    **extra})
        assert r.status_code == 400, r.text
    r = client.post(CHAT, json={"messages": MSG, "json_schema": {"not": {}}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "json_schema"


def test_n_probs_is_logprobs_with_n_alternatives(client: TestClient) -> None:
    r = client.post(CHAT, json={"messages": MSG, "n_probs": 3})
    assert r.status_code == 200, r.text
    content = r.json()["choices"][0]["logprobs"]["content"]
    assert content and all(len(t["top_logprobs"]) == 3 for t in content)
    r = client.post(CHAT, json={"messages": MSG, "n_probs": 3, "logprobs": True,
                                "top_logprobs": 2})
    assert r.status_code == 400 and r.json()["error"]["param"] == "n_probs"
    r = client.post(CHAT, json={"messages": MSG, "n_probs": 0})
    assert r.status_code == 200 and r.json()["choices"][0].get("logprobs") is None


def test_stream_on_batch_is_refused(client: TestClient) -> None:
    r = client.post("/v1/completions/batch", json={"prompts": [MSG], "stream": True})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "stream"
    assert client.post("/v1/completions/batch", json={"prompts": [MSG],
                                                      "stream": False}).status_code == 200


def test_cached_tokens_are_reported_on_every_route(client: TestClient,
                                                   backend: FakeBackend) -> None:
    backend.cached_tokens = 5
    chat = client.post(CHAT, json={"messages": MSG, "n": 2}).json()
    assert chat["usage"]["prompt_tokens_details"] == {"cached_tokens": 5}
    assert contract().first_violation("ChatCompletionResponse", chat) is None
    done = client.post("/v1/completions", json={"prompt": ["ab cd ef", "gh ij kl"], "n": 2,
                                                "max_tokens": 2}).json()
    assert done["usage"]["prompt_tokens_details"] == {"cached_tokens": 10}  # once per prompt
    batch = client.post("/v1/completions/batch", json={"prompts": [MSG, MSG]}).json()
    assert batch["usage"]["prompt_tokens_details"] == {"cached_tokens": 10}
    assert [i["usage"]["prompt_tokens_details"] for i in batch["completions"]] == [
        {"cached_tokens": 5}] * 2
    assert contract().first_violation("BatchCompletionResponse", batch) is None
    events = _events(client.post(CHAT, json={"messages": MSG, "stream": True, "stream_options": {
        "include_usage": True}}).text)
    assert events[-1]["usage"]["prompt_tokens_details"] == {"cached_tokens": 5}
