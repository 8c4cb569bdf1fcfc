"""Token-in/token-out on the default model: `prompt_token_ids` on chat and batch, and vLLM's
/inference/v1/generate, give the tokens and logprobs of the same prompt sent as messages, token
for token, greedy and seeded, streamed or not, with the weights' span."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from starlette.testclient import TestClient

from kiln.model.loader import load_model
from tests.e2e.app_client import app_client

MESSAGES = [{"role": "user", "content": "Write one sentence about the sea."}]
GREEDY: dict[str, Any] = {"temperature": 0, "max_tokens": 16, "ignore_eos": True}
SEEDED: dict[str, Any] = {"temperature": 1.0, "seed": 11, "top_p": 1.0, "max_tokens": 16,
                          "ignore_eos": True}


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with app_client(load_model(None), None, kv_memory_mb=32, enable_weight_updates=True) as c:
        yield c


def chat(c: TestClient, sampling: dict[str, Any], **extra: Any) -> dict[str, Any]:
    r = c.post("/v1/chat/completions", json={
        "messages": MESSAGES, "return_token_ids": True, "logprobs": True, "top_logprobs": 2,
        **sampling, **extra})
    assert r.status_code == 200, r.text
    return r.json()


def logprobs(content: list[dict[str, Any]]) -> list[tuple[float, list[float]]]:
    return [(e["logprob"], [t["logprob"] for t in e["top_logprobs"]]) for e in content]


@pytest.mark.parametrize("sampling", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_chat_prompt_token_ids_equal_the_messages(client: TestClient,
                                                  sampling: dict[str, Any]) -> None:
    text = chat(client, sampling)
    ids = text["prompt_token_ids"]
    got = chat(client, sampling, prompt_token_ids=ids)
    assert got["prompt_token_ids"] == ids
    assert got["choices"][0]["token_ids"] == text["choices"][0]["token_ids"]
    assert got["choices"][0]["message"] == text["choices"][0]["message"]
    assert logprobs(got["choices"][0]["logprobs"]["content"]) == \
        logprobs(text["choices"][0]["logprobs"]["content"])


@pytest.mark.parametrize("sampling", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_generate_equals_chat(client: TestClient, sampling: dict[str, Any]) -> None:
    text = chat(client, sampling)
    r = client.post("/inference/v1/generate", json={
        "token_ids": text["prompt_token_ids"], "sampling_params": {**sampling, "logprobs": 2}})
    assert r.status_code == 200, r.text
    body = r.json()
    choice = body["choices"][0]
    assert choice["token_ids"] == text["choices"][0]["token_ids"]
    assert logprobs(choice["logprobs"]["content"]) == \
        logprobs(text["choices"][0]["logprobs"]["content"])
    assert choice["finish_reason"] == "length"
    assert choice["weight_versions"] == [{"version": "default", "start": 0, "end": 16}]
    assert body["weight_version"] == "default" and body["usage"]["completion_tokens"] == 16


def test_generate_streams_the_same_tokens(client: TestClient) -> None:
    text = chat(client, GREEDY)
    events: list[dict[str, Any]] = []
    with client.stream("POST", "/inference/v1/generate", json={
            "token_ids": text["prompt_token_ids"], "sampling_params": GREEDY,
            "stream": True}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line[6:]))
    ids = [t for e in events for c in e["choices"] for t in c["token_ids"]]
    assert ids == text["choices"][0]["token_ids"]
    last = events[-1]["choices"][0]
    assert last["finish_reason"] == "length" and last["weight_versions"] == [
        {"version": "default", "start": 0, "end": 16}]
    assert all(e["choices"][0]["finish_reason"] is None for e in events[:-1])


def test_batch_prompt_token_ids(client: TestClient) -> None:
    text = chat(client, GREEDY)
    other = [{"role": "user", "content": "Name a bird."}]
    r = client.post("/v1/completions/batch", json={
        "prompts": [MESSAGES, other], "return_token_ids": True, **GREEDY,
        "prompt_token_ids": [text["prompt_token_ids"], text["prompt_token_ids"][:-3]]})
    assert r.status_code == 200, r.text
    items = r.json()["completions"]
    assert items[0]["token_ids"] == text["choices"][0]["token_ids"]
    assert items[0]["prompt_token_ids"] == text["prompt_token_ids"]
    assert items[1]["prompt_token_ids"] == text["prompt_token_ids"][:-3]
    assert all(item["weight_version"] == "default" for item in items)


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/chat/completions", {"messages": MESSAGES, "prompt_token_ids": [1, 2], "echo": True},
     "echo"),
    ("/v1/chat/completions", {"messages": MESSAGES, "prompt_token_ids": [10**6]},
     "prompt_token_ids"),
    ("/v1/chat/completions", {"messages": MESSAGES, "prompt_token_ids": [1, 2],
                              "chat_template_kwargs": {"x": 1}}, "chat_template_kwargs"),
    ("/v1/completions/batch", {"prompts": [MESSAGES], "prompt_token_ids": [[1], [2]]},
     "prompt_token_ids"),
    ("/inference/v1/generate", {"token_ids": [1, 2], "sampling_params": {"output_kind": 1}},
     None),
    ("/inference/v1/generate", {"token_ids": [1, 2], "sampling_params": {"temperature": -1}},
     None),
    ("/inference/v1/generate", {"token_ids": [1, 2], "sampling_params": {},
                                "kv_transfer_params": {"a": 1}}, None),
])
def test_refused(client: TestClient, path: str, body: dict[str, Any], param: str | None) -> None:
    r = client.post(path, json=body)
    assert r.status_code == 400, r.text
    if param is not None:
        assert r.json()["error"]["param"] == param


def test_generate_is_off_without_the_flag() -> None:
    with app_client(load_model(None), None, kv_memory_mb=16) as c:
        r = c.post("/inference/v1/generate", json={"token_ids": [1], "sampling_params": {}})
        assert r.status_code == 404
