"""Forced tool calls in the Qwen3.5 XML format (kiln/api/structured/xml_tools.py through
``from_tool_choice``): llguidance's matcher on the tiny test tokenizer accepts the calls the
template writes and refuses the rest, every accepted call parses back through
kiln/text/tools.py into arguments valid against the tool's schema, and what raw text cannot
enforce is refused naming ``tools``. Also which format a chat template asks for."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest

from kiln.api.structured.constraints import from_tool_choice
from kiln.text.tools import parse_tool_calls, tool_format
from tests.api.test_constraints import _accepts, _tags
from tests.tiny_models import QWEN3_TEMPLATE, QWEN35_XML_TEMPLATE

PARAMS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "description": "any text"},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
        "unit": {"type": "string", "enum": ["c", "f"]},
        "opts": {"$ref": "#/$defs/Opts"},
        "note": {"anyOf": [{"type": "string", "maxLength": 8}, {"type": "null"}]},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 2},
    },
    "required": ["city", "days"],
    "$defs": {"Opts": {"type": "object", "properties": {"wind": {"type": "boolean"}},
                       "required": ["wind"]}},
}
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": PARAMS}}
PING = {"type": "function", "function": {"name": "ping"}}  # no parameters: any keys, raw text
TOOLS = [WEATHER, PING]


def xml_grammar(choice: Any, parallel: bool = True, tools: Any = None) -> str:
    built = from_tool_choice(TOOLS if tools is None else tools, choice, parallel, _tags(),
                             "xml")
    assert built is not None and built[1] == "tool_choice"
    return built[0]


def call(name: str, *params: tuple[str, str]) -> str:
    """One call laid out as the template writes it."""
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params)
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


VALID = [
    (call("get_weather", ("city", "Paris"), ("days", "3")), {"city": "Paris", "days": 3}),
    (call("get_weather", ("city", "two\nlines </param"), ("days", "7")),
     {"city": "two\nlines </param", "days": 7}),
    (call("get_weather", ("city", ""), ("days", "1"), ("unit", "f"),
          ("opts", '{"wind": false}'), ("note", "null"), ("tags", '["a", "b"]')),
     {"city": "", "days": 1, "unit": "f", "opts": {"wind": False}, "note": None,
      "tags": ["a", "b"]}),
    (call("get_weather", ("city", "x"), ("days", "2"), ("note", "short")),
     {"city": "x", "days": 2, "note": "short"}),
]
INVALID = [
    call("get_weather", ("city", "x")),  # required days missing
    call("get_weather", ("city", "x"), ("days", "0")),  # below minimum
    call("get_weather", ("city", "x"), ("days", '"3"')),  # a string is not an integer
    call("get_weather", ("city", "x"), ("days", "3"), ("unit", "k")),  # not in the enum
    call("get_weather", ("city", "x"), ("days", "3"), ("opts", '{"wind": 1}')),
    call("get_weather", ("city", "x"), ("days", "3"), ("opts", '{}')),  # wind required
    call("get_weather", ("city", "x"), ("days", "3"), ("note", "far too long")),
    call("get_weather", ("city", "x"), ("days", "3"), ("tags", '["a", "b", "c"]')),
    call("get_weather", ("city", "x"), ("days", "3"), ("extra", "1")),  # closed by default
    call("get_weather", ("city", "a</parameter>b"), ("days", "3")),
    call("get_wether", ("city", "x"), ("days", "3")),  # no such function
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "x", "days": 3}}\n</tool_call>',
]


@pytest.mark.parametrize(("text", "args"), VALID)
def test_valid_calls_are_accepted_and_parse_back(text: str, args: dict[str, Any]) -> None:
    assert _accepts(xml_grammar("required"), text)
    named = {"type": "function", "function": {"name": "get_weather"}}
    assert _accepts(xml_grammar(named), text)
    parsed = parse_tool_calls(text, TOOLS)
    assert parsed.content == "" and len(parsed.tool_calls) == 1
    got = json.loads(parsed.tool_calls[0].arguments)
    assert got == args
    jsonschema.validate(got, PARAMS)


@pytest.mark.parametrize("text", INVALID)
def test_invalid_calls_are_refused(text: str) -> None:
    assert not _accepts(xml_grammar("required"), text)


def test_a_tool_without_parameters_takes_any_raw_keys() -> None:
    text = call("ping", ("host", "a b"), ("n", "3"))
    assert _accepts(xml_grammar({"type": "function", "function": {"name": "ping"}}), text)
    assert json.loads(parse_tool_calls(text, TOOLS).tool_calls[0].arguments) == {
        "host": "a b", "n": "3"}  # no schema types: the parser keeps text


def test_named_function_and_parallel_calls() -> None:
    weather = VALID[0][0]
    ping = call("ping")
    named = xml_grammar({"type": "function", "function": {"name": "ping"}})
    assert _accepts(named, ping) and not _accepts(named, weather)
    assert not _accepts(named, ping + "\n" + ping)  # a named function is exactly one call
    many, single = xml_grammar("required", True), xml_grammar("required", False)
    assert _accepts(many, weather + "\n" + ping)
    assert _accepts(single, weather) and not _accepts(single, weather + "\n" + ping)
    parsed = parse_tool_calls(weather + "\n" + ping, TOOLS)
    assert [c.name for c in parsed.tool_calls] == ["get_weather", "ping"]


@pytest.mark.parametrize(("prop", "keyword"), [
    ({"type": "string", "pattern": "^[a-z]+$"}, "pattern"),
    ({"type": "string", "format": "date-time"}, "format"),
    ({"type": ["string", "integer"]}, "string or a integer"),
    ({"enum": [1, 2]}, "enum"),
    ({"type": "string", "enum": ["a</parameter>"]}, "enum"),
])
def test_what_raw_text_cannot_enforce_is_a_refusal(prop: dict[str, Any], keyword: str) -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"p": prop}}}}]
    with pytest.raises(Exception) as info:
        from_tool_choice(tools, "required", True, _tags(), "xml")
    assert getattr(info.value, "param", None) == "tools"
    assert keyword in str(info.value) and "'f'" in str(info.value)


def test_root_keywords_beyond_properties_are_refused() -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}}, "minProperties": 1}}}]
    with pytest.raises(Exception) as info:
        from_tool_choice(tools, "required", True, _tags(), "xml")
    assert getattr(info.value, "param", None) == "tools" and "minProperties" in str(info.value)


def test_the_template_decides_the_format() -> None:
    assert tool_format(QWEN35_XML_TEMPLATE.read_text(encoding="utf-8")) == "xml"
    assert tool_format(QWEN3_TEMPLATE.read_text(encoding="utf-8")) == "json"
    assert tool_format(None) == "json"
