"""Rotary frequency scaling (kiln/model/checkpoint/rope.py: inv_freq): Llama 3.1+'s
``llama3`` scaling from a config.json gives transformers' frequencies bit for bit and its
logits; the same scaling as a GGUF holds it (llama.cpp's per-frequency divisors,
``rope_freqs.weight``) runs through the C step to the same logits; what is not implemented is
refused at load, never ignored (both had been: a config.json's llama3 scaling was refused, a
GGUF's ``rope_freqs.weight`` failed as an unknown tensor)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from kiln_kernels.testing import llama3_rope_freqs

from kiln.model import load_model
from kiln.model.checkpoint.config import ModelConfig, UnsupportedModelError, config_from_gguf
from kiln.model.checkpoint.rope import RopeScaling
from kiln.model.layers import RotaryEmbedding
from tests.model.test_transformers_reference import ours, theirs
from tests.numerics import assert_logits_close, assert_same_argmax
from tests.tiny_models import _write_folder, random_tensors, tiny_config, write_tiny_gguf

transformers = pytest.importorskip("transformers")

# a tiny model's 8 frequencies (head_dim 16, theta 10000) have wavelengths 6.3 .. 19,869: an
# original context of 64 keeps the first, blends two and divides five
LLAMA3: dict[str, Any] = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 64}


def llama_cpp_divisors(head_dim: int, theta: float, spec: dict[str, Any]) -> list[float]:
    """llama.cpp's converter's rope_freqs.weight for a llama3 rope_scaling."""
    return llama3_rope_freqs(head_dim, theta, spec["factor"], spec["low_freq_factor"],
                             spec["high_freq_factor"], spec["original_max_position_embeddings"])


def test_llama3_frequencies_are_transformers_bit_for_bit() -> None:
    for theta, head_dim, spec in ((10000.0, 16, LLAMA3), (500000.0, 64, {**LLAMA3, "factor": 32.0,
                                  "original_max_position_embeddings": 8192})):
        config = transformers.LlamaConfig(
            hidden_size=4 * head_dim, num_attention_heads=4, head_dim=head_dim,
            rope_parameters={**spec, "rope_theta": theta})
        want, _ = transformers.modeling_rope_utils.ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")
        cfg = ModelConfig.from_hf({**tiny_config("llama").to_hf(), "head_dim": head_dim,
                                   "rope_theta": theta, "rope_scaling": spec})
        got = RotaryEmbedding(head_dim, theta, cfg.rope_scaling).inv_freq(torch.device("cpu"))
        assert torch.equal(got, want.float())
        assert got.tolist() != RotaryEmbedding(head_dim, theta).inv_freq(
            torch.device("cpu")).tolist()  # it scales something


def test_a_gguf_s_divisors_are_the_same_frequencies() -> None:
    """llama.cpp's divisors are llama3's scaling: in float64 the frequencies over them are
    llama3's blend (the two formulas agree to float64 rounding). In float32 the divisors path is
    two roundings from the quotient of its float32 base frequencies (the divisor rounded to
    float32, then the division), so within 2u(1 + u), u = 2^-24, relatively. (The float32
    llama3 path is transformers' own, bit for bit: the test above.)"""
    cpu = torch.device("cpu")
    divisors = torch.tensor(llama_cpp_divisors(16, 10000.0, LLAMA3), dtype=torch.float64)
    f, low, high = (float(LLAMA3[k]) for k in ("factor", "low_freq_factor", "high_freq_factor"))
    old = float(LLAMA3["original_max_position_embeddings"])
    base64 = 10000.0 ** (-torch.arange(0, 16, 2, dtype=torch.float64) / 16)
    wavelen = 2 * math.pi / base64
    smooth = (old / wavelen - low) / (high - low)
    blend = torch.where(wavelen < old / high, base64, torch.where(
        wavelen > old / low, base64 / f, (1 - smooth) * base64 / f + smooth * base64))
    torch.testing.assert_close(base64 / divisors, blend, rtol=1e-12, atol=0)
    base32 = RotaryEmbedding(16, 10000.0).inv_freq(cpu)
    got = RotaryEmbedding(16, 10000.0, RopeScaling("divisors", divisors=tuple(divisors.tolist())))
    u = 2.0**-24
    torch.testing.assert_close(got.inv_freq(cpu).double(), base32.double() / divisors,
                               rtol=2 * u * (1 + u), atol=0)


def test_llama3_scaled_checkpoints_match_transformers(tmp_path: Path) -> None:
    """An HF folder with llama3 rope_scaling, and the same weights as a GGUF with llama.cpp's
    rope_freqs.weight (through the C step), against transformers reading the folder."""
    cfg = tiny_config("llama")
    folder = _write_folder(tmp_path / "hf", cfg, 4, shards=1,
                           tokenizer_config={"eos_token": "<|im_end|>",
                                             "chat_template": "{{ messages }}"},
                           generation_config={}, extra_config={"rope_scaling": LLAMA3})
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    ids = [int(i) for i in torch.randint(3, cfg.vocab_size, (40,),
                                         generator=torch.Generator().manual_seed(2))]
    want = theirs(ref, ids)
    hf = load_model(str(folder), device="cpu")
    assert hf.config.rope_scaling is not None and hf.config.rope_scaling.kind == "llama3"
    gguf_path = write_tiny_gguf(tmp_path / "m.gguf", cfg, random_tensors(cfg, 4),
                                rope_freqs=llama_cpp_divisors(16, cfg.rope_theta, LLAMA3))
    gg = load_model(str(gguf_path))
    assert gg.config.rope_scaling is not None and gg.config.rope_scaling.kind == "divisors"
    assert gg.model.plan.step == "c"
    plain = load_model(str(write_tiny_gguf(tmp_path / "plain.gguf", cfg, random_tensors(cfg, 4))))
    for loaded in (hf, gg):
        got = ours(loaded, ids)
        assert_logits_close(got, want, loaded.config, len(ids), "llama")
        assert_same_argmax(got, want, loaded.config, len(ids))
    # unscaled, the same weights give other logits: the scaling is what makes them equal
    assert not torch.allclose(ours(plain, ids), want, atol=1e-3)


@pytest.mark.parametrize("spec", [{"rope_type": "yarn", "factor": 4.0},
                                  {"type": "dynamic", "factor": 2.0},
                                  {"rope_type": "longrope", "factor": 2.0}])
def test_unimplemented_scalings_are_refused(spec: dict[str, Any]) -> None:
    with pytest.raises(UnsupportedModelError, match="not supported"):
        ModelConfig.from_hf({**tiny_config("llama").to_hf(), "rope_scaling": spec})
    params = {**spec, "rope_theta": 10000.0}  # transformers 5's rope_parameters
    with pytest.raises(UnsupportedModelError, match="not supported"):
        ModelConfig.from_hf({**tiny_config("llama").to_hf(), "rope_parameters": params})


def _gguf_meta(**extra: Any) -> dict[str, Any]:
    return {"general.architecture": "llama", "llama.embedding_length": 64,
            "llama.attention.head_count": 4, "llama.feed_forward_length": 96,
            "llama.block_count": 2, "llama.attention.layer_norm_rms_epsilon": 1e-6,
            "llama.context_length": 2048, **extra}


def test_gguf_scalings() -> None:
    def cfg(meta: dict[str, Any], divisors: tuple[float, ...] | None = None) -> ModelConfig:
        return config_from_gguf(meta, vocab_size=512, has_output=True, has_qkv_bias=False,
                                has_qk_norm=False, rope_divisors=divisors)

    assert cfg(_gguf_meta()).rope_scaling is None
    linear = cfg(_gguf_meta(**{"llama.rope.scaling.type": "linear",
                               "llama.rope.scaling.factor": 4.0})).rope_scaling
    assert linear == RopeScaling("linear", factor=4.0)
    both = cfg(_gguf_meta(**{"llama.rope.scaling.type": "linear",
                             "llama.rope.scaling.factor": 2.0}), (1.0,) * 8).rope_scaling
    assert both == RopeScaling("divisors", divisors=(2.0,) * 8)
    with pytest.raises(UnsupportedModelError, match="'yarn' is not supported"):
        cfg(_gguf_meta(**{"llama.rope.scaling.type": "yarn"}))
    with pytest.raises(UnsupportedModelError, match="one per rotary frequency"):
        cfg(_gguf_meta(), (1.0,) * 7)
    with pytest.raises(UnsupportedModelError, match="finite and positive"):
        cfg(_gguf_meta(), (1.0,) * 7 + (0.0,))


def test_identity_records_of_unscaled_configs_keep_their_keys() -> None:
    """Hashes of what ran (rollout provenance) are over ``record()``: an unscaled config's has
    no rope_scaling key, so they are the hashes of the configs before the field."""
    plain = tiny_config("llama")
    assert "rope_scaling" not in plain.record()
    scaled = ModelConfig.from_hf({**plain.to_hf(), "rope_scaling": LLAMA3})
    assert scaled.record()["rope_scaling"]["kind"] == "llama3"
    assert ModelConfig.from_hf(scaled.to_hf()) == scaled


def test_the_frequencies_are_torch_free_and_within_2_ulp_of_torch_s_pow() -> None:
    """kiln.model.checkpoint.rope.inv_freq (no torch, the power correctly rounded) is what the torch
    path uses, and within 2 ulp of torch's own float32 formula in every entry (torch's vectorised
    ``pow`` is within 1 ulp of the exact power, then a correctly rounded reciprocal; measured
    here: 0-2 ulp in at most one entry); on the default model's shape (head_dim 64, theta
    100,000) equal."""
    import numpy as np

    from kiln.model.checkpoint.rope import inv_freq

    for head_dim in (16, 64, 80, 128, 256):
        for theta in (10000.0, 25000.0, 100000.0, 500000.0, 1e6):
            got = inv_freq(head_dim, theta)
            exps = torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float32) / head_dim
            want = (1.0 / (theta ** exps)).numpy()
            assert got.dtype == np.float32 and got.shape == (head_dim // 2,)
            ulps = np.abs(got.view(np.int32).astype(np.int64) - want.view(np.int32))
            assert int(ulps.max()) <= 2, (head_dim, theta)
            assert torch.equal(RotaryEmbedding(head_dim, theta).inv_freq(torch.device("cpu")),
                               torch.from_numpy(got))
    exps = torch.arange(0, 64, 2, dtype=torch.int64).to(torch.float32) / 64
    assert np.array_equal(inv_freq(64, 100000.0), (1.0 / (100000.0 ** exps)).numpy())
