"""Block-quantized GGUF weights on the CPU.

A GGUF model's matrices in the formats of ``kiln_kernels.quant`` (Q4_0, Q4_1, Q8_0, Q5_0, Q5_1,
Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, F16, BF16, F32) are kept as :class:`~kiln_kernels.quant.PackedWeight` blocks
(q/k/v and gate/up fused row-wise, as a ``PackedConcat`` where their formats differ), holding
gguf-py's float32 values bit for bit.

- When every projection and the head are packed, every step runs in C (``CpuStep`` of
  :mod:`kiln.model.base`, over :func:`cpu_step_weights`, the C program's view of the weights)
  and the projections' float32 copies are released (:func:`release_float32`): the torch path, a
  fallback there, multiplies every row by the blocks. A packed token embedding (the head, when tied) is released too: lookups dequantize
  their rows (:class:`PackedEmbedding`).
- Otherwise the torch path keeps both: decode rows (a sequence's one new token) are multiplied
  by the packed blocks, reading ~1/6 of the bytes, and prefill rows by the float32 weights. The
  two products differ only in summation order (~1e-6 relative), and which one a row gets
  depends on that row alone (decode or not), never on the rest of the batch.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import torch
import torch.nn.functional as F
from kiln_kernels.cpu.cpu_step import CpuStepWeights
from kiln_kernels.quant import Packed, PackedWeight
from torch import nn

from kiln.model.step_weights import fuse, step_weights

if TYPE_CHECKING:
    from kiln.model.base import CausalLM
    from kiln.model.layers import DecoderLayer
    from kiln.model.weights import WeightSink



@dataclass(frozen=True)
class RowRoute:
    """The rows of one forward pass that use packed weights."""

    rows: torch.Tensor | None = None  # int64 row indices; None when no row does
    every: bool = False  # every row does (no gather/scatter needed)

    @staticmethod
    def from_mask(mask: torch.Tensor) -> RowRoute:
        count = int(mask.sum())
        if count == 0:
            return NO_ROUTE
        if count == mask.numel():
            return RowRoute(rows=torch.arange(count), every=True)
        return RowRoute(rows=mask.nonzero().flatten())


NO_ROUTE = RowRoute()


class PackedEmbedding(nn.Module):
    """The token embedding read from packed blocks (:func:`release_float32`): each lookup
    dequantizes only its rows, gguf-py's values bit for bit. ``weight`` is a meta placeholder
    of the table's shape, or the float32 table while :func:`packed_disabled` holds it."""

    def __init__(self, packed: PackedWeight) -> None:
        super().__init__()
        self.packed = packed
        self.weight = nn.Parameter(
            torch.empty((packed.out_features, packed.in_features), device="meta"),
            requires_grad=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.weight.is_meta:
            rows: torch.Tensor = self.packed.dequantize_rows(ids)
            return rows
        return F.embedding(ids, self.weight)


def project(x: torch.Tensor, weight: torch.Tensor, packed: Packed | None,
            route: RowRoute) -> torch.Tensor:
    """``F.linear(x, weight)``, with the routed rows taken from the packed weight (every row,
    when :func:`release_float32` left only a placeholder of ``weight``)."""
    if packed is not None and weight.is_meta:
        released: torch.Tensor = packed.matmul(x)
        return released
    if packed is None or route.rows is None:
        return F.linear(x, weight)
    if route.every:
        out: torch.Tensor = packed.matmul(x)
        return out
    y: torch.Tensor = F.linear(x, weight)
    y.index_copy_(0, route.rows, packed.matmul(x.index_select(0, route.rows)))
    return y


def project_many(x: torch.Tensor, weights: list[torch.Tensor], packed: Packed | None,
                 route: RowRoute) -> list[torch.Tensor]:
    """Several projections of one input (q/k/v, gate/up); ``packed`` is their row-wise fusion."""
    sizes = [int(w.shape[0]) for w in weights]
    if packed is not None and weights[0].is_meta:  # released: every row from the blocks
        return list(torch.split(packed.matmul(x), sizes, dim=1))
    if packed is None or route.rows is None:
        return [F.linear(x, w) for w in weights]
    if route.every:
        return list(torch.split(packed.matmul(x), sizes, dim=1))
    outs = [F.linear(x, w) for w in weights]
    fused = torch.split(packed.matmul(x.index_select(0, route.rows)), sizes, dim=1)
    for out, part in zip(outs, fused, strict=True):
        out.index_copy_(0, route.rows, part)
    return outs


@dataclass(frozen=True)
class PackedParts:
    """A model's packed weights, placed: per layer (qkv, o, gate_up, down), the head, and the
    token embedding's blocks; ``nbytes`` of the layers' and the head's."""

    layers: tuple[tuple[Packed | None, Packed | None, Packed | None, Packed | None], ...]
    head: Packed | None
    embedding: PackedWeight | None
    nbytes: int


def packed_parts(model: CausalLM, packed: dict[str, PackedWeight]) -> PackedParts:
    """Where ``packed`` (keyed by HF parameter names; the head is ``lm_head.weight``, or
    ``model.embed_tokens.weight`` when tied) goes in ``model``. Projections whose weights are
    not all packed stay on float32."""
    layers = []
    total = 0
    for i in range(len(model.model.layers)):
        pre = f"model.layers.{i}."
        row = (fuse(packed, [f"{pre}self_attn.{p}_proj.weight" for p in "qkv"]),
               packed.get(f"{pre}self_attn.o_proj.weight"),
               fuse(packed, [f"{pre}mlp.gate_proj.weight", f"{pre}mlp.up_proj.weight"]),
               packed.get(f"{pre}mlp.down_proj.weight"))
        total += sum(p.nbytes for p in row if p is not None)
        layers.append(row)
    head_name = "model.embed_tokens.weight" if model.lm_head is None else "lm_head.weight"
    head = packed.get(head_name)
    if head is not None:
        total += head.nbytes
    return PackedParts(tuple(layers), head, packed.get("model.embed_tokens.weight"), total)


def cpu_step_weights(model: CausalLM, embedding: Packed | None = None
                     ) -> CpuStepWeights | None:
    """The C program's view of ``model`` (``kiln.model.step_weights.step_weights``, the one layout
    of them), or None when some projection is not packed; ``embedding``: the token embedding's
    blocks, looked up in the C step (None: the model's ``embed_tokens`` runs first)."""
    products: dict[str, Packed | None] = {}
    for i, module in enumerate(model.model.layers):
        layer = cast("DecoderLayer", module)
        attn, mlp, pre = layer.self_attn, layer.mlp, f"model.layers.{i}."
        products.update({pre + "qkv": attn.packed_qkv, pre + "o": attn.packed_o,
                         pre + "gate_up": mlp.packed_gate_up, pre + "down": mlp.packed_down})
    small = {name: p.detach() for name, p in model.named_parameters() if p.dim() == 1}
    return step_weights(model.config, products, small, head=model.packed_head, embed=embedding)


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
