"""One-shot tool-call parsing (docs/behavior.md §12, docs/decisions.md)."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from kiln.text.tools import ParsedOutput, ToolCall, coerce_param, parse_tool_calls, tool_names

TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "days": {"type": "integer"},
                    "metric": {"type": "boolean"},
                    "options": {"type": "object"},
                    "tags": {"type": "array"},
                    "ratio": {"type": "number"},
                    "note": {"type": ["string", "null"]},
                },
            },
        },
    },
    {"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}},
    {"type": "function", "function": {"name": "run_code"}},
]


def hermes(name: str, arguments: Any) -> str:
    body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"<tool_call>\n{body}\n</tool_call>"


def xml(name: str, params: dict[str, str]) -> str:
    inner = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
    return f"<tool_call>\n<function={name}>\n{inner}</function>\n</tool_call>"


def calls(out: ParsedOutput) -> list[tuple[str, Any]]:
    return [(c.name, json.loads(c.arguments)) for c in out.tool_calls]


def test_tool_names_from_openai_definitions() -> None:
    assert tool_names(TOOLS) == {"get_weather", "search", "run_code"}
    assert tool_names(None) == set()
    assert tool_names([{"type": "function", "function": {}}, "junk", {"name": "bare"}]) == {
        "bare"
    }


def test_tool_call_wire_shape_and_id() -> None:
    out = parse_tool_calls(hermes("search", {"q": "x"}), TOOLS)
    call = out.tool_calls[0]
    assert re.fullmatch(r"call_[0-9a-f]{32}", call.id)
    assert call.wire() == {
        "id": call.id,
        "type": "function",
        "function": {"name": "search", "arguments": '{"q": "x"}'},
    }
    assert call.wire(2)["index"] == 2
    other = parse_tool_calls(hermes("search", {"q": "x"}), TOOLS).tool_calls[0]
    assert other.id != call.id


def test_no_tools_means_no_parsing() -> None:
    text = "a " + hermes("search", {"q": 1}) + "  "
    assert parse_tool_calls(text, None) == ParsedOutput(text, [])
    assert parse_tool_calls(text, []) == ParsedOutput(text, [])


def test_hermes_json_single_call_with_leading_text() -> None:
    out = parse_tool_calls("Let me check.\n\n" + hermes("get_weather", {"city": "Paris"}), TOOLS)
    assert out.content == "Let me check."
    assert calls(out) == [("get_weather", {"city": "Paris"})]
    assert out.tool_calls[0].arguments == '{"city": "Paris"}'


def test_arguments_as_json_string_and_as_object_agree() -> None:
    as_obj = parse_tool_calls(hermes("search", {"q": "cats", "n": 3}), TOOLS)
    as_str = parse_tool_calls(hermes("search", json.dumps({"q": "cats", "n": 3})), TOOLS)
    assert calls(as_obj) == calls(as_str) == [("search", {"q": "cats", "n": 3})]
    assert as_obj.tool_calls[0].arguments == as_str.tool_calls[0].arguments


def test_missing_or_null_arguments_are_empty_object() -> None:
    out = parse_tool_calls('<tool_call>{"name": "search"}</tool_call>', TOOLS)
    assert calls(out) == [("search", {})]
    out = parse_tool_calls('<tool_call>{"name": "search", "arguments": null}</tool_call>', TOOLS)
    assert calls(out) == [("search", {})]


def test_nested_json_and_unicode_arguments() -> None:
    args = {"filter": {"and": [{"city": "Zürich"}, {"tags": ["☀", "雨"]}]}, "deep": [[1, [2]]]}
    out = parse_tool_calls(hermes("search", args), TOOLS)
    assert calls(out) == [("search", args)]
    assert "Zürich" in out.tool_calls[0].arguments  # ensure_ascii=False
    assert "雨" in out.tool_calls[0].arguments


def test_openai_style_function_wrapper_inside_tags() -> None:
    body = json.dumps({"type": "function", "function": {"name": "search", "arguments": "{}"}})
    out = parse_tool_calls(f"<tool_call>{body}</tool_call>", TOOLS)
    assert calls(out) == [("search", {})]


def test_two_calls_every_call_parsed() -> None:
    text = hermes("get_weather", {"city": "Paris"}) + "\n" + hermes("get_weather", {"city": "Oslo"})
    out = parse_tool_calls(text, TOOLS)
    assert out.content == ""
    assert calls(out) == [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Oslo"})]
    assert out.tool_calls[0].id != out.tool_calls[1].id


def test_three_calls_mixed_formats_with_text_between() -> None:
    text = (
        "First.\n"
        + hermes("search", {"q": "a"})
        + "\nThen the weather:\n"
        + xml("get_weather", {"city": "Rome", "days": "2"})
        + "\nAnd code.  \n"
        + hermes("run_code", {"src": "print(1)"})
        + "\n\n"
    )
    out = parse_tool_calls(text, TOOLS)
    assert calls(out) == [
        ("search", {"q": "a"}),
        ("get_weather", {"city": "Rome", "days": 2}),
        ("run_code", {"src": "print(1)"}),
    ]
    assert out.content == "First.\nThen the weather:\nAnd code."


def test_qwen35_xml_format() -> None:
    text = (
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
        "</function>\n</tool_call>"
    )
    out = parse_tool_calls(text, TOOLS)
    assert calls(out) == [("get_weather", {"city": "Paris"})]
    assert out.content == ""


def test_xml_values_keep_inner_newlines_and_strip_only_one() -> None:
    out = parse_tool_calls(xml("run_code", {"src": "\nline1\n  line2\n"}), TOOLS)
    assert calls(out) == [("run_code", {"src": "\nline1\n  line2\n"})]


def test_xml_values_may_hold_the_function_close_tag() -> None:
    src = "print('</function>')\n</function>"
    out = parse_tool_calls(xml("run_code", {"src": src}), TOOLS)
    assert calls(out) == [("run_code", {"src": src})]
    two = xml("run_code", {"src": "1"}).replace("</function>", "</function>\n<function=x>", 1)
    assert parse_tool_calls(two, TOOLS).tool_calls == []  # still not two functions in one block


def test_xml_typed_params_follow_schema() -> None:
    params = {
        "city": "42",  # string in the schema: stays a string
        "days": "3",
        "metric": "true",
        "options": '{"unit": "C", "hourly": [1, 2]}',
        "tags": '["a", "b"]',
        "ratio": "0.5",
        "note": "null",
    }
    out = parse_tool_calls(xml("get_weather", params), TOOLS)
    assert calls(out) == [
        (
            "get_weather",
            {
                "city": "42",
                "days": 3,
                "metric": True,
                "options": {"unit": "C", "hourly": [1, 2]},
                "tags": ["a", "b"],
                "ratio": 0.5,
                "note": None,
            },
        )
    ]


def test_xml_values_that_do_not_fit_the_type_stay_strings() -> None:
    params = {"days": "three", "metric": "maybe", "options": "[1]", "unknown": "7"}
    out = parse_tool_calls(xml("get_weather", params), TOOLS)
    assert calls(out) == [
        ("get_weather", {"days": "three", "metric": "maybe", "options": "[1]", "unknown": "7"})
    ]
    # No schema (run_code declares no parameters): everything is text.
    out = parse_tool_calls(xml("run_code", {"n": "5", "flag": "true"}), TOOLS)
    assert calls(out) == [("run_code", {"n": "5", "flag": "true"})]


def test_coerce_param_rules() -> None:
    assert coerce_param("5.0", ["integer"]) == 5
    assert coerce_param("True", ["boolean"]) is True
    assert coerce_param("true", ["integer"]) == "true"
    assert coerce_param("7", ["string", "integer"]) == 7
    assert coerce_param("x", ["null", "string"]) == "x"


def test_xml_tolerates_missing_closers_but_not_garbage() -> None:
    text = "<tool_call>\n<function=search>\n<parameter=q>\nhi\n</tool_call>"
    assert calls(parse_tool_calls(text, TOOLS)) == [("search", {"q": "hi"})]
    bad = "<tool_call>\n<function=search>\nstray words\n</function>\n</tool_call>"
    assert parse_tool_calls(bad, TOOLS) == ParsedOutput(bad, [])
    two = "<tool_call><function=a></function><function=b></function></tool_call>"
    assert parse_tool_calls(two, TOOLS) == ParsedOutput(two, [])


@pytest.mark.parametrize(
    "block",
    [
        '<tool_call>\n{"name": "search", "arguments": {"q": }\n</tool_call>',  # bad JSON
        '<tool_call>\n{"arguments": {"q": 1}}\n</tool_call>',  # no name
        '<tool_call>\n{"name": "search", "arguments": "not json"}\n</tool_call>',
        '<tool_call>\n{"name": "search", "arguments": [1, 2]}\n</tool_call>',
        "<tool_call>\n<function=>\n</function>\n</tool_call>",  # empty XML name
        "<tool_call></tool_call>",
    ],
)
def test_malformed_block_is_kept_verbatim(block: str) -> None:
    text = "Intro \n" + block + "\nafter"
    assert parse_tool_calls(text, TOOLS) == ParsedOutput(text, [])
    # Next to a good call the bad block still survives verbatim in content.
    mixed = "Intro \n" + block + "\n" + hermes("search", {"q": 1}) + "\n"
    out = parse_tool_calls(mixed, TOOLS)
    assert calls(out) == [("search", {"q": 1})]
    assert out.content == "Intro \n" + block


def test_an_unterminated_block_never_reaches_the_content() -> None:
    """Issue 52: a call cut short (max_tokens) is the call as far as it was written, or nothing
    when not even its name was; its text is never content."""
    out = parse_tool_calls("Sure.\n<tool_call>\n{\"name\": \"search\", \"argu", TOOLS)
    assert out.content == "Sure." and [(c.name, c.arguments) for c in out.tool_calls] == [
        ("search", "")]
    out = parse_tool_calls('<tool_call>\n{"name": "search", "arguments": {"q": "ca', TOOLS)
    assert [(c.name, c.arguments) for c in out.tool_calls] == [("search", '{"q": "ca')]
    text2 = hermes("search", {"q": 1}) + "\n<tool_call>\n{\"name\": "
    out = parse_tool_calls(text2, TOOLS)
    assert calls(out) == [("search", {"q": 1})] and out.content == ""
    assert parse_tool_calls("Hm.\n<tool_call>\n{\"na", TOOLS) == ParsedOutput("Hm.", [])
    xml = "<tool_call>\n<function=search>\n<parameter=q>\n2"
    assert calls(parse_tool_calls(xml, TOOLS)) == [("search", {"q": "2"})]
    # a whole call whose closing tag never came
    closed = parse_tool_calls('<tool_call>{"name": "search", "arguments": {"q": 1}}', TOOLS)
    assert calls(closed) == [("search", {"q": 1})] and closed.content == ""
    # reasoning is parsed for complete calls only (partial=False)
    assert parse_tool_calls("x <tool_call>{", TOOLS, partial=False).content == "x <tool_call>{"


def test_bare_json_fallback_only_for_declared_names() -> None:
    bare = '  {"name": "get_weather", "arguments": {"city": "Lima"}}\n'
    out = parse_tool_calls(bare, TOOLS)
    assert out.content == ""
    assert calls(out) == [("get_weather", {"city": "Lima"})]
    undeclared = '{"name": "launch_rockets", "arguments": {}}'
    assert parse_tool_calls(undeclared, TOOLS) == ParsedOutput(undeclared, [])
    not_whole = 'Answer: {"name": "search", "arguments": {}}'
    assert parse_tool_calls(not_whole, TOOLS) == ParsedOutput(not_whole, [])
    extra_keys = '{"name": "search", "arguments": {}, "why": "because"}'
    assert parse_tool_calls(extra_keys, TOOLS) == ParsedOutput(extra_keys, [])
    assert parse_tool_calls(bare, None) == ParsedOutput(bare, [])


def test_llama3_json_calls_are_whole_answer_calls() -> None:
    """Llama 3.1-3.3 answer a call as one JSON object with "parameters" (no tags)."""
    llama = '{"name": "get_weather", "parameters": {"city": "Lima"}}'
    assert calls(parse_tool_calls(llama, TOOLS)) == [("get_weather", {"city": "Lima"})]
    assert parse_tool_calls(llama, TOOLS).content == ""
    both = '{"name": "search", "parameters": {}, "arguments": {}}'
    assert parse_tool_calls(both, TOOLS) == ParsedOutput(both, [])
    undeclared = '{"name": "launch_rockets", "parameters": {}}'
    assert parse_tool_calls(undeclared, TOOLS) == ParsedOutput(undeclared, [])


def test_plain_answer_with_tools_is_untouched() -> None:
    text = "The weather is nice. <tool and <tool_call without closing? no.\n"
    assert parse_tool_calls(text, TOOLS) == ParsedOutput(text, [])


def test_toolcall_create_encodes_arguments() -> None:
    call = ToolCall.create("f", {"ü": 1})
    assert call.arguments == '{"ü": 1}'


def test_xml_parameter_types_follow_local_refs() -> None:
    """A parameter typed through ``$ref`` (pydantic writes nested models so) decodes as JSON."""
    tools = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {
            "opts": {"$ref": "#/$defs/Opts"},
            "maybe": {"anyOf": [{"$ref": "#/definitions/N"}, {"type": "null"}]},
            "dangling": {"$ref": "#/$defs/Missing"}},
        "$defs": {"Opts": {"type": "object"}}, "definitions": {"N": {"type": "integer"}}}}}]
    text = ("<tool_call>\n<function=f>\n<parameter=opts>\n{\"a\": 1}\n</parameter>\n"
            "<parameter=maybe>\n7\n</parameter>\n<parameter=dangling>\n{}\n</parameter>\n"
            "</function>\n</tool_call>")
    assert calls(parse_tool_calls(text, tools)) == [
        ("f", {"opts": {"a": 1}, "maybe": 7, "dangling": "{}"})]
