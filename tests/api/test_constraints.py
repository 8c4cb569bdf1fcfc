"""Request fields -> llguidance grammars (kiln/api/structured/constraints.py), without a model:
the strict-by-default schema rewrite, the refusals that name their field, and the tool-call
grammar checked by llguidance's own matcher on the tiny test tokenizer."""

from __future__ import annotations

import asyncio
from typing import Any

import llguidance
import pytest

from kiln.api.errors import ApiError
from kiln.api.structured.constraints import (
    constraint,
    from_response_format,
    from_structured_outputs,
    from_tool_choice,
)
from kiln.api.structured.schema_keywords import closed
from tests.tiny_models import tiny_tokenizer

TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {
    "type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}}}]


def test_objects_are_closed_unless_they_say_otherwise() -> None:
    schema = {"type": "object", "properties": {
        "a": {"type": "object", "properties": {"b": {"type": "string"}}},
        "open": {"type": "object", "properties": {}, "additionalProperties": True},
        "pat": {"type": "object", "properties": {}, "patternProperties": {"^x": {}}},
        "list": {"type": "array", "items": {"type": "object", "properties": {"c": {}}}},
        "either": {"anyOf": [{"type": "object", "properties": {"d": {}}}, {"type": "null"}]}},
        "$defs": {"D": {"type": "object", "properties": {"e": {}}}},
        "allOf": [{"type": "object", "properties": {"f": {}}}]}
    out = closed(schema)
    assert out["additionalProperties"] is False
    props = out["properties"]
    assert props["a"]["additionalProperties"] is False
    assert props["open"]["additionalProperties"] is True
    assert "additionalProperties" not in props["pat"]
    assert props["list"]["items"]["additionalProperties"] is False
    assert props["either"]["anyOf"][0]["additionalProperties"] is False
    assert out["$defs"]["D"]["additionalProperties"] is False
    assert "additionalProperties" not in out["allOf"][0]  # closing parts would refuse the others
    assert "additionalProperties" not in schema  # the request's own schema is not changed


@pytest.mark.parametrize(("value", "param"), [
    ({"type": "bogus"}, "response_format.type"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": [1]}},
     "response_format.json_schema.schema"),
])
def test_response_format_refusals_name_the_field(value: Any, param: str) -> None:
    with pytest.raises(Exception) as info:
        from_response_format(value)
    assert getattr(info.value, "param", None) == param


def test_text_and_null_are_unconstrained() -> None:
    assert from_response_format(None) is None
    assert from_response_format({"type": "text"}) is None
    assert from_structured_outputs(None) is None
    assert from_structured_outputs({"disable_any_whitespace": True}) is None
    assert from_tool_choice(TOOLS, "auto", True) is None
    assert from_tool_choice(TOOLS, "none", True) is None


@pytest.mark.parametrize(("choice", "tools", "param"), [
    ("bogus", TOOLS, "tool_choice"),
    ({"type": "function"}, TOOLS, "tool_choice"),
    ({"type": "function", "function": {"name": "g"}}, TOOLS, "tool_choice.function.name"),
    ("required", [], "tools"),
])
def test_tool_choice_refusals_name_the_field(choice: Any, tools: Any, param: str) -> None:
    with pytest.raises(Exception) as info:
        from_tool_choice(tools, choice, True)
    assert getattr(info.value, "param", None) == param


def _accepts(grammar: str, text: str) -> bool:
    """Whether llguidance's grammar accepts ``text``, tokenized by the tiny test tokenizer."""
    tiny = tiny_tokenizer()
    tok = llguidance.LLTokenizer(tiny.to_str(), eos_token=tiny.token_to_id("<|im_end|>"))
    m = llguidance.LLMatcher(tok, grammar, log_level=0)
    assert not m.is_error(), m.get_error()
    return m.consume_tokens(tok.tokenize_str(text)) and m.is_accepting()


def _tags() -> tuple[int | None, int | None]:
    tiny = tiny_tokenizer()
    return tiny.token_to_id("<tool_call>"), tiny.token_to_id("</tool_call>")


def test_tool_tags_as_the_models_own_tokens() -> None:
    """Qwen3-style tokenizers hold <tool_call> as one added token, which llguidance keeps apart
    from text: without the tag ids the model could only spell the tag out."""
    call = '<tool_call>\n{"name": "f", "arguments": {"x": 3}}\n</tool_call>'
    named = {"type": "function", "function": {"name": "f"}}
    plain_tags = from_tool_choice(TOOLS, named, True)
    own_tags = from_tool_choice(TOOLS, named, True, _tags())
    assert plain_tags is not None and own_tags is not None
    assert not _accepts(plain_tags[0], call)  # the tokenizer emits the added token here
    assert _accepts(own_tags[0], call)


def test_tool_grammar_accepts_calls_and_refuses_others() -> None:
    built = from_tool_choice(TOOLS, {"type": "function", "function": {"name": "f"}}, True,
                             _tags())
    assert built is not None and built[1] == "tool_choice"
    grammar = built[0]
    assert _accepts(grammar, '<tool_call>\n{"name": "f", "arguments": {"x": 3}}\n</tool_call>')
    assert not _accepts(grammar, '<tool_call>\n{"name": "f", "arguments": {"x": "3"}}\n'
                                 '</tool_call>')
    assert not _accepts(grammar, '<tool_call>\n{"name": "g", "arguments": {"x": 3}}\n'
                                 '</tool_call>')
    one = '<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>'
    many = from_tool_choice(TOOLS, "required", True, _tags())
    single = from_tool_choice(TOOLS, "required", False, _tags())
    assert many is not None and single is not None
    assert _accepts(many[0], one + "\n" + one)
    assert not _accepts(single[0], one + "\n" + one) and _accepts(single[0], one)


def test_two_constraints_are_a_400() -> None:
    with pytest.raises(ApiError) as info:
        asyncio.run(constraint(object(), code="c", response_format={"type": "json_object"},
                               structured_outputs={"regex": "a"}))
    assert info.value.status == 400 and info.value.param == "structured_outputs"


def test_ignore_eos_with_a_constraint_is_a_400() -> None:
    with pytest.raises(ApiError) as info:
        asyncio.run(constraint(object(), code="c", structured_outputs={"choice": ["a"]},
                               ignore_eos=True))
    assert info.value.param == "ignore_eos"


def test_json_tool_call_arguments_may_use_local_refs() -> None:
    """A parameters schema with ``$defs`` (as pydantic writes nested models) compiles: its
    ``#/$defs/..`` refs resolve inside the call object, which carries the definitions."""
    tools = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"o": {"$ref": "#/$defs/O"}}, "required": ["o"],
        "$defs": {"O": {"type": "object", "properties": {"w": {"type": "boolean"}},
                        "required": ["w"]}}}}}]
    built = from_tool_choice(tools, "required", False, _tags())
    assert built is not None
    ok = '<tool_call>\n{"name": "f", "arguments": {"o": {"w": true}}}\n</tool_call>'
    assert _accepts(built[0], ok)
    assert not _accepts(built[0], ok.replace("true", "1"))
