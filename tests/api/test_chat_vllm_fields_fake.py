"""vLLM's chat fields: add_generation_prompt, continue_final_message, echo, return_token_ids."""

from __future__ import annotations

from typing import Any

import pytest
from starlette.testclient import TestClient

from kiln.api.contract import contract
from tests.api.fake_backend import EOS, FakeBackend
from tests.api.test_chat_fake import sse_events

CHAT = "/v1/chat/completions"
USER = {"role": "user", "content": "hi"}
PARTIAL = [USER, {"role": "assistant", "content": "Once upon"}]
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]


def chat(client: TestClient, **fields: Any) -> dict[str, Any]:
    r = client.post(CHAT, json={"messages": [USER], **fields})
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    assert contract().first_violation("ChatCompletionResponse", body) is None
    return body


def prompt(backend: FakeBackend) -> str:
    return backend.tokenizer.decode(backend.submitted[-1].prompt_token_ids)


def test_add_generation_prompt(client: TestClient, backend: FakeBackend) -> None:
    chat(client)
    assert prompt(backend) == "<user>hi\n<assistant>"
    chat(client, add_generation_prompt=False)
    assert prompt(backend) == "<user>hi\n"


def test_continue_final_message_continues_it(client: TestClient, backend: FakeBackend) -> None:
    chat(client, messages=PARTIAL, add_generation_prompt=False, continue_final_message=True)
    assert prompt(backend) == "<user>hi\n<assistant>Once upon"  # no end of turn after it
    chat(client, messages=PARTIAL, add_generation_prompt=False)
    assert prompt(backend) == "<user>hi\n<assistant>Once upon\n"


@pytest.mark.parametrize(("fields", "param"), [
    ({"messages": PARTIAL, "continue_final_message": True}, "continue_final_message"),
    ({"continue_final_message": True, "add_generation_prompt": False}, "continue_final_message"),
    ({"messages": [USER, {"role": "assistant", "content": ""}], "continue_final_message": True,
      "add_generation_prompt": False}, "continue_final_message"),
])
def test_continue_final_message_refusals(client: TestClient, fields: dict[str, Any],
                                         param: str) -> None:
    r = client.post(CHAT, json={"messages": [USER], **fields})
    assert r.status_code == 400, r.text
    assert (r.json()["error"]["code"], r.json()["error"]["param"]) == ("chat_invalid_request", param)


def test_echo_puts_the_final_assistant_message_first(client: TestClient,
                                                     backend: FakeBackend) -> None:
    backend.reply = " a time"
    body = chat(client, messages=PARTIAL, add_generation_prompt=False,
                continue_final_message=True, echo=True)
    assert body["choices"][0]["message"]["content"] == "Once upon a time"
    body = chat(client, echo=True)  # the last message is the user's: nothing to echo
    assert body["choices"][0]["message"]["content"] == " a time"


def test_return_token_ids(client: TestClient, backend: FakeBackend) -> None:
    backend.reply = "ok"
    body = chat(client, return_token_ids=True, n=2)
    assert body["prompt_token_ids"] == backend.submitted[-1].prompt_token_ids
    assert [c["token_ids"] for c in body["choices"]] == [[ord("o") + 3, ord("k") + 3, EOS]] * 2
    body = chat(client)
    assert "prompt_token_ids" not in body and "token_ids" not in body["choices"][0]


def stream(client: TestClient, **fields: Any) -> list[dict[str, Any]]:
    """The chunks of a streamed chat, each checked against the contract."""
    r = client.post(CHAT, json={"messages": [USER], "stream": True, **fields})
    assert r.status_code == 200, r.text
    chunks = [e for e in sse_events(r.text) if e != "[DONE]"]
    for c in chunks:
        assert contract().first_violation("ChatCompletionChunk", c) is None
    return chunks


def streamed(chunks: list[dict[str, Any]], key: str) -> list[Any]:
    return [ch[key] for c in chunks for ch in c["choices"] if key in ch]


@pytest.mark.parametrize("fields", [{}, {"tools": TOOLS}])
def test_return_token_ids_in_a_stream_are_the_non_streaming_ones(
        client: TestClient, backend: FakeBackend, fields: dict[str, Any]) -> None:
    """The role chunk carries the prompt's ids; each chunk the ids generated since the last
    (held-back text's ids wait for the chunk that carries it), so they add up to every id."""
    backend.reply = 'Sure. <tool_call>{"name": "f", "arguments": {}}</tool_call>'
    whole = chat(client, return_token_ids=True, seed=3, **fields)
    chunks = stream(client, return_token_ids=True, seed=3, **fields)
    assert chunks[0]["prompt_token_ids"] == whole["prompt_token_ids"]
    assert all("prompt_token_ids" not in c for c in chunks[1:])
    ids = streamed(chunks, "token_ids")
    assert [i for chunk_ids in ids for i in chunk_ids] == whole["choices"][0]["token_ids"]
    assert len(ids) > 2  # spread over the chunks, not sent at the end
    assert not streamed(stream(client, seed=3, **fields), "token_ids")


def test_echo_in_a_stream_is_the_first_content(client: TestClient, backend: FakeBackend) -> None:
    backend.reply = " a time"
    fields = {"messages": PARTIAL, "add_generation_prompt": False,
              "continue_final_message": True, "echo": True}
    chunks = stream(client, **fields)
    deltas = [d.get("content") for d in streamed(chunks, "delta") if d.get("content")]
    assert deltas[0] == "Once upon"
    assert "".join(deltas) == chat(client, **fields)["choices"][0]["message"]["content"]
    assert "".join(d.get("content") or "" for d in streamed(stream(client, echo=True), "delta")
                   ) == " a time"  # the last message is the user's: nothing to echo
