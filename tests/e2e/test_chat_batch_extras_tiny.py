"""logprob_token_ids and repetition_detection honoured on chat and batch by the real engine, on
a tiny random Qwen3 (the engine-double tests, tests/api/test_generation_extras_fake.py, check
the mapping; these check what comes back through chat's and batch's own paths), and the render
routes showing the output constraint the generating route would run."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from kiln.api.contract import contract
from kiln.model import LoadedModel
from kiln.model.loader import load_model
from kiln.text.token_bytes import token_bytes
from tests.e2e.app_client import app_client
from tests.tiny_models import write_tiny_qwen3

MSG = [{"role": "user", "content": "Tell me about the fox."}]
CHAT, BATCH = "/v1/chat/completions", "/v1/completions/batch"
ROUTES = pytest.mark.parametrize("route", [CHAT, BATCH])
# The constraint admits only the letter a, which the tiny tokenizer spells with one token: an
# output that loops on one token, whatever the random weights prefer.
LOOP: dict[str, Any] = {"structured_outputs": {"regex": "a{40}"}, "temperature": 0,
                        "max_tokens": 12, "return_token_ids": True}


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_qwen3(tmp_path_factory.mktemp("extras") / "model", seed=3)


@pytest.fixture(scope="module")
def loaded(folder: Path) -> LoadedModel:
    return load_model(str(folder))


@pytest.fixture(scope="module")
def client(folder: Path, loaded: LoadedModel) -> Iterator[TestClient]:
    with app_client(loaded, str(folder), kv_memory_mb=32) as c:
        yield c


def run(client: TestClient, route: str, **fields: Any) -> dict[str, Any]:
    """The first choice (chat) or item (batch) of a request with MSG as its one prompt."""
    body = {"messages": MSG} if route == CHAT else {"prompts": [MSG]}
    r = client.post(route, json={**body, **fields})
    assert r.status_code == 200, r.text
    data: dict[str, Any] = r.json()
    schema = "ChatCompletionResponse" if route == CHAT else "BatchCompletionResponse"
    assert contract().first_violation(schema, data) is None, data
    out: dict[str, Any] = data["choices" if route == CHAT else "completions"][0]
    return out


@ROUTES
def test_repetition_detection_ends_a_loop_with_its_stop_reason(
    client: TestClient, loaded: LoadedModel, route: str
) -> None:
    (a,) = loaded.tokenizer.encode("a")
    assert loaded.tokenizer.encode("aaaa") == [a] * 4  # no merge spells two of them at once
    plain = run(client, route, **LOOP)
    assert plain["token_ids"] == [a] * 12 and plain["finish_reason"] == "length"
    assert "stop_reason" not in plain
    rule = {"max_pattern_size": 2, "min_count": 4}
    cut = run(client, route, **LOOP, repetition_detection=rule)
    assert (cut["finish_reason"], cut["stop_reason"]) == ("stop", "repetition_detected")
    assert cut["token_ids"] == [a] * 4  # four copies of the one-token pattern


def test_chat_stream_ends_a_loop_with_its_stop_reason(client: TestClient) -> None:
    body = {"messages": MSG, **LOOP, "return_token_ids": False, "stream": True,
            "repetition_detection": {"max_pattern_size": 1, "min_count": 3}}
    with client.stream("POST", CHAT, json=body) as r:
        assert r.status_code == 200
        text = "".join(r.iter_text())
    events = [line[6:] for line in text.splitlines() if line.startswith("data: {")]
    chunks = [json.loads(e) for e in events]
    content = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    finishing = [c["choices"][0] for c in chunks if c["choices"]
                 and c["choices"][0].get("finish_reason")]
    assert content == "aaa"
    assert [(c["finish_reason"], c["stop_reason"]) for c in finishing] == [
        ("stop", "repetition_detected")]


@ROUTES
def test_logprob_token_ids_read_the_sampled_distribution(
    client: TestClient, loaded: LoadedModel, route: str
) -> None:
    """The named ids come back, in their order, as each position's alternatives; at the first
    position the greedy token is named, so its entry is the sampled token's own logprob (the
    same row of the same log-softmax: equal bits), which the natural top-1 also reads."""
    greedy = {"temperature": 0, "max_tokens": 4, "ignore_eos": True, "return_token_ids": True,
              "logprobs": True}
    # different cache salts: each request computes its whole prompt (the same arithmetic), none
    # reads the other's prefix-cache blocks
    natural = run(client, route, **greedy, top_logprobs=1, cache_salt=f"{route}-natural")
    ids = natural["token_ids"]
    named_ids = [ids[0], *(t for t in (77, 5, 300) if t != ids[0])]
    named = run(client, route, **greedy, logprob_token_ids=named_ids, cache_salt=f"{route}-named")
    assert named["token_ids"] == ids  # the same greedy run
    nat, got = natural["logprobs"]["content"], named["logprobs"]["content"]
    assert nat[0]["top_logprobs"][0]["logprob"] == nat[0]["logprob"]  # greedy: the top one
    assert got[0]["top_logprobs"][0]["logprob"] == got[0]["logprob"] == nat[0]["logprob"]
    for before, entry in zip(nat, got, strict=True):
        assert entry["logprob"] == before["logprob"]
        top = entry["top_logprobs"]
        assert [t["bytes"] for t in top] == [token_bytes(loaded.tokenizer, t) for t in named_ids]
        # greedy takes the most likely token: no named id is more likely
        assert all(t["logprob"] <= entry["logprob"] for t in top)


@pytest.mark.parametrize(("route", "body"), [
    ("/v1/chat/completions/render", {"messages": MSG, "structured_outputs": {"regex": "a+"}}),
    ("/v1/completions/render", {"prompt": "Once", "structured_outputs": {"regex": "a+"}}),
])
def test_render_shows_the_output_constraint(client: TestClient, route: str,
                                            body: dict[str, Any]) -> None:
    r = client.post(route, json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    shown = out if isinstance(out, dict) else out[0]
    grammar = shown["sampling_params"]["grammar"]
    assert grammar is not None and grammar["param"].startswith("structured_outputs")
    assert grammar["after"] == []
