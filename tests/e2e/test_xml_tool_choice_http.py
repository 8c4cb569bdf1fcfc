"""Forced tool calls over HTTP on a tiny random Qwen3 whose chat template writes tool calls in
the Qwen3.5 XML format: the grammar makes even random weights answer with a valid XML call,
which comes back as ``tool_calls`` (JSON and SSE) with arguments valid against the schema."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest
from starlette.testclient import TestClient

from kiln.api.app import build_app
from kiln.api.contract import contract
from kiln.api.structured import xml_tools
from kiln.config import ServerConfig
from kiln.model.loader import load_model
from kiln.serving import EngineBackend
from tests.api.test_chat_fake import sse_events
from tests.tiny_models import QWEN35_XML_TEMPLATE, write_tiny_qwen3

CHAT = "/v1/chat/completions"
MSG = [{"role": "user", "content": "What is the weather?"}]
# Every value is bounded (enum, small integer, boolean), so a random model finishes its call.
PARAMS: dict[str, Any] = {"type": "object", "properties": {
    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    "days": {"type": "integer", "minimum": 1, "maximum": 7},
    "wind": {"type": "boolean"}}, "required": ["unit", "days"]}
TOOLS: list[dict[str, Any]] = [{"type": "function", "function": {"name": "get_weather", "parameters": PARAMS}},
         {"type": "function", "function": {"name": "get_time", "parameters": {
             "type": "object", "properties": {"utc": {"type": "boolean"}},
             "required": ["utc"]}}}]


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    folder = write_tiny_qwen3(tmp_path_factory.mktemp("xml-tools") / "model", seed=5,
                              template=QWEN35_XML_TEMPLATE)
    config = ServerConfig(model=str(folder), kv_memory_mb=32)
    with TestClient(build_app(config, EngineBackend(load_model(str(folder)), config))) as c:
        yield c


def chat(client: TestClient, **body: Any) -> dict[str, Any]:
    r = client.post(CHAT, json={"messages": MSG, "tools": TOOLS, "max_tokens": 120, **body})
    assert r.status_code == 200, r.text
    data: dict[str, Any] = r.json()
    assert contract().first_violation("ChatCompletionResponse", data) is None
    return data


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_named_function_returns_a_valid_xml_call(client: TestClient, seed: int) -> None:
    data = chat(client, seed=seed, logprobs=True, tool_choice={
        "type": "function", "function": {"name": "get_weather"}})
    choice = data["choices"][0]
    written = "".join(t["token"] for t in choice["logprobs"]["content"])
    assert written.startswith("<tool_call>\n<function=get_weather>\n<parameter=unit>\n")
    assert choice["finish_reason"] == "tool_calls"
    calls = choice["message"]["tool_calls"]
    assert [c["function"]["name"] for c in calls] == ["get_weather"]
    jsonschema.validate(json.loads(calls[0]["function"]["arguments"]), PARAMS)


def test_required_without_parallel_returns_one_call(client: TestClient) -> None:
    data = chat(client, seed=4, tool_choice="required", parallel_tool_calls=False)
    calls = data["choices"][0]["message"]["tool_calls"]
    assert len(calls) == 1 and calls[0]["function"]["name"] in {"get_weather", "get_time"}
    schema = TOOLS[0 if calls[0]["function"]["name"] == "get_weather" else 1]["function"]
    jsonschema.validate(json.loads(calls[0]["function"]["arguments"]), schema["parameters"])


def test_streamed_named_call(client: TestClient) -> None:
    body = {"messages": MSG, "tools": TOOLS, "max_tokens": 120, "seed": 1, "stream": True,
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}
    with client.stream("POST", CHAT, json=body) as r:
        assert r.status_code == 200
        events = sse_events("".join(r.iter_text()))
    deltas = [c["delta"] for e in events if isinstance(e, dict) for c in e.get("choices", [])]
    finish = [c["finish_reason"] for e in events if isinstance(e, dict)
              for c in e.get("choices", []) if c.get("finish_reason")]
    assert finish == ["tool_calls"]
    args = "".join(tc["function"].get("arguments", "") for d in deltas
                   for tc in d.get("tool_calls", []))
    streamed = json.loads(args)
    jsonschema.validate(streamed, PARAMS)
    alone = chat(client, seed=1, tool_choice={"type": "function",
                                              "function": {"name": "get_weather"}})
    assert streamed == json.loads(alone["choices"][0]["message"]["tool_calls"][0]["function"]
                                  ["arguments"])  # same seed, same tokens, same call


def test_a_schema_raw_text_cannot_enforce_is_a_400(client: TestClient) -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"d": {"type": "string", "format": "date"}}}}}]
    r = client.post(CHAT, json={"messages": MSG, "tools": tools, "tool_choice": "required"})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["param"] == "tools" and "format" in err["message"]


def test_batch_forces_an_xml_call_on_every_item(client: TestClient) -> None:
    r = client.post("/v1/completions/batch", json={
        "prompts": [MSG, [{"role": "user", "content": "And tomorrow?"}]], "n": 2, "seed": 3,
        "max_tokens": 120, "tools": TOOLS,
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}}})
    assert r.status_code == 200, r.text
    items = r.json()["completions"]
    assert len(items) == 4
    for item in items:
        assert item["finish_reason"] == "tool_calls", item
        assert [c["function"]["name"] for c in item["tool_calls"]] == ["get_weather"]
        jsonschema.validate(json.loads(item["tool_calls"][0]["function"]["arguments"]), PARAMS)


# A raw-text parameter: random weights write prose in it (issue 52.2).
SEARCH_PARAMS: dict[str, Any] = {"type": "object", "properties": {
    "query": {"type": "string"}, "limit": {"type": "integer", "minimum": 1, "maximum": 9}},
    "required": ["query", "limit"]}
SEARCH = [{"type": "function", "function": {"name": "search", "parameters": SEARCH_PARAMS}}]
SEARCH_HEAD = "<tool_call>\n<function=search>\n<parameter=query>\n"


@pytest.mark.parametrize("choice", [{"type": "function", "function": {"name": "search"}},
                                    "required"])
def test_a_string_parameter_has_an_end_and_the_forced_call_completes(
        client: TestClient, monkeypatch: pytest.MonkeyPatch, choice: Any) -> None:
    """Issue 52.2: random weights wrote `<parameter=query>` and then prose until max_tokens
    (finish_reason "length"). With the raw-text cap (small here) the value ends, the call
    completes and comes back as `tool_calls` valid against the schema."""
    monkeypatch.setattr(xml_tools, "RAW_VALUE_MAX_TOKENS", 8, raising=False)
    for seed in (1, 2):
        data = chat(client, seed=seed, tools=SEARCH, tool_choice=choice, max_tokens=200,
                    parallel_tool_calls=False, logprobs=True)
        choice_ = data["choices"][0]
        written = "".join(t["token"] for t in choice_["logprobs"]["content"])
        assert written.startswith(SEARCH_HEAD) and "\n</parameter>\n<parameter=limit>\n" in written
        assert choice_["finish_reason"] == "tool_calls", written
        calls = choice_["message"]["tool_calls"]
        assert [c["function"]["name"] for c in calls] == ["search"]
        args = json.loads(calls[0]["function"]["arguments"])
        jsonschema.validate(args, SEARCH_PARAMS)
        assert written.startswith(SEARCH_HEAD + args["query"] + "\n</parameter>\n")
        assert not choice_["message"].get("content")


@pytest.mark.parametrize("stream", [False, True])
def test_max_tokens_inside_a_forced_call_reports_the_call_so_far(client: TestClient,
                                                                 stream: bool) -> None:
    """Issue 52.2: max_tokens reached inside a forced XML call finishes with "length" and the
    call as far as it was written in `tool_calls` (as vLLM reports it), never in the content."""
    body = {"messages": MSG, "tools": SEARCH, "max_tokens": 40, "seed": 1, "stream": stream,
            "tool_choice": {"type": "function", "function": {"name": "search"}}}
    r = client.post(CHAT, json=body)
    assert r.status_code == 200, r.text
    if stream:
        events = [e for e in sse_events(r.text) if isinstance(e, dict) and e.get("choices")]
        deltas = [e["choices"][0]["delta"] for e in events]
        content = "".join(d.get("content") or "" for d in deltas)
        calls = [tc for d in deltas for tc in d.get("tool_calls") or []]
        names = [c["function"]["name"] for c in calls if c["function"].get("name")]
        args = "".join(c["function"].get("arguments", "") for c in calls)
        finish = [e["choices"][0]["finish_reason"] for e in events
                  if e["choices"][0].get("finish_reason")]
    else:
        choice = r.json()["choices"][0]
        content = choice["message"].get("content") or ""
        names = [c["function"]["name"] for c in choice["message"]["tool_calls"]]
        args = choice["message"]["tool_calls"][0]["function"]["arguments"]
        finish = [choice["finish_reason"]]
    assert finish == ["length"] and names == ["search"] and content == ""
    assert set(json.loads(args)) == {"query"}  # cut inside the query: limit not yet written


def test_a_bounded_raw_text_parameter_is_honoured(client: TestClient) -> None:
    """Issue 52.2: minLength/maxLength on a raw-text parameter hold under the engine's masks,
    and the call completes (tests/api/test_xml_tool_cap.py drives the bounds that used to fail
    partway through a value)."""
    params = json.loads(json.dumps(SEARCH_PARAMS))
    params["properties"]["query"].update(minLength=90, maxLength=120)
    tools = [{"type": "function", "function": {"name": "search", "parameters": params}}]
    data = chat(client, seed=3, tools=tools, tool_choice="required", max_tokens=400,
                parallel_tool_calls=False)
    choice = data["choices"][0]
    assert choice["finish_reason"] == "tool_calls", choice
    args = json.loads(choice["message"]["tool_calls"][0]["function"]["arguments"])
    jsonschema.validate(args, params)
    assert 90 <= len(args["query"]) <= 120


def test_a_bound_past_the_length_budget_is_a_400(client: TestClient) -> None:
    params = json.loads(json.dumps(SEARCH_PARAMS))
    params["properties"]["query"]["maxLength"] = 100_000
    tools = [{"type": "function", "function": {"name": "search", "parameters": params}}]
    r = client.post(CHAT, json={"messages": MSG, "tools": tools, "tool_choice": "required"})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "tools"
    assert "function 'search', parameter 'query': maxLength 100000" in err["message"]
