"""vLLM's request fields honoured on chat by the real engine, on a tiny random Qwen3 served with
a thinking template: thinking_token_budget (Kiln's budget), truncate_prompt_tokens (the prompt
that runs), prompt_logprobs (the scoring route's values), return_tokens_as_token_ids and
request_id. (The mapping on the engine double: tests/api/test_chat_vllm_request_fields_fake.py.)"""

from __future__ import annotations

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
GREEDY: dict[str, Any] = {"messages": MSG, "temperature": 0, "max_tokens": 8, "ignore_eos": True,
                          "return_token_ids": True}


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    folder = write_tiny_qwen3(tmp_path_factory.mktemp("chatfields"), seed=3)
    loaded = load_model(str(folder), chat_template_path=str(TEMPLATE))
    with app_client(loaded, str(folder), chat_template=str(TEMPLATE), kv_memory_mb=64) as c:
        yield c


def post(client: TestClient, route: str = CHAT, **body: Any) -> dict[str, Any]:
    r = client.post(route, json=body)
    assert r.status_code == 200, r.text
    data: dict[str, Any] = r.json()
    if route == CHAT:
        assert contract().first_violation("ChatCompletionResponse", data) is None, data
    return data


@pytest.mark.parametrize("n_tokens", [0, 3])
def test_thinking_token_budget_closes_thinking_after_n(client: TestClient, n_tokens: int) -> None:
    free = post(client, **{**GREEDY, "max_tokens": 12})
    assert "thinking_budget" not in free["choices"][0]  # no budget: none applied
    data = post(client, **{**GREEDY, "max_tokens": 12}, thinking_token_budget=n_tokens)
    outcome = data["choices"][0]["thinking_budget"]
    assert (outcome["triggered"], outcome["closed"], outcome["thinking_tokens"]) == (
        True, True, n_tokens)
    assert data["kiln_metadata"]["thinking_budget"]["max_tokens"] == n_tokens


def test_truncate_prompt_tokens_runs_the_end_of_the_prompt(client: TestClient) -> None:
    whole = post(client, **GREEDY)
    ids = whole["prompt_token_ids"]
    cut = post(client, **GREEDY, truncate_prompt_tokens=6)
    assert cut["usage"]["prompt_tokens"] == 6 and cut["prompt_token_ids"] == ids[-6:]
    # the same tokens sent as a completions prompt generate the same greedy tokens
    same = post(client, "/v1/completions", prompt=ids[-6:], temperature=0, max_tokens=8,
                ignore_eos=True, return_token_ids=True)
    assert cut["choices"][0]["token_ids"] == same["choices"][0]["token_ids"]
    right = post(client, **GREEDY, truncate_prompt_tokens=6, truncation_side="right")
    assert right["prompt_token_ids"] == ids[:6]


def test_prompt_logprobs_are_the_scoring_routes(client: TestClient) -> None:
    data = post(client, **GREEDY, prompt_logprobs=3)
    ids = data["prompt_token_ids"]
    scored = post(client, "/v1/completions", prompt=ids, prompt_logprobs=3, max_tokens=0)
    # the same scoring pass over the same ids: equal values, bit for bit
    assert data["prompt_logprobs"] == scored["choices"][0]["prompt_logprobs"]
    assert len(data["prompt_logprobs"]) == len(ids) and data["prompt_logprobs"][0] is None


def test_return_tokens_as_token_ids_and_request_id(client: TestClient) -> None:
    data = post(client, **GREEDY, logprobs=True, top_logprobs=2, return_tokens_as_token_ids=True,
                request_id="grpo-1")
    assert data["id"] == "chatcmpl-grpo-1"
    choice = data["choices"][0]
    content = choice["logprobs"]["content"]
    assert [e["token"] for e in content] == [f"token_id:{t}" for t in choice["token_ids"]]
    # greedy: the top alternative is the chosen token, written the same way
    assert all(e["top_logprobs"][0]["token"] == e["token"] for e in content)


def test_batch_items_take_the_same_fields(client: TestClient) -> None:
    """Batch runs them per item as chat does: an item equals the chat request sent alone."""
    fields: dict[str, Any] = {"temperature": 0, "max_tokens": 8, "ignore_eos": True,
                              "return_token_ids": True, "truncate_prompt_tokens": 6,
                              "prompt_logprobs": 2, "logprobs": True,
                              "return_tokens_as_token_ids": True, "thinking_token_budget": 2}
    r = client.post("/v1/completions/batch",
                    json={"prompts": [MSG], "request_id": "b-1", **fields})
    assert r.status_code == 200, r.text
    data = r.json()
    assert contract().first_violation("BatchCompletionResponse", data) is None, data
    assert data["id"] == "batchcmpl-b-1"
    (item,) = data["completions"]
    alone = post(client, messages=MSG, **fields)
    assert item["prompt_token_ids"] == alone["prompt_token_ids"] and len(item[
        "prompt_token_ids"]) == 6
    assert item["token_ids"] == alone["choices"][0]["token_ids"]
    assert item["prompt_logprobs"] == alone["prompt_logprobs"]
    assert item["logprobs"] == alone["choices"][0]["logprobs"]
    assert item["thinking_budget"]["thinking_tokens"] == 2
