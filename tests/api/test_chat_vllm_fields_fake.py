"""vLLM's chat fields: add_generation_prompt, continue_final_message, echo, return_token_ids."""

from __future__ import annotations

from typing import Any

import pytest
from starlette.testclient import TestClient

from kiln.api.contract import contract
from tests.api.fake_backend import EOS, FakeBackend

CHAT = "/v1/chat/completions"
USER = {"role": "user", "content": "hi"}
PARTIAL = [USER, {"role": "assistant", "content": "Once upon"}]


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


@pytest.mark.parametrize("fields", [
    {"return_token_ids": True},
    {"echo": True, "messages": PARTIAL},
])
def test_streaming_refuses_them(client: TestClient, fields: dict[str, Any]) -> None:
    r = client.post(CHAT, json={"messages": [USER], "stream": True, **fields})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "unsupported_parameter" and err["param"] in fields
