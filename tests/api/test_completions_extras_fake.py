"""/v1/completions: best_of, prompt_logprobs beside generation, truncate_prompt_tokens with
truncation_side, thinking_token_budget, on the engine double."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from starlette.testclient import TestClient

from kiln.api.app import build_app
from kiln.config import ServerConfig
from kiln.engine.outputs import RequestOutput
from kiln.engine.request import Request
from tests.api.fake_backend import FakeBackend
from tests.api.test_completions_fake import URL, events, post


class SeededBackend(FakeBackend):
    """Each run's text is its seed, once per token, and its tokens' behaviour logprob is
    -(seed % 5) / 10: the cumulative logprob ranks the runs by seed % 5."""

    def _out(self, request: Request, ids: list[int], *args: Any, **kwargs: Any) -> RequestOutput:
        out = super()._out(request, ids, *args, **kwargs)
        seed = request.sampling.seed or 0
        out.new_logprobs = [-(seed % 5) / 10] * len(ids)
        out.text_delta = str(seed) * len(ids) if out.text_delta else ""
        return out


@pytest.fixture
def seeded() -> Iterator[tuple[TestClient, SeededBackend]]:
    backend = SeededBackend(reply="ab")
    with TestClient(build_app(ServerConfig(), backend), raise_server_exceptions=False) as c:
        yield c, backend


def test_best_of_returns_the_best_n_by_cumulative_logprob(
    seeded: tuple[TestClient, SeededBackend]
) -> None:
    client, backend = seeded
    # prompt 0 runs seeds 3, 4, 5, 6 (ranks 3, 4, 0, 1); prompt 1 seeds 7, 8, 9, 10 (2, 3, 4, 0)
    body = post(client, prompt=["x", "y"], n=2, best_of=4, seed=3, max_tokens=4)
    assert len(backend.submitted) == 8
    assert [c["text"] for c in body["choices"]] == ["55", "66", "1010", "77"]
    assert [c["index"] for c in body["choices"]] == [0, 1, 2, 3]
    assert body["usage"]["completion_tokens"] == 8 * 3  # every run's tokens (2 and EOS)


def test_best_of_equal_to_n_keeps_the_order(seeded: tuple[TestClient, SeededBackend]) -> None:
    client, _ = seeded
    body = post(client, prompt="x", n=3, best_of=3, seed=3, max_tokens=4)
    assert [c["text"] for c in body["choices"]] == ["33", "44", "55"]


@pytest.mark.parametrize(("fields", "param"), [
    ({"n": 3, "best_of": 2}, "best_of"),
    ({"n": 1, "best_of": 2, "stream": True}, "best_of"),
    ({"prompt": ["a"] * 9, "best_of": 8}, "best_of"),
])
def test_best_of_refusals(client: TestClient, fields: dict[str, Any], param: str) -> None:
    r = client.post(URL, json={"prompt": "a", "max_tokens": 2, **fields})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_prompt_logprobs_beside_generation(client: TestClient, backend: FakeBackend) -> None:
    backend.reply = "zz"
    body = post(client, prompt="ab", max_tokens=4, prompt_logprobs=2, logprobs=1)
    (choice,) = body["choices"]
    assert choice["text"] == "zz"
    # the double scores token t at -t; its top ids are 0, 1, ...
    a, b = ord("a") + 3, ord("b") + 3
    assert choice["prompt_logprobs"][0] is None
    assert choice["prompt_logprobs"][1] == {
        "0": {"logprob": -0.0, "rank": 1, "decoded_token": ""},
        "1": {"logprob": -1.0, "rank": 2, "decoded_token": ""},
        str(a): {"logprob": -float(a), "rank": a + 1, "decoded_token": "a"}}
    assert list(choice["prompt_logprobs"][2]) == ["0", "1", str(b)]
    assert len(choice["logprobs"]["tokens"]) == 3  # generation's logprobs beside it


def test_prompt_logprobs_in_the_first_chunk_of_each_choice(client: TestClient) -> None:
    r = client.post(URL, json={"prompt": "ab", "max_tokens": 3, "n": 2, "stream": True,
                               "prompt_logprobs": 0})
    assert r.status_code == 200, r.text
    chunks = [e for e in events(r.text) if e != "[DONE]"]
    firsts: dict[int, Any] = {}
    for e in chunks:
        for c in e["choices"]:
            if c["index"] in firsts:
                assert "prompt_logprobs" not in c
            else:
                firsts[c["index"]] = c
    assert all(len(c["prompt_logprobs"]) == 3 for c in firsts.values()) and len(firsts) == 2


def test_prompt_logprobs_past_max_logprobs(client: TestClient) -> None:
    r = client.post(URL, json={"prompt": "ab", "max_tokens": 4, "prompt_logprobs": 21})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt_logprobs"


@pytest.mark.parametrize(("side", "kept"), [(None, "defgh"), ("left", "defgh"), ("right", "abcd")])
def test_truncate_prompt_tokens(client: TestClient, backend: FakeBackend, side: str | None,
                                kept: str) -> None:
    # the double's encoding is BOS + a token per byte: keeping 5 of "abcdefgh" drops BOS too
    body = post(client, prompt="abcdefgh", max_tokens=2, truncate_prompt_tokens=5,
                truncation_side=side, echo=True)
    ids = backend.submitted[-1].prompt_token_ids
    want = [ord(ch) + 3 for ch in kept]
    assert ids == (want if side != "right" else [1, *want])
    assert body["choices"][0]["text"].startswith(backend.tokenizer.decode(ids))
    assert body["usage"]["prompt_tokens"] == 5


def test_truncate_to_leave_room_for_max_tokens(client: TestClient, backend: FakeBackend) -> None:
    limit = backend.max_model_len
    post(client, prompt="x" * (limit + 10), max_tokens=6, truncate_prompt_tokens=-1)
    assert backend.submitted[-1].prompt_token_ids == [ord("x") + 3] * (limit - 6)
    post(client, prompt="abc", max_tokens=2, truncate_prompt_tokens=10)  # shorter: unchanged
    assert len(backend.submitted[-1].prompt_token_ids) == 4


def test_truncation_that_leaves_nothing_is_a_400(client: TestClient, backend: FakeBackend) -> None:
    r = client.post(URL, json={"prompt": "ab", "max_tokens": backend.max_model_len,
                               "truncate_prompt_tokens": -1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "truncate_prompt_tokens"


def test_thinking_token_budget_applies_inside_a_reasoning_block(
    client: TestClient, backend: FakeBackend
) -> None:
    post(client, prompt="Q: why?\n<think>\n", max_tokens=40, thinking_token_budget=7)
    spec = backend.submitted[-1].sampling.thinking
    assert spec is not None and spec.max_tokens == 7
    assert backend.tokenizer.decode(list(spec.close_ids)) == "</think>"
    for prompt, budget in (("Q: why?", 7), ("Q: why?\n<think>\n", -1)):
        post(client, prompt=prompt, max_tokens=40, thinking_token_budget=budget)
        assert backend.submitted[-1].sampling.thinking is None


@pytest.mark.parametrize(("field", "value"), [
    ("truncate_prompt_tokens", 2), ("best_of", 2), ("thinking_token_budget", 3),
])
def test_scoring_refuses_what_does_not_apply(client: TestClient, field: str, value: Any) -> None:
    r = client.post(URL, json={"prompt": "abc", "prompt_logprobs": 1, field: value})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert (err["code"], err["param"]) == ("unsupported_parameter", field)


def test_integral_float_token_ids_are_token_ids(client: TestClient, backend: FakeBackend) -> None:
    # JSON Schema's integers admit 2.0: such a prompt had been a 500 (schemathesis found it)
    post(client, prompt=[10.0, 11], max_tokens=1)
    assert backend.submitted[-1].prompt_token_ids == [10, 11]
    post(client, prompt=[[12.0], [13]], max_tokens=1)
    assert backend.submitted[-1].prompt_token_ids == [13]
    r = client.post(URL, json={"prompt": [10.0, 11], "prompt_logprobs": 0})
    assert r.status_code == 200, r.text


def test_cache_salt_reaches_every_engine_request(client: TestClient, backend: FakeBackend) -> None:
    post(client, prompt=["a", "b"], n=2, max_tokens=1, cache_salt="tenant-1")
    assert [r.cache_salt for r in backend.submitted] == ["tenant-1"] * 4
    post(client, prompt="a", max_tokens=1)
    assert backend.submitted[-1].cache_salt is None


def test_priority_reaches_every_engine_request(client: TestClient, backend: FakeBackend) -> None:
    post(client, prompt=["a", "b"], max_tokens=1, priority=-3)
    assert [r.priority for r in backend.submitted] == [-3, -3]
    post(client, prompt="a", max_tokens=1)
    assert backend.submitted[-1].priority == 0
