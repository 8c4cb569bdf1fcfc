from __future__ import annotations

import pytest
import torch

from kiln.model import KVCache, ModelConfig, UnsupportedModelError, build_forward_batch
from tests.tiny_models import tiny_config

QWEN2 = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": 100,
         "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
         "num_attention_heads": 8, "num_key_value_heads": 2, "rms_norm_eps": 1e-6,
         "rope_theta": 1000000.0, "max_position_embeddings": 32768, "tie_word_embeddings": True}


def test_from_hf_qwen2_defaults() -> None:
    cfg = ModelConfig.from_hf(QWEN2)
    assert (cfg.arch, cfg.qkv_bias, cfg.qk_norm, cfg.head_dim) == ("qwen2", True, False, 8)
    assert cfg.rope_theta == 1e6 and cfg.max_position == 32768 and cfg.tie_word_embeddings
    assert ModelConfig.from_hf(cfg.to_hf()) == cfg


def test_from_hf_rope_parameters_and_errors() -> None:
    hf = {**QWEN2, "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
          "head_dim": 32, "rope_parameters": {"rope_type": "default", "rope_theta": 5e5}}
    del hf["rope_theta"]
    cfg = ModelConfig.from_hf(hf)
    assert (cfg.arch, cfg.qk_norm, cfg.head_dim, cfg.rope_theta) == ("qwen3", True, 32, 5e5)
    with pytest.raises(UnsupportedModelError, match="rope_scaling"):
        ModelConfig.from_hf({**QWEN2, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})
    with pytest.raises(UnsupportedModelError, match="multiple"):
        ModelConfig.from_hf({**QWEN2, "num_key_value_heads": 3})


def test_a_sliding_window_caps_the_context() -> None:
    """Within its window, full attention is the model's sliding-window attention: Mistral 7B
    v0.1's 4,096 of 32,768 becomes the context; Qwen2's window only with use_sliding_window."""
    mistral = {**QWEN2, "architectures": ["MistralForCausalLM"], "model_type": "mistral",
               "sliding_window": 4096}
    assert ModelConfig.from_hf(mistral).max_position == 4096
    assert ModelConfig.from_hf({**mistral, "sliding_window": None}).max_position == 32768
    assert ModelConfig.from_hf({**mistral, "sliding_window": 65536}).max_position == 32768
    qwen = {**QWEN2, "sliding_window": 1024}
    assert ModelConfig.from_hf(qwen).max_position == 32768  # use_sliding_window absent
    assert ModelConfig.from_hf({**qwen, "use_sliding_window": False}).max_position == 32768
    assert ModelConfig.from_hf({**qwen, "use_sliding_window": True}).max_position == 1024


def test_kv_cache_shapes_and_bytes() -> None:
    cfg = tiny_config("qwen3")
    kv = KVCache(cfg, num_blocks=5, block_size=16, dtype=torch.bfloat16,
                 device=torch.device("cpu"))
    assert len(kv.k) == len(kv.v) == cfg.num_layers
    assert kv.k[0].shape == (5, 16, cfg.num_kv_heads, cfg.head_dim)
    per_block = KVCache.bytes_per_block(cfg, 16, torch.bfloat16)
    assert per_block == 2 * cfg.num_layers * 16 * cfg.num_kv_heads * cfg.head_dim * 2
    total = sum(t.numel() * t.element_size() for t in kv.k + kv.v)
    assert total == 5 * per_block


def test_build_forward_batch() -> None:
    b = build_forward_batch([([7, 8, 9], 0, [5]), ([4], 6, [2, 9])], block_size=4)
    assert b.input_ids.tolist() == [7, 8, 9, 4]
    assert b.positions.tolist() == [0, 1, 2, 6]
    assert b.query_start_loc.tolist() == [0, 3, 4]
    assert b.seq_lens.tolist() == [3, 7]
    assert b.block_tables.tolist() == [[5, 0], [2, 9]]
    assert b.slot_mapping.tolist() == [20, 21, 22, 38]
    assert b.logits_indices.tolist() == [2, 3]
    assert b.query_start_loc.dtype == torch.int32 and b.slot_mapping.dtype == torch.int64
    assert build_forward_batch([([1, 2], 0, [0])], 4, logits="all").logits_indices.tolist() \
        == [0, 1]
    with pytest.raises(ValueError, match="cannot hold"):
        build_forward_batch([([1, 2, 3], 3, [0])], 4)
