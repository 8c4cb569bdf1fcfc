"""POST /v1/completions prompt scoring on the default model vs transformers on the same weights.

transformers 5 cannot load the GGUF here (its GGUF path requires `accelerate`, which is not a
project dependency), so the reference is ``LlamaForCausalLM(LlamaConfig(...))`` holding our loaded
model's state dict (the names match HF's). It checks the engine's chunked, paged scoring path and
the HTTP formatting against an independent forward; the GGUF dequantization itself is covered by
the loader tests.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
from starlette.testclient import TestClient

from kiln.api.contract import contract
from kiln.model import LoadedModel
from kiln.model.float32_copies import float32_state_dict
from tests.e2e.app_client import app_client
from tests.numerics import chain_rtol, check_rank, forward_rtol
from tests.tiny_models import default_model

pytestmark = pytest.mark.slow

TEXT = ("The old lighthouse keeper climbed the spiral stairs every evening, lit the great lamp, "
        "and watched the ships pass safely through the narrow, rocky channel below his tower.")


@pytest.fixture(scope="module")
def loaded() -> LoadedModel:
    return default_model()


@pytest.fixture(scope="module")
def client(loaded: LoadedModel) -> Iterator[TestClient]:
    with app_client(loaded, None, kv_memory_mb=64) as c:
        yield c


@pytest.fixture(scope="module")
def hf_logits(loaded: LoadedModel) -> torch.Tensor:
    """transformers' raw logits [S, vocab] for TEXT's tokens, on our model's weights."""
    from transformers import LlamaConfig, LlamaForCausalLM

    hf_cfg = {k: v for k, v in loaded.config.to_hf().items()
              if k not in ("architectures", "model_type")}
    ref = LlamaForCausalLM(LlamaConfig(**hf_cfg))  # float32 parameters (torch's default)
    ref.eval()
    missing, unexpected = ref.load_state_dict(float32_state_dict(loaded.model), strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}
    assert ref.lm_head.weight.data_ptr() == ref.model.embed_tokens.weight.data_ptr()  # tied
    ids = loaded.tokenizer.encode(TEXT, add_special_tokens=True)
    assert ref.model.norm.weight.dtype == torch.float32
    with torch.no_grad():
        out: torch.Tensor = ref(torch.tensor([ids])).logits[0].float()
    return out


def post(client: TestClient, **body: Any) -> Any:
    return client.post("/v1/completions", json=body)


def scored(client: TestClient, k: int, prompt: Any = TEXT) -> list[dict[str, Any]]:
    r = post(client, prompt=prompt, prompt_logprobs=k, max_tokens=1)
    assert r.status_code == 200, r.text
    body = r.json()
    assert contract().first_violation("TextCompletionResponse", body) is None
    lps: list[Any] = body["choices"][0]["prompt_logprobs"]
    assert lps[0] is None and body["usage"]["prompt_tokens"] == len(lps)
    return lps[1:]


def test_top5_matches_transformers(client: TestClient, loaded: LoadedModel,
                                   hf_logits: torch.Tensor) -> None:
    ids = loaded.tokenizer.encode(TEXT, add_special_tokens=True)
    assert 30 <= len(ids) <= 50
    positions = scored(client, 5)
    assert len(positions) == len(ids) - 1
    lsm = torch.log_softmax(hf_logits, -1).double().numpy()
    raw = hf_logits.double().numpy()
    for p, entries in enumerate(positions, start=1):
        row, obs = raw[p - 1], ids[p]
        # the C step against transformers on the same weights: float32 both, other orders
        margin = forward_rtol(loaded.config, len(ids)) * float(np.abs(row).max())
        bound = 2 * margin + chain_rtol(len(row))  # logit and log-sum-exp; the vocabulary sum
        got_top = sorted((e["rank"], int(t)) for t, e in entries.items() if e["rank"] <= 5)
        assert [r for r, _ in got_top] == [1, 2, 3, 4, 5]
        check_rank(row, obs, 5, entries[str(obs)]["rank"], [t for _, t in got_top], 2 * margin,
                   f"position {p}")
        for t, e in entries.items():
            assert abs(e["logprob"] - lsm[p - 1, int(t)]) <= bound, (p, t)
        assert len(entries) == (5 if obs in [t for _, t in got_top] else 6)


def test_k0_and_k256(client: TestClient, loaded: LoadedModel) -> None:
    ids = loaded.tokenizer.encode(TEXT, add_special_tokens=True)[:12]
    only = scored(client, 0, ids)
    full = scored(client, 256, ids)
    for p, (a, b) in enumerate(zip(only, full, strict=True), start=1):
        assert list(a) == [str(ids[p])]
        obs = b[str(ids[p])]
        assert a[str(ids[p])]["logprob"] == obs["logprob"]
        assert len(b) == (256 if obs["rank"] <= 256 else 257)
        ranks = sorted(e["rank"] for e in b.values())
        assert ranks[:256] == list(range(1, 257))
        if obs["rank"] > 256:
            assert a[str(ids[p])]["rank"] == obs["rank"]
        by_rank = sorted(b.values(), key=lambda e: e["rank"])[:256]
        assert all(x["logprob"] >= y["logprob"] for x, y in itertools.pairwise(by_rank))


@pytest.mark.parametrize(("body", "code"), [
    ({"prompt": [1, 2, 49152], "prompt_logprobs": 1}, "completion_invalid_request"),
    ({"prompt": [1, 2, 10**6], "prompt_logprobs": 0}, "completion_invalid_request"),
    ({"prompt": [1, 2, 3], "prompt_logprobs": 257}, "completion_invalid_request"),
    # (without prompt_logprobs a request generates since issue 25: test_completions_live.py)
    ({"prompt": [1, 2, 3], "prompt_logprobs": 1, "stream": True}, "completion_invalid_request"),
])
def test_invalid_requests(client: TestClient, body: dict[str, Any], code: str) -> None:
    r = post(client, **body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == code


def test_boundary_ids_and_single_token(client: TestClient) -> None:
    edge = scored(client, 3, [0, 49151, 1])
    assert len(edge) == 2 and "49151" in edge[0] and "1" in edge[1]
    assert all(e["logprob"] <= 0 and e["rank"] >= 1 for pos in edge for e in pos.values())
    assert scored(client, 5, [42]) == []


def test_a_prompt_bigger_than_the_kv_cache_is_400(loaded: LoadedModel) -> None:
    """It can never fit: a 400 like the context window, with no Retry-After (a 503 had made
    the OpenAI SDK retry it)."""
    with app_client(loaded, None, kv_memory_mb=1) as c:  # one 16-token block of KV cache
        r = post(c, prompt=list(range(100, 140)), prompt_logprobs=1)
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert (err["code"], err["param"]) == ("context_length_exceeded", "prompt")
        assert "retry-after" not in r.headers
        chat = c.post("/v1/chat/completions",
                      json={"messages": [{"role": "user", "content": "word " * 30}]})
        assert chat.status_code == 400 and "retry-after" not in chat.headers
        assert chat.json()["error"]["code"] == "context_length_exceeded"
        assert len(scored(c, 1, list(range(100, 117)))) == 16  # 16 fed tokens still fit
