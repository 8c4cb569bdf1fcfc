"""Anthropic's Messages API end to end: the official `anthropic` SDK against a live server on the
default model (`messages.create`, `messages.stream`, `messages.count_tokens`, a `tool_use` ->
`tool_result` round trip, errors in Anthropic's shape). Every response and event is validated
against the contract; the thinking budget is tested on a tiny Qwen3 (test_messages_thinking)."""

from __future__ import annotations

from typing import Any

import anthropic
import httpx
import pytest

from tests import HANG_S
from tests.e2e.conftest import LiveServer
from tests.e2e.named_sse import check, named_events

pytestmark = pytest.mark.slow

WEATHER = {"name": "get_weather", "description": "The weather in a city.",
           "input_schema": {"type": "object", "properties": {
               "city": {"type": "string", "enum": ["Paris", "Rome"]}},
               "required": ["city"], "additionalProperties": False}}
HI: list[Any] = [{"role": "user", "content": "Say hello."}]


@pytest.fixture(scope="module")
def client(live_server: LiveServer) -> Any:  # Any: the SDK's overloads type model names
    return anthropic.Anthropic(base_url=live_server.url, api_key="unused", timeout=HANG_S,
                               max_retries=0)


@pytest.fixture(scope="module")
def model(live_server: LiveServer) -> str:
    ids: str = httpx.get(live_server.url + "/v1/models", timeout=HANG_S).json()["data"][0]["id"]
    return ids


def post(live_server: LiveServer, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(live_server.url + path, json=body, timeout=HANG_S,
                      headers={"anthropic-version": "2023-06-01"})


def test_create(client: Any, model: str, live_server: LiveServer) -> None:
    m = client.messages.create(model=model, max_tokens=32, messages=HI, extra_body={"temperature": 0},
                               system="You are terse.")
    assert m.role == "assistant" and m.content and m.content[0].type == "text"
    assert m.stop_reason in ("end_turn", "max_tokens")
    assert m.usage.output_tokens <= 32
    r = post(live_server, "/v1/messages", {"model": model, "max_tokens": 32, "messages": HI,
                                           "temperature": 0, "system": "You are terse."})
    assert r.status_code == 200, r.text
    check("MessagesResponse", r.json())
    assert r.json()["content"][0]["text"] == m.content[0].text  # greedy: the same answer
    # the prompt resent whole: its prefix comes from the cache
    assert r.json()["usage"]["cache_read_input_tokens"] > 0


def test_count_tokens_is_what_create_runs(client: Any, model: str) -> None:
    counted = client.messages.count_tokens(model=model, messages=HI, system="You are terse.",
                                           tools=[WEATHER])
    m = client.messages.create(model=model, max_tokens=4, messages=HI, system="You are terse.",
                               tools=[WEATHER])
    assert counted.input_tokens == m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0)


def test_stream(client: Any, model: str, live_server: LiveServer) -> None:
    with client.messages.stream(model=model, max_tokens=24, messages=HI,
                                extra_body={"temperature": 0}) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert final.content[0].type == "text" and final.content[0].text == text
    with httpx.stream("POST", live_server.url + "/v1/messages", timeout=HANG_S, json={
            "model": model, "max_tokens": 24, "messages": HI, "temperature": 0,
            "stream": True}) as r:
        assert r.status_code == 200
        events = named_events(r.read().decode())
    names = [n for n, _ in events]
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    for name, data in events:
        assert data["type"] == name
        check("MessagesStreamEvent", data)
    written = "".join(d["delta"]["text"] for n, d in events if n == "content_block_delta")
    assert written == text


def test_tool_use_round_trip(client: Any, model: str,
                             live_server: LiveServer) -> None:
    first = client.messages.create(
        model=model, max_tokens=64, extra_body={"temperature": 0}, tools=[WEATHER],
        tool_choice={"type": "tool", "name": "get_weather"},
        messages=[{"role": "user", "content": "What is the weather in Rome?"}])
    assert first.stop_reason == "tool_use"
    uses = [b for b in first.content if b.type == "tool_use"]
    assert len(uses) == 1 and uses[0].name == "get_weather"
    assert uses[0].input["city"] in ("Paris", "Rome")
    second = client.messages.create(
        model=model, max_tokens=24, extra_body={"temperature": 0}, tools=[WEATHER],
        messages=[{"role": "user", "content": "What is the weather in Rome?"},
                  {"role": "assistant", "content": first.content},
                  {"role": "user", "content": [{"type": "tool_result",
                                                "tool_use_id": uses[0].id,
                                                "content": "Sunny, 24 C"}]}])
    assert second.content and second.usage.cache_read_input_tokens  # the first turn's prefix
    with httpx.stream("POST", live_server.url + "/v1/messages", timeout=HANG_S, json={
            "model": model, "max_tokens": 64, "temperature": 0, "tools": [WEATHER],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": True}, "stream": True,
            "messages": [{"role": "user", "content": "Weather in Paris?"}]}) as r:
        events = named_events(r.read().decode())
    for _, data in events:
        check("MessagesStreamEvent", data)
    starts = [d["content_block"] for n, d in events if n == "content_block_start"]
    assert [b["type"] for b in starts if b["type"] == "tool_use"] == ["tool_use"]
    assert starts[0]["type"] == "tool_use"
    partial = "".join(d["delta"]["partial_json"] for n, d in events
                      if n == "content_block_delta" and d["index"] == 0)
    assert partial.startswith("{") and "city" in partial
    assert events[-2][1]["delta"]["stop_reason"] == "tool_use"


def test_errors_in_anthropic_shape(live_server: LiveServer, model: str) -> None:
    cases: list[tuple[dict[str, Any], Any]] = [
        ({"model": model, "messages": HI}, 400),  # max_tokens is required
        ({"model": "claude-nope", "max_tokens": 8, "messages": HI}, 404),
        ({"model": model, "max_tokens": 8, "messages": HI, "mcp_servers": [
            {"type": "url", "url": "https://x.example/mcp", "name": "x"}]}, 400),
        ({"model": model, "max_tokens": 8, "messages": HI,
          "tools": [{"type": "web_search_20250305", "name": "web_search"}]}, 400),
        ({"model": model, "max_tokens": 8, "messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "url", "url": "https://x.example/a.png"}}]}]},
         400),
        ({"model": model, "max_tokens": 2000, "messages": HI,
          "thinking": {"type": "enabled", "budget_tokens": 4000}}, 400),
    ]
    for body, status in cases:
        r = post(live_server, "/v1/messages", body)
        assert r.status_code == status, (body, r.text)
        check("MessagesErrorResponse", r.json())
    with pytest.raises(anthropic.NotFoundError):
        anthropic.Anthropic(base_url=live_server.url, api_key="unused", timeout=HANG_S,
                            max_retries=0).messages.create(
            model="claude-nope", max_tokens=4, messages=HI)
