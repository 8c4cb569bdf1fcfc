"""The float32 copies of a loaded model's packed weights (:mod:`kiln.model.quantized`).

A loader attaches the blocks it packed (:func:`install_packed`); where every step then runs in C
the projections' float32 copies are released (:func:`release_float32`), and they come back,
dequantized from the blocks, only for the duration of :func:`packed_disabled` (the torch path on
float32 weights; :func:`float32_state_dict`, the weights for another framework's reference).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import cast

import torch
from kiln_kernels.quant import Packed, PackedWeight
from torch import nn

from kiln.model.base import CausalLM
from kiln.model.layers import DecoderLayer, SwiGLUMLP
from kiln.model.quantized import PackedEmbedding
from kiln.model.weights import WeightSink


def attach_packed(model: CausalLM, packed: dict[str, PackedWeight]) -> int:
    """``model.attach_packed(packed)``: the bytes attached."""
    return model.attach_packed(packed)


def _projection_groups(model: CausalLM) -> Iterator[tuple[Packed | None, list[nn.Linear]]]:
    """Every packed projection slot and its float32 modules, in the packed rows' order."""
    for module in model.model.layers:
        layer = cast("DecoderLayer", module)
        attn, mlp = layer.self_attn, layer.mlp
        yield attn.packed_qkv, [attn.q_proj, attn.k_proj, attn.v_proj]
        yield attn.packed_o, [attn.o_proj]
        if isinstance(mlp, SwiGLUMLP):  # a mixture's experts are never packed
            yield mlp.packed_gate_up, [mlp.gate_proj, mlp.up_proj]
            yield mlp.packed_down, [mlp.down_proj]


def release_float32(model: CausalLM) -> int:
    """Free the float32 copies of the packed projection weights, leaving placeholders of their
    shape on the meta device: every product then reads the packed blocks (the C step, and
    :func:`project` on the torch path). Meant for a model whose every step runs in C
    (the plan's weights ``packed``), where those copies would only serve the torch path's fallbacks: the
    default model's process holds 381 MB less. Returns the bytes freed."""
    freed = 0
    for packed, linears in _projection_groups(model):
        if packed is None:
            continue
        for lin in linears:
            w = lin.weight
            if not w.is_meta:
                freed += w.numel() * w.element_size()
                lin.weight = nn.Parameter(torch.empty(w.shape, dtype=w.dtype, device="meta"),
                                          requires_grad=False)
    emb, packed_emb = model.model.embed_tokens, model.packed_embedding
    if packed_emb is not None and not isinstance(emb, PackedEmbedding) \
            and tuple(emb.weight.shape) == (packed_emb.out_features, packed_emb.in_features):
        if not emb.weight.is_meta:
            freed += emb.weight.numel() * emb.weight.element_size()
        model.model.embed_tokens = PackedEmbedding(packed_emb)
    return freed


def _materialize(model: CausalLM) -> list[tuple[nn.Module, torch.Tensor]]:
    """Float32 weights again for released projections and embedding (dequantized from their
    blocks: gguf-py's values); returns the placeholders to put back."""
    saved: list[tuple[nn.Module, torch.Tensor]] = []
    for packed, linears in _projection_groups(model):
        if packed is None or not linears[0].weight.is_meta:
            continue
        rows = [int(lin.weight.shape[0]) for lin in linears]
        for lin, part in zip(linears, torch.split(packed.dequantize(), rows), strict=True):
            saved.append((lin, lin.weight))
            lin.weight = nn.Parameter(part.contiguous(), requires_grad=False)
    emb = model.model.embed_tokens
    if isinstance(emb, PackedEmbedding) and emb.weight.is_meta:
        saved.append((emb, emb.weight))
        emb.weight = nn.Parameter(emb.packed.dequantize(), requires_grad=False)
    return saved


@contextlib.contextmanager
def packed_disabled(model: CausalLM) -> Iterator[None]:
    """Run ``model`` on float32 weights only (e.g. after editing them in place, which the packed
    copies do not see); released weights are dequantized for the duration."""
    placeholders = _materialize(model)
    try:
        with model.torch_only():
            yield
    finally:
        for module, placeholder in placeholders:
            module.weight = nn.Parameter(placeholder, requires_grad=False)


def float32_state_dict(model: CausalLM) -> dict[str, torch.Tensor]:
    """``model.state_dict()`` with every released projection weight dequantized from its blocks
    (gguf-py's float32 values): the weights for another framework's reference model."""
    with packed_disabled(model):
        return dict(model.state_dict())


def install_packed(model: CausalLM, sink: WeightSink, packed: dict[str, PackedWeight]) -> None:
    """A loader's last step for the weights it packed (and did not write as float32): attach
    them; when every step then runs in C, release the float32 placeholders (the loaded weights
    never get a float32 copy); else write their float32 values after all."""
    if packed:
        model.attach_packed(packed)
        if model.plan.weights == "packed":  # every step runs in C: the float32 copies would idle
            release_float32(model)
    released = {n for n, p in model.named_parameters() if p.is_meta}
    for name, pw in packed.items():
        if name in released:
            sink.held_elsewhere(name, (pw.out_features, pw.in_features))
        else:
            sink.put(name, pw.dequantize())
