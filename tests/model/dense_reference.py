"""An independent dense (no KV cache) forward of llama/qwen2/qwen3 weights, for tests."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kiln.model import ModelConfig


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _rope(x: torch.Tensor, theta: float) -> torch.Tensor:
    """x: [heads, S, D]; HF rotate_half convention, positions 0..S-1."""
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    ang = torch.arange(x.shape[1], dtype=torch.float32)[:, None] * inv[None, :]
    cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


@torch.no_grad()
def dense_logits(cfg: ModelConfig, w: dict[str, torch.Tensor], ids: list[int]) -> torch.Tensor:
    """Logits [S, vocab] of a whole sequence with causal SDPA."""
    s = len(ids)
    h = w["model.embed_tokens.weight"][torch.tensor(ids)]
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        x = _rms(h, w[p + "input_layernorm.weight"], cfg.rms_norm_eps)

        def proj(name: str, x: torch.Tensor = x, p: str = p) -> torch.Tensor:
            return F.linear(x, w[p + f"self_attn.{name}.weight"], w.get(p + f"self_attn.{name}.bias"))

        q = proj("q_proj").view(s, cfg.num_heads, cfg.head_dim).transpose(0, 1)
        k = proj("k_proj").view(s, cfg.num_kv_heads, cfg.head_dim).transpose(0, 1)
        v = proj("v_proj").view(s, cfg.num_kv_heads, cfg.head_dim).transpose(0, 1)
        if cfg.qk_norm:
            q = _rms(q, w[p + "self_attn.q_norm.weight"], cfg.rms_norm_eps)
            k = _rms(k, w[p + "self_attn.k_norm.weight"], cfg.rms_norm_eps)
        q, k = _rope(q, cfg.rope_theta), _rope(k, cfg.rope_theta)
        rep = cfg.num_heads // cfg.num_kv_heads
        k, v = k.repeat_interleave(rep, 0), v.repeat_interleave(rep, 0)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        h = h + F.linear(o.transpose(0, 1).reshape(s, -1), w[p + "self_attn.o_proj.weight"])
        x = _rms(h, w[p + "post_attention_layernorm.weight"], cfg.rms_norm_eps)
        gate = F.linear(x, w[p + "mlp.gate_proj.weight"])
        up = F.linear(x, w[p + "mlp.up_proj.weight"])
        h = h + F.linear(F.silu(gate) * up, w[p + "mlp.down_proj.weight"])
    h = _rms(h, w["model.norm.weight"], cfg.rms_norm_eps)
    out_w = w["model.embed_tokens.weight"] if cfg.tie_word_embeddings else w["lm_head.weight"]
    return F.linear(h, out_w)
