"""Block-quantized weights (GGML Q4_0 / Q4_1 / Q8_0) times float32 activations on the CPU.

A :class:`PackedWeight` keeps a GGUF tensor in its 4- or 8-bit blocks and multiplies by it
without ever materialising the float32 matrix: each 32-wide block is dequantized in registers
to exactly the float32 values gguf-py's ``dequantize`` gives, so the weights are the model's
weights bit for bit; only the summation order differs from a float32 GEMM. Decode reads about
a fifth of the bytes of the float32 weights, and bytes are what bound decode on a CPU.

Kernel: ``gemm.c`` (C; AVX-512 where the CPU has it, a portable loop otherwise), compiled once
per machine by :mod:`.build`; reference and layouts: :mod:`.reference`. Each output is summed in
the same order whatever else the batch holds, so a row's result does not depend on its
neighbours.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Literal

import torch

from .build import NATIVE_FLAGS, KernelBuildError, load
from .reference import (
    TILE_BYTES,
    dequantize_q4,
    dequantize_q8,
    dequantize_tiles,
    gemm_ref,
    tile_rows,
    untile,
)

__all__ = [
    "GGML_BLOCK_BYTES",
    "NATIVE_FLAGS",
    "KernelBuildError",
    "PackedWeight",
    "dequantize_q4",
    "dequantize_q8",
    "dequantize_tiles",
    "gemm_ref",
    "kernels_available",
    "pack_ggml",
    "quant_gemm",
    "tile_rows",
    "untile",
]

Format = Literal["q4", "q8"]
# GGML block sizes in bytes (32 weights each): fp16 scale(s) + packed values.
GGML_BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q8_0": 34}

_build_errors: dict[tuple[str, ...], str] = {}  # flags -> why that build failed (not retried)


def _library(flags: tuple[str, ...]) -> ctypes.CDLL:
    """The loaded library for ``flags`` (``build.load`` caches successes)."""
    if flags in _build_errors:
        raise KernelBuildError(_build_errors[flags])
    try:
        return load(flags)
    except (KernelBuildError, OSError, AttributeError) as exc:
        _build_errors[flags] = str(exc)
        raise KernelBuildError(str(exc)) from exc


def kernels_available() -> bool:
    """Whether the C kernels could be built and loaded here (builds them on first call)."""
    try:
        _library(NATIVE_FLAGS)
    except KernelBuildError:
        return False
    return True


def counter_uniform_native(seeds: torch.Tensor, steps: torch.Tensor, vocab: int
                           ) -> torch.Tensor | None:
    """The sampler's ``counter_uniform`` (float32 [B, vocab], the same bits) from the C library
    (``counter.c``), or None where the library cannot be built."""
    try:
        lib = _library(NATIVE_FLAGS)
    except KernelBuildError:
        return None
    s = seeds.to(device="cpu", dtype=torch.int64).contiguous()
    t = steps.to(device="cpu", dtype=torch.int64).contiguous()
    out = torch.empty((s.shape[0], vocab), dtype=torch.float32)
    lib.kiln_counter_uniform(s.data_ptr(), t.data_ptr(), s.shape[0], vocab, out.data_ptr())
    return out


def quant_gemm(fmt: Format, x: torch.Tensor, tiles: torch.Tensor,
               flags: tuple[str, ...] = NATIVE_FLAGS) -> torch.Tensor:
    """``x [M, K] @ w.T`` for the tiled weight ``tiles [N/4, K/32, tile]`` -> float32 [M, N]."""
    g, nb, size = tiles.shape
    n, k = 4 * g, 32 * nb
    if x.device.type != "cpu" or x.dtype != torch.float32 or x.dim() != 2 or x.shape[1] != k:
        raise ValueError(f"x must be a float32 CPU tensor [M, {k}], got {tuple(x.shape)}")
    if size != TILE_BYTES[fmt] or tiles.dtype != torch.uint8 or not tiles.is_contiguous():
        raise ValueError(f"tiles must be contiguous uint8 [N/4, K/32, {TILE_BYTES[fmt]}]")
    x = x.contiguous()
    y = torch.empty((x.shape[0], n), dtype=torch.float32)
    if x.shape[0]:
        _library(flags).kiln_quant_gemm(int(fmt == "q8"), x.data_ptr(), x.shape[0], k,
                                        tiles.data_ptr(), n, y.data_ptr(),
                                        torch.get_num_threads())
    return y


@dataclass(frozen=True)
class PackedWeight:
    """A ``[out_features, in_features]`` weight kept as quantized tiles of 4 rows."""

    fmt: Format
    tiles: torch.Tensor  # uint8 [N/4, K/32, TILE_BYTES[fmt]]

    @property
    def out_features(self) -> int:
        return 4 * int(self.tiles.shape[0])

    @property
    def in_features(self) -> int:
        return 32 * int(self.tiles.shape[1])

    @property
    def nbytes(self) -> int:
        return self.tiles.numel()

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """``x [M, K] @ w.T`` -> float32 [M, N] (the C kernel)."""
        return quant_gemm(self.fmt, x, self.tiles)

    def dequantize(self) -> torch.Tensor:
        return dequantize_tiles(self.fmt, self.tiles)

    def dequantize_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows ``ids`` (int64, any shape) of :meth:`dequantize`, bit for bit, without the
        rest: ``[*ids.shape, in_features]`` (an embedding lookup on the blocks)."""
        flat = ids.reshape(-1).to(torch.int64).contiguous()
        k = self.in_features
        try:
            lib = _library(NATIVE_FLAGS)
        except KernelBuildError:  # the reference: the selected tiles, dequantized
            tiles = self.tiles.index_select(0, torch.div(flat, 4, rounding_mode="floor"))
            rows = dequantize_tiles(self.fmt, tiles).view(-1, 4, k)
            return rows[torch.arange(flat.numel()), flat % 4].view(*ids.shape, k)
        out = torch.empty((flat.numel(), k), dtype=torch.float32)
        bad = lib.kiln_dequant_rows(int(self.fmt == "q8"), self.tiles.data_ptr(),
                                    self.out_features, k, flat.data_ptr(), flat.numel(),
                                    out.data_ptr())
        if bad >= 0:
            raise IndexError(f"row {int(flat[bad])} is outside the {self.out_features} rows")
        return out.view(*ids.shape, k)

    @staticmethod
    def cat(parts: list[PackedWeight]) -> PackedWeight:
        """The row-wise concatenation of weights of one format and width (fused projections:
        tiles never straddle two parts, since every part has a multiple of 4 rows)."""
        if not parts or len({(p.fmt, p.in_features) for p in parts}) != 1:
            raise ValueError("can only concatenate packed weights of one format and width")
        return PackedWeight(parts[0].fmt, torch.cat([p.tiles for p in parts]).contiguous())


def _halves(blocks: torch.Tensor, at: int) -> torch.Tensor:
    """The fp16 field at byte offset ``at`` of every block, as float32 ``[N, nb]``."""
    return blocks[:, :, at:at + 2].contiguous().view(torch.float16).squeeze(-1).to(torch.float32)


def pack_ggml(raw: torch.Tensor, ggml_type: str) -> PackedWeight:
    """Pack a GGUF tensor's raw blocks (uint8 ``[N, row_bytes]``, N a multiple of 4) of type
    ``Q4_0``, ``Q4_1`` or ``Q8_0``. Q4_0 becomes q4 with ``m = -8 d`` (``d*q - 8d`` is exact)."""
    if ggml_type not in GGML_BLOCK_BYTES:
        raise ValueError(f"unsupported GGML type {ggml_type!r}")
    size = GGML_BLOCK_BYTES[ggml_type]
    if raw.dtype != torch.uint8 or raw.dim() != 2 or raw.shape[1] % size:
        raise ValueError(f"raw {ggml_type} rows must be uint8 [N, k * {size}]")
    n, nb = raw.shape[0], raw.shape[1] // size
    blocks = raw.reshape(n, nb, size)
    d = _halves(blocks, 0)
    if ggml_type == "Q8_0":
        return PackedWeight("q8", tile_rows("q8", blocks[:, :, 2:].reshape(n, nb * 32), d))
    m = _halves(blocks, 2) if ggml_type == "Q4_1" else -8.0 * d
    first = 4 if ggml_type == "Q4_1" else 2
    qs = blocks[:, :, first:first + 16].reshape(n, nb * 16)
    return PackedWeight("q4", tile_rows("q4", qs, torch.stack((d, m), dim=-1)))
