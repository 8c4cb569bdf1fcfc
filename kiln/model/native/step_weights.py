"""The C step's weights, laid out in one place: a model's products fused as the C step takes
them (q/k/v into one, gate/up into one: ``layer_products``, ``fuse``) and the per-layer table the
C program reads (``step_weights``), for the torch-free ``CModel`` (``kiln.model.native.c_model``)
and the torch ``CausalLM`` (``kiln.model.cpu_step.cpu_step_weights``) alike. A layer feature the C
step gains is read here. Imports no torch."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kiln_kernels.cpu.cpu_step import CpuStepLayer, CpuStepWeights
from kiln_kernels.quant import Packed, PackedWeight

from kiln.model.checkpoint import rope
from kiln.model.checkpoint.config import ModelConfig


def fuse(packed: Mapping[str, PackedWeight], names: list[str]) -> Packed | None:
    """The row-wise fusion of these projections (a PackedConcat where their formats differ), or
    None where one is not packed or their widths differ."""
    parts = [packed.get(n) for n in names]
    if any(p is None for p in parts):
        return None
    try:
        return PackedWeight.cat([p for p in parts if p is not None])
    except ValueError:  # different widths
        return None


def layer_products(cfg: ModelConfig, packed: Mapping[str, PackedWeight]
                   ) -> dict[str, Packed | None]:
    """A layer's products as the C step takes them (``model.layers.N.`` + qkv, o, gate_up, down),
    fused from the per-projection packed weights keyed by HF name."""
    out: dict[str, Packed | None] = {}
    for i in range(cfg.num_layers):
        pre = f"model.layers.{i}."
        out[pre + "qkv"] = fuse(packed, [f"{pre}self_attn.{p}_proj.weight" for p in "qkv"])
        out[pre + "o"] = packed.get(f"{pre}self_attn.o_proj.weight")
        out[pre + "gate_up"] = fuse(packed, [f"{pre}mlp.gate_proj.weight",
                                             f"{pre}mlp.up_proj.weight"])
        out[pre + "down"] = packed.get(f"{pre}mlp.down_proj.weight")
    return out


def step_weights(cfg: ModelConfig, products: Mapping[str, Packed | None],
                 small: Mapping[str, Any], *, head: Packed | None, embed: Packed | None
                 ) -> CpuStepWeights | None:
    """The C program's weights: the one place they are laid out, for the torch-free ``CModel``
    and the torch ``CausalLM`` alike (a layer feature the C step gains is read here).
    ``products``: ``layer_products``' keys; ``small``: the norms and biases by HF name (numpy
    or torch, one dimension); ``head``: the LM head's blocks; ``embed``: the token embedding's,
    looked up in the C step (None: the caller embeds first). None where a product is missing
    (the compute plan then names the torch path), and for a model whose layers are not the
    Llama block the C step runs (Gemma 3's sliding windows, sandwich norms and GeGLU: the torch
    path runs it)."""
    if head is None or not cfg.plain_block:
        return None
    layers: list[CpuStepLayer] = []
    for i in range(cfg.num_layers):
        pre = f"model.layers.{i}."
        qkv, o, gate_up, down = (products.get(pre + k) for k in ("qkv", "o", "gate_up", "down"))
        if qkv is None or o is None or gate_up is None or down is None:
            return None
        layers.append(CpuStepLayer(
            qkv, o, gate_up, down, in_norm=small[f"{pre}input_layernorm.weight"],
            post_norm=small[f"{pre}post_attention_layernorm.weight"],
            q_norm=small.get(f"{pre}self_attn.q_norm.weight"),
            k_norm=small.get(f"{pre}self_attn.k_norm.weight"),
            q_bias=small.get(f"{pre}self_attn.q_proj.bias"),
            k_bias=small.get(f"{pre}self_attn.k_proj.bias"),
            v_bias=small.get(f"{pre}self_attn.v_proj.bias")))
    return CpuStepWeights(hidden=cfg.hidden_size, inter=cfg.intermediate_size,
                          heads=cfg.num_heads, kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
                          eps=cfg.rms_norm_eps, layers=tuple(layers),
                          final_norm=small["model.norm.weight"], head=head,
                          inv_freq=rope.inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling),
                          embed=embed)
