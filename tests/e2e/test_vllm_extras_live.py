"""vLLM's sampling extras on the default model: bad_words, skip_special_tokens."""

from __future__ import annotations

from typing import Any

import httpx

from tests import HANG_S
from tests.e2e.conftest import LiveServer


def post(live_server: LiveServer, route: str, **body: Any) -> dict[str, Any]:
    r = httpx.post(live_server.url + route, timeout=HANG_S, json=body)
    assert r.status_code == 200, r.text
    data: dict[str, Any] = r.json()
    return data


def test_bad_words_change_the_greedy_text(live_server: LiveServer) -> None:
    """A word the greedy answer says is never said once it is a bad word, on completions and
    chat; its tokens do not appear after their prefix."""
    prompt = {"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0,
              "return_token_ids": True}
    plain = post(live_server, "/v1/completions", **prompt)["choices"][0]
    assert "Paris" in plain["text"]
    banned = post(live_server, "/v1/completions", **prompt, bad_words=["Paris"])["choices"][0]
    assert "Paris" not in banned["text"]
    msg = [{"role": "user", "content": "What is the capital of France?"}]
    chat = {"messages": msg, "max_tokens": 24, "temperature": 0}
    assert "Paris" in post(live_server, "/v1/chat/completions", **chat)[
        "choices"][0]["message"]["content"]
    content = post(live_server, "/v1/chat/completions", **chat, bad_words=["Paris"])[
        "choices"][0]["message"]["content"]
    assert "Paris" not in content


def test_skip_special_tokens_false_keeps_their_text(live_server: LiveServer) -> None:
    """A special token forced by logit_bias makes no text by default; with
    skip_special_tokens false it does, spaced unless spaces_between_special_tokens is false."""
    tok = live_server.backend.tokenizer
    start = tok.encode("<|im_start|>")
    assert len(start) == 1 and tok.is_special(start[0])
    body = {"prompt": "Hello", "max_tokens": 2, "temperature": 0, "ignore_eos": True,
            "logit_bias": {str(start[0]): 100}}

    def text(route_body: dict[str, Any]) -> str:
        out: str = post(live_server, "/v1/completions", **route_body)["choices"][0]["text"]
        return out

    assert text(body) == ""
    assert text({**body, "skip_special_tokens": False}) == "<|im_start|> <|im_start|>"
    assert text({**body, "skip_special_tokens": False,
                 "spaces_between_special_tokens": False}) == "<|im_start|><|im_start|>"


def test_logprob_token_ids_equal_the_natural_top_logprobs(live_server: LiveServer) -> None:
    """The natural top 3 of each greedy position, asked for by id, read the same values."""
    body = {"prompt": "Once upon a time", "max_tokens": 4, "temperature": 0, "ignore_eos": True,
            "return_tokens_as_token_ids": True}
    natural = post(live_server, "/v1/completions", **body, logprobs=3)["choices"][0]["logprobs"]
    first = natural["top_logprobs"][0]
    ids = [int(k.split(":")[1]) for k in first]
    named = post(live_server, "/v1/completions", **body, logprobs=0,
                 logprob_token_ids=ids[::-1])["choices"][0]["logprobs"]
    assert named["tokens"] == natural["tokens"]
    assert named["top_logprobs"][0] == first  # the same ids, the same values
    for top in named["top_logprobs"]:
        assert set(top) >= {f"token_id:{t}" for t in ids}


def test_repetition_detection_ends_a_loop_early(live_server: LiveServer) -> None:
    """Greedy counting of ones loops; with repetition_detection it stops once the loop shows."""
    body = {"prompt": "1 1 1 1 1 1 1 1 1 1 1 1", "max_tokens": 40, "temperature": 0,
            "ignore_eos": True, "return_token_ids": True}
    plain = post(live_server, "/v1/completions", **body)["choices"][0]
    assert plain["finish_reason"] == "length" and len(plain["token_ids"]) == 40
    rule = {"max_pattern_size": 4, "min_count": 4}
    cut = post(live_server, "/v1/completions", **body, repetition_detection=rule)["choices"][0]
    assert (cut["finish_reason"], cut["stop_reason"]) == ("stop", "repetition_detected")
    assert len(cut["token_ids"]) < 40
    assert cut["token_ids"] == plain["token_ids"][:len(cut["token_ids"])]  # the same greedy run
    assert plain["text"].startswith(cut["text"])
