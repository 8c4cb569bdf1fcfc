"""temperature 0 on chat is the model's greedy answer (docs/decisions.md), on the default model: all
generated token is the top-1 token of the scoring route's distribution at its position."""

from __future__ import annotations

import httpx

from tests import HANG_S
from tests.e2e.conftest import LiveServer

HAIKU = [{"role": "user", "content": "Write a haiku about the sea."}]


def test_chat_temperature_zero_is_the_argmax(live_server: LiveServer) -> None:
    r = httpx.post(live_server.url + "/v1/chat/completions", timeout=HANG_S, json={
        "messages": HAIKU, "temperature": 0, "max_tokens": 24, "rollout_provenance": True})
    assert r.status_code == 200, r.text
    record = r.json()["choices"][0]["rollout_provenance"]
    full = list(record["input_token_ids"])
    actions = [a for a in record["action_tokens"] if a["source"] == "sampled"]
    assert len(actions) >= 8
    scored = httpx.post(live_server.url + "/v1/completions", timeout=HANG_S,
                        json={"prompt": full, "prompt_logprobs": 1}).json()
    lps = scored["choices"][0]["prompt_logprobs"]
    for a in actions:
        entry = lps[a["sequence_index"]][str(a["token_id"])]
        assert entry["rank"] == 1, (a, entry)
