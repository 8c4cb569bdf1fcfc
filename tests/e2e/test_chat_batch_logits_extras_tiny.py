"""logit_bias, allowed_token_ids, min_tokens and stop_token_ids honoured on chat and batch by the
real engine, on a tiny random Qwen3 (the mapping: tests/api/test_chat_batch_logits_extras_fake.py).
Each test first shows what the same request does without the field, so that it can fail."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from kiln.api.contract import contract
from kiln.model import LoadedModel
from kiln.model.loader import load_model
from tests.e2e.app_client import app_client
from tests.tiny_models import write_tiny_qwen3

MSG = [{"role": "user", "content": "Tell me about the fox."}]
CHAT, BATCH = "/v1/chat/completions", "/v1/completions/batch"
ROUTES = pytest.mark.parametrize("route", [CHAT, BATCH])
GREEDY: dict[str, Any] = {"temperature": 0, "max_tokens": 6, "ignore_eos": True,
                          "return_token_ids": True}


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_qwen3(tmp_path_factory.mktemp("logits") / "model", seed=5)


@pytest.fixture(scope="module")
def loaded(folder: Path) -> LoadedModel:
    return load_model(str(folder))


@pytest.fixture(scope="module")
def client(folder: Path, loaded: LoadedModel) -> Iterator[TestClient]:
    with app_client(loaded, str(folder), kv_memory_mb=32) as c:
        yield c


def run(client: TestClient, route: str, **fields: Any) -> list[dict[str, Any]]:
    """Every choice (chat, n) or item (batch: the prompt twice) of a request."""
    body = {"messages": MSG} if route == CHAT else {"prompts": [MSG, MSG]}
    r = client.post(route, json={**body, **fields})
    assert r.status_code == 200, r.text
    data: dict[str, Any] = r.json()
    schema = "ChatCompletionResponse" if route == CHAT else "BatchCompletionResponse"
    assert contract().first_violation(schema, data) is None, data
    out: list[dict[str, Any]] = data["choices" if route == CHAT else "completions"]
    return out


@ROUTES
def test_allowed_token_ids_restrict_what_is_sampled(client: TestClient, route: str) -> None:
    sampled = {"temperature": 1.0, "seed": 11, "max_tokens": 8, "ignore_eos": True,
               "return_token_ids": True, "n": 2 if route == CHAT else 1}
    plain = {t for c in run(client, route, **sampled) for t in c["token_ids"]}
    allowed = [5, 77, 300]
    assert not plain <= set(allowed)  # the random weights prefer others
    for c in run(client, route, **sampled, allowed_token_ids=allowed):
        assert len(c["token_ids"]) == 8 and set(c["token_ids"]) <= set(allowed), c


@ROUTES
def test_logit_bias_moves_the_greedy_choice(client: TestClient, route: str) -> None:
    (plain, *_) = run(client, route, **GREEDY)
    pushed = next(t for t in (77, 78) if t != plain["token_ids"][0])
    for c in run(client, route, **GREEDY, logit_bias={str(pushed): 100}):
        assert c["token_ids"] == [pushed] * 6  # +100 outweighs a random model's logits


@ROUTES
def test_stop_token_ids_stop_and_min_tokens_delays_them(client: TestClient, route: str) -> None:
    (plain, *_) = run(client, route, **GREEDY)
    ids = plain["token_ids"]
    k = next(i for i in range(1, len(ids)) if ids[i] not in ids[:i])  # first new token after 0
    for c in run(client, route, **GREEDY, stop_token_ids=[ids[k]]):
        assert c["token_ids"][:k] == ids[:k] and len(c["token_ids"]) in (k, k + 1), c
        assert (c["finish_reason"], c["stop_reason"]) == ("stop", ids[k])
    first = ids[0]
    stopped = run(client, route, **GREEDY, stop_token_ids=[first])[0]
    assert stopped["finish_reason"] == "stop" and len(stopped["token_ids"]) <= 1
    for c in run(client, route, **GREEDY, stop_token_ids=[first], min_tokens=3):
        assert first not in c["token_ids"][:3], c  # banned until 3 tokens are out
        assert len(c["token_ids"]) >= 3, c
