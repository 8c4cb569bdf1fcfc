"""vLLM's ``structured_outputs`` and ``response_format`` on /v1/completions (JSON and SSE), and
the per-request constraint of /v1/completions/batch, end to end on the default model."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import jsonschema
import pytest

from tests import HANG_S
from tests.e2e.conftest import LiveServer
from tests.e2e.test_chat_live import sse

pytestmark = pytest.mark.slow
PROMPT = "Q: What is your favourite thing?\nA:"


def complete(server: LiveServer, **kw: Any) -> httpx.Response:
    body = {"prompt": PROMPT, "max_tokens": 24, **kw}
    return httpx.post(server.url + "/v1/completions", json=body, timeout=HANG_S)


def texts(r: httpx.Response) -> list[tuple[str, str]]:
    assert r.status_code == 200, r.text
    return [(c["text"], c["finish_reason"]) for c in r.json()["choices"]]


def test_choice_returns_exactly_one_of_the_choices(live_server: LiveServer) -> None:
    choices = ["apples", "bananas", "cherry pie"]
    got = texts(complete(live_server, n=4, seed=1, structured_outputs={"choice": choices}))
    assert all(t in choices and f == "stop" for t, f in got), got


def test_regex(live_server: LiveServer) -> None:
    pattern = r"[A-Z][a-z]{2,6} [0-9]{1,3}"
    for text, finish in texts(complete(live_server, n=2, seed=2,
                                       structured_outputs={"regex": pattern})):
        assert finish == "stop" and re.fullmatch(pattern, text), text


def test_lark_grammar(live_server: LiveServer) -> None:
    lark = 'start: "(" pair ("," pair)* ")"\npair: KEY "=" NUM\nKEY: /[a-z]{1,4}/\nNUM: /[0-9]{1,2}/'
    body = re.compile(r"\([a-z]{1,4}=[0-9]{1,2}(,[a-z]{1,4}=[0-9]{1,2})*\)")
    for text, finish in texts(complete(live_server, n=2, seed=3, max_tokens=40,
                                       structured_outputs={"grammar": lark})):
        if finish == "stop":
            assert body.fullmatch(text), text
        else:
            assert text.startswith("(")


@pytest.mark.parametrize("as_text", [False, True])
def test_json_schema_object_or_text(live_server: LiveServer, as_text: bool) -> None:
    schema = {"type": "object", "properties": {"thing": {"type": "string", "maxLength": 20},
                                               "score": {"type": "integer", "minimum": 0,
                                                         "maximum": 10}},
              "required": ["thing", "score"]}
    so = {"json": json.dumps(schema) if as_text else schema}
    for text, finish in texts(complete(live_server, n=2, seed=4, max_tokens=48,
                                       structured_outputs=so)):
        assert finish == "stop", text
        jsonschema.validate(json.loads(text), schema)


def test_json_object_and_response_format(live_server: LiveServer) -> None:
    for kw in ({"structured_outputs": {"json_object": True}},
               {"response_format": {"type": "json_object"}}):
        for text, finish in texts(complete(live_server, seed=5, max_tokens=64, **kw)):
            if finish == "stop":
                assert isinstance(json.loads(text), dict)


def test_disable_any_whitespace(live_server: LiveServer) -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
              "required": ["a", "b"]}
    for text, finish in texts(complete(live_server, seed=6, structured_outputs={
            "json": schema, "disable_any_whitespace": True})):
        assert finish == "stop" and " " not in text, text


def test_stream_regex(live_server: LiveServer) -> None:
    r = complete(live_server, seed=7, stream=True, structured_outputs={"regex": "[0-9]{4}"})
    events = sse(r.text)
    assert events[-1] == "[DONE]"
    out = "".join(e["choices"][0]["text"] for e in events[:-1] if e.get("choices"))
    assert re.fullmatch("[0-9]{4}", out), out


def test_structural_tag_enforces_each_structure_after_its_trigger(
        live_server: LiveServer) -> None:
    """Free text, but every "=" the model writes starts `=<integer 0..99>;`."""
    tag = {"type": "structural_tag", "triggers": ["="], "structures": [
        {"begin": "=", "schema": {"type": "integer", "minimum": 0, "maximum": 99}, "end": ";"}]}
    prompt = "a=1; b=2; c=3; d"
    written = 0
    for seed in (1, 2, 3):
        r = httpx.post(live_server.url + "/v1/completions", timeout=HANG_S, json={
            "prompt": prompt, "max_tokens": 16, "seed": seed, "response_format": tag})
        (text, finish), = texts(r)
        closed = re.fullmatch(r"[^=]*(=(0|[1-9][0-9]?);[^=]*)*", text)
        cut = re.fullmatch(r"[^=]*(=(0|[1-9][0-9]?);[^=]*)*=[0-9]{0,2}", text)
        assert closed or (finish == "length" and cut), (text, finish)
        written += text.count("=")
    assert written > 0  # the prompt's pattern makes the model write the trigger


@pytest.mark.parametrize(("so", "param", "code"), [
    ({"regex": "[a-"}, "structured_outputs.regex", None),
    ({"grammar": "start: foo"}, "structured_outputs.grammar", None),
    ({"json": "{not json"}, "structured_outputs.json", None),
    ({"regex": "a", "choice": ["a"]}, "structured_outputs", None),
    ({"structural_tag": "x"}, "structured_outputs.structural_tag", None),
    ({"structural_tag": '{"format": {"type": "bogus"}}'},
     "structured_outputs.structural_tag.format.type", None),
    ({"json": {"type": "object", "not": {}}}, "structured_outputs.json", None),
])
def test_bad_constraint_is_a_400(live_server: LiveServer, so: dict[str, Any], param: str,
                                 code: str | None) -> None:
    r = complete(live_server, structured_outputs=so)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param, err
    if code is not None:
        assert err["code"] == code


def test_scoring_with_a_constraint_is_refused(live_server: LiveServer) -> None:
    r = complete(live_server, max_tokens=0, prompt_logprobs=1,
                 structured_outputs={"choice": ["a"]})
    assert r.status_code == 400 and r.json()["error"]["code"] == "unsupported_parameter"


def batch(server: LiveServer, **kw: Any) -> dict[str, Any]:
    body = {"prompts": [[{"role": "user", "content": "Pick a colour."}],
                        [{"role": "user", "content": "What is 2 + 2?"}]], "n": 2, "seed": 1,
            "max_tokens": 40, **kw}
    r = httpx.post(server.url + "/v1/completions/batch", json=body, timeout=HANG_S)
    assert r.status_code == 200, r.text
    return dict(r.json())


def test_batch_constraint_applies_to_every_item(live_server: LiveServer) -> None:
    out = batch(live_server, structured_outputs={"choice": ["red", "green", "4"]})
    items = out["completions"]
    assert len(items) == 4
    assert all(i["text"] in ("red", "green", "4") for i in items), items
    schema = {"type": "object", "properties": {"answer": {"type": "integer"}},
              "required": ["answer"]}
    out = batch(live_server, response_format={"type": "json_schema", "json_schema": {
        "name": "a", "schema": schema}})
    for item in out["completions"]:
        if item["finish_reason"] == "stop":
            jsonschema.validate(json.loads(item["text"]), schema)


def test_batch_forced_tool_call(live_server: LiveServer) -> None:
    tool = {"type": "function", "function": {"name": "pick", "parameters": {
        "type": "object", "properties": {"colour": {"type": "string", "enum": ["red", "blue"]}},
        "required": ["colour"]}}}
    out = batch(live_server, tools=[tool],
                tool_choice={"type": "function", "function": {"name": "pick"}})
    for item in out["completions"]:
        calls = item["tool_calls"]
        assert [c["function"]["name"] for c in calls] == ["pick"], item
        assert json.loads(calls[0]["function"]["arguments"])["colour"] in ("red", "blue")
