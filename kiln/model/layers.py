"""The layer vocabulary every architecture is built from.

Parameter names follow the Hugging Face checkpoints (``q_proj``, ``input_layernorm``, ...), so a
state-dict key of a Kiln model is the safetensors key of the checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

import torch
import torch.nn.functional as F
from kiln_kernels.quant import Packed
from torch import nn

from kiln.model.attention import AttentionPlan, paged_attention
from kiln.model.checkpoint import rope
from kiln.model.checkpoint.config import ModelConfig
from kiln.model.checkpoint.rope import RopeScaling
from kiln.model.quantized import NO_ROUTE, RowRoute, project, project_many


@runtime_checkable
class LoraHook(Protocol):
    """Per-row LoRA deltas (``kiln.model.lora.LoraBatch``), carried in ``ForwardBatch.lora``."""

    def apply(self, layer: int, module: str, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Add the delta of projection ``module`` (``q_proj`` ...) of ``layer`` for input ``x``
        to its output ``y`` (in place) and return ``y``."""
        ...


class RMSNorm(nn.Module):
    """RMSNorm over the last dimension, computed in float32 (as HF Llama/Qwen do)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)


class RotaryEmbedding:
    """HF ``rotate_half`` (NEOX-style) rotary embedding; cos/sin computed from positions. Its
    frequencies, scaled as ``scaling`` says, are the ones every path uses (the C step reads
    ``inv_freq``)."""

    def __init__(self, head_dim: int, theta: float, scaling: RopeScaling | None = None) -> None:
        self.head_dim = head_dim
        self.theta = theta
        self.scaling = scaling
        self._inv_freq: dict[torch.device, torch.Tensor] = {}

    def inv_freq(self, device: torch.device) -> torch.Tensor:
        """The frequencies of ``kiln.model.checkpoint.rope.inv_freq`` (computed without torch, the
        same on every path and machine), on ``device``."""
        if device not in self._inv_freq:
            values = rope.inv_freq(self.head_dim, self.theta, self.scaling)
            self._inv_freq[device] = torch.from_numpy(values).to(device)
        return self._inv_freq[device]

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """``[T, head_dim]`` cos and sin for the given absolute positions."""
        freqs = positions.to(torch.float32)[:, None] * self.inv_freq(positions.device)[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x [T, heads, head_dim]`` rotated by per-token ``cos``/``sin`` ``[T, head_dim]``."""
    return x * cos[:, None, :] + rotate_half(x) * sin[:, None, :]


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """GELU with the tanh approximation (transformers' ``gelu_pytorch_tanh``: Gemma's gate)."""
    return F.gelu(x, approximate="tanh")


ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": F.silu, "gelu_tanh": gelu_tanh}


class SwiGLUMLP(nn.Module):
    """down(act(gate(x)) * up(x)): SwiGLU with ``silu``, GeGLU with ``gelu_tanh``."""

    def __init__(self, hidden: int, intermediate: int, layer_idx: int = 0,
                 act: str = "silu") -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.act = ACTIVATIONS[act]
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)
        self.packed_gate_up: Packed | None = None  # set_packed (CausalLM.attach_packed)
        self.packed_down: Packed | None = None

    def set_packed(self, gate_up: Packed | None, down: Packed | None) -> None:
        self.packed_gate_up, self.packed_down = gate_up, down

    @property
    def has_packed(self) -> bool:
        return self.packed_gate_up is not None or self.packed_down is not None

    def forward(self, x: torch.Tensor, lora: LoraHook | None = None,
                route: RowRoute = NO_ROUTE) -> torch.Tensor:
        gate, up = project_many(x, [self.gate_proj.weight, self.up_proj.weight],
                                self.packed_gate_up, route)
        if lora is None:
            return project(self.act(gate).mul_(up), self.down_proj.weight, self.packed_down,
                           route)
        i = self.layer_idx
        gate = lora.apply(i, "gate_proj", x, gate)
        h = self.act(gate) * lora.apply(i, "up_proj", x, up)
        return lora.apply(i, "down_proj", h, project(h, self.down_proj.weight, self.packed_down,
                                                     route))


class MoEMLP(nn.Module):
    """A mixture of experts (Qwen3-MoE): the router (``gate``, softmax over the experts in
    float32, the top ``k``, renormalised over them with ``norm_topk_prob``) picks each token's
    experts, SwiGLU MLPs of their own, and the token's output is the weighted sum of theirs.
    A step's tokens are grouped by expert, so each expert's weights are read once per step, and
    only the experts some token is routed to run. HF's names: ``mlp.gate``,
    ``mlp.experts.N.{gate,up,down}_proj``."""

    def __init__(self, cfg: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.top_k = cfg.experts_per_token
        self.renormalise = cfg.norm_topk_prob
        self.gate = nn.Linear(cfg.hidden_size, cfg.num_experts, bias=False)
        self.experts = nn.ModuleList(
            SwiGLUMLP(cfg.hidden_size, cfg.moe_intermediate_size, layer_idx, cfg.hidden_act)
            for _ in range(cfg.num_experts))

    def set_packed(self, gate_up: Packed | None, down: Packed | None) -> None:
        if gate_up is not None or down is not None:
            raise ValueError("an MoE layer's experts are not packed")

    @property
    def has_packed(self) -> bool:
        return False

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each row's ``k`` experts (int64 ``[T, k]``, by falling weight) and their weights."""
        probs = F.softmax(F.linear(x, self.gate.weight), dim=-1, dtype=torch.float32)
        weights, experts = torch.topk(probs, self.top_k, dim=-1)
        if self.renormalise:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return experts, weights.to(x.dtype)

    def forward(self, x: torch.Tensor, lora: LoraHook | None = None,
                route: RowRoute = NO_ROUTE) -> torch.Tensor:
        # (an adapter never reaches here with MLP targets: kiln.model.lora refuses them for a
        # mixture of experts, whose experts it has no weights for)
        experts, weights = self.route(x)
        out = torch.zeros_like(x)
        for e in torch.unique(experts).tolist():  # ascending: a row sums its experts in id order
            rows, slot = torch.where(experts == e)
            y = self.experts[e](x.index_select(0, rows)) * weights[rows, slot, None]
            out.index_add_(0, rows, y)
        return out


class PagedSelfAttention(nn.Module):
    """GQA self-attention over the paged KV cache, with optional q/k/v bias and q/k RMSNorm."""

    def __init__(self, cfg: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads = cfg.num_heads
        self.num_kv_heads = cfg.num_kv_heads
        self.head_dim = cfg.head_dim
        self.scale = cfg.attn_scale or cfg.head_dim ** -0.5
        self.window = cfg.window(layer_idx)  # 0: the whole context
        hd = cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.num_heads * hd, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * hd, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * hd, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(cfg.num_heads * hd, cfg.hidden_size, bias=False)
        self.q_norm: RMSNorm | None = RMSNorm(hd, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm: RMSNorm | None = RMSNorm(hd, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.packed_qkv: Packed | None = None  # set_packed (CausalLM.attach_packed)
        self.packed_o: Packed | None = None

    def set_packed(self, qkv: Packed | None, o: Packed | None) -> None:
        self.packed_qkv, self.packed_o = qkv, o

    @property
    def has_packed(self) -> bool:
        return self.packed_qkv is not None or self.packed_o is not None

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                k_cache: torch.Tensor, v_cache: torch.Tensor, plan: AttentionPlan,
                lora: LoraHook | None = None, route: RowRoute = NO_ROUTE) -> torch.Tensor:
        t = x.shape[0]
        q, k, v = project_many(x, [self.q_proj.weight, self.k_proj.weight, self.v_proj.weight],
                               self.packed_qkv, route)
        if self.q_proj.bias is not None:  # Qwen2: q/k/v biases
            q = q + self.q_proj.bias
            k = k + self.k_proj.bias
            v = v + self.v_proj.bias
        if lora is not None:
            q = lora.apply(self.layer_idx, "q_proj", x, q)
            k = lora.apply(self.layer_idx, "k_proj", x, k)
            v = lora.apply(self.layer_idx, "v_proj", x, v)
        q = q.reshape(t, self.num_heads, self.head_dim)
        k = k.reshape(t, self.num_kv_heads, self.head_dim)
        v = v.reshape(t, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q = self.q_norm(q)
            k = self.k_norm(k)
        q = apply_rotary(q, cos, sin)
        k = apply_rotary(k, cos, sin)
        out = paged_attention(q, k, v, k_cache, v_cache, plan, self.scale, self.window)
        flat = out.reshape(t, self.num_heads * self.head_dim)
        projected = project(flat, self.o_proj.weight, self.packed_o, route)
        if lora is not None:
            projected = lora.apply(self.layer_idx, "o_proj", flat, projected)
        return projected


class DecoderLayer(nn.Module):
    """Pre-norm block: x + attn(norm(x)), then x + mlp(norm(x)). With ``sandwich_norms``
    (Gemma) the attention's and the MLP's outputs are normed too before they are added, and the
    norms take HF Gemma's names: ``post_attention_layernorm`` norms the attention's output,
    ``pre_feedforward_layernorm`` the MLP's input, ``post_feedforward_layernorm`` its output."""

    def __init__(self, cfg: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        hidden, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.input_layernorm = RMSNorm(hidden, eps)
        self.self_attn = PagedSelfAttention(cfg, layer_idx)
        self.post_attention_layernorm = RMSNorm(hidden, eps)
        self.mlp: SwiGLUMLP | MoEMLP = (
            MoEMLP(cfg, layer_idx) if cfg.is_moe(layer_idx)
            else SwiGLUMLP(hidden, cfg.intermediate_size, layer_idx, cfg.hidden_act))
        self.pre_feedforward_layernorm: RMSNorm | None = None
        self.post_feedforward_layernorm: RMSNorm | None = None
        if cfg.sandwich_norms:
            self.pre_feedforward_layernorm = RMSNorm(hidden, eps)
            self.post_feedforward_layernorm = RMSNorm(hidden, eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                k_cache: torch.Tensor, v_cache: torch.Tensor, plan: AttentionPlan,
                lora: LoraHook | None = None, route: RowRoute = NO_ROUTE) -> torch.Tensor:
        h = self.self_attn(self.input_layernorm(x), cos, sin, k_cache, v_cache, plan, lora,
                           route)
        if self.pre_feedforward_layernorm is None or self.post_feedforward_layernorm is None:
            x = x + h
            out: torch.Tensor = x + self.mlp(self.post_attention_layernorm(x), lora, route)
            return out
        x = x + self.post_attention_layernorm(h)
        m = self.mlp(self.pre_feedforward_layernorm(x), lora, route)
        out = x + self.post_feedforward_layernorm(m)
        return out
