"""Structural tags in xgrammar's nested ``format`` form (kiln/api/structured/structural_formats.py
through constraints.py): each format's text checked by llguidance's matcher on the tiny test
tokenizer, the wire shapes, and the refusals that name the format's path."""

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
from tests.api.test_structural_tags import ADD, token_id

ADD_TAG = {"begin": "<function=add>", "content": {"type": "json_schema", "json_schema": ADD},
           "end": "</function>"}
ECHO_TAG = {"type": "tag", "begin": "<function=echo>",
            "content": {"type": "json_schema", "json_schema": {"type": "string"}},
            "end": "</function>"}
TRIGGERED: dict[str, Any] = {"type": "triggered_tags", "triggers": ["<function="],
                             "tags": [ADD_TAG, ECHO_TAG]}
ADD_CALL = '<function=add>{"a": 1, "b": 2}</function>'
ECHO_CALL = '<function=echo>"hi"</function>'


def grammar(fmt: Any) -> str:
    built = from_response_format({"type": "structural_tag", "format": fmt}, token_id=token_id)
    assert built is not None and built[1] == "response_format"
    return built[0]


def accepts(fmt: Any, text: str) -> bool:
    return _accepts(grammar(fmt), text)


@pytest.mark.parametrize(("options", "text", "ok"), [
    ({}, "", True),
    ({}, "Just prose.", True),
    ({}, f"x {ADD_CALL} y {ECHO_CALL}", True),
    ({}, "<function=add>{\"a\": 1}</function>", False),  # b is required
    ({}, "<function=sub>{}</function>", False),  # no tag begins so
    ({"at_least_one": True}, "", False),
    ({"at_least_one": True}, "prose", False),
    ({"at_least_one": True}, f"{ADD_CALL} then text {ECHO_CALL}", True),
    ({"at_least_one": True}, f"text first {ADD_CALL}", False),  # the first tag comes first
    ({"stop_after_first": True}, "prose", True),
    ({"stop_after_first": True}, f"hi {ADD_CALL}", True),
    ({"stop_after_first": True}, f"hi {ADD_CALL} more", False),  # nothing after the first tag
    ({"at_least_one": True, "stop_after_first": True}, ECHO_CALL, True),
    ({"at_least_one": True, "stop_after_first": True}, f"{ECHO_CALL}{ECHO_CALL}", False),
    ({"at_least_one": True, "stop_after_first": True}, f"x{ECHO_CALL}", False),
    ({"excludes": ["bad"]}, "a bad word", False),
    ({"excludes": ["bad"]}, f"good {ADD_CALL}", True),
])
def test_triggered_tags(options: dict[str, Any], text: str, ok: bool) -> None:
    assert accepts({**TRIGGERED, **options}, text) is ok


THINK_THEN_CALLS = {"type": "sequence", "elements": [
    {"type": "tag", "begin": "<think>", "content": {"type": "any_text"}, "end": "</think>"},
    TRIGGERED]}


@pytest.mark.parametrize(("text", "ok"), [
    ("<think>hmm</think>", True),
    (f"<think>a <function=add> is text here</think>ok {ECHO_CALL} done", True),
    ("no think block", False),
    ("<think>a</think>b</think>", False),  # free text after the block is the triggered tags'
    ("<think>a</think>b <function=add>{}</function>", False),
])
def test_a_sequence_of_a_tag_and_triggered_tags(text: str, ok: bool) -> None:
    """The any_text content of a tag runs to the tag's end (the tokenizer holds <think> and
    </think> as tokens: the tags are written as them); the triggered tags run to the output's
    end."""
    assert accepts(THINK_THEN_CALLS, text) is ok


@pytest.mark.parametrize(("text", "ok"), [
    ("[]", True),
    (f"[a {ADD_CALL} b]", True),
    ("[x] y", False),  # the tag ends the output
    ("[x", False),
    ("[a <function=sub>]", False),
])
def test_triggered_tags_inside_a_tag_run_to_its_end(text: str, ok: bool) -> None:
    assert accepts({"type": "tag", "begin": "[", "content": TRIGGERED, "end": "]"}, text) is ok


@pytest.mark.parametrize(("options", "text", "ok"), [
    ({}, "", True),
    ({}, f"{ECHO_CALL},{ADD_CALL},{ECHO_CALL}", True),
    ({}, f"{ECHO_CALL} x", False),  # no other text
    ({}, f"{ECHO_CALL}{ECHO_CALL}", False),  # the separator is required
    ({"at_least_one": True}, "", False),
    ({"stop_after_first": True}, f"{ECHO_CALL},{ECHO_CALL}", False),
    ({"stop_after_first": True}, ECHO_CALL, True),
])
def test_tags_with_separator(options: dict[str, Any], text: str, ok: bool) -> None:
    fmt = {"type": "tags_with_separator", "separator": ",", "tags": [ADD_TAG, ECHO_TAG],
           **options}
    assert accepts(fmt, text) is ok


def test_tags_with_separator_inside_a_tag() -> None:
    fmt = {"type": "tag", "begin": "<calls>[", "end": "]</calls>", "content": {
        "type": "tags_with_separator", "separator": ", ", "tags": [ECHO_TAG],
        "at_least_one": True}}
    assert accepts(fmt, f"<calls>[{ECHO_CALL}, {ECHO_CALL}]</calls>")
    assert not accepts(fmt, "<calls>[]</calls>")


@pytest.mark.parametrize(("text", "ok"), [
    ("A:12x!", True),
    ("A:12y", True),
    ("A:1x", False),
    ("A:12z", False),
    ('A:99x{"n": 3}', False),
])
def test_const_string_regex_grammar_and_or(text: str, ok: bool) -> None:
    fmt = {"type": "sequence", "elements": [
        {"type": "const_string", "value": "A:"},
        {"type": "regex", "pattern": "[0-9]{2}"},
        {"type": "grammar", "grammar": 'start: "x" | "y"'},
        {"type": "or", "elements": [{"type": "const_string", "value": "!"},
                                    {"type": "const_string", "value": ""}]}]}
    assert accepts(fmt, text) is ok


def test_a_gbnf_grammar_inside_a_tag() -> None:
    fmt = {"type": "tag", "begin": "<g>", "end": "</g>", "content": {
        "type": "grammar", "grammar": 'root ::= "yes" | "no" num\nnum ::= [0-9]+'}}
    assert accepts(fmt, "<g>yes</g>") and accepts(fmt, "<g>no42</g>")
    assert not accepts(fmt, "<g>maybe</g>")


def test_json_schema_is_closed_and_a_tag_takes_several_ends() -> None:
    fmt = {"type": "tag", "begin": "<r>", "end": ["</r>", "</answer>"],
           "content": {"type": "json_schema", "json_schema": {
               "type": "object", "properties": {"n": {"type": "integer"}}}}}
    assert accepts(fmt, '<r>{"n": 3}</r>')
    assert accepts(fmt, '<r>{"n": 3}</answer>')
    assert not accepts(fmt, '<r>{"n": 3, "m": 4}</r>')  # no extra keys by default
    assert accepts({"type": "json_schema", "json_schema": True}, "[1, 2]")


def test_any_text_alone_and_its_excludes() -> None:
    assert accepts({"type": "any_text"}, "anything at all\n")
    assert not accepts({"type": "any_text", "excludes": ["secret"]}, "a secret")
    tagged = {"type": "tag", "begin": "(", "end": ")",
              "content": {"type": "any_text", "excludes": ["x"]}}
    assert accepts(tagged, "(abc)")
    assert not accepts(tagged, "(axc)")
    assert not accepts(tagged, "(a)b)")


def test_a_trigger_that_is_the_models_own_token() -> None:
    """Qwen's <tool_call> is one added token: the trigger and begin may be it or its
    spelling, and so may the end's closing tag."""
    fmt = {"type": "triggered_tags", "triggers": ["<tool_call>"], "tags": [
        {"begin": "<tool_call>\n", "content": {"type": "json_schema", "json_schema": ADD},
         "end": "\n</tool_call>"}]}
    call = '<tool_call>\n{"a": 1, "b": 2}\n</tool_call>'
    assert accepts(fmt, "Let me add. " + call + " ok")
    assert accepts({**fmt, "at_least_one": True, "stop_after_first": True}, call)
    assert not accepts(fmt, '<tool_call>\n{"a": "x", "b": 2}\n</tool_call>')


def test_the_wire_shapes_reach_the_grammar() -> None:
    rf = {"type": "structural_tag", "format": TRIGGERED}
    body = {"messages": [{"role": "user", "content": "x"}], "response_format": rf}
    req = msgspec.json.decode(json.dumps(body).encode(), type=wire.ChatCompletionRequest)
    built = from_response_format(req.response_format, token_id=token_id)
    assert built is not None and _accepts(built[0], ECHO_CALL)
    so = from_structured_outputs({"structural_tag": json.dumps(rf)}, token_id=token_id)
    assert so is not None and so[1] == "structured_outputs.structural_tag"
    assert _accepts(so[0], f"x {ADD_CALL}")


F = "response_format.format"


def _nested(levels: int) -> dict[str, Any]:
    fmt: dict[str, Any] = {"type": "const_string", "value": "x"}
    for _ in range(levels):
        fmt = {"type": "tag", "begin": "(", "content": fmt, "end": ")"}
    return fmt



@pytest.mark.parametrize(("fmt", "param"), [
    ({"type": "bogus"}, f"{F}.type"),
    ({"type": ["tag"]}, f"{F}.type"),
    (_nested(200), F),  # a bound on nesting, not a RecursionError
    ("any_text", F),
    ({"type": "const_string"}, f"{F}.value"),
    ({"type": "const_string", "value": "a", "text": "b"}, f"{F}.text"),
    ({"type": "regex", "pattern": "[a-"}, f"{F}.pattern"),
    ({"type": "grammar", "grammar": "start: foo"}, f"{F}.grammar"),
    ({"type": "json_schema", "json_schema": {"type": "object", "not": {}}}, f"{F}.json_schema"),
    ({"type": "json_schema", "json_schema": {}, "style": "qwen_xml"}, f"{F}.style"),
    ({"type": "sequence", "elements": []}, f"{F}.elements"),
    ({"type": "sequence", "elements": [{"type": "any_text"}, {"type": "const_string",
                                                              "value": "x"}]},
     f"{F}.elements[0]"),
    ({"type": "or", "elements": [{"type": "any_text"}, {"type": "const_string", "value": "x"}]},
     f"{F}.elements"),
    ({"type": "tag", "begin": "<a>", "content": {"type": "any_text"}, "end": ""}, f"{F}.end"),
    ({"type": "tag", "begin": "<a>", "content": {"type": "nope"}, "end": "</a>"},
     f"{F}.content.type"),
    ({**TRIGGERED, "triggers": []}, f"{F}.triggers"),
    ({**TRIGGERED, "tags": []}, f"{F}.tags"),
    ({**TRIGGERED, "tags": [{**ADD_TAG, "begin": "<tool>"}]}, f"{F}.tags[0].begin"),
    ({**TRIGGERED, "triggers": ["<", "<function="]}, f"{F}.tags[0].begin"),
    ({**TRIGGERED, "tags": [{"type": "const_string", "value": "x"}]}, f"{F}.tags[0].type"),
    ({**TRIGGERED, "at_least_one": "yes"}, f"{F}.at_least_one"),
    ({"type": "tags_with_separator", "tags": [ADD_TAG]}, f"{F}.separator"),
])
def test_bad_formats_name_their_path(fmt: Any, param: str) -> None:
    with pytest.raises(ApiError) as info:
        asyncio.run(constraint(object(), code="c", response_format={
            "type": "structural_tag", "format": fmt}))
    assert info.value.status == 400 and info.value.param == param, info.value.message


def test_nesting_within_the_bound_compiles() -> None:
    assert accepts(_nested(40), "(" * 40 + "x" + ")" * 40)


def test_format_beside_the_legacy_fields_is_refused() -> None:
    with pytest.raises(ApiError) as info:
        asyncio.run(constraint(object(), code="c", structured_outputs={"structural_tag": json.dumps(
            {"format": TRIGGERED, "triggers": ["<f"]})}))
    assert info.value.param == "structured_outputs.structural_tag.format"
