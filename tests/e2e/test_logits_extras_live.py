"""vLLM's logits extras on the default model: logit_bias, allowed_token_ids, min_tokens."""

from __future__ import annotations

from typing import Any

import httpx

from tests import HANG_S
from tests.e2e.conftest import LiveServer


def complete(live_server: LiveServer, **body: Any) -> dict[str, Any]:
    r = httpx.post(live_server.url + "/v1/completions", timeout=HANG_S,
                   json={"return_token_ids": True, **body})
    assert r.status_code == 200, r.text
    choice: dict[str, Any] = r.json()["choices"][0]
    return choice


def test_logit_bias_forces_a_token(live_server: LiveServer) -> None:
    the = live_server.backend.tokenizer.encode(" the")[0]
    choice = complete(live_server, prompt="Once upon a time", max_tokens=5, temperature=0,
                      ignore_eos=True, logit_bias={str(the): 100})
    assert choice["token_ids"] == [the] * 5
    plain = complete(live_server, prompt="Once upon a time", max_tokens=5, temperature=0,
                     ignore_eos=True)
    assert plain["token_ids"] != [the] * 5  # the bias made the difference


def test_allowed_token_ids(live_server: LiveServer) -> None:
    allowed = live_server.backend.tokenizer.encode(" cat dog bird")
    choice = complete(live_server, prompt="My favourite animal is", max_tokens=6,
                      temperature=1.0, seed=4, ignore_eos=True, allowed_token_ids=allowed,
                      logprobs=5)
    assert set(choice["token_ids"]) <= set(allowed)
    for top in choice["logprobs"]["top_logprobs"]:
        assert 1 <= len(top) <= len(allowed)  # masked tokens are no alternatives


def test_min_tokens_holds_back_eos(live_server: LiveServer) -> None:
    msg = [{"role": "user", "content": "Answer with one word: is the sky blue?"}]

    def chat(**extra: Any) -> dict[str, Any]:
        r = httpx.post(live_server.url + "/v1/chat/completions", timeout=HANG_S,
                       json={"messages": msg, "temperature": 0, "max_tokens": 64, **extra})
        assert r.status_code == 200, r.text
        data: dict[str, Any] = r.json()
        return data

    short = chat()
    n = short["usage"]["completion_tokens"]
    assert short["choices"][0]["finish_reason"] == "stop" and n < 40
    longer = chat(min_tokens=n + 5)
    assert longer["usage"]["completion_tokens"] >= n + 5
