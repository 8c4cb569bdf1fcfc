"""Speculative decoding changes nothing but the speed: on the default model (and a tiny
checkpoint), a server with n-gram or draft-model speculation answers every request with the
token ids,
logprobs and rollout provenance of a server without it, bit for bit — greedy, seeded, n = 2
with a penalty, a stop token, a stop string, a JSON schema, logprobs — while its counters show
that drafts were verified and accepted (the equality is not vacuous)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from kiln.api.app import build_app
from kiln.config import ServerConfig
from kiln.serving import EngineBackend
from tests.tiny_models import random_tensors, tiny_config, write_tiny_gguf

SPEC = json.dumps({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4,
                   "prompt_lookup_min": 2})

def draft_spec(model: str | Path) -> str:
    return json.dumps({"method": "draft_model", "model": str(model), "num_speculative_tokens": 4})


TEXT = ("def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\n"
        "def mul(a, b):\n    return a * b\n")
MESSAGES = [{"role": "user", "content": f"Repeat this code exactly:\n{TEXT}"}]
BODIES: list[dict[str, Any]] = [
    {"temperature": 0},
    {"temperature": 1.0, "seed": 3},
    {"temperature": 0.7, "seed": 5, "n": 2, "presence_penalty": 0.4, "top_p": 0.9},
    {"temperature": 0, "stop_token_ids": [28]},
    {"temperature": 0, "stop": ["return a * b"]},
    {"temperature": 0, "logprobs": True, "top_logprobs": 2},
    {"temperature": 0, "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object", "properties": {"a": {"type": "integer"}},
                                "required": ["a"]}}}},
    {"temperature": 0, "max_tokens": 7},
]


def serve(model: str | None, spec: str | None) -> TestClient:
    cfg = ServerConfig(model=model, kv_memory_mb=64, speculative_config=spec)
    return TestClient(build_app(cfg, EngineBackend.from_config(cfg)))


def answers(c: TestClient, messages: list[dict[str, Any]]) -> list[Any]:
    out = []
    for body in BODIES:
        r = c.post("/v1/chat/completions", json={
            "messages": messages, "max_tokens": 96, "return_token_ids": True, **body})
        assert r.status_code == 200, r.text
        out.append([(ch["token_ids"], ch["message"], ch.get("logprobs"), ch["finish_reason"])
                    for ch in r.json()["choices"]])
    r = c.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 64,
                                             "temperature": 0.8, "seed": 9,
                                             "rollout_provenance": True})
    assert r.status_code == 200, r.text
    out.append(r.json()["choices"][0]["rollout_provenance"])
    return out


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cfg = tiny_config("qwen3")
    return write_tiny_gguf(tmp_path_factory.mktemp("spec") / "tiny.gguf", cfg,
                           random_tensors(cfg, 0), q8=True)


@pytest.fixture(scope="module")
def plain_answers() -> list[Any]:
    with serve(None, None) as c:
        return answers(c, MESSAGES)


@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_default_model_answers_are_unchanged(method: str, plain_answers: list[Any]) -> None:
    """draft_model: the default model drafts for itself (the same tokenizer; a smaller sibling
    in real use), so its greedy drafts are accepted where the target is greedy too."""
    from kiln.model.checkpoint.locate import default_model_path

    want = plain_answers
    spec = SPEC if method == "ngram" else draft_spec(default_model_path())
    with serve(None, spec) as c:
        got = answers(c, MESSAGES)
        stats = c.app.state.kiln.backend.stats()  # type: ignore[attr-defined]
        plan = c.get("/health").json()["compute_plan"]
        metrics = c.get("/metrics").text
    assert got == want
    assert stats["spec_decode_num_accepted_tokens"] > 0, stats
    assert stats["spec_decode_num_draft_tokens"] >= stats["spec_decode_num_accepted_tokens"]
    assert plan["speculative"].startswith(method)
    assert "vllm:spec_decode_num_accepted_tokens_total" in metrics


def test_tiny_checkpoint_answers_are_unchanged(tiny: Path,
                                               tmp_path_factory: pytest.TempPathFactory) -> None:
    """n-gram drafts, and a draft model of other (random) weights and the same tokenizer,
    whose drafts the target mostly rejects."""
    cfg = tiny_config("qwen3")
    other = write_tiny_gguf(tmp_path_factory.mktemp("draft") / "other.gguf", cfg,
                            random_tensors(cfg, 1), q8=True)
    messages = [{"role": "user", "content": "Hello, world! Hello, world! Hello, world!"}]
    with serve(str(tiny), None) as c:
        want = answers(c, messages)
    for spec in (SPEC, draft_spec(other)):
        with serve(str(tiny), spec) as c:
            assert answers(c, messages) == want, spec
            stats = c.app.state.kiln.backend.stats()  # type: ignore[attr-defined]
            assert stats["spec_decode_num_draft_tokens"] > 0, (spec, stats)


def test_a_bad_speculative_config_fails_at_start(tiny: Path) -> None:
    from kiln.config import ConfigError

    with pytest.raises(ConfigError, match="not built"):
        ServerConfig(speculative_config='{"method": "mtp"}')
    cfg = ServerConfig(kv_memory_mb=64, speculative_config=draft_spec("/no/such/draft.gguf"))
    with pytest.raises(ValueError, match=r"--speculative-config model .* cannot be loaded"):
        EngineBackend.from_config(cfg)
    cfg = ServerConfig(kv_memory_mb=64, speculative_config=draft_spec(tiny))
    with pytest.raises(ValueError, match="another tokenizer"):  # the default model's target
        EngineBackend.from_config(cfg)


def test_logprobs_requests_are_verified_with_torch_s_logit_rows() -> None:
    """logprobs requests' logit rows go through torch (the C step computes them, drafts
    included): the answer and its logprobs equal plain decoding's, and drafts were kept."""
    body = {"messages": MESSAGES, "max_tokens": 96, "temperature": 0.9, "seed": 4,
            "logprobs": True, "top_logprobs": 3, "return_token_ids": True}
    with serve(None, None) as c:
        want = c.post("/v1/chat/completions", json=body).json()["choices"]
    with serve(None, SPEC) as c:
        backend = c.app.state.kiln.backend  # type: ignore[attr-defined]
        c.post("/v1/chat/completions", json={**body, "max_tokens": 1})  # torch's logit rows
        assert backend.engine.executor.last_path == "torch"
        before = backend.stats()["spec_decode_num_accepted_tokens"]
        got = c.post("/v1/chat/completions", json=body).json()["choices"]
        after = backend.stats()["spec_decode_num_accepted_tokens"]
    assert got == want
    assert after > before
