"""Batch items on the default model: each carries its token ids and logprobs, and a seeded item
is the same request sent alone to chat, token for token (an RL trainer's GRPO group as one
batch request must be the policy its chat probes see)."""

from __future__ import annotations

from typing import Any

import httpx

from tests import HANG_S
from tests.e2e.conftest import LiveServer

PROMPTS: list[Any] = [
    [{"role": "user", "content": "Write one line about the sea."}],
    [{"role": "user", "content": "Name three colours."}],
]
SAMPLING = {"temperature": 0.9, "top_p": 0.95, "max_tokens": 12, "logprobs": True,
            "top_logprobs": 2, "return_token_ids": True}


def test_a_seeded_batch_item_is_the_request_sent_alone(live_server: LiveServer) -> None:
    n, seed = 2, 4321
    r = httpx.post(live_server.url + "/v1/completions/batch", timeout=HANG_S, json={
        "prompts": PROMPTS, "n": n, "seed": seed, **SAMPLING})
    assert r.status_code == 200, r.text
    items = r.json()["completions"]
    assert len(items) == len(PROMPTS) * n
    for item in items:
        p, c = item["prompt_index"], item["completion_index"]
        alone = httpx.post(live_server.url + "/v1/chat/completions", timeout=HANG_S, json={
            "messages": PROMPTS[p], "seed": seed + p * n + c, **SAMPLING})
        assert alone.status_code == 200, alone.text
        body = alone.json()
        choice = body["choices"][0]
        assert item["prompt_token_ids"] == body["prompt_token_ids"]
        assert item["token_ids"] == choice["token_ids"]
        assert len(item["token_ids"]) == item["usage"]["completion_tokens"]
        got, want = item["logprobs"]["content"], choice["logprobs"]["content"]
        # the C step is batch-invariant: the same logits bit for bit, whatever runs beside them
        assert [e["logprob"] for e in got] == [e["logprob"] for e in want]
        assert [[t["token"] for t in e["top_logprobs"]] for e in got] == [
            [t["token"] for t in e["top_logprobs"]] for e in want]
        assert item["text"] == choice["message"]["content"]
    assert len({tuple(i["token_ids"]) for i in items}) > 1  # the seeds gave different samples
