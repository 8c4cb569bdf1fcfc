"""Structural tags (kiln/api/structured/structural_tags.py through constraints.py): free text in
which each ``begin`` + JSON of the structure's schema + ``end`` is enforced once a trigger is
written, checked by llguidance's matcher on the tiny test tokenizer; the wire shapes of
``response_format`` and ``structured_outputs``; and the refusals that name their field."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import msgspec
import pytest

from kiln.api._generated import wire
from kiln.api.errors import ApiError
from kiln.api.structured.constraints import (
    constraint,
    from_response_format,
    from_structured_outputs,
)
from tests.api.test_constraints import _accepts
from tests.tiny_models import tiny_tokenizer

ADD = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
       "required": ["a", "b"]}
LEGACY: dict[str, Any] = {
    "type": "structural_tag",
    "structures": [
        {"begin": "<function=add>", "schema": ADD, "end": "</function>"},
        {"begin": "<function=echo>", "schema": {"type": "string"}, "end": "</function>"},
    ],
    "triggers": ["<function="],
}


def token_id(text: str) -> int | None:
    found = tiny_tokenizer().token_to_id(text)
    return found if isinstance(found, int) else None


def grammar(value: Any = None) -> str:
    built = from_response_format(LEGACY if value is None else value, token_id=token_id)
    assert built is not None and built[1] == "response_format"
    return built[0]


@pytest.mark.parametrize("text", [
    "",
    "Just prose, no call.",
    'Sum: <function=add>{"a": 1, "b": 2}</function> done',
    '<function=echo>"hi"</function><function=add>{"a": 3, "b": 4}</function>',
    "a trigger half written at the end: <function",
    "other tags are text: <tool_call> </function>",
])
def test_free_text_and_valid_structures_are_accepted(text: str) -> None:
    if "<tool_call>" in text:  # the tokenizer writes the added token, which is not text
        text = text.replace("<tool_call>", "<tool call>")
    assert _accepts(grammar(), text)


@pytest.mark.parametrize("text", [
    'Sum: <function=add>{"a": 1}</function>',  # b is required
    'Sum: <function=add>{"a": 1, "b": 2, "c": 3}</function>',  # closed by default
    '<function=add>{"a": 1, "b": 2}',  # never closed
    "<function=sub>{}</function>",  # no structure begins so
    '<function=echo>3</function>',  # not a string
])
def test_a_trigger_commits_to_a_valid_structure(text: str) -> None:
    assert not _accepts(grammar(), text)


def test_a_trigger_that_is_the_models_own_token() -> None:
    """Qwen's <tool_call> is one added token: the trigger may be it or its spelling."""
    spec = {"type": "structural_tag", "triggers": ["<tool_call>"], "structures": [
        {"begin": "<tool_call>\n", "schema": ADD, "end": "\n</tool_call>"}]}
    g = grammar(spec)
    call = '<tool_call>\n{"a": 1, "b": 2}\n</tool_call>'
    assert tiny_tokenizer().encode(call).ids[0] == token_id("<tool_call>")
    assert _accepts(g, "Let me add. " + call + " ok")
    assert _accepts(g, call + call)
    assert not _accepts(g, '<tool_call>\n{"a": "x", "b": 2}\n</tool_call>')


def test_the_wire_shapes_reach_the_grammar() -> None:
    body = {"messages": [{"role": "user", "content": "x"}], "response_format": LEGACY}
    req = msgspec.json.decode(json.dumps(body).encode(), type=wire.ChatCompletionRequest)
    assert _accepts(grammar(req.response_format), '<function=echo>"x"</function>')
    text = json.dumps({k: v for k, v in LEGACY.items() if k != "type"})
    so = from_structured_outputs({"structural_tag": text}, token_id=token_id)
    assert so is not None and so[1] == "structured_outputs.structural_tag"
    assert _accepts(so[0], 'x <function=add>{"a": 1, "b": 2}</function>')


@pytest.mark.parametrize(("value", "param"), [
    ({**LEGACY, "triggers": []}, "response_format.triggers"),
    ({**LEGACY, "triggers": ["<f", "<function="]}, "response_format.triggers"),
    ({**LEGACY, "structures": []}, "response_format.structures"),
    ({**LEGACY, "structures": [{"begin": "<tool>", "end": "</tool>"}]},
     "response_format.structures[0].begin"),
    ({**LEGACY, "structures": [{"begin": "<function=f>", "schema": [1], "end": "x"}]},
     "response_format.structures[0].schema"),
])
def test_bad_structural_tags_name_their_field(value: Any, param: str) -> None:
    with pytest.raises(Exception) as info:
        from_response_format(value)
    assert getattr(info.value, "param", None) == param


def test_structural_tag_text_that_is_not_json_names_its_field() -> None:
    with pytest.raises(ApiError) as info:
        asyncio.run(constraint(object(), code="c",
                               structured_outputs={"structural_tag": "{not json"}))
    assert info.value.status == 400
    assert info.value.param == "structured_outputs.structural_tag"
