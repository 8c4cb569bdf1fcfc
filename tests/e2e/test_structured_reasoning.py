"""Structured outputs on a reasoning model: with thinking on, the constraint starts once the
reasoning block closes (here a thinking budget forces the close), so the reasoning is free text
and the answer follows the grammar. A tiny random Qwen3 (two EOS ids) with a thinking template."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest
from starlette.testclient import TestClient

from tests.e2e.test_thinking_budget_http import MSG, serve
from tests.tiny_models import write_tiny_qwen3

CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    folder = write_tiny_qwen3(tmp_path_factory.mktemp("qwen3-structured"), seed=5)
    with serve(str(folder), folder) as client:
        yield client


def chat(client: TestClient, **kw: Any) -> dict[str, Any]:
    body = {"messages": MSG, "max_tokens": 48, "thinking_budget_tokens": 6, **kw}
    r = client.post(CHAT, json=body)
    assert r.status_code == 200, r.text
    return dict(r.json()["choices"][0])


def test_assumption_the_template_starts_in_reasoning(tiny: TestClient) -> None:
    r = tiny.post(CHAT, json={"messages": MSG, "max_tokens": 1})
    assert r.json()["kiln_metadata"]["thinking_enabled"] is True


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_choice_applies_after_the_reasoning_closes(tiny: TestClient, seed: int) -> None:
    choice = chat(tiny, seed=seed, structured_outputs={"choice": ["alpha", "beta"]})
    assert choice["message"]["content"] in ("alpha", "beta"), choice
    assert choice["finish_reason"] == "stop"
    assert choice["thinking_budget"]["closed"] is True
    # the reasoning is the model's own (6 budgeted tokens), not constrained
    assert choice["message"].get("reasoning_content") is not None


def test_json_schema_after_the_reasoning(tiny: TestClient) -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    for seed in (1, 2):
        choice = chat(tiny, seed=seed, max_tokens=64, response_format={
            "type": "json_schema", "json_schema": {"name": "n", "schema": schema}})
        if choice["finish_reason"] == "stop":
            jsonschema.validate(json.loads(choice["message"]["content"]), schema)
        else:  # a random model may spend the tokens on digits; the prefix still fits
            assert choice["finish_reason"] == "length"
            assert choice["message"]["content"].startswith('{"n": ')


def test_without_thinking_the_constraint_starts_at_once(tiny: TestClient) -> None:
    choice = chat(tiny, seed=4, chat_template_kwargs={"enable_thinking": False},
                  thinking_budget_tokens=None, structured_outputs={"regex": "[0-9]{3}"})
    assert len(choice["message"]["content"]) == 3 and choice["message"]["content"].isdigit()
    assert choice["finish_reason"] == "stop"


def test_forced_tool_call_on_a_model_with_tool_call_tokens(tiny: TestClient) -> None:
    """This tokenizer holds <tool_call> as one added token; the call parses either way."""
    tool = {"type": "function", "function": {"name": "pick", "parameters": {
        "type": "object", "properties": {"c": {"type": "string", "enum": ["a", "b"]}},
        "required": ["c"]}}}
    for seed in (1, 2):
        choice = chat(tiny, seed=seed, tools=[tool], thinking_budget_tokens=None,
                      chat_template_kwargs={"enable_thinking": False},
                      tool_choice={"type": "function", "function": {"name": "pick"}})
        assert choice["finish_reason"] == "tool_calls", choice
        (call,) = choice["message"]["tool_calls"]
        assert json.loads(call["function"]["arguments"])["c"] in ("a", "b")
