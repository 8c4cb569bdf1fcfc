"""/v1/completions generation (vLLM's request) through the HTTP edge, on the engine double:
prompt shapes, choice order, max_tokens, echo, logprobs arrays, stop ids, unsupported fields,
streaming. (Values on a real model: tests/e2e/test_completions_live.py.)"""

from __future__ import annotations

import json
from typing import Any

import pytest
from starlette.testclient import TestClient

from kiln.api.contract import contract
from kiln.api.requests.extras import bad_words_ids, included_stop
from kiln.engine.repetition import RepetitionDetection
from tests.api.fake_backend import FakeBackend

URL = "/v1/completions"


def post(client: TestClient, **body: Any) -> dict[str, Any]:
    r = client.post(URL, json=body)
    assert r.status_code == 200, r.text
    data: dict[str, Any] = r.json()
    assert contract().first_violation("TextCompletionResponse", data) is None, data
    return data


def test_text_prompt_generates_16_tokens_by_default(client: TestClient, backend: FakeBackend) -> None:
    backend.reply = "x" * 40
    body = post(client, prompt="Once upon a time")
    assert body["object"] == "text_completion" and body["id"].startswith("cmpl-")
    (choice,) = body["choices"]
    assert choice["text"] == "x" * 16 and choice["finish_reason"] == "length"
    assert backend.submitted[-1].sampling.max_tokens == 16
    # the double's tokenizer: BOS + one token per byte
    assert body["usage"] == {"prompt_tokens": 17, "completion_tokens": 16, "total_tokens": 33,
                             "prompt_tokens_details": {"cached_tokens": 0}}


@pytest.mark.parametrize("prompt", [["ab", "cd"], [[10, 11], [12, 13, 14]]])
def test_choices_are_prompt_major(client: TestClient, backend: FakeBackend, prompt: Any) -> None:
    body = post(client, prompt=prompt, n=2, max_tokens=3, seed=5)
    assert [c["index"] for c in body["choices"]] == [0, 1, 2, 3]
    sent = backend.submitted[-4:]
    lens = [len(r.prompt_token_ids) for r in sent]
    assert lens == ([3, 3, 3, 3] if isinstance(prompt[0], str) else [2, 2, 3, 3])  # BOS + 2
    assert [r.sampling.seed for r in sent] == [5, 6, 7, 8]
    assert body["usage"]["prompt_tokens"] == (6 if isinstance(prompt[0], str) else 5)


def test_token_id_prompt(client: TestClient, backend: FakeBackend) -> None:
    post(client, prompt=[5, 6, 7], max_tokens=2)
    assert backend.submitted[-1].prompt_token_ids == [5, 6, 7]


def test_completions_start_from_neutral_sampling(client: TestClient, backend: FakeBackend) -> None:
    post(client, prompt="a", max_tokens=1)
    p = backend.submitted[-1].sampling
    assert (p.temperature, p.top_p, p.top_k, p.presence_penalty) == (1.0, 1.0, 0, 0.0)
    post(client, prompt="a", max_tokens=1, sampling_preset="qwen3-thinking-general", top_k=-1)
    p = backend.submitted[-1].sampling
    assert (p.top_p, p.top_k, p.presence_penalty) == (0.95, 0, 1.5)


def test_echo_and_logprobs(client: TestClient, backend: FakeBackend) -> None:
    backend.reply = "hey"
    body = post(client, prompt=[10, 11, 12], max_tokens=2, echo=True, logprobs=1)
    (choice,) = body["choices"]
    lp = choice["logprobs"]
    assert choice["text"].endswith("he")
    assert len(lp["tokens"]) == 3 + 2
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    # echoed positions: the mock scorer's values (logprob = -token id)
    assert lp["token_logprobs"][1:3] == [-11.0, -12.0]
    # generated positions: the engine's values (the double: -token id / 100)
    assert lp["token_logprobs"][3:] == [-(ord("h") + 3) / 100, -(ord("e") + 3) / 100]
    assert all(len(d) == 2 for d in lp["top_logprobs"][3:])  # the top 1 and the chosen token
    assert lp["text_offset"] == sorted(lp["text_offset"]) and lp["text_offset"][0] == 0


def test_max_tokens_zero_with_echo_is_the_prompt(client: TestClient, backend: FakeBackend) -> None:
    before = len(backend.submitted)
    body = post(client, prompt="abc", max_tokens=0, echo=True)
    assert body["choices"][0]["text"] == "abc" and body["choices"][0]["finish_reason"] == "length"
    assert len(backend.submitted) == before  # nothing to generate


def test_stop_token_ids_and_return_token_ids(client: TestClient, backend: FakeBackend) -> None:
    body = post(client, prompt="a", max_tokens=4, stop_token_ids=[7], ignore_eos=True,
                return_token_ids=True, request_id="abc")
    assert backend.submitted[-1].sampling.stop_token_ids == (7,)
    assert backend.submitted[-1].sampling.ignore_eos is True
    assert body["id"] == "cmpl-abc"
    assert body["choices"][0]["prompt_token_ids"] == [1, ord("a") + 3]
    assert len(body["choices"][0]["token_ids"]) == 4


@pytest.mark.parametrize(("field", "value"), [
    ("suffix", "x"), ("use_beam_search", True),
    ("prompt_embeds", "x"),
    ("kv_transfer_params", {}),
    ("guided_json", {"type": "object"}), ("guided_choice", ["a", "b"]),
])
def test_unsupported_fields_are_a_400_naming_them(
    client: TestClient, field: str, value: Any
) -> None:
    for extra in ({"max_tokens": 2}, {"max_tokens": 0, "prompt_logprobs": 1}):
        r = client.post(URL, json={"prompt": "ab", field: value, **extra})
        assert r.status_code == 400, (field, r.text)
        err = r.json()["error"]
        assert (err["code"], err["param"]) == ("unsupported_parameter", field)


@pytest.mark.parametrize(("field", "value"), [
    ("suffix", None), ("logit_bias", {}), ("use_beam_search", False), ("min_tokens", 0),
    ("response_format", {"type": "text"}), ("thinking_token_budget", -1), ("priority", 0),
    ("guided_regex", None),
])
def test_defaults_of_unsupported_fields_are_fine(client: TestClient, field: str, value: Any) -> None:
    post(client, prompt="ab", max_tokens=1, **{field: value})


@pytest.mark.parametrize(("body", "param"), [
    ({"prompt": "ab", "prompt_logprobs": 1, "echo": True}, "echo"),
    ({"prompt": "ab", "prompt_logprobs": 1, "stream": True}, "stream"),
    ({"prompt": ["ab", "c"], "prompt_logprobs": 1}, "prompt"),
    ({"prompt": "ab", "max_tokens": 1, "n": 2, "prompt_logprobs": 1}, "n"),
])
def test_scoring_rules(client: TestClient, body: dict[str, Any], param: str) -> None:
    r = client.post(URL, json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


@pytest.mark.parametrize(("body", "param"), [
    ({"prompt": ["a"] * 33, "n": 2}, "n"),
    ({"prompt": [[5, 1000]]}, "prompt"),
    ({"prompt": "", "add_special_tokens": False}, "prompt"),
    ({"prompt": "a", "logprobs": 21}, "logprobs"),
    ({"prompt": "a", "n": 0}, "n"),
])
def test_bad_generation_requests(client: TestClient, body: dict[str, Any], param: str) -> None:
    r = client.post(URL, json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def events(text: str) -> list[Any]:
    out = []
    for line in text.splitlines():
        if line.startswith("data: "):
            data = line[len("data: "):]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def test_stream_with_usage(client: TestClient, backend: FakeBackend) -> None:
    backend.reply = "hello"
    r = client.post(URL, json={"prompt": ["a", "b"], "max_tokens": 3, "stream": True,
                               "echo": True, "logprobs": 0,
                               "stream_options": {"include_usage": True}})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    evs = events(r.text)
    assert evs[-1] == "[DONE]"
    chunks = evs[:-1]
    for c in chunks:
        assert contract().first_violation("TextCompletionChunk", c) is None, c
    usage = chunks[-1]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 6
    for index, prompt in enumerate(["a", "b"]):
        mine = [c["choices"][0] for c in chunks[:-1] if c["choices"][0]["index"] == index]
        assert "".join(c["text"] for c in mine) == prompt + "hel"
        assert [c["finish_reason"] for c in mine][-1] == "length"
        assert all(c["finish_reason"] is None for c in mine[:-1])
        tokens = [t for c in mine for t in (c["logprobs"] or {}).get("tokens", [])]
        assert len(tokens) == 2 + 3  # BOS + the prompt's byte, then three generated
        offsets = [o for c in mine for o in (c["logprobs"] or {}).get("text_offset", [])]
        assert offsets == sorted(offsets)


def test_stream_interval_groups_tokens(client: TestClient, backend: FakeBackend) -> None:
    backend.reply = "abcdefgh"
    r = client.post(URL, json={"prompt": "a", "max_tokens": 7, "stream": True, "stream_interval": 3})
    texts = [e["choices"][0]["text"] for e in events(r.text)[:-1]]
    assert texts == ["a", "bcd", "efg"]


def test_logits_extras_reach_the_engine(client: TestClient, backend: FakeBackend) -> None:
    post(client, prompt="a", max_tokens=4, logit_bias={"7": 150, "5": -3.5},
         allowed_token_ids=[9, 5, 9], min_tokens=2, stop_token_ids=[11])
    p = backend.submitted[-1].sampling
    assert p.logit_bias == ((5, -3.5), (7, 100.0))  # clamped to +-100
    assert p.allowed_token_ids == (5, 9)
    assert (p.min_tokens, p.min_tokens_ids) == (2, (2, 11))  # EOS and the stop token ids
    post(client, prompt="a", max_tokens=4, min_tokens=2, ignore_eos=True)
    assert backend.submitted[-1].sampling.min_tokens_ids == ()


@pytest.mark.parametrize(("body", "param", "code"), [
    ({"logit_bias": {"1000": 1}}, "logit_bias", "completion_invalid_request"),
    ({"allowed_token_ids": [1000]}, "allowed_token_ids", "completion_invalid_request"),
    ({"allowed_token_ids": []}, "allowed_token_ids", "completion_invalid_request"),
    ({"min_tokens": 5, "max_tokens": 4}, "min_tokens", "completion_invalid_request"),
    ({"min_tokens": 1, "stop": "x"}, "min_tokens", "unsupported_parameter"),
])
def test_logits_extras_checks(client: TestClient, body: dict[str, Any], param: str, code: str
                              ) -> None:
    r = client.post(URL, json={"prompt": "a", **body})
    assert r.status_code == 400, r.text
    assert (r.json()["error"]["param"], r.json()["error"]["code"]) == (param, code)


def test_include_stop_str_in_output(client: TestClient, backend: FakeBackend) -> None:
    backend.reply, backend.stop_string = "abc", "d"
    body = post(client, prompt="a", max_tokens=8, stop="d", include_stop_str_in_output=True)
    assert body["choices"][0]["text"] == "abcd"
    assert body["choices"][0]["stop_reason"] == "d"
    plain = post(client, prompt="a", max_tokens=8, stop="d")
    assert plain["choices"][0]["text"] == "abc"


def test_bad_words_spelling_after_a_space() -> None:
    """vLLM's rule: the spaced spelling counts when it has as many tokens and another first."""
    table = {"cat": [10], " cat": [11], "sea lion": [12, 13], " sea lion": [14, 15, 16]}

    class Words:
        def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
            return table[text]

    assert bad_words_ids(["  cat", "sea lion"], Words()) == ((10,), (11,), (12, 13))


def test_bad_words_reach_the_engine_and_not_scoring(client: TestClient, backend: FakeBackend
                                                    ) -> None:
    post(client, prompt="a", max_tokens=2, bad_words=["b"])
    assert backend.submitted[-1].sampling.bad_words_ids == ((ord("b") + 3,),)
    for field, value in (("bad_words", ["b"]),
                         ("repetition_detection", {"max_pattern_size": 2, "min_count": 2})):
        r = client.post(URL, json={"prompt": "ab", "max_tokens": 0, "prompt_logprobs": 1,
                                   field: value})
        assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text


def test_special_token_text_settings_reach_the_engine(client: TestClient, backend: FakeBackend
                                                      ) -> None:
    post(client, prompt="a", max_tokens=2)
    p = backend.submitted[-1].sampling
    assert (p.skip_special_tokens, p.spaces_between_special_tokens) == (True, True)
    post(client, prompt="a", max_tokens=2, skip_special_tokens=False,
         spaces_between_special_tokens=False)
    p = backend.submitted[-1].sampling
    assert (p.skip_special_tokens, p.spaces_between_special_tokens) == (False, False)
    r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "a"}],
                                                  "skip_special_tokens": False})
    assert r.status_code == 200, r.text
    assert backend.submitted[-1].sampling.skip_special_tokens is False


def test_session_id_is_accepted_and_changes_nothing(client: TestClient, backend: FakeBackend
                                                    ) -> None:
    """An opaque routing key (kiln/scale/routing.py): the same engine request as without it."""
    a = post(client, prompt="a", max_tokens=3, seed=5)
    sent = backend.submitted[-1]
    b = post(client, prompt="a", max_tokens=3, seed=5, session_id="chat-42")
    assert backend.submitted[-1].sampling == sent.sampling
    assert backend.submitted[-1].prompt_token_ids == sent.prompt_token_ids
    assert a["choices"] == b["choices"]


def test_logprob_token_ids_reach_the_engine(client: TestClient, backend: FakeBackend) -> None:
    post(client, prompt="a", max_tokens=2, logprobs=1, logprob_token_ids=[7, 5, 7])
    assert backend.submitted[-1].sampling.logprob_token_ids == (7, 5)
    assert backend.submitted[-1].sampling.logprobs == 1


@pytest.mark.parametrize(("body", "code"), [
    ({"logprob_token_ids": [3]}, "completion_invalid_request"),  # needs logprobs
    ({"logprob_token_ids": [1000], "logprobs": 0}, "completion_invalid_request"),
    ({"logprob_token_ids": [], "logprobs": 0}, "completion_invalid_request"),
    ({"logprob_token_ids": list(range(257)), "logprobs": 0}, "completion_invalid_request"),
    ({"logprob_token_ids": [3], "logprobs": 0, "max_tokens": 0, "prompt_logprobs": 1},
     "unsupported_parameter"),
])
def test_logprob_token_ids_checks(client: TestClient, body: dict[str, Any], code: str) -> None:
    r = client.post(URL, json={"prompt": "ab", **body})
    assert r.status_code == 400, r.text
    assert (r.json()["error"]["param"], r.json()["error"]["code"]) == ("logprob_token_ids", code)


def test_repetition_detection_reaches_the_engine(client: TestClient, backend: FakeBackend
                                                 ) -> None:
    post(client, prompt="a", max_tokens=2,
         repetition_detection={"max_pattern_size": 4, "min_count": 3})
    assert backend.submitted[-1].sampling.repetition_detection == RepetitionDetection(4, 3, 1)
    post(client, prompt="a", max_tokens=2, repetition_detection=None)
    assert backend.submitted[-1].sampling.repetition_detection is None


@pytest.mark.parametrize("rule", [{}, {"min_count": 2}, {"max_pattern_size": 3},
                                  {"max_pattern_size": 2, "min_count": 2, "min_pattern_size": 3},
                                  {"max_pattern_size": "2", "min_count": 2}])
def test_repetition_detection_that_detects_nothing_is_a_400(client: TestClient,
                                                            rule: dict[str, Any]) -> None:
    r = client.post(URL, json={"prompt": "a", "max_tokens": 2, "repetition_detection": rule})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "repetition_detection"


def test_include_stop_str_only_puts_back_a_stop_string() -> None:
    assert included_stop(True, "stop", "d", ("d",)) == "d"
    assert included_stop(True, "stop", "repetition_detected", ("d",)) == ""
    assert included_stop(False, "stop", "d", ("d",)) == ""
    assert included_stop(True, "length", None, ("d",)) == ""
