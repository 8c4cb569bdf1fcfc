"""Thinking budgets end to end through HTTP: a tiny random Qwen3 checkpoint and the default model,
both served with a Qwen3.5-style thinking template (`--chat-template`)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from kiln.api.contract import contract
from kiln.model.loader import load_model
from tests.e2e.app_client import app_client
from tests.tiny_models import write_tiny_qwen3

TEMPLATE = Path(__file__).resolve().parents[1] / "fixtures" / "thinking_chat_template.jinja"
CHAT = "/v1/chat/completions"
MSG = [{"role": "user", "content": "Think about the number seven."}]


def serve(model: str | None, tmp: Path) -> contextlib.AbstractContextManager[TestClient]:
    loaded = load_model(model, chat_template_path=str(TEMPLATE))
    return app_client(loaded, model, chat_template=str(TEMPLATE), kv_memory_mb=64)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    folder = write_tiny_qwen3(tmp_path_factory.mktemp("qwen3"), seed=3)
    with serve(str(folder), folder) as client:
        yield client


def close_ids(client: TestClient) -> list[int]:
    backend = client.app.state.kiln.backend  # type: ignore[attr-defined]
    ids: list[int] = backend.tokenizer.encode("</think>")
    return ids


def post(client: TestClient, body: dict[str, Any]) -> dict[str, Any]:
    r = client.post(CHAT, json=body)
    assert r.status_code == 200, r.text
    data: dict[str, Any] = r.json()
    assert contract().first_violation("ChatCompletionResponse", data) is None, data
    return data


@pytest.mark.parametrize("n_tokens", [0, 3, 7])
def test_token_budget_forces_close_after_n(tiny: TestClient, n_tokens: int) -> None:
    body = {"messages": MSG, "temperature": 0, "max_tokens": 24, "ignore_eos": True,
            "thinking_budget_tokens": n_tokens}
    data = post(tiny, body)
    outcome = data["choices"][0]["thinking_budget"]
    assert outcome == {"triggered": True, "trigger": "tokens", "closed": True,
                       "thinking_tokens": n_tokens, "thinking_time_ms": outcome["thinking_time_ms"]}
    record = data["kiln_metadata"]["thinking_budget"]
    assert record["applied"] is True and record["configured"] is True
    assert record["max_tokens"] == n_tokens and record["tokens_source"] == "request"
    assert data["kiln_metadata"]["thinking_enabled"] is True


def test_budget_token_ids_in_stream_order(tiny: TestClient) -> None:
    """The forced close sequence follows exactly N thinking tokens in the engine output."""
    backend = tiny.app.state.kiln.backend  # type: ignore[attr-defined]
    import asyncio

    from kiln.engine.request import Request, SamplingParams, ThinkingBudgetSpec

    close = tuple(close_ids(tiny))
    spec = ThinkingBudgetSpec(close, 5, None)
    prompt = backend.tokenizer.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n")

    async def run() -> tuple[list[int], list[bool]]:
        ids: list[int] = []
        forced: list[bool] = []
        stream = backend.submit(Request("budget-probe", prompt, SamplingParams(
            temperature=0.0, max_tokens=20, ignore_eos=True, thinking=spec)))
        async for out in stream:
            ids += out.new_token_ids
            forced += out.new_forced
            if out.finished:
                break
        return ids, forced

    ids, forced = asyncio.run(run())
    assert ids[5 : 5 + len(close)] == list(close)
    assert forced[:5] == [False] * 5 and all(forced[5 : 5 + len(close)])


def test_time_budget_reports_time(tiny: TestClient) -> None:
    body = {"messages": MSG, "temperature": 0, "max_tokens": 40, "ignore_eos": True,
            "thinking_budget_ms": 0}
    outcome = post(tiny, body)["choices"][0]["thinking_budget"]
    assert outcome["triggered"] is True and outcome["trigger"] == "time"


def test_stop_overlapping_close_is_400(tiny: TestClient) -> None:
    r = tiny.post(CHAT, json={"messages": MSG, "stop": ["nk>"], "thinking_budget_tokens": 4})
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "chat_invalid_request"
    assert r.json()["error"]["param"] == "stop"  # it had named max_tokens


def test_budget_inert_without_thinking(tiny: TestClient) -> None:
    body = {"messages": MSG, "temperature": 0, "max_tokens": 8, "thinking_budget_tokens": 2,
            "chat_template_kwargs": {"enable_thinking": False}}
    data = post(tiny, body)
    assert "thinking_budget" not in data["choices"][0]
    record = data["kiln_metadata"]["thinking_budget"]
    assert record["configured"] is True and record["applied"] is False
    assert data["kiln_metadata"]["thinking_source"] == "request"


def test_streamed_record_on_finish_chunk(tiny: TestClient) -> None:
    import json

    body = {"messages": MSG, "temperature": 0, "max_tokens": 16, "ignore_eos": True,
            "thinking_budget_tokens": 2, "stream": True}
    r = tiny.post(CHAT, json=body)
    events = [json.loads(line[6:]) for line in r.text.splitlines()
              if line.startswith("data: ") and line != "data: [DONE]"]
    finish = [e for e in events if e["choices"] and e["choices"][0].get("finish_reason")]
    record = finish[0]["kiln_metadata"]["thinking_budget"]
    assert record["applied"] is True and record["trigger"] == "tokens" and record["closed"] is True
    for e in events:
        assert contract().first_violation("ChatCompletionChunk", e) is None


@pytest.mark.slow
def test_default_model_with_thinking_template(tmp_path: Path) -> None:
    with serve(None, tmp_path) as client:
        body = {"messages": MSG, "temperature": 0, "max_tokens": 20, "ignore_eos": True,
                "thinking_budget_tokens": 4}
        data = post(client, body)
        outcome = data["choices"][0]["thinking_budget"]
        assert outcome["trigger"] == "tokens" and outcome["thinking_tokens"] == 4
        n_close = len(close_ids(client))
        assert n_close > 1  # SmolLM2 spells "</think>" with several tokens
        r = client.post(CHAT, json={**body, "max_tokens": n_close - 1})
        assert r.status_code == 400 and r.json()["error"]["code"] == "chat_invalid_request"
        assert outcome["closed"] is True
        msg = data["choices"][0]["message"]
        assert "reasoning_content" in msg  # the forced </think> split reasoning from content
        # budgeted and unbudgeted together behave as alone
        plain = {"messages": MSG, "temperature": 0, "max_tokens": 10}
        alone = post(client, plain)["choices"][0]["message"]
        import concurrent.futures as cf

        with cf.ThreadPoolExecutor(2) as pool:
            a = pool.submit(post, client, plain)
            b = pool.submit(post, client, body)
            assert a.result()["choices"][0]["message"] == alone
            assert b.result()["choices"][0]["thinking_budget"]["thinking_tokens"] == 4
