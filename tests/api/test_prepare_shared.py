"""Chat and batch share one preparation (kiln/api/requests/prepare.py): the same conversation and
fields reach the engine as the same prompt ids and the same per-choice SamplingParams, and both
routes check the prompt against the context window."""

from __future__ import annotations

from typing import Any

from starlette.testclient import TestClient

from tests.api.fake_backend import FakeBackend

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
FIELDS: dict[str, Any] = {
    "n": 2, "seed": 7, "temperature": 0.7, "top_p": 0.9, "max_tokens": 5, "stop": ["x", "yz"],
    "logprobs": True, "top_logprobs": 2,
}


def test_chat_and_batch_send_the_engine_the_same_work(
    client: TestClient, backend: FakeBackend
) -> None:
    chat = client.post("/v1/chat/completions", json={"messages": MESSAGES, **FIELDS})
    assert chat.status_code == 200, chat.text
    from_chat = list(backend.submitted)
    backend.submitted.clear()
    batch = client.post("/v1/completions/batch", json={"prompts": [MESSAGES], **FIELDS})
    assert batch.status_code == 200, batch.text
    from_batch = list(backend.submitted)
    assert len(from_chat) == len(from_batch) == 2
    for c, b in zip(from_chat, from_batch, strict=True):
        assert c.prompt_token_ids == b.prompt_token_ids
        assert c.sampling == b.sampling  # seeds too: choice c of prompt 0 is seed + c on both


def test_both_routes_refuse_a_prompt_that_fills_the_context(
    client: TestClient, backend: FakeBackend
) -> None:
    # one token per byte (the fake tokenizer): rendered, this prompt is over max_model_len
    long = [{"role": "user", "content": "a" * backend.max_model_len}]
    chat = client.post("/v1/chat/completions", json={"messages": long})
    batch = client.post("/v1/completions/batch", json={"prompts": [long]})
    assert chat.status_code == batch.status_code == 400
    assert chat.json()["error"]["code"] == batch.json()["error"]["code"] == \
        "context_length_exceeded"
    assert chat.json()["error"]["param"] == "messages"
    assert batch.json()["error"]["param"] == "prompts[0]"
    assert backend.submitted == []
