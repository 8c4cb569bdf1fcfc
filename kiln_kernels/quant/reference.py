"""Torch references: the packed layouts written and read back, the float32 weight a packed
weight stands for, and the product the kernels compute (``x @ w.T``).

The q4 / q8 repacked layouts (the other formats keep their blocks: :mod:`.formats`).
Row blocks (GGUF order, before tiling): q4 ``qs`` uint8 [N, K/2] + ``sc`` float32 [N, K/32, 2]
(d, m); q8 ``qs`` int8 [N, K] + ``sc`` float32 [N, K/32]. Tiles (what the kernels read): rows in
groups of 4, block by block - q4: 4 x (d, m) float32 then 4 x 16 bytes (96 bytes); q8: 4 x d
float32 then 4 x 32 bytes (144 bytes).
"""

from __future__ import annotations

import torch

from ..tiling import RAW_BLOCK, TILE_BYTES
from .formats import dequantize_raw, untile_raw

__all__ = ["TILE_BYTES", "dequantize_q4", "dequantize_q8", "dequantize_tiles", "gemm_ref",
           "tile_rows", "untile"]


def tile_rows(fmt: str, qs: torch.Tensor, sc: torch.Tensor) -> torch.Tensor:
    """Row blocks -> uint8 tiles ``[N/4, K/32, TILE_BYTES[fmt]]`` (N must be a multiple of 4)."""
    n, nb = sc.shape[0], sc.shape[1]
    if n % 4:
        raise ValueError(f"{n} rows: the tiled layout needs a multiple of 4")
    scales = sc.contiguous().view(torch.uint8).reshape(n // 4, 4, nb, -1).transpose(1, 2)
    values = qs.contiguous().view(torch.uint8).reshape(n // 4, 4, nb, -1).transpose(1, 2)
    g, head = n // 4, 4 * scales.shape[-1]
    tiles = torch.empty((g, nb, head + 4 * values.shape[-1]), dtype=torch.uint8)
    tiles[:, :, :head].view(g, nb, 4, -1).copy_(scales)  # each written once, in place
    tiles[:, :, head:].view(g, nb, 4, -1).copy_(values)
    return tiles


def untile(fmt: str, tiles: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Tiles -> row blocks ``(qs, sc)`` (the inverse of :func:`tile_rows`)."""
    g, nb, _ = tiles.shape
    per_row_sc = 8 if fmt == "q4" else 4
    head = 4 * per_row_sc
    scales = tiles[:, :, :head].reshape(g, nb, 4, per_row_sc).transpose(1, 2).contiguous()
    values = tiles[:, :, head:].reshape(g, nb, 4, -1).transpose(1, 2).contiguous()
    n = 4 * g
    sc = scales.view(torch.float32).reshape(n, nb, 2) if fmt == "q4" else (
        scales.view(torch.float32).reshape(n, nb))
    qs = values.reshape(n, -1)
    return (qs if fmt == "q4" else qs.view(torch.int8)), sc


def dequantize_q4(qs: torch.Tensor, sc: torch.Tensor) -> torch.Tensor:
    """qs uint8 [N, K/2], sc float32 [N, K/32, 2] (d, m) -> float32 [N, K]; w = d * q + m."""
    n, nb = sc.shape[0], sc.shape[1]
    blocks = qs.view(n, nb, 16)
    q = torch.cat((blocks & 0x0F, blocks >> 4), dim=2).to(torch.float32)  # [N, nb, 32]
    w = torch.addcmul(sc[:, :, 1:2], sc[:, :, 0:1], q)  # d * q + m, one rounding (d*q exact)
    return w.reshape(n, nb * 32)


def dequantize_q8(qs: torch.Tensor, sc: torch.Tensor) -> torch.Tensor:
    """qs int8 [N, K], sc float32 [N, K/32] -> float32 [N, K]; w = d * q."""
    n, nb = sc.shape
    return (qs.view(n, nb, 32).to(torch.float32) * sc[:, :, None]).reshape(n, nb * 32)


def dequantize_tiles(fmt: str, tiles: torch.Tensor) -> torch.Tensor:
    """The float32 weight ``[N, K]`` of tiles of any format (:mod:`.formats`)."""
    if fmt in RAW_BLOCK:
        return dequantize_raw(fmt, untile_raw(tiles, RAW_BLOCK[fmt]))
    qs, sc = untile(fmt, tiles)
    return dequantize_q4(qs, sc) if fmt == "q4" else dequantize_q8(qs, sc)


def gemm_ref(fmt: str, x: torch.Tensor, tiles: torch.Tensor) -> torch.Tensor:
    """What the kernels compute: ``x [M, K] @ w.T`` -> float32 [M, N]."""
    return x @ dequantize_tiles(fmt, tiles).t()
