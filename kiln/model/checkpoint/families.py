"""The decoder families beyond the Llama block, as their checkpoints describe them: Gemma 3's
text decoder and Qwen3-MoE, from a ``config.json`` or a GGUF's metadata. Each reader returns
``ModelConfig`` fields (``kiln.model.checkpoint.config`` builds the config) and refuses what the
model cannot run with ``UnsupportedModelError``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from kiln.model.checkpoint import rope
from kiln.model.checkpoint.errors import UnsupportedModelError


def gguf_float(value: Any) -> float:
    """A GGUF float32 as the shortest decimal that rounds to it (1e-5, not 9.9999997e-06)."""
    return float(str(np.float32(value)))


def moe_from_hf(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Qwen3-MoE's experts: ``num_experts`` of ``moe_intermediate_size``, ``num_experts_per_tok``
    of them per token, on every ``decoder_sparse_step``-th layer not in ``mlp_only_layers``."""
    layers = int(cfg["num_hidden_layers"])
    experts = int(cfg.get("num_experts") or cfg.get("num_local_experts") or 0)
    step = int(cfg.get("decoder_sparse_step", 1) or 1)
    dense = {int(i) for i in cfg.get("mlp_only_layers") or []}
    if cfg.get("shared_expert_intermediate_size"):
        raise UnsupportedModelError("qwen3_moe: shared experts are not supported")
    return {
        "num_experts": experts,
        "experts_per_token": int(cfg.get("num_experts_per_tok", 0)),
        "moe_intermediate_size": int(cfg.get("moe_intermediate_size", 0)),
        "norm_topk_prob": bool(cfg.get("norm_topk_prob", False)),
        "moe_layers": tuple(experts > 0 and i not in dense and (i + 1) % step == 0
                            for i in range(layers)),
    }


def gemma3_from_hf(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Gemma 3's text decoder (transformers' ``gemma3_text``): per-layer sliding windows with
    their own rotary base, scaled embeddings, (1 + w) RMSNorms before and after each block, q/k
    norms, the tanh-approximated GELU, the attention scale of ``query_pre_attn_scalar``: every
    ``ModelConfig`` field."""
    if "text_config" in cfg:
        raise UnsupportedModelError("gemma3: a multimodal checkpoint (Gemma3ForConditional"
                                    "Generation); its text decoder alone is served from a "
                                    "gemma3_text folder")
    if cfg.get("attn_logit_softcapping") is not None:
        raise UnsupportedModelError("gemma3: attn_logit_softcapping is not supported")
    if cfg.get("use_bidirectional_attention"):
        raise UnsupportedModelError("gemma3: use_bidirectional_attention is not supported")
    act = cfg.get("hidden_activation", cfg.get("hidden_act", "gelu_pytorch_tanh"))
    if act != "gelu_pytorch_tanh":
        raise UnsupportedModelError(f"gemma3: hidden_activation {act!r} is not supported")
    layers = int(cfg["num_hidden_layers"])
    types = cfg.get("layer_types")
    if types is None:
        pattern = int(cfg.get("sliding_window_pattern", 6))
        types = ["sliding_attention" if (i + 1) % pattern else "full_attention"
                 for i in range(layers)]
    if len(types) != layers or set(types) - {"sliding_attention", "full_attention"}:
        raise UnsupportedModelError(f"gemma3: layer_types {types!r}")
    window = int(cfg.get("sliding_window") or 4096)
    params = cfg.get("rope_parameters")
    full: Mapping[str, Any] = {}
    local: Mapping[str, Any] = {}
    if isinstance(params, Mapping) and "full_attention" in params:  # transformers 5
        full, local = params.get("full_attention") or {}, params.get("sliding_attention") or {}
    elif isinstance(cfg.get("rope_scaling"), Mapping):  # transformers 4
        full = cfg["rope_scaling"]
    if local.get("rope_type", "default") != "default":
        raise UnsupportedModelError("gemma3: the sliding layers' rope must be the default")
    try:
        scaling = rope.from_hf({"rope_parameters": full})
    except rope.RopeScalingError as exc:
        raise UnsupportedModelError(str(exc)) from exc
    theta = full.get("rope_theta", cfg.get("rope_theta", 1_000_000.0))
    local_theta = local.get("rope_theta", cfg.get("rope_local_base_freq", 10_000.0))
    hidden = int(cfg["hidden_size"])
    heads = int(cfg["num_attention_heads"])
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    softcap = cfg.get("final_logit_softcapping")
    return dict(
        arch="gemma3",
        vocab_size=int(cfg["vocab_size"]),
        hidden_size=hidden,
        intermediate_size=int(cfg["intermediate_size"]),
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=head_dim,
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=float(theta),
        max_position=int(cfg.get("max_position_embeddings", 131072)),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", True)),
        qkv_bias=bool(cfg.get("attention_bias", False)),
        qk_norm=True,
        rope_scaling=scaling,
        layer_windows=tuple(window if t == "sliding_attention" else 0 for t in types),
        rope_local_theta=float(local_theta),
        # transformers: torch.tensor(hidden ** 0.5) (float32), times the embedding
        embed_scale=float(np.float32(hidden ** 0.5)),
        attn_scale=float(cfg.get("query_pre_attn_scalar", head_dim)) ** -0.5,
        hidden_act="gelu_tanh",
        sandwich_norms=True,
        norm_shift=1.0,
        final_logit_softcap=float(softcap) if softcap else 0.0,
    )


def gemma3_from_gguf(meta: Mapping[str, Any], layers: int, hidden: int, heads: int,
                      head_dim: int) -> dict[str, Any]:
    """A Gemma 3 GGUF's fields as llama.cpp reads them (its converter writes the window, the
    global rotary base and the soft cap; the norms hold 1 + w already): every sixth layer global
    unless ``attention.sliding_window_pattern`` says otherwise, the sliding layers' base
    ``rope.freq_base_swa`` (10,000), and the attention scale 1/sqrt(head_dim), but
    1/sqrt(hidden / heads) for the 62-layer 27B model (its query_pre_attn_scalar)."""
    window = int(meta.get("gemma3.attention.sliding_window", 0) or 0)
    pattern = meta.get("gemma3.attention.sliding_window_pattern", 6)
    if isinstance(pattern, (list, tuple)):
        sliding = [bool(p) for p in pattern][:layers]
    else:
        n = int(pattern)
        sliding = [n == 0 or i % n < n - 1 for i in range(layers)]
    if len(sliding) != layers:
        raise UnsupportedModelError("GGUF gemma3: a sliding_window_pattern per layer")
    softcap = meta.get("gemma3.final_logit_softcapping")
    scale = (hidden // heads) ** -0.5 if layers == 62 else head_dim ** -0.5
    return {
        "layer_windows": tuple(window if s and window else 0 for s in sliding) if window
        else (),
        "rope_local_theta": gguf_float(meta.get("gemma3.rope.freq_base_swa", 10_000.0)),
        "embed_scale": float(np.float32(hidden ** 0.5)),
        "attn_scale": float(scale),
        "hidden_act": "gelu_tanh",
        "sandwich_norms": True,
        "final_logit_softcap": gguf_float(softcap) if softcap else 0.0,
    }


def moe_from_gguf(meta: Mapping[str, Any], layers: int) -> dict[str, Any]:
    """llama.cpp's qwen3moe: every layer's MLP a mixture, its weights renormalised."""
    def key(name: str) -> Any:
        full = f"qwen3moe.{name}"
        if full not in meta:
            raise UnsupportedModelError(f"GGUF metadata lacks {full}")
        return meta[full]

    return {"num_experts": int(key("expert_count")),
            "experts_per_token": int(key("expert_used_count")),
            "moe_intermediate_size": int(key("expert_feed_forward_length")),
            "norm_topk_prob": True, "moe_layers": (True,) * layers}
