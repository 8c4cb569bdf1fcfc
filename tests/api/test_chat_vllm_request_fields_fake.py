"""vLLM's request fields on chat as on completions (shared code in
kiln/api/requests/extras.py): request_id, thinking_token_budget, truncate_prompt_tokens with
truncation_side, return_tokens_as_token_ids and prompt_logprobs, through the HTTP edge on the
engine double; bad values are a 400 naming the field. Until issue 25's fourth pass chat
accepted and ignored all of them as unknown fields. (A real model: tests/e2e/test_chat_vllm_request_fields_tiny.py.)"""

from __future__ import annotations

from typing import Any

import pytest
from starlette.testclient import TestClient

from tests.api.fake_backend import FakeBackend
from tests.api.test_chat_fake import sse_events
from tests.api.test_generation_extras_fake import post, refused

CHAT = "/v1/chat/completions"
THINK = {"chat_template_kwargs": {"enable_thinking": True}}  # the prompt ends inside <think>


def chat(client: TestClient, **fields: Any) -> dict[str, Any]:
    return post(client, CHAT, **fields)


def test_request_id_is_the_response_id(client: TestClient) -> None:
    assert chat(client, max_tokens=2, request_id="run-7")["id"] == "chatcmpl-run-7"
    assert chat(client, max_tokens=2)["id"] != "chatcmpl-run-7"  # a fresh uuid otherwise
    error = refused(client, CHAT, request_id="")
    assert (error["param"], error["code"]) == ("request_id", "chat_invalid_request")


@pytest.mark.parametrize(("fields", "limit"), [
    ({"thinking_token_budget": 3}, 3),
    ({"thinking_token_budget": 3, "thinking_budget_tokens": 3}, 3),
    ({"thinking_token_budget": -1}, None),
    ({"thinking_token_budget": -1, "thinking_budget_tokens": None}, None),
    ({"thinking_token_budget": None, "thinking_budget_tokens": 4}, 4),
])
def test_thinking_token_budget_is_kilns_budget(client: TestClient, backend: FakeBackend,
                                               fields: dict[str, Any], limit: int | None) -> None:
    body = chat(client, max_tokens=16, **THINK, **fields)
    spec = backend.submitted[-1].sampling.thinking
    assert (spec.max_tokens if spec is not None else None) == limit
    record = body["kiln_metadata"]["thinking_budget"]
    assert (record["configured"], record.get("max_tokens")) == (limit is not None, limit)
    assert record["tokens_source"] == ("request" if limit is not None else "request_unlimited")


@pytest.mark.parametrize("fields", [
    {"thinking_token_budget": 3, "thinking_budget_tokens": 4},
    {"thinking_token_budget": -1, "thinking_budget_tokens": 4},
    {"thinking_token_budget": 3, "thinking_budget_tokens": None},
    {"thinking_token_budget": -2},
])
def test_inconsistent_thinking_budgets_are_refused(client: TestClient,
                                                   fields: dict[str, Any]) -> None:
    error = refused(client, CHAT, max_tokens=16, **THINK, **fields)
    assert (error["param"], error["code"]) == ("thinking_token_budget", "chat_invalid_request")


def test_truncate_prompt_tokens_keeps_the_end_or_the_start(client: TestClient,
                                                           backend: FakeBackend) -> None:
    full = chat(client, max_tokens=2)
    whole = backend.submitted[-1].prompt_token_ids
    assert full["usage"]["prompt_tokens"] == len(whole) > 5
    left = chat(client, max_tokens=2, truncate_prompt_tokens=5)
    assert backend.submitted[-1].prompt_token_ids == whole[-5:]
    assert left["usage"]["prompt_tokens"] == 5
    right = chat(client, max_tokens=2, truncate_prompt_tokens=5, truncation_side="right")
    assert backend.submitted[-1].prompt_token_ids == whole[:5]
    assert right["usage"]["prompt_tokens"] == 5
    chat(client, max_tokens=2, truncate_prompt_tokens=len(whole) + 9)  # longer: kept whole
    assert backend.submitted[-1].prompt_token_ids == whole
    # -1: max_model_len - max_tokens tokens (4096 on the double)
    room = chat(client, max_tokens=4096 - 4, truncate_prompt_tokens=-1)
    assert room["usage"]["prompt_tokens"] == 4 and backend.submitted[-1].prompt_token_ids == \
        whole[-4:]


@pytest.mark.parametrize("fields", [
    {"truncate_prompt_tokens": 0},
    {"truncate_prompt_tokens": -2},
    {"truncate_prompt_tokens": -1, "max_tokens": 4096},
])
def test_bad_truncation_is_refused(client: TestClient, fields: dict[str, Any]) -> None:
    error = refused(client, CHAT, **fields)
    assert (error["param"], error["code"]) == ("truncate_prompt_tokens", "chat_invalid_request")


def test_truncation_side_is_left_or_right(client: TestClient) -> None:
    error = refused(client, CHAT, truncate_prompt_tokens=3, truncation_side="middle")
    assert (error["param"], error["code"]) == ("truncation_side", "chat_invalid_request")


def test_return_tokens_as_token_ids_names_logprobs_tokens_by_id(client: TestClient) -> None:
    plain = chat(client, max_tokens=3, logprobs=True, top_logprobs=2)["choices"][0]
    as_ids = chat(client, max_tokens=3, logprobs=True, top_logprobs=2,
                  return_tokens_as_token_ids=True, return_token_ids=True)["choices"][0]
    content = as_ids["logprobs"]["content"]
    assert [e["token"] for e in content] == [f"token_id:{t}" for t in as_ids["token_ids"]]
    for before, entry in zip(plain["logprobs"]["content"], content, strict=True):
        assert entry["bytes"] == before["bytes"] and entry["logprob"] == before["logprob"]
        assert all(t["token"].startswith("token_id:") for t in entry["top_logprobs"])
        assert len(entry["top_logprobs"]) == len(before["top_logprobs"]) == 2


def test_prompt_logprobs_beside_the_choices(client: TestClient, backend: FakeBackend) -> None:
    body = chat(client, max_tokens=2, prompt_logprobs=2)
    ids = backend.submitted[-1].prompt_token_ids
    lists = body["prompt_logprobs"]
    assert len(lists) == len(ids) == body["usage"]["prompt_tokens"] and lists[0] is None
    for pos, entry in enumerate(lists[1:], start=1):
        assert str(ids[pos]) in entry  # the observed token is always there
        assert 2 <= len(entry) <= 3  # the top 2, and the observed token when it is not one
    assert "prompt_logprobs" not in chat(client, max_tokens=2)
    short = chat(client, max_tokens=2, prompt_logprobs=0, truncate_prompt_tokens=4)
    assert len(short["prompt_logprobs"]) == 4  # the prompt that ran


@pytest.mark.parametrize(("fields", "code"), [
    ({"prompt_logprobs": 21}, "chat_invalid_request"),  # over --max-logprobs (20)
    ({"prompt_logprobs": -1}, "chat_invalid_request"),
    ({"prompt_logprobs": 1, "stream": True}, "unsupported_parameter"),
])
def test_bad_prompt_logprobs_are_refused(client: TestClient, fields: dict[str, Any],
                                         code: str) -> None:
    error = refused(client, CHAT, **fields)
    assert (error["param"], error["code"]) == ("prompt_logprobs", code)


def test_add_special_tokens_puts_bos_before_the_template(client: TestClient,
                                                        backend: FakeBackend) -> None:
    plain = chat(client, max_tokens=2)
    ids = backend.submitted[-1].prompt_token_ids
    assert ids[0] != 1  # the double's BOS is 1; the template's text comes first by default
    bos = chat(client, max_tokens=2, add_special_tokens=True)
    assert backend.submitted[-1].prompt_token_ids == [1, *ids]
    assert bos["usage"]["prompt_tokens"] == plain["usage"]["prompt_tokens"] + 1
    chat(client, max_tokens=2, add_special_tokens=False)
    assert backend.submitted[-1].prompt_token_ids == ids


def test_return_tokens_as_token_ids_in_a_stream(client: TestClient, backend: FakeBackend) -> None:
    r = client.post(CHAT, json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
                                "stream": True, "logprobs": True, "top_logprobs": 1,
                                "return_tokens_as_token_ids": True, "request_id": "s-1"})
    assert r.status_code == 200, r.text
    chunks = [e for e in sse_events(r.text) if e != "[DONE]"]
    assert {c["id"] for c in chunks} == {"chatcmpl-s-1"}
    entries = [e for c in chunks for ch in c["choices"]
               for e in ((ch.get("logprobs") or {}).get("content") or [])]
    assert len(entries) == 3
    assert all(e["token"].startswith("token_id:") and
               e["top_logprobs"][0]["token"].startswith("token_id:") for e in entries)
    tokens = [int(e["token"].removeprefix("token_id:")) for e in entries]
    text = "".join(ch["delta"].get("content") or "" for c in chunks for ch in c["choices"])
    assert backend.tokenizer.decode(tokens) == text  # the ids of the streamed text
