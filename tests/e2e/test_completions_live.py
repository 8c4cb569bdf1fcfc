"""/v1/completions generation on the default model through the official OpenAI SDK, as a new
user and lm-evaluation-harness call it; logprobs checked against the scoring route."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from tests import HANG_S
from tests.e2e.conftest import LiveServer
from tests.numerics import same_logits_logprob_atol


@pytest.fixture
def client(live_server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=live_server.url + "/v1", api_key="unused", timeout=HANG_S,
                         max_retries=0)


def model(live_server: LiveServer) -> str:
    return live_server.backend.model_id


def scored(live_server: LiveServer, ids: list[int], k: int = 1) -> list[Any]:
    r = httpx.post(live_server.url + "/v1/completions", timeout=HANG_S,
                   json={"prompt": ids, "prompt_logprobs": k, "max_tokens": 0})
    assert r.status_code == 200, r.text
    result: list[Any] = r.json()["choices"][0]["prompt_logprobs"]
    return result


def test_new_users_first_call(client: openai.OpenAI, live_server: LiveServer) -> None:
    out = client.completions.create(model=model(live_server), prompt="Once upon a time",
                                    max_tokens=8)
    assert out.object == "text_completion" and len(out.choices) == 1
    choice = out.choices[0]
    assert choice.text and choice.finish_reason in ("length", "stop")
    assert out.usage is not None and 1 <= out.usage.completion_tokens <= 8
    assert out.usage.prompt_tokens == len(live_server.backend.tokenizer.encode(
        "Once upon a time", add_special_tokens=True))


def test_lm_eval_loglikelihood_echo_equals_scoring(
    client: openai.OpenAI, live_server: LiveServer
) -> None:
    tok = live_server.backend.tokenizer
    ids = [tok.encode("The capital of France is"), tok.encode("Two plus two is four")]
    out = client.completions.create(model=model(live_server), prompt=ids, max_tokens=1,
                                    logprobs=1, echo=True, temperature=0)
    assert [c.index for c in out.choices] == [0, 1]
    for prompt, choice in zip(ids, out.choices, strict=True):
        lp = choice.logprobs
        assert lp is not None and lp.token_logprobs is not None and lp.top_logprobs is not None
        assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
        assert len(lp.token_logprobs) == len(prompt) + 1  # the echo, then one generated token
        ref = scored(live_server, prompt)
        for pos in range(1, len(prompt)):
            # the same code path (the scoring route computes the echoed positions): bit-identical
            assert lp.token_logprobs[pos] == ref[pos][str(prompt[pos])]["logprob"], pos
        assert choice.text.startswith(tok.decode(prompt))


def test_greedy_generation_logprobs_match_scoring(
    client: openai.OpenAI, live_server: LiveServer
) -> None:
    prompt = live_server.backend.tokenizer.encode("Once upon a time, in a land far away,")
    out = client.completions.create(model=model(live_server), prompt=prompt, max_tokens=8,
                                    temperature=0, logprobs=5,
                                    extra_body={"return_token_ids": True, "ignore_eos": True})
    choice = out.choices[0]
    generated: list[int] = choice.model_extra["token_ids"]  # type: ignore[index]
    assert len(generated) == 8
    lp = choice.logprobs
    assert lp is not None and lp.token_logprobs is not None and lp.top_logprobs is not None
    ref = scored(live_server, prompt + generated, k=5)
    for i, tid in enumerate(generated):
        got, want = lp.token_logprobs[i], ref[len(prompt) + i][str(tid)]
        assert got is not None and want["rank"] == 1  # greedy: the top token
        # Generation's logits come from the prefill/decode steps, scoring's from its own chunks:
        # bit for bit the same in the C step; their log_softmax differ in order only
        tol = same_logits_logprob_atol(live_server.backend.loaded.config.vocab_size,
                                       want["logprob"])
        assert abs(got - want["logprob"]) <= tol, (i, got, want)
        top = lp.top_logprobs[i]
        assert top is not None and max(top.values()) == got and len(top) == 5
    # text_offset: each token starts where the previous one's text ended
    assert lp.text_offset is not None and lp.tokens is not None
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
    assert "".join(lp.tokens) == choice.text


def test_stream_equals_the_json_answer(client: openai.OpenAI, live_server: LiveServer) -> None:
    args: dict[str, Any] = {"model": model(live_server), "prompt": ["Once upon a time", "Hello"],
                            "max_tokens": 6, "temperature": 0, "n": 2}
    whole = client.completions.create(**args)
    texts = ["", "", "", ""]
    usage = None
    for chunk in client.completions.create(**args, stream=True,
                                           stream_options={"include_usage": True}):
        for c in chunk.choices:
            texts[c.index] += c.text
        if chunk.usage is not None:
            usage = chunk.usage
    assert texts == [c.text for c in whole.choices]
    assert texts[0] == texts[1]  # greedy: both choices of a prompt agree
    assert usage is not None and whole.usage is not None
    assert usage.completion_tokens == whole.usage.completion_tokens


def test_seeded_sampling_repeats(client: openai.OpenAI, live_server: LiveServer) -> None:
    args: dict[str, Any] = {"model": model(live_server), "prompt": "The weather today",
                            "max_tokens": 8, "temperature": 1.0, "seed": 3, "n": 2}
    a = [c.text for c in client.completions.create(**args).choices]
    b = [c.text for c in client.completions.create(**args).choices]
    assert a == b and a[0] != a[1]


def test_stop_string(client: openai.OpenAI, live_server: LiveServer) -> None:
    base: dict[str, Any] = {"model": model(live_server), "prompt": "1, 2, 3, 4,",
                            "max_tokens": 12, "temperature": 0}
    full = client.completions.create(**base).choices[0].text
    cut = full.strip()[:2]
    assert cut
    out = client.completions.create(**base, stop=[cut]).choices[0]
    assert out.finish_reason == "stop" and cut not in out.text
    assert out.model_extra is not None and out.model_extra["stop_reason"] == cut
