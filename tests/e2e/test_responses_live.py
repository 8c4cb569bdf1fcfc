"""OpenAI's Responses API end to end: the official `openai` SDK against a live server on the
default model (text, a function-tool round trip, `responses.parse`, `responses.stream`, a
three-turn `previous_response_id` chain), and the raw stream's events checked one by one.
Every response object and event is validated against the contract."""

from __future__ import annotations

import json
from typing import Any, Literal

import httpx
import openai
import pytest
from pydantic import BaseModel

from tests import HANG_S
from tests.e2e.conftest import LiveServer
from tests.e2e.named_sse import check, named_events

pytestmark = pytest.mark.slow

WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city.",
           "parameters": {"type": "object", "properties": {
               "city": {"type": "string", "enum": ["Paris", "Rome"]}},
               "required": ["city"], "additionalProperties": False}, "strict": True}


@pytest.fixture(scope="module")
def client(live_server: LiveServer) -> Any:  # Any: the SDK's overloads type model names
    return openai.OpenAI(base_url=live_server.url + "/v1", api_key="unused", timeout=HANG_S,
                         max_retries=0)


@pytest.fixture(scope="module")
def model(client: Any) -> str:
    name: str = client.models.list().data[0].id
    return name


def raw(live_server: LiveServer, body: dict[str, Any]) -> dict[str, Any]:
    r = httpx.post(live_server.url + "/v1/responses", json=body, timeout=HANG_S)
    assert r.status_code == 200, r.text
    data: dict[str, Any] = r.json()
    check("ResponsesObject", data)
    return data


def test_text(client: Any, model: str, live_server: LiveServer) -> None:
    r = client.responses.create(model=model, input="What is the capital of France?",
                                instructions="Answer in one word.", max_output_tokens=16,
                                temperature=0)
    assert r.status in ("completed", "incomplete")
    assert r.output_text
    assert r.usage is not None and r.usage.input_tokens > 0
    assert r.usage.output_tokens <= 16
    same = raw(live_server, {"model": model, "input": "What is the capital of France?",
                             "instructions": "Answer in one word.", "max_output_tokens": 16,
                             "temperature": 0})
    assert same["output"][0]["content"][0]["text"] == r.output_text  # greedy: the same answer


def test_matches_chat(live_server: LiveServer, model: str) -> None:
    """One engine path: the same turn through chat gives the same tokens."""
    body = {"model": model, "input": "Name a colour.", "max_output_tokens": 12, "seed": 7,
            "temperature": 0.8, "top_logprobs": 2}
    resp = raw(live_server, body)
    chat = httpx.post(live_server.url + "/v1/chat/completions", timeout=HANG_S, json={
        "model": model, "messages": [{"role": "user", "content": "Name a colour."}],
        "max_tokens": 12, "seed": 7, "temperature": 0.8, "logprobs": True, "top_logprobs": 2})
    assert chat.status_code == 200, chat.text
    choice = chat.json()["choices"][0]
    part = resp["output"][0]["content"][0]
    assert part["text"] == choice["message"]["content"]
    assert [lp["token"] for lp in part["logprobs"]] == \
        [lp["token"] for lp in choice["logprobs"]["content"]]
    assert [lp["logprob"] for lp in part["logprobs"]] == \
        [lp["logprob"] for lp in choice["logprobs"]["content"]]
    assert all(len(lp["top_logprobs"]) == 2 for lp in part["logprobs"])


def test_function_tool_round_trip(client: Any, model: str,
                                  live_server: LiveServer) -> None:
    first = client.responses.create(model=model, input="What is the weather in Paris?",
                                    tools=[WEATHER],
                                    tool_choice={"type": "function", "name": "get_weather"},
                                    max_output_tokens=64, temperature=0)
    calls = [o for o in first.output if o.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather"
    assert json.loads(calls[0].arguments)["city"] in ("Paris", "Rome")
    stored = httpx.get(f"{live_server.url}/v1/responses/{first.id}", timeout=HANG_S).json()
    check("ResponsesObject", stored)
    assert stored["output"][0]["arguments"] == calls[0].arguments
    second = client.responses.create(
        model=model, previous_response_id=first.id, max_output_tokens=16, temperature=0,
        input=[{"type": "function_call_output", "call_id": calls[0].call_id,
                "output": "Sunny, 21 C"}])
    assert second.status in ("completed", "incomplete") and second.output_text
    assert second.usage is not None and second.usage.input_tokens_details.cached_tokens > 0
    # stateless: the same turn, the items resent whole (store false), the same answer
    again = raw(live_server, {
        "model": model, "store": False, "max_output_tokens": 16, "temperature": 0,
        "tools": [WEATHER],
        "input": [{"role": "user", "content": "What is the weather in Paris?"},
                  {"type": "function_call", "call_id": calls[0].call_id,
                   "name": "get_weather", "arguments": calls[0].arguments},
                  {"type": "function_call_output", "call_id": calls[0].call_id,
                   "output": "Sunny, 21 C"}]})
    assert again["output"][0]["content"][0]["text"] == second.output_text
    gone = httpx.get(f"{live_server.url}/v1/responses/{again['id']}", timeout=HANG_S)
    assert gone.status_code == 404  # store: false keeps nothing


class City(BaseModel):
    country: Literal["France", "Spain", "Italy"]
    capital: bool


def test_parse_with_pydantic(client: Any, model: str) -> None:
    r = client.responses.parse(model=model, input="Paris: which country, and is it the capital?",
                               text_format=City, max_output_tokens=48, temperature=0)
    assert isinstance(r.output_parsed, City)


def test_stream_events_in_order(client: Any, model: str) -> None:
    types: list[str] = []
    with client.responses.stream(model=model, input="Say hello.", max_output_tokens=64,
                                 temperature=0) as stream:
        for event in stream:
            types.append(event.type)
        final = stream.get_final_response()
    assert types[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]
    deltas = [t for t in types if t == "response.output_text.delta"]
    assert deltas and types[4:4 + len(deltas)] == deltas
    assert types[4 + len(deltas):] == ["response.output_text.done", "response.content_part.done",
                                       "response.output_item.done",
                                       f"response.{'completed' if final.status == 'completed' else 'incomplete'}"]
    assert final.output_text


def test_raw_stream_is_the_contract(live_server: LiveServer, model: str) -> None:
    body = {"model": model, "input": "What is the weather in Rome?", "tools": [WEATHER],
            "tool_choice": "required", "max_output_tokens": 64, "stream": True,
            "temperature": 0, "include": ["message.output_text.logprobs"]}
    with httpx.stream("POST", live_server.url + "/v1/responses", json=body,
                      timeout=HANG_S) as r:
        assert r.status_code == 200
        events = named_events(r.read().decode())
    for number, (name, data) in enumerate(events):
        assert data["type"] == name and data["sequence_number"] == number
        check("ResponsesStreamEvent", data)
    names = [n for n, _ in events]
    assert "response.function_call_arguments.delta" in names
    final = events[-1][1]["response"]
    calls = [o for o in final["output"] if o["type"] == "function_call"]
    done = [d for n, d in events if n == "response.function_call_arguments.done"]
    assert [c["arguments"] for c in calls] == [d["arguments"] for d in done]
    stored = httpx.get(f"{live_server.url}/v1/responses/{final['id']}", timeout=HANG_S).json()
    assert stored == final
    again = httpx.get(f"{live_server.url}/v1/responses/{final['id']}",
                      params={"stream": "true", "starting_after": "1"}, timeout=HANG_S)
    replayed = named_events(again.text)
    assert replayed[0][1]["sequence_number"] == 2 and replayed[-1][1]["response"] == final
    for _, data in replayed:
        check("ResponsesStreamEvent", data)


def test_three_turn_chain(client: Any, model: str, live_server: LiveServer) -> None:
    first = client.responses.create(model=model, input="My name is Ada.", max_output_tokens=8,
                                    temperature=0)
    second = client.responses.create(model=model, input="What is my name?",
                                     previous_response_id=first.id, max_output_tokens=8,
                                     temperature=0)
    third = client.responses.create(model=model, input="Spell it.",
                                    previous_response_id=second.id, max_output_tokens=8,
                                    temperature=0)
    for r in (second, third):
        assert r.usage is not None and r.usage.input_tokens_details.cached_tokens > 0
    assert third.usage is not None and second.usage is not None
    assert third.usage.input_tokens > second.usage.input_tokens  # the whole conversation
    items = client.responses.input_items.list(third.id)
    assert [i.type for i in items.data] == ["message"]
    check("ResponsesInputItemList", httpx.get(
        f"{live_server.url}/v1/responses/{third.id}/input_items", timeout=HANG_S).json())
    client.responses.delete(second.id)
    with pytest.raises(openai.NotFoundError, match="not stored"):
        client.responses.create(model=model, input="Again?", previous_response_id=third.id,
                                max_output_tokens=4)


def test_refused_fields_are_400(live_server: LiveServer, model: str) -> None:
    cases: list[tuple[dict[str, Any], Any]] = [
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"background": True}, "background"),
        ({"input": [{"role": "user", "content": [
            {"type": "input_image", "image_url": "http://x/y.png"}]}]}, "input[0].content[0]"),
        ({"reasoning": {"summary": "detailed"}}, "reasoning.summary"),
        ({"include": ["file_search_call.results"]}, "include[0]"),
        ({"previous_response_id": "resp_nope"}, "previous_response_id"),
    ]
    for extra, param in cases:
        r = httpx.post(live_server.url + "/v1/responses", timeout=HANG_S,
                       json={"model": model, "input": "Hi", **extra})
        assert r.status_code in (400, 404), r.text
        check("ErrorResponse", r.json())
        assert r.json()["error"]["param"] == param, r.text


def test_rollout_provenance_is_chats(live_server: LiveServer, model: str) -> None:
    """rollout_provenance on the agent APIs: chat's record of the same turn."""
    body = {"model": model, "input": "Name a fruit.", "max_output_tokens": 8, "seed": 11,
            "temperature": 0.7, "rollout_provenance": True}
    resp = raw(live_server, body)
    chat = httpx.post(live_server.url + "/v1/chat/completions", timeout=HANG_S, json={
        "model": model, "messages": [{"role": "user", "content": "Name a fruit."}],
        "max_tokens": 8, "seed": 11, "temperature": 0.7, "rollout_provenance": True}).json()
    record = chat["choices"][0]["rollout_provenance"]
    check("RolloutProvenanceV1", resp["rollout_provenance"])
    assert resp["rollout_provenance"]["input_token_ids"] == record["input_token_ids"]
    assert resp["rollout_provenance"]["action_tokens"] == record["action_tokens"]
    msg = httpx.post(live_server.url + "/v1/messages", timeout=HANG_S, json={
        "model": model, "max_tokens": 8, "seed": 11, "temperature": 0.7,
        "rollout_provenance": True, "messages": [{"role": "user", "content": "Name a fruit."}]})
    assert msg.status_code == 200, msg.text
    check("MessagesResponse", msg.json())
    assert msg.json()["rollout_provenance"]["action_tokens"] == record["action_tokens"]
    refused = httpx.post(live_server.url + "/v1/responses", timeout=HANG_S,
                         json={**body, "stream": True})
    assert refused.status_code == 400
    assert refused.json()["error"]["param"] == "rollout_provenance"
