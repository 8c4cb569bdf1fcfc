"""Chat logprobs on the default model through the OpenAI SDK: the values of the scoring route
for a greedy answer, the tokens' own bytes, and the same entries in stream chunks."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from tests import HANG_S
from tests.e2e.conftest import LiveServer
from tests.numerics import same_logits_logprob_atol

MSG: list[Any] = [{"role": "user", "content": "Say hello in French, then in Japanese."}]


@pytest.fixture
def client(live_server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=live_server.url + "/v1", api_key="unused", timeout=HANG_S,
                         max_retries=0)


def test_greedy_chat_logprobs_match_scoring(live_server: LiveServer) -> None:
    r = httpx.post(live_server.url + "/v1/chat/completions", timeout=HANG_S, json={
        "messages": MSG, "temperature": 0, "max_tokens": 12,
        "logprobs": True, "top_logprobs": 3, "rollout_provenance": True})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    record, content = choice["rollout_provenance"], choice["logprobs"]["content"]
    actions = record["action_tokens"]
    assert len(content) == len(actions) >= 8
    scored = httpx.post(live_server.url + "/v1/completions", timeout=HANG_S, json={
        "prompt": record["input_token_ids"], "prompt_logprobs": 3}).json()
    lps = scored["choices"][0]["prompt_logprobs"]
    for entry, action in zip(content, actions, strict=True):
        want = lps[action["sequence_index"]][str(action["token_id"])]
        # the C step gives a scored position the decode step's logits bit for bit; the two
        # paths' log_softmax over them differ in order only (tests/numerics.py)
        vocab = live_server.backend.loaded.config.vocab_size
        bound = same_logits_logprob_atol(vocab, want["logprob"])
        assert abs(entry["logprob"] - want["logprob"]) <= bound
        assert want["rank"] == 1 and len(entry["top_logprobs"]) == 3
        assert entry["top_logprobs"][0]["logprob"] == entry["logprob"]
    special = live_server.backend.tokenizer.eos_token_ids
    joined = b"".join(bytes(e["bytes"]) for e, a in zip(content, actions, strict=True)
                      if a["token_id"] not in special)
    assert joined.decode("utf-8") == choice["message"]["content"]


def test_stream_chunks_carry_the_same_logprobs(client: openai.OpenAI, live_server: LiveServer) -> None:
    args: dict[str, Any] = {"model": live_server.backend.model_id, "messages": MSG,
                            "temperature": 0, "max_tokens": 10, "logprobs": True,
                            "top_logprobs": 2}
    whole = client.chat.completions.create(**args)
    logprobs = whole.choices[0].logprobs
    assert logprobs is not None and logprobs.content is not None
    streamed = []
    for chunk in client.chat.completions.create(**args, stream=True):
        for c in chunk.choices:
            if c.logprobs is not None and c.logprobs.content:
                streamed.extend(c.logprobs.content)
    assert [(e.token, e.logprob, e.bytes) for e in streamed] == \
        [(e.token, e.logprob, e.bytes) for e in logprobs.content]
    assert all(len(e.top_logprobs) == 2 for e in streamed)


def test_more_than_20_alternatives_is_a_400(client: openai.OpenAI, live_server: LiveServer) -> None:
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=live_server.backend.model_id, messages=MSG,
                                       logprobs=True, top_logprobs=21)
