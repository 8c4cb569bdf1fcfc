"""Rollout provenance through the chat handler (engine test double)."""

from __future__ import annotations

from starlette.testclient import TestClient

from kiln.api.app import build_app
from kiln.api.contract import contract
from kiln.config import ServerConfig
from kiln.provenance import semantic_problems
from tests.api.fake_backend import FakeBackend

CHAT = "/v1/chat/completions"
MSG = [{"role": "user", "content": "hi"}]


def test_record_is_contract_valid_and_meets_semantics(client: TestClient) -> None:
    body = client.post(CHAT, json={"messages": MSG, "rollout_provenance": True, "seed": 9}).json()
    assert contract().first_violation("ChatCompletionResponse", body) is None, body
    record = body["choices"][0]["rollout_provenance"]
    assert semantic_problems(record) == []
    n = record["prompt_token_count"]
    assert record["input_token_ids"][-1] == 2  # the terminal EOS is part of the rollout
    assert [a["sequence_index"] for a in record["action_tokens"]] == list(
        range(n, len(record["input_token_ids"]))
    )
    assert record["seed"] == 9
    assert record["sampling"]["max_tokens"] == 2048


def test_seed_is_drawn_and_recorded(client: TestClient, backend: FakeBackend) -> None:
    body = client.post(CHAT, json={"messages": MSG, "rollout_provenance": True}).json()
    seed = body["choices"][0]["rollout_provenance"]["seed"]
    assert backend.submitted[-1].sampling.seed == seed


def test_max_tokens_zero_is_400(client: TestClient) -> None:
    r = client.post(CHAT, json={"messages": MSG, "rollout_provenance": True, "max_tokens": 0})
    assert r.status_code == 400


def test_penalty_outside_record_range_is_400(client: TestClient) -> None:
    r = client.post(CHAT, json={"messages": MSG, "rollout_provenance": True,
                                "presence_penalty": 3.0})
    assert r.status_code == 400 and r.json()["error"]["param"] == "presence_penalty"


def test_501_without_identity() -> None:
    class Anonymous(FakeBackend):
        def policy_identity(self, version: str | None = None) -> None:
            return None

    with TestClient(build_app(ServerConfig(), Anonymous())) as c:
        r = c.post(CHAT, json={"messages": MSG, "rollout_provenance": True})
        assert r.status_code == 501
        assert r.json()["error"]["code"] == "rollout_provenance_unavailable"


def test_semantic_problems_detects_violations() -> None:
    good = {
        "input_token_ids": [1, 2, 3], "prompt_token_count": 2,
        "action_tokens": [{"sequence_index": 2, "token_id": 3, "source": "sampled",
                           "behavior_logprob": -0.1}],
        "sampling": {"stop": []},
    }
    assert semantic_problems(good) == []
    bad = {**good, "action_tokens": [{"sequence_index": 2, "token_id": 4, "source": "forced",
                                      "behavior_logprob": None}]}
    assert len(semantic_problems(bad)) == 3  # token mismatch, no sampled, forced outside close
