"""Tool calls through the chat handler (JSON and SSE), against the engine test double."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
from starlette.testclient import TestClient

from kiln.api._generated import wire
from kiln.api.app import build_app
from kiln.api.contract import contract
from kiln.config import ServerConfig
from kiln.text.chat_template import template_messages
from tests.api.fake_backend import FakeBackend
from tests.api.test_chat_fake import sse_events

CHAT = "/v1/chat/completions"
MSG = [{"role": "user", "content": "weather?"}]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}]
TWO_CALLS = (
    "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
    "</tool_call>\n<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n"
    "</function>\n</tool_call>"
)


def client_with(reply: str) -> TestClient:
    return TestClient(build_app(ServerConfig(), FakeBackend(reply=reply)))


def test_every_call_parsed_non_streaming() -> None:
    with client_with(TWO_CALLS) as c:
        body = c.post(CHAT, json={"messages": MSG, "tools": TOOLS}).json()
    assert contract().first_violation("ChatCompletionResponse", body) is None
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    msg = choice["message"]
    assert msg["content"] == "Let me check."
    calls = msg["tool_calls"]
    assert [json.loads(c["function"]["arguments"]) for c in calls] == [
        {"city": "Paris"}, {"city": "Rome"}
    ]
    assert all(c["id"].startswith("call_") and len(c["id"]) == 37 for c in calls)
    assert body["kiln_metadata"]["final_content_empty"] is False


def test_parallel_tool_calls_false_keeps_first() -> None:
    with client_with(TWO_CALLS) as c:
        body = c.post(CHAT, json={"messages": MSG, "tools": TOOLS,
                                  "parallel_tool_calls": False}).json()
    assert len(body["choices"][0]["message"]["tool_calls"]) == 1


def test_tool_choice_none_disables_parsing() -> None:
    with client_with(TWO_CALLS) as c:
        body = c.post(CHAT, json={"messages": MSG, "tools": TOOLS, "tool_choice": "none"}).json()
    assert "tool_calls" not in body["choices"][0]["message"]
    assert body["choices"][0]["message"]["content"] == TWO_CALLS
    assert body["choices"][0]["finish_reason"] == "stop"


def test_streamed_tool_calls_concatenate_to_non_streamed() -> None:
    with client_with(TWO_CALLS) as c:
        plain = c.post(CHAT, json={"messages": MSG, "tools": TOOLS}).json()
        r = c.post(CHAT, json={"messages": MSG, "tools": TOOLS, "stream": True})
    events = [e for e in sse_events(r.text) if isinstance(e, dict)]
    for e in events:
        assert contract().first_violation("ChatCompletionChunk", e) is None
    content = ""
    calls: dict[int, dict[str, Any]] = {}
    finish = None
    for e in events:
        if not e["choices"]:
            continue
        delta = e["choices"][0]["delta"]
        content += delta.get("content", "")
        for tc in delta.get("tool_calls", []):
            slot = calls.setdefault(tc["index"], {"id": None, "name": None, "arguments": ""})
            if "id" in tc:
                slot["id"], slot["name"] = tc["id"], tc["function"]["name"]
            slot["arguments"] += tc["function"]["arguments"]
        finish = e["choices"][0].get("finish_reason", finish)
    expected = plain["choices"][0]["message"]
    assert content == expected["content"]
    assert [calls[i]["name"] for i in sorted(calls)] == ["get_weather", "get_weather"]
    assert [calls[i]["arguments"] for i in sorted(calls)] == [
        c["function"]["arguments"] for c in expected["tool_calls"]
    ]
    assert finish == "tool_calls"


def test_prior_turn_string_arguments_are_parsed_for_the_template() -> None:
    msgs = msgspec.convert(
        [{"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "f", "arguments": "{\"x\": 1}"}}]}],
        list[wire.ChatMessageInput],
    )
    rendered = template_messages(msgs)
    assert rendered[0]["tool_calls"][0]["function"]["arguments"] == {"x": 1}
    assert rendered[0]["content"] is None


# A SmolLM2-style template: it concatenates content (null fails) and prints arguments as text.
CONCAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
    "{% for c in m.get('tool_calls') or [] %}{{ '<tool_call>' + c['function']['arguments'] }}"
    "{% endfor %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% endif %}"
)
CONCAT_TEMPLATE = CONCAT_TEMPLATE.replace("{{ m['content'] }}", "{{ '' + m['content'] }}")


def test_a_returned_tool_call_turn_renders_on_a_template_that_cannot_take_null() -> None:
    """The standard agent loop sends back the assistant message the server returned (content
    "" plus tool_calls): null content, then decoded arguments, fail on such a template, so the
    prompt renders with "" and the raw argument string instead of a 400."""
    from kiln.text.chat_template import ChatTemplate

    backend = FakeBackend(reply="It is sunny.")
    backend.chat_template = ChatTemplate(CONCAT_TEMPLATE)  # type: ignore[assignment]
    client = TestClient(build_app(ServerConfig(), backend))
    turn: list[dict[str, Any]] = [*MSG,
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 20}"}]
    for content in ("", None):
        turn[1]["content"] = content
        r = client.post(CHAT, json={"messages": turn, "tools": TOOLS, "max_tokens": 8})
        assert r.status_code == 200, r.text
        prompt = backend.tokenizer.decode(backend.submitted[-1].prompt_token_ids)
        assert '<|im_start|>assistant\n<tool_call>{"city": "Paris"}<|im_end|>' in prompt
    bad_turn = [{"role": "user", "content": "hi"}, {"role": "assistant", "tool_calls": [7]}]
    r = client.post(CHAT, json={"messages": bad_turn, "max_tokens": 8})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_messages"


def test_a_call_cut_by_max_tokens_finishes_with_length() -> None:
    """A complete call followed by one that max_tokens cut short: the complete call is returned,
    the cut text never reaches the content (issue 52), and finish_reason says "length" (JSON,
    SSE and batch), so a client learns that a call may be missing."""
    cut = TWO_CALLS.index("<tool_call>", TWO_CALLS.index("</tool_call>")) + 20
    body = {"messages": MSG, "tools": TOOLS, "max_tokens": cut}
    with client_with(TWO_CALLS) as c:
        plain = c.post(CHAT, json=body).json()
        stream = c.post(CHAT, json={**body, "stream": True})
        batch = c.post("/v1/completions/batch",
                       json={"prompts": [MSG], "tools": TOOLS, "max_tokens": cut}).json()
        whole = c.post(CHAT, json={"messages": MSG, "tools": TOOLS}).json()
    choice = plain["choices"][0]
    assert choice["finish_reason"] == "length"
    assert [t["function"]["name"] for t in choice["message"]["tool_calls"]] == ["get_weather"]
    assert choice["message"]["content"] == "Let me check."
    assert "<tool_call>" not in stream.text and "<functio" not in stream.text
    assert batch["completions"][0]["text"] == "Let me check."
    finishes = [e["choices"][0].get("finish_reason") for e in sse_events(stream.text)
                if isinstance(e, dict) and e["choices"]]
    assert [f for f in finishes if f] == ["length"]
    assert batch["completions"][0]["finish_reason"] == "length"
    assert whole["choices"][0]["finish_reason"] == "tool_calls"  # not cut: as before


@pytest.mark.parametrize("stream", [False, True])
def test_a_parallel_call_cut_inside_its_arguments_is_reported_as_far_as_written(
        stream: bool) -> None:
    """Issue 52: a second `<tool_call>` cut by max_tokens had been left in the content; it is
    the second call with the arguments written so far, and finish_reason is "length"."""
    cut = TWO_CALLS.index("Rome") + 2
    body = {"messages": MSG, "tools": TOOLS, "max_tokens": cut, "stream": stream}
    with client_with(TWO_CALLS) as c:
        r = c.post(CHAT, json=body)
    if stream:
        events = [e for e in sse_events(r.text) if isinstance(e, dict) and e.get("choices")]
        content = "".join(e["choices"][0]["delta"].get("content") or "" for e in events)
        deltas = [tc for e in events for tc in e["choices"][0]["delta"].get("tool_calls") or []]
        args = ["".join(d["function"].get("arguments", "") for d in deltas if d["index"] == i)
                for i in (0, 1)]
        finish = [e["choices"][0]["finish_reason"] for e in events
                  if e["choices"][0].get("finish_reason")]
    else:
        message = r.json()["choices"][0]["message"]
        content = message["content"] or ""
        args = [t["function"]["arguments"] for t in message["tool_calls"]]
        finish = [r.json()["choices"][0]["finish_reason"]]
    assert content == "Let me check." and finish == ["length"]
    assert [json.loads(a) for a in args] == [{"city": "Paris"}, {"city": "Ro"}]


def test_a_clients_tool_call_close_stop_still_yields_the_call() -> None:
    """Hermes clients send stop "</tool_call>": the engine cuts it from the text, so the call
    was left unterminated and came back as plain content. It is put back for parsing (JSON,
    SSE and batch agree), and never shown when it does not complete a call."""
    reply = 'Sure.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n'
    backend = FakeBackend(reply=reply)
    backend.stop_string = "</tool_call>"
    body = {"messages": MSG, "tools": TOOLS, "stop": ["</tool_call>"]}
    with TestClient(build_app(ServerConfig(), backend)) as c:
        plain = c.post(CHAT, json=body).json()["choices"][0]
        stream = c.post(CHAT, json={**body, "stream": True}).text
        batch = c.post("/v1/completions/batch",
                       json={"prompts": [MSG], "tools": TOOLS, "stop": "</tool_call>"}).json()
    assert plain["finish_reason"] == "tool_calls" and plain["message"]["content"] == "Sure."
    assert json.loads(plain["message"]["tool_calls"][0]["function"]["arguments"]) == {"city": "Oslo"}
    events = [e for e in sse_events(stream) if isinstance(e, dict) and e.get("choices")]
    content = "".join(e["choices"][0]["delta"].get("content", "") for e in events)
    names = [tc["function"]["name"] for e in events
             for tc in e["choices"][0]["delta"].get("tool_calls", []) if "id" in tc]
    assert content == "Sure." and names == ["get_weather"]
    # nowhere in the stream but the finishing chunk's stop_reason, which names the stop (vLLM's)
    assert '"stop_reason":"</tool_call>"' in stream
    assert "</tool_call>" not in stream.replace('"stop_reason":"</tool_call>"', "")
    assert batch["completions"][0]["tool_calls"][0]["function"]["name"] == "get_weather"
    backend.reply = "Sure.\n<tool_call>\nnot a call\n"  # a stop that completes nothing stays out
    with TestClient(build_app(ServerConfig(), backend)) as c:
        plain = c.post(CHAT, json=body).json()["choices"][0]
        stream = c.post(CHAT, json={**body, "stream": True}).text
    assert "tool_calls" not in plain["message"] and "</tool_call>" not in plain["message"]["content"]
    assert "</tool_call>" not in stream.replace('"stop_reason":"</tool_call>"', "")
