"""Chat logprobs and vLLM extras through the HTTP edge, on the engine double."""

from __future__ import annotations

import json
from typing import Any

import pytest
from starlette.testclient import TestClient

from kiln.api.contract import contract
from tests.api.fake_backend import FakeBackend

CHAT = "/v1/chat/completions"
MSG = [{"role": "user", "content": "hi"}]


def test_logprobs_in_json(client: TestClient, backend: FakeBackend) -> None:
    backend.reply = "ok!"
    r = client.post(CHAT, json={"messages": MSG, "logprobs": True, "top_logprobs": 2})
    assert r.status_code == 200, r.text
    body = r.json()
    assert contract().first_violation("ChatCompletionResponse", body) is None
    content = body["choices"][0]["logprobs"]["content"]
    assert backend.submitted[-1].sampling.logprobs == 2
    assert [e["token"] for e in content] == ["o", "k", "!", ""]  # the double ends with EOS
    assert content[0]["logprob"] == -(ord("o") + 3) / 100
    assert content[0]["bytes"] == [ord("o")]
    assert [t["logprob"] for t in content[0]["top_logprobs"]] == [-0.03, -0.04]


def test_no_logprobs_unless_asked(client: TestClient, backend: FakeBackend) -> None:
    body = client.post(CHAT, json={"messages": MSG}).json()
    assert "logprobs" not in body["choices"][0]
    assert backend.submitted[-1].sampling.logprobs is None
    client.post(CHAT, json={"messages": MSG, "logprobs": True})
    assert backend.submitted[-1].sampling.logprobs == 0


@pytest.mark.parametrize(("body", "code", "param"), [
    ({"top_logprobs": 21, "logprobs": True}, "chat_invalid_request", "top_logprobs"),
    ({"top_logprobs": 2}, "chat_invalid_request", "top_logprobs"),
    ({"logit_bias": {"1000": 10}}, "chat_invalid_request", "logit_bias"),
    ({"min_tokens": 3, "max_tokens": 2}, "chat_invalid_request", "min_tokens"),
    ({"min_tokens": 3, "stop": ["x"]}, "unsupported_parameter", "min_tokens"),
])
def test_refusals(client: TestClient, body: dict[str, Any], code: str, param: str) -> None:
    r = client.post(CHAT, json={"messages": MSG, **body})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert (err["code"], err["param"]) == (code, param)


def test_extras_reach_the_engine(client: TestClient, backend: FakeBackend) -> None:
    r = client.post(CHAT, json={"messages": MSG, "stop_token_ids": [9, 10], "min_tokens": 2,
                                "logit_bias": {"4": -200}})
    assert r.status_code == 200, r.text
    p = backend.submitted[-1].sampling
    assert p.stop_token_ids == (9, 10) and p.logit_bias == ((4, -100.0),)
    assert (p.min_tokens, p.min_tokens_ids) == (2, (2, 9, 10))


def test_logprobs_in_stream_chunks(client: TestClient, backend: FakeBackend) -> None:
    backend.reply = "abc"
    r = client.post(CHAT, json={"messages": MSG, "stream": True, "logprobs": True,
                                "top_logprobs": 1})
    chunks = [json.loads(line[6:]) for line in r.text.splitlines()
              if line.startswith("data: {")]
    for c in chunks:
        assert contract().first_violation("ChatCompletionChunk", c) is None, c
    content = [e for c in chunks for ch in c["choices"] for e in
               ((ch.get("logprobs") or {}).get("content") or [])]
    assert [e["token"] for e in content] == ["a", "b", "c", ""]
    assert all(len(e["top_logprobs"]) == 1 for e in content)


def test_include_stop_str_in_output(client: TestClient, backend: FakeBackend) -> None:
    """The stop string that ended the answer stays at its end when asked, in JSON and stream."""
    backend.reply, backend.stop_string = "abc", "d"
    body = {"messages": MSG, "stop": "d", "chat_template_kwargs": {"enable_thinking": False}}
    kept = client.post(CHAT, json={**body, "include_stop_str_in_output": True}).json()
    assert kept["choices"][0]["message"]["content"] == "abcd"
    plain = client.post(CHAT, json=body).json()
    assert plain["choices"][0]["message"]["content"] == "abc"
    r = client.post(CHAT, json={**body, "include_stop_str_in_output": True, "stream": True})
    chunks = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
    text = "".join(ch["delta"].get("content") or "" for c in chunks for ch in c["choices"])
    assert text == "abcd"


def test_bad_words_reach_the_engine_as_token_ids(client: TestClient, backend: FakeBackend
                                                 ) -> None:
    """Each word as is and after a space, when that spelling has as many tokens and another
    first one (never on this byte tokenizer: " ab" is one token longer than "ab")."""
    r = client.post(CHAT, json={"messages": MSG, "bad_words": ["ab", " c", ""]})
    assert r.status_code == 200, r.text
    assert backend.submitted[-1].sampling.bad_words_ids == ((ord("a") + 3, ord("b") + 3),
                                                            (ord("c") + 3,))


def test_batch_items_take_the_same_extras(client: TestClient, backend: FakeBackend) -> None:
    """bad_words, skip_special_tokens / spaces_between_special_tokens and
    include_stop_str_in_output on every batch item, as on chat."""
    backend.reply, backend.stop_string = "abc", "d"
    body = {"prompts": [MSG, MSG], "stop": "d", "bad_words": ["x"], "skip_special_tokens": False,
            "spaces_between_special_tokens": False,
            "chat_template_kwargs": {"enable_thinking": False}}
    kept = client.post("/v1/completions/batch",
                       json={**body, "include_stop_str_in_output": True}).json()
    assert [i["text"] for i in kept["completions"]] == ["abcd", "abcd"]
    for r in backend.submitted[-2:]:
        p = r.sampling
        assert p.bad_words_ids == ((ord("x") + 3,),)
        assert (p.skip_special_tokens, p.spaces_between_special_tokens) == (False, False)
    plain = client.post("/v1/completions/batch", json=body).json()
    assert [i["text"] for i in plain["completions"]] == ["abc", "abc"]
