"""Block-quantized GGUF weights on the CPU.

A GGUF model's matrices in the formats of ``kiln_kernels.quant`` (Q4_0, Q4_1, Q8_0, Q5_0, Q5_1,
Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, F16, BF16, F32) are kept as :class:`~kiln_kernels.quant.PackedWeight` blocks
(q/k/v and gate/up fused row-wise, as a ``PackedConcat`` where their formats differ), holding
gguf-py's float32 values bit for bit.

- When every projection and the head are packed, every step runs in C (``CpuStep`` and
  ``cpu_step_weights``, the C program's view of the weights, of :mod:`kiln.model.cpu_step`) and
  the projections' float32 copies are released (:mod:`kiln.model.float32_copies`): the torch
  path, a fallback there, multiplies every row by the blocks. A packed token embedding (the
  head, when tied) is released too: lookups dequantize their rows (:class:`PackedEmbedding`).
- Otherwise the torch path keeps both: decode rows (a sequence's one new token) are multiplied
  by the packed blocks, reading ~1/6 of the bytes, and prefill rows by the float32 weights. The
  two products differ only in summation order (~1e-6 relative), and which one a row gets
  depends on that row alone (decode or not), never on the rest of the batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from kiln_kernels.quant import Packed, PackedWeight
from torch import nn

from kiln.model.native.step_weights import fuse


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
    """The token embedding read from packed blocks (``kiln.model.float32_copies``'s
    ``release_float32``): each lookup dequantizes only its rows, gguf-py's values bit for bit.
    ``weight`` is a meta placeholder of the table's shape, or the float32 table while
    ``packed_disabled`` holds it."""

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
    when ``release_float32`` left only a placeholder of ``weight``)."""
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


def packed_parts(packed: dict[str, PackedWeight], num_layers: int, tied: bool) -> PackedParts:
    """Where ``packed`` (keyed by HF parameter names; the head is ``lm_head.weight``, or
    ``model.embed_tokens.weight`` when ``tied``) goes in a model of ``num_layers`` layers.
    Projections whose weights are not all packed stay on float32."""
    layers = []
    total = 0
    for i in range(num_layers):
        pre = f"model.layers.{i}."
        row = (fuse(packed, [f"{pre}self_attn.{p}_proj.weight" for p in "qkv"]),
               packed.get(f"{pre}self_attn.o_proj.weight"),
               fuse(packed, [f"{pre}mlp.gate_proj.weight", f"{pre}mlp.up_proj.weight"]),
               packed.get(f"{pre}mlp.down_proj.weight"))
        total += sum(p.nbytes for p in row if p is not None)
        layers.append(row)
    head_name = "model.embed_tokens.weight" if tied else "lm_head.weight"
    head = packed.get(head_name)
    if head is not None:
        total += head.nbytes
    return PackedParts(tuple(layers), head, packed.get("model.embed_tokens.weight"), total)
