"""Thinking on the agent APIs, on a tiny random Qwen3 served with a Qwen3.5-style thinking
template: Anthropic's `thinking.budget_tokens` and OpenAI's `reasoning.effort` are Kiln's
thinking budget (a forced close after that many thinking tokens), so each answer equals chat's
with `thinking_budget_tokens` token for token; without a budget the same greedy turn thinks to
max_tokens. Greedy on random weights never closes its reasoning by itself here, which the
unbudgeted run shows."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from kiln.model.loader import load_model
from tests import HANG_S
from tests.e2e.app_client import app_client
from tests.e2e.named_sse import check, named_events
from tests.tiny_models import write_tiny_qwen3

TEMPLATE = Path(__file__).resolve().parents[1] / "fixtures" / "thinking_chat_template.jinja"
ASK = "Think."
BUDGET, MAX = 1024, 1100  # Anthropic's smallest budget, and room after it


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    folder = write_tiny_qwen3(tmp_path_factory.mktemp("think") / "tq3", seed=3)
    loaded = load_model(str(folder), chat_template_path=str(TEMPLATE))
    with app_client(loaded, str(folder), chat_template=str(TEMPLATE), kv_memory_mb=64) as c:
        yield c


def ok(r: Any, definition: str) -> dict[str, Any]:
    assert r.status_code == 200, r.text
    data: dict[str, Any] = r.json()
    check(definition, data)
    return data


def chat(c: TestClient, budget: int) -> dict[str, Any]:
    data = ok(c.post("/v1/chat/completions", json={
        "model": "tq3", "messages": [{"role": "user", "content": ASK}], "max_tokens": MAX,
        "temperature": 0, "thinking_budget_tokens": budget}), "ChatCompletionResponse")
    assert data["choices"][0]["thinking_budget"]["thinking_tokens"] == budget
    message: dict[str, Any] = data["choices"][0]["message"]
    return message


def message(c: TestClient, thinking: dict[str, Any], stream: bool = False) -> Any:
    body = {"model": "tq3", "max_tokens": MAX, "temperature": 0, "thinking": thinking,
            "messages": [{"role": "user", "content": ASK}], "stream": stream}
    if stream:
        with c.stream("POST", "/v1/messages", json=body) as r:
            assert r.status_code == 200
            return named_events(r.read().decode())
    return ok(c.post("/v1/messages", json=body), "MessagesResponse")


def test_budget_tokens_is_the_thinking_budget(tiny: TestClient) -> None:
    free = message(tiny, {"type": "adaptive"})
    assert free["stop_reason"] == "max_tokens"
    assert [b["type"] for b in free["content"]] == ["thinking"]  # never closed by itself
    budgeted = message(tiny, {"type": "enabled", "budget_tokens": BUDGET})
    want = chat(tiny, BUDGET)
    assert [b["type"] for b in budgeted["content"]] == ["thinking", "text"]
    assert budgeted["content"][0]["thinking"] == want["reasoning_content"]
    assert budgeted["content"][1]["text"] == want["content"]
    assert budgeted["content"][0]["thinking"] != free["content"][0]["thinking"]
    events = message(tiny, {"type": "enabled", "budget_tokens": BUDGET}, stream=True)
    for _, data in events:
        check("MessagesStreamEvent", data)
    thought = "".join(d["delta"]["thinking"] for n, d in events if n == "content_block_delta"
                      and d["delta"]["type"] == "thinking_delta")
    assert thought == want["reasoning_content"]
    assert [d["delta"]["type"] for n, d in events if n == "content_block_delta"
            ].count("signature_delta") == 1


def test_omitted_display_sends_an_empty_thinking_block(tiny: TestClient) -> None:
    data = message(tiny, {"type": "enabled", "budget_tokens": BUDGET, "display": "omitted"})
    assert data["content"][0] == {"type": "thinking", "thinking": "",
                                  "signature": data["content"][0]["signature"]}
    assert data["content"][0]["signature"].startswith("kiln-sha256:")


def test_reasoning_effort_is_the_thinking_budget(tiny: TestClient) -> None:
    want = chat(tiny, BUDGET)  # effort low: 1024 tokens
    body = {"model": "tq3", "input": ASK, "max_output_tokens": MAX, "temperature": 0,
            "reasoning": {"effort": "low"}, "include": ["reasoning.encrypted_content"]}
    data = ok(tiny.post("/v1/responses", json=body), "ResponsesObject")
    reasoning, answer = data["output"][0], data["output"][1]
    assert reasoning["type"] == "reasoning" and answer["type"] == "message"
    assert reasoning["content"][0]["text"] == want["reasoning_content"]
    assert answer["content"][0]["text"] == want["content"]
    backend = tiny.app.state.kiln.backend  # type: ignore[attr-defined]
    close = backend.tokenizer.encode("</think>", add_special_tokens=False)
    assert data["usage"]["output_tokens_details"]["reasoning_tokens"] == BUDGET + len(close)
    # a stateless client sends the reasoning back sealed: the next turn renders the same prompt
    again = dict(body, input=[{"role": "user", "content": ASK}, reasoning, answer,
                              {"role": "user", "content": "And eight?"}], store=False)
    stored = dict(body, input="And eight?", previous_response_id=data["id"], store=False)
    a = ok(tiny.post("/v1/responses", json=again), "ResponsesObject")
    b = ok(tiny.post("/v1/responses", json=stored), "ResponsesObject")
    assert a["usage"]["input_tokens"] == b["usage"]["input_tokens"]
    assert a["output"][0]["content"] == b["output"][0]["content"]


def test_effort_none_turns_thinking_off(tiny: TestClient) -> None:
    data = ok(tiny.post("/v1/responses", json={
        "model": "tq3", "input": ASK, "max_output_tokens": 16, "temperature": 0,
        "reasoning": {"effort": "none"}}), "ResponsesObject")
    assert [o["type"] for o in data["output"]] == ["message"]
    assert data["usage"]["output_tokens_details"]["reasoning_tokens"] == 0


def test_the_anthropic_sdk_sends_the_budget(tiny: TestClient) -> None:
    """The same budgeted turn through Anthropic's SDK (the SDK takes no temperature: extra_body)."""
    import anthropic

    transport: Any = tiny  # Starlette's TestClient is an httpx client
    sdk = anthropic.Anthropic(base_url="http://testserver", api_key="unused",
                              http_client=transport, max_retries=0, timeout=HANG_S)
    m = sdk.messages.create(model="tq3", max_tokens=MAX, messages=[{"role": "user",
                                                                     "content": ASK}],
                            thinking={"type": "enabled", "budget_tokens": BUDGET},
                            extra_body={"temperature": 0})
    want = chat(tiny, BUDGET)
    assert [b.type for b in m.content] == ["thinking", "text"]
    assert m.content[0].thinking == want["reasoning_content"]  # type: ignore[union-attr]
    assert m.content[1].text == want["content"]  # type: ignore[union-attr]
