"""Structured outputs and forced tool calls on chat, end to end on the default model (which,
left to itself, answers in prose and never calls a tool): the OpenAI SDK's ``parse``,
``response_format`` JSON and SSE, refusals, and ``tool_choice`` required / named."""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Any

import httpx
import jsonschema
import openai
import pydantic
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests import HANG_S
from tests.e2e.conftest import LiveServer
from tests.e2e.test_chat_live import check, check_stream

pytestmark = pytest.mark.slow
MODEL = "SmolLM2-135M-Instruct"
ASK: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Describe a fictional person as JSON."}]
WEATHER: dict[str, Any] = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
        "required": ["city", "unit"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {
        "zone": {"type": "string"}}, "required": ["zone"]}}}


class Colour(StrEnum):
    red = "red"
    green = "green"


class Pet(pydantic.BaseModel):
    name: str
    legs: int = pydantic.Field(ge=0, le=8)


class Person(pydantic.BaseModel):
    name: str
    age: int = pydantic.Field(ge=0, le=120)
    height_m: float = pydantic.Field(ge=0.5, le=2.5)
    colour: Colour
    nickname: str | None = None
    pets: list[Pet] = pydantic.Field(max_length=2)


def post(server: LiveServer, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(server.url + "/v1/chat/completions", json=body, timeout=HANG_S)


def test_sdk_parse_returns_a_parsed_pydantic_object(live_server: LiveServer) -> None:
    client = openai.OpenAI(base_url=live_server.url + "/v1", api_key="unused", timeout=HANG_S,
                           max_retries=0)
    for seed in (1, 2):
        done = client.chat.completions.parse(
            model=MODEL, messages=ASK, response_format=Person, seed=seed, max_tokens=200)
        choice = done.choices[0]
        assert choice.finish_reason == "stop", choice
        assert isinstance(choice.message.parsed, Person)


def test_sdk_parse_stream(live_server: LiveServer) -> None:
    client = openai.OpenAI(base_url=live_server.url + "/v1", api_key="unused", timeout=HANG_S,
                           max_retries=0)
    with client.chat.completions.stream(model=MODEL, messages=ASK, response_format=Person,
                                        seed=3, max_tokens=200) as stream:
        final = stream.get_final_completion()
    assert isinstance(final.choices[0].message.parsed, Person)


def test_json_schema_sse_text_validates(live_server: LiveServer) -> None:
    schema = Person.model_json_schema()
    r = post(live_server, {"messages": ASK, "stream": True, "seed": 4, "max_tokens": 200,
                           "response_format": {"type": "json_schema", "json_schema": {
                               "name": "person", "schema": schema, "strict": True}}})
    assert r.status_code == 200, r.text
    chunks = check_stream(r.text)
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    jsonschema.validate(json.loads(text), schema)
    assert [c["choices"][0].get("finish_reason") for c in chunks if c["choices"]][-1] == "stop"


def test_json_object_is_an_object(live_server: LiveServer) -> None:
    r = post(live_server, {"messages": ASK, "seed": 5, "max_tokens": 120,
                           "response_format": {"type": "json_object"}})
    assert r.status_code == 200, r.text
    check("ChatCompletionResponse", r.json())
    choice = r.json()["choices"][0]
    if choice["finish_reason"] == "stop":
        assert isinstance(json.loads(choice["message"]["content"]), dict)


def test_text_format_is_unconstrained(live_server: LiveServer) -> None:
    plain = post(live_server, {"messages": ASK, "max_tokens": 8, "temperature": 0})
    text = post(live_server, {"messages": ASK, "max_tokens": 8, "temperature": 0,
                              "response_format": {"type": "text"}})
    assert text.json()["choices"][0]["message"] == plain.json()["choices"][0]["message"]


def test_cut_json_says_length(live_server: LiveServer) -> None:
    r = post(live_server, {"messages": ASK, "max_tokens": 3, "seed": 6,
                           "response_format": {"type": "json_schema", "json_schema": {
                               "name": "p", "schema": Person.model_json_schema()}}})
    assert r.json()["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize(("fmt", "param", "needle"), [
    ({"type": "bogus"}, "response_format", "bogus"),
    ({"type": "json_schema"}, "response_format", "json_schema"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "if": {"type": "object"}}}}, "response_format.json_schema.schema", "if"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}},
     "response_format.json_schema.schema", "strin"),
])
def test_malformed_or_refused_format_is_a_400(live_server: LiveServer, fmt: Any, param: str,
                                              needle: str) -> None:
    r = post(live_server, {"messages": ASK, "max_tokens": 4, "response_format": fmt})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and needle in err["message"], err


def test_ignore_eos_with_a_format_is_a_400(live_server: LiveServer) -> None:
    r = post(live_server, {"messages": ASK, "max_tokens": 4, "ignore_eos": True,
                           "response_format": {"type": "json_object"}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "ignore_eos"


def _calls(body: dict[str, Any]) -> list[dict[str, Any]]:
    check("ChatCompletionResponse", body)
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls", choice
    return list(choice["message"]["tool_calls"])


def _valid(call: dict[str, Any], tools: list[dict[str, Any]]) -> None:
    fn = next(t["function"] for t in tools if t["function"]["name"] == call["function"]["name"])
    jsonschema.validate(json.loads(call["function"]["arguments"]), fn["parameters"])


def test_named_function_forces_exactly_that_call(live_server: LiveServer) -> None:
    for seed in (1, 2, 3):
        r = post(live_server, {
            "messages": [{"role": "user", "content": "Hello!"}], "tools": [WEATHER, TIME],
            "tool_choice": {"type": "function", "function": {"name": "get_time"}},
            "seed": seed, "max_tokens": 60})
        calls = _calls(r.json())
        assert [c["function"]["name"] for c in calls] == ["get_time"]
        _valid(calls[0], [WEATHER, TIME])


def test_required_without_parallel_returns_one_valid_call(live_server: LiveServer) -> None:
    for seed in (1, 2):
        r = post(live_server, {
            "messages": [{"role": "user", "content": "Hi"}], "tools": [WEATHER, TIME],
            "tool_choice": "required", "parallel_tool_calls": False, "seed": seed,
            "max_tokens": 60})
        calls = _calls(r.json())
        assert len(calls) == 1
        _valid(calls[0], [WEATHER, TIME])


def test_required_with_parallel_calls_are_valid(live_server: LiveServer) -> None:
    r = post(live_server, {"messages": [{"role": "user", "content": "Hi"}],
                           "tools": [WEATHER], "tool_choice": "required", "seed": 7,
                           "max_tokens": 100})
    choice = r.json()["choices"][0]
    calls = choice["message"]["tool_calls"]
    assert calls and choice["finish_reason"] in ("tool_calls", "length")
    for call in calls:
        _valid(call, [WEATHER])


def test_forced_call_streams_as_tool_call_deltas(live_server: LiveServer) -> None:
    r = post(live_server, {
        "messages": [{"role": "user", "content": "Hello!"}], "tools": [WEATHER],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "stream": True, "seed": 2, "max_tokens": 60})
    chunks = [c for c in check_stream(r.text) if c["choices"]]
    deltas = [d for c in chunks for d in c["choices"][0]["delta"].get("tool_calls") or []]
    assert deltas and deltas[0]["function"]["name"] == "get_weather"
    args = "".join(d["function"].get("arguments") or "" for d in deltas)
    jsonschema.validate(json.loads(args), WEATHER["function"]["parameters"])
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


@pytest.mark.parametrize(("choice", "tools", "param"), [
    ({"type": "function", "function": {"name": "nope"}}, [WEATHER], "tool_choice.function.name"),
    ("bogus", [WEATHER], "tool_choice"),
    ({"type": "function"}, [WEATHER], "tool_choice"),
    ("required", None, "tools"),
])
def test_bad_tool_choice_is_a_400_naming_it(live_server: LiveServer, choice: Any, tools: Any,
                                            param: str) -> None:
    body: dict[str, Any] = {"messages": ASK, "max_tokens": 4, "tool_choice": choice}
    if tools is not None:
        body["tools"] = tools
    r = post(live_server, body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.json()
