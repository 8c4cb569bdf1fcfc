"""Rollout provenance on real (tiny, random-weight) models through HTTP: contract validity, the
semantic constraints, behaviour logprobs reproduced by scoring, and hash stability."""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from kiln.api.contract import contract
from kiln.model.loader import load_model
from kiln.provenance import semantic_problems
from tests.e2e.app_client import app_client
from tests.numerics import sampled_logprob_atol
from tests.tiny_models import write_tiny_qwen3

CHAT = "/v1/chat/completions"
MSG = [{"role": "user", "content": "Say something."}]
UNFILTERED = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0,
              "presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0}
TEMPLATE = Path(__file__).resolve().parents[1] / "fixtures" / "thinking_chat_template.jinja"


def client_for(folder: Path, template: Path | None = None
               ) -> contextlib.AbstractContextManager[TestClient]:
    loaded = load_model(str(folder), chat_template_path=None if template is None else str(template))
    return app_client(loaded, str(folder), kv_memory_mb=32)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_qwen3(tmp_path_factory.mktemp("rollout") / "m", seed=11)


def rollout(client: TestClient, **extra: Any) -> dict[str, Any]:
    body = {"messages": MSG, "rollout_provenance": True, "max_tokens": 12, "seed": 5,
            "include_config_hashes": True, **extra}
    r = client.post(CHAT, json=body)
    assert r.status_code == 200, r.text
    data: dict[str, Any] = r.json()
    assert contract().first_violation("ChatCompletionResponse", data) is None, data
    record = data["choices"][0]["rollout_provenance"]
    assert semantic_problems(record) == []
    return data


def test_scoring_reproduces_behavior_logprobs(model_dir: Path) -> None:
    with client_for(model_dir) as c:
        record = rollout(c, **UNFILTERED)["choices"][0]["rollout_provenance"]
        ids = record["input_token_ids"]
        r = c.post("/v1/completions", json={"prompt": ids, "prompt_logprobs": 0})
        assert r.status_code == 200, r.text
        scored = r.json()["choices"][0]["prompt_logprobs"]
        # the same model scores the prompt in chunks and decoded it a row at a time: another
        # summation order; the sampler's exp and log are its own (a few ulps, inside the bound)
        model = load_model(str(model_dir))
        bound = sampled_logprob_atol(model.model, model.config, len(ids), 1.0)
        for action in record["action_tokens"]:
            assert action["source"] == "sampled"
            pos = action["sequence_index"]
            observed = scored[pos][str(action["token_id"])]["logprob"]
            assert abs(observed - action["behavior_logprob"]) <= bound, (pos, observed, action)


def test_greedy_behavior_logprob_is_zero(model_dir: Path) -> None:
    with client_for(model_dir) as c:
        record = rollout(c, temperature=0)["choices"][0]["rollout_provenance"]
        assert all(a["behavior_logprob"] == 0.0 for a in record["action_tokens"])


def test_forced_close_tokens_in_record(model_dir: Path) -> None:
    with client_for(model_dir, TEMPLATE) as c:
        data = rollout(c, thinking_budget_tokens=2, ignore_eos=False, max_tokens=16)
        record = data["choices"][0]["rollout_provenance"]
        close = record["sampling"]["thinking_budget"]["close_token_ids"]
        forced = [a for a in record["action_tokens"] if a["source"] == "forced"]
        assert [a["token_id"] for a in forced] == close
        assert all(a["behavior_logprob"] is None for a in forced)


def test_hashes_stable_across_restarts_and_sensitive(model_dir: Path, tmp_path: Path) -> None:
    def identity(folder: Path, template: Path | None = None, **extra: Any) -> dict[str, Any]:
        with client_for(folder, template) as c:
            data = rollout(c, **extra)
        rec = data["choices"][0]["rollout_provenance"]
        return {"policy": rec["behavior_policy"], "tokenizer": rec["tokenizer"],
                "effective": data["kiln_metadata"]["config_hashes"]["effective_config_hash"]}

    first = identity(model_dir)
    assert identity(model_dir) == first  # a restart changes nothing
    other = write_tiny_qwen3(tmp_path / "other", seed=12)
    assert identity(other)["policy"]["base_model_sha256"] != first["policy"]["base_model_sha256"]
    copy = tmp_path / "copy"
    shutil.copytree(model_dir, copy)
    assert identity(copy)["policy"]["base_model_sha256"] == first["policy"]["base_model_sha256"]
    templated = identity(model_dir, TEMPLATE)
    assert templated["tokenizer"]["chat_template_sha256"] != first["tokenizer"]["chat_template_sha256"]
    sampled = identity(model_dir, temperature=0.3)
    assert sampled["effective"] != first["effective"]
    assert sampled["policy"] == first["policy"]
