"""Incremental tool-call parsing for SSE (docs/behavior.md §10): equals the one-shot parse."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from kiln.text.tool_stream import MAX_HELD_WHITESPACE, StreamEvents, ToolCallStreamer
from kiln.text.tools import parse_tool_calls
from tests.text.test_tools import TOOLS, hermes, xml

CASES = {
    "plain": "Just an answer, no tools.\n\nBye  \n",
    "decoys": "a < b, <tool and <tool_cal x; <tool_call_y> is not a tag <<tool_c\n",
    "one_hermes": "Let me look.\n\n" + hermes("get_weather", {"city": "Paris"}),
    "two_calls": hermes("search", {"q": "a"}) + "\n" + hermes("search", json.dumps({"q": "b"})),
    "three_mixed": (
        "First \t\n"
        + hermes("search", {"q": "日本"})
        + "\nthen < and <tool_ stuff\n"
        + xml("get_weather", {"city": "Rome", "days": "4", "metric": "false"})
        + " between "
        + hermes("run_code", {"src": "x = {'a': [1, {}]}"})
        + "\n\n  "
    ),
    "malformed_then_good": (
        "Hi \n<tool_call>\n{\"name\": \"search\", bad}\n</tool_call>\n"
        + xml("search", {"q": "ok"})
        + "\ntail text"
    ),
    "unterminated": "Working... \n" + hermes("search", {"q": 1}) + "\n<tool_call>\n{\"name\":",
    "only_malformed": " x\n<tool_call>{\"arguments\": {}}</tool_call>  \n",
    "bare_json": '\n {"name": "get_weather", "arguments": {"city": "Lima", "n": [1, 2]}}\n',
    "bare_json_undeclared": '{"name": "nope", "arguments": {}} and then text <tool_c',
    "json_not_call": '{"answer": 42}\nMore text.',
    "invalid_braces": "{ not json } but then " + hermes("search", {"q": "z"}),
}


KEEPS_A_BLOCK = {"malformed_then_good", "unterminated", "only_malformed"}


def chunks(text: str, rng: random.Random) -> list[str]:
    out, pos = [], 0
    while pos < len(text):
        n = rng.randint(1, 7)
        out.append(text[pos:pos + n])
        pos += n
    return out


def signature(items: list[Any]) -> list[tuple[str, Any]]:
    return [(c.name, json.loads(c.arguments)) for c in items]


def stream(pieces: list[str], tools: list[Any] | None = TOOLS) -> tuple[str, list[Any], list[Any]]:
    """Streams `pieces`, checking after each push that the output is a prefix of the one-shot."""
    full = "".join(pieces)
    expected = parse_tool_calls(full, tools)
    streamer = ToolCallStreamer(tools)
    content, calls, indices = "", [], []
    for piece in [*pieces, None]:
        events = streamer.push(piece) if piece is not None else streamer.finish()
        content += events.content
        for index, call in events.tool_calls:
            indices.append(index)
            calls.append(call)
        assert expected.content.startswith(content), (pieces, content)
        assert signature(calls) == signature(expected.tool_calls)[: len(calls)], pieces
    return content, calls, indices


@pytest.mark.parametrize("name", sorted(CASES))
def test_random_chunkings_match_one_shot(name: str) -> None:
    text = CASES[name]
    expected = parse_tool_calls(text, TOOLS)
    rng = random.Random(f"kiln-{name}")
    for _ in range(30):
        content, calls, indices = stream(chunks(text, rng))
        assert content == expected.content
        assert signature(calls) == signature(expected.tool_calls)
        assert indices == list(range(len(calls)))
        if name not in KEEPS_A_BLOCK:
            assert "<tool_call>" not in content


def test_cases_exercise_the_interesting_shapes() -> None:
    counts = {k: len(parse_tool_calls(v, TOOLS).tool_calls) for k, v in CASES.items()}
    assert counts["two_calls"] == 2
    assert counts["three_mixed"] == 3
    assert counts["bare_json"] == 1
    assert counts["bare_json_undeclared"] == counts["json_not_call"] == 0
    assert counts["malformed_then_good"] == counts["unterminated"] == 1


def test_whole_text_in_one_push_and_char_by_char() -> None:
    text = CASES["three_mixed"]
    expected = parse_tool_calls(text, TOOLS)
    for pieces in ([text], list(text)):
        content, calls, _ = stream(pieces)
        assert content == expected.content
        assert signature(calls) == signature(expected.tool_calls)


def test_content_streams_eagerly_and_holds_only_tag_prefix() -> None:
    s = ToolCallStreamer(TOOLS)
    assert s.push("Hello world") == StreamEvents("Hello world", [])
    assert s.push("  \n<tool_c").content == ""  # whitespace + a possible tag start are held
    assert s.push("alm").content == "  \n<tool_calm"  # not a tag after all
    assert s.push(" more\n").content == " more"
    ev = s.push("<tool_call>")
    assert ev.content == ""  # the held "\n" is trimmed before the block
    ev = s.push('{"name": "search", "arguments": {}}</tool_call>')
    assert ev.content == "" and [(i, c.name) for i, c in ev.tool_calls] == [(0, "search")]
    assert s.emitted_calls == 1
    assert s.push(" after").content == " after"
    assert s.finish() == StreamEvents("", [])


def test_long_whitespace_run_is_not_held_past_the_limit() -> None:
    s = ToolCallStreamer(TOOLS)
    ev = s.push("x" + " " * (MAX_HELD_WHITESPACE + 10))
    assert ev.content == "x" + " " * 10
    assert s.finish().content == " " * MAX_HELD_WHITESPACE  # no call: kept verbatim


def test_block_is_buffered_until_its_closing_tag() -> None:
    s = ToolCallStreamer(TOOLS)
    block = xml("get_weather", {"city": "Paris", "days": "2"})
    for ch in block[:-1]:
        assert s.push(ch) == StreamEvents("", [])
    ev = s.push(block[-1])
    assert [(i, c.name, json.loads(c.arguments)) for i, c in ev.tool_calls] == [
        (0, "get_weather", {"city": "Paris", "days": 2})
    ]


def test_bare_json_is_held_then_released_when_it_cannot_be_a_call() -> None:
    s = ToolCallStreamer(TOOLS)
    assert s.push('{"name": "search", "arguments": {}}').content == ""
    assert s.push("\n").content == ""
    ev = s.finish()
    assert ev.content == "" and [c.name for _, c in ev.tool_calls] == ["search"]
    s = ToolCallStreamer(TOOLS)
    assert s.push('{"a": 1}').content == '{"a": 1}'  # complete, not a call: released at once
    s = ToolCallStreamer(TOOLS)
    assert s.push('{"name": "search", "arguments": {}}').content == ""
    assert s.push(" ok").content == '{"name": "search", "arguments": {}} ok'


def test_a_llama3_call_streams_as_one_call() -> None:
    s = ToolCallStreamer(TOOLS)
    text = '{"name": "get_weather", "parameters": {"city": "Lima"}}'
    assert all(s.push(ch).content == "" for ch in text)
    ev = s.finish()
    assert ev.content == ""
    assert [(c.name, json.loads(c.arguments)) for _, c in ev.tool_calls] == [
        ("get_weather", {"city": "Lima"})]


def test_no_tools_passes_text_through() -> None:
    s = ToolCallStreamer(None)
    text = "  " + hermes("search", {"q": 1}) + "  "
    assert s.push(text) == StreamEvents(text, [])
    assert s.finish() == StreamEvents("", [])
