"""Tiny models in the formats kept as the file's blocks (K-quants, Q5_0/Q5_1, F16/BF16/F32) and
in the mixes llama-quantize writes (Q4_K_M; Q3_K_M- and Q2_K-style), through the C step: against the torch path on the
same dequantized weights, batch-invariant, and from a GGUF file (llama, qwen2, qwen3) against a model
holding gguf-py's dequantized weights."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from kiln_kernels.cpu import available as kernels_available
from kiln_kernels.quant import PackedConcat, PackedWeight, pack_ggml
from kiln_kernels.testing import random_raw

from kiln.model import CausalLM, KVCache, build_forward_batch, load_model
from kiln.model.checkpoint.config import ModelConfig
from kiln.model.float32_copies import attach_packed, float32_state_dict
from tests.gguf_blocks import gguf_dequantize
from tests.model.test_cpu_step import BLOCK, compare_greedy, new_cache, tables
from tests.numerics import assert_logits_close
from tests.tiny_models import model_from_tensors, random_tensors, tiny_config, write_tiny_gguf

pytestmark = pytest.mark.skipif(not kernels_available(), reason="no C compiler for the kernels")

ROLES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "head")
# llama-quantize's Q4_K_M on a model whose widths are multiples of 256 (attn_v, ffn_down and
# the head one step up), and on one whose hidden size is not (SmolLM2: Q5_0 and Q8_0 fallbacks)
Q4_K_M = {"q_proj": "Q4_K", "k_proj": "Q4_K", "v_proj": "Q6_K", "o_proj": "Q4_K",
          "gate_proj": "Q4_K", "up_proj": "Q4_K", "down_proj": "Q6_K", "head": "Q6_K"}
Q4_K_M_FALLBACK = {"q_proj": "Q5_0", "k_proj": "Q5_0", "v_proj": "Q8_0", "o_proj": "Q5_0",
                   "gate_proj": "Q5_0", "up_proj": "Q5_0", "down_proj": "Q4_K", "head": "Q8_0"}
# llama-quantize-style Q3_K_M and Q2_K mixes (v, down and the head a step or more up)
Q3_K_M = {"q_proj": "Q3_K", "k_proj": "Q3_K", "v_proj": "Q5_K", "o_proj": "Q3_K",
          "gate_proj": "Q3_K", "up_proj": "Q3_K", "down_proj": "Q4_K", "head": "Q6_K"}
Q2_K_MIX = {"q_proj": "Q2_K", "k_proj": "Q2_K", "v_proj": "Q3_K", "o_proj": "Q2_K",
            "gate_proj": "Q2_K", "up_proj": "Q2_K", "down_proj": "Q3_K", "head": "Q6_K"}
# llama-quantize's IQ4_XS (the head a step up; on SmolLM2's 576 wide matrices it writes IQ4_NL)
IQ4_MIX = {"q_proj": "IQ4_XS", "k_proj": "IQ4_XS", "v_proj": "IQ4_NL", "o_proj": "IQ4_XS",
           "gate_proj": "IQ4_XS", "up_proj": "IQ4_NL", "down_proj": "IQ4_XS", "head": "Q6_K"}
FORMATS = ["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q5_0", "Q5_1", "IQ4_NL", "IQ4_XS", "F16",
           "BF16", "F32"]


def k_config(arch: str, tie: bool = False) -> ModelConfig:
    """A tiny config whose every matrix width is a multiple of 256 (the K-quants' unit)."""
    return dataclasses.replace(tiny_config(arch, tie=tie), hidden_size=256,
                               intermediate_size=512, num_heads=4, num_kv_heads=2, head_dim=64)


def role(name: str, head: str) -> str | None:
    if name == head:
        return "head"
    return next((r for r in ROLES if name.endswith(f"{r}.weight")), None)


def raw_weights(cfg: ModelConfig, types: dict[str, str], seed: int = 3
                ) -> tuple[dict[str, torch.Tensor], dict[str, tuple[torch.Tensor, str]]]:
    """Random float tensors for the norms and biases, random raw blocks of ``types`` for every
    projection and the head; the float tensors of those hold gguf-py's dequantized values."""
    tensors = random_tensors(cfg, seed=seed)
    head = "model.embed_tokens.weight" if cfg.tie_word_embeddings else "lm_head.weight"
    blocks: dict[str, tuple[torch.Tensor, str]] = {}
    for i, name in enumerate(sorted(tensors)):
        r = role(name, head)
        if r is None:
            continue
        n, k = tensors[name].shape
        amp = 1.5 if r == "head" else 2.0 / k ** 0.5  # about the float weights' own size
        raw = random_raw(types[r], n, k, seed=seed * 1000 + i, amp=amp)
        blocks[name] = (raw, types[r])
        tensors[name] = gguf_dequantize(raw, types[r])
    return tensors, blocks


def packed_model(cfg: ModelConfig, types: dict[str, str]) -> CausalLM:
    tensors, blocks = raw_weights(cfg, types)
    model = model_from_tensors(cfg, tensors)
    attach_packed(model, {n: pack_ggml(raw, t) for n, (raw, t) in blocks.items()})
    assert model.plan.step == "c", "every matrix has a kernel: the C step runs"
    return model


@pytest.mark.parametrize("fmt", FORMATS)
def test_each_format_through_the_c_step(fmt: str) -> None:
    model = packed_model(k_config("qwen3"), dict.fromkeys(ROLES, fmt))
    compare_greedy(model, [[5, 9, 33, 7], [100, 3], [42] * 19], steps=6)


@pytest.mark.parametrize(("arch", "types"), [("qwen2", Q4_K_M), ("llama", Q4_K_M_FALLBACK),
                                             ("qwen3", Q4_K_M)])
def test_mixed_formats_through_the_c_step(arch: str, types: dict[str, str]) -> None:
    """q/k/v of different formats fuse into one PackedConcat; the C step against torch."""
    model = packed_model(k_config(arch), types)
    layer = model.model.layers[0]
    assert isinstance(layer.self_attn.packed_qkv, PackedConcat)  # type: ignore[union-attr]
    compare_greedy(model, [[5, 9, 33, 7], [42] * 19], steps=8)


@pytest.mark.parametrize("types", [Q4_K_M, dict.fromkeys(ROLES, "Q5_1"), Q2_K_MIX])
def test_a_decode_row_never_depends_on_its_batch(types: dict[str, str]) -> None:
    """A decoding sequence's logits are the same bits alone or beside other decodes and a
    prefill chunk (the products' passes differ by row count)."""
    model = packed_model(k_config("qwen2"), types)
    tbl = tables(3)
    caches = [new_cache(model) for _ in range(2)]
    for kv in caches:
        model.forward(build_forward_batch([([7, 8, 9], 0, tbl[0]), ([11, 12], 0, tbl[1])],
                                          BLOCK), kv)
    step = [([3], 3, tbl[0]), ([4], 2, tbl[1]), (list(range(20, 33)), 0, tbl[2])]
    mixed = model.forward(build_forward_batch(step, BLOCK, "all"), caches[0])
    alone = model.forward(build_forward_batch(step[:1], BLOCK), caches[1])
    assert torch.equal(mixed[0], alone[0])


@pytest.mark.parametrize(("arch", "tie", "types"), [("qwen2", False, Q4_K_M),
                                                    ("qwen3", True, Q4_K_M),
                                                    ("qwen2", False, Q3_K_M),
                                                    ("llama", False, Q2_K_MIX),
                                                    ("llama", True, IQ4_MIX)])
def test_k_quant_gguf_runs_in_c(tmp_path: Path, arch: str, tie: bool,
                                types: dict[str, str]) -> None:
    """A Q4_K_M-style GGUF file (raw blocks written with gguf-py's GGUFWriter) loads with every
    step in C, its weights are gguf-py's bit for bit, and its logits match a model built from
    gguf-py's dequantized weights on the torch path."""
    cfg = k_config(arch, tie=tie)
    tensors, blocks = raw_weights(cfg, types, seed=5)
    path = write_tiny_gguf(tmp_path / f"tiny-{arch}.gguf", cfg, tensors, blocks=blocks)
    lm = load_model(str(path))
    assert lm.model.plan.step == "c", "a K-quant file should run every step in C"
    held = float32_state_dict(lm.model)
    for name in blocks:
        assert torch.equal(held[name].view(torch.int32), tensors[name].view(torch.int32)), name
    ref = model_from_tensors(cfg, tensors)
    ids = [1, 40, 41, 300, 7, 9, 2, 100, 5, 6]
    got = lm.model(build_forward_batch([(ids, 0, [0, 1, 2])], 4, logits="all"),
                   KVCache(cfg, 4, 4, torch.float32, torch.device("cpu"), heads_major=True))
    want = ref._torch_forward(build_forward_batch([(ids, 0, [0, 1, 2])], 4, logits="all"),
                              KVCache(cfg, 4, 4, torch.float32, torch.device("cpu")))
    assert_logits_close(got, want, cfg, len(ids))  # same weights, another summation order


def test_a_matrix_without_a_kernel_is_logged(tmp_path: Path,
                                             caplog: pytest.LogCaptureFixture) -> None:
    """An IQ3_S projection has no kernel: one start-up line names it and why; the model runs
    on the torch path with gguf-py's weights."""
    import gguf
    import numpy as np

    cfg = k_config("qwen2")
    tensors, blocks = raw_weights(cfg, Q4_K_M, seed=6)
    name = "model.layers.1.mlp.down_proj.weight"
    n, k = tensors[name].shape
    gen = torch.Generator().manual_seed(0)
    iq = torch.randint(0, 256, (n, k // 256, 110), dtype=torch.uint8, generator=gen)
    iq[:, :, 0:2] = torch.full((n, k // 256, 1), 1e-3).to(torch.float16).view(torch.uint8)
    blocks[name] = (iq.reshape(n, -1), "IQ3_S")
    out = gguf.quants.dequantize(iq.reshape(n, -1).numpy(), gguf.GGMLQuantizationType.IQ3_S)
    tensors[name] = torch.from_numpy(np.asarray(out, dtype=np.float32).copy()).reshape(n, k)
    path = write_tiny_gguf(tmp_path / "iq3_s.gguf", cfg, tensors, blocks=blocks)
    with caplog.at_level("WARNING", logger="kiln.model"):
        lm = load_model(str(path))
    lines = [r.getMessage() for r in caplog.records if "torch path" in r.getMessage()]
    assert len(lines) == 1 and "IQ3_S" in lines[0] and "blk.1.ffn_down.weight" in lines[0]
    assert lm.model.plan.step != "c"
    assert torch.equal(float32_state_dict(lm.model)[name], tensors[name])
    assert isinstance(lm.model.model.layers[0].mlp.packed_down, PackedWeight)  # type: ignore[union-attr]


@pytest.mark.parametrize(("arch", "dtype"), [("qwen3", torch.bfloat16), ("llama", torch.float16)])
def test_half_precision_hf_folder_runs_in_c(tmp_path: Path, arch: str,
                                            dtype: torch.dtype) -> None:
    """An HF folder in bfloat16 / float16: its matrices are held as they are (two bytes a
    weight, no float32 copy), every step runs in C, and the logits match the torch path on the
    exactly widened weights."""
    import json

    from safetensors.torch import save_file

    from tests.tiny_models import QWEN3_TEMPLATE, tiny_tokenizer

    cfg = k_config(arch, tie=arch == "llama")
    tensors = {n: t.to(dtype) for n, t in random_tensors(cfg, seed=9).items()}
    tmp_path.mkdir(exist_ok=True)
    tiny_tokenizer().save(str(tmp_path / "tokenizer.json"))
    hf = cfg.to_hf()
    hf["torch_dtype"] = str(dtype).removeprefix("torch.")
    (tmp_path / "config.json").write_text(json.dumps(hf))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"eos_token": "<|im_end|>", "chat_template": QWEN3_TEMPLATE.read_text(encoding="utf-8")}))
    save_file(tensors, str(tmp_path / "model.safetensors"))
    lm = load_model(str(tmp_path), dtype="float32")
    assert lm.model.plan.step == "c", "a half-precision folder should run every step in C"
    layer = lm.model.model.layers[0]
    assert layer.self_attn.q_proj.weight.is_meta  # type: ignore[union-attr]
    widened = {n: t.to(torch.float32) for n, t in tensors.items()}
    held = float32_state_dict(lm.model)
    for name in ("model.layers.1.mlp.down_proj.weight", "model.embed_tokens.weight"):
        assert torch.equal(held[name], widened[name])
    ref = model_from_tensors(cfg, widened)
    ids = [1, 40, 41, 300, 7, 9, 2, 100]
    got = lm.model(build_forward_batch([(ids, 0, [0, 1])], 4, logits="all"),
                   KVCache(cfg, 4, 4, torch.float32, torch.device("cpu"), heads_major=True))
    want = ref._torch_forward(build_forward_batch([(ids, 0, [0, 1])], 4, logits="all"),
                              KVCache(cfg, 4, 4, torch.float32, torch.device("cpu")))
    assert_logits_close(got, want, cfg, len(ids))  # same weights, another summation order
