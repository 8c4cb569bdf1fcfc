"""Block-quantized weights (GGML Q4_0 / Q4_1 / Q8_0 / Q5_0 / Q5_1 / Q2_K ... Q6_K, and
F16 / BF16 / F32) times float32 activations on the CPU.

A :class:`PackedWeight` keeps a GGUF tensor in its blocks (:mod:`.formats`) and multiplies by it
without ever materialising the float32 matrix: each 32-wide block is dequantized in registers
(32 weights at a time) to exactly the float32 values gguf-py's ``dequantize`` gives, so the
weights are the model's weights bit for bit; only the summation order differs from a float32
GEMM. Decode reads a fifth to a third of the bytes of the float32 weights, and bytes are what
bound decode on a CPU. A :class:`PackedConcat` is a row-wise concatenation of weights in
different formats (a fused q/k/v projection whose parts the file quantized differently).

Kernel: ``kiln_kernels/cpu/matmul/gemm.c`` (C; AVX-512 where the CPU has it, a portable loop
otherwise), compiled once per machine by :mod:`kiln_kernels.cpu`; reference and layouts: :mod:`.reference`. Each output is summed in
the same order whatever else the batch holds, so a row's result does not depend on its
neighbours.

Importing this package does not import torch: a :class:`PackedWeight` over numpy tiles gives
its shape and bytes, concatenates (:meth:`PackedWeight.cat`) and feeds the C step
(:mod:`kiln_kernels.cpu.cpu_step`) without it. What computes in torch (products, dequantizing,
packing torch tensors, the torch references of :mod:`.reference`, imported on first use as
PEP 562 names) imports torch when called.
"""

from __future__ import annotations

import importlib
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, cast

import numpy as np

from ..cpu import NATIVE_FLAGS, KernelBuildError, library, threads
from ..cpu.arrays import addr, dtype_name, is_contiguous, is_numpy, shape
from ..tiling import (
    FORMAT_IDS,
    GGML_FORMAT,
    GGML_TYPES,
    QK,
    TILE_BYTES,
    tile_ggml,
)

if TYPE_CHECKING:
    import torch

    from .reference import (
        dequantize_q4,
        dequantize_q8,
        dequantize_tiles,
        gemm_ref,
        tile_rows,
        untile,
    )

_REFERENCE = ("dequantize_q4", "dequantize_q8", "dequantize_tiles", "gemm_ref", "tile_rows",
              "untile")

__all__ = [
    "DENSE_FORMATS",
    "FORMAT_IDS",
    "GGML_BLOCK_BYTES",
    "GGML_FORMAT",
    "GGML_TYPES",
    "MAX_PARTS",
    "NATIVE_FLAGS",
    "QK",
    "TILE_BYTES",
    "KernelBuildError",
    "Packed",
    "PackedConcat",
    "PackedWeight",
    "dequantize_q4",
    "dequantize_q8",
    "dequantize_tiles",
    "gemm_ref",
    "pack_dense",
    "pack_ggml",
    "quant_gemm",
    "tile_rows",
    "untile",
]

Format = Literal["q4", "q8", "q5_0", "q5_1", "q4_k", "q5_k", "q6_k", "f16", "bf16", "f32",
                 "q2_k", "q3_k", "iq4_nl", "iq4_xs"]
# GGML block sizes in bytes of the 32-weight types repacked as q4 / q8: fp16 scale(s) + values.
GGML_BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q8_0": 34}


def __getattr__(name: str) -> Any:
    if name in _REFERENCE:  # the torch references, imported (with torch) on first use
        return getattr(importlib.import_module(f"{__name__}.reference"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


Tiles = Any  # uint8 [N/4, K/qk, tile]: a numpy array or a CPU torch tensor


def _torch_tiles(tiles: Tiles) -> torch.Tensor:
    """Tiles as a torch tensor (numpy tiles shared, not copied; only read, so read-only ones
    without torch's warning)."""
    import torch

    if not is_numpy(tiles):
        return cast("torch.Tensor", tiles)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(tiles)


def quant_gemm(fmt: Format, x: torch.Tensor, tiles: Tiles,
               flags: tuple[str, ...] = NATIVE_FLAGS) -> torch.Tensor:
    """``x [M, K] @ w.T`` for the tiled weight ``tiles [N/4, K/qk, tile]`` -> float32 [M, N]."""
    import torch

    g, nb, size = shape(tiles)
    n, k = 4 * g, QK[fmt] * nb
    if x.device.type != "cpu" or x.dtype != torch.float32 or x.dim() != 2 or x.shape[1] != k:
        raise ValueError(f"x must be a float32 CPU tensor [M, {k}], got {tuple(x.shape)}")
    if size != TILE_BYTES[fmt] or dtype_name(tiles) != "uint8" or not is_contiguous(tiles):
        raise ValueError(f"tiles must be contiguous uint8 [N/4, K/{QK[fmt]}, {TILE_BYTES[fmt]}]")
    x = x.contiguous()
    y = torch.empty((x.shape[0], n), dtype=torch.float32)
    if x.shape[0]:
        library(flags).kiln_quant_gemm(FORMAT_IDS[fmt], x.data_ptr(), x.shape[0], k,
                                        addr(tiles), n, y.data_ptr(), threads())
    return y


@dataclass(frozen=True)
class PackedWeight:
    """A ``[out_features, in_features]`` weight kept as quantized tiles of 4 rows (a numpy
    array or a torch tensor: the products and dequantizing take either, through torch)."""

    fmt: Format
    tiles: Tiles  # uint8 [N/4, K/QK[fmt], TILE_BYTES[fmt]]

    @property
    def out_features(self) -> int:
        return 4 * int(self.tiles.shape[0])

    @property
    def in_features(self) -> int:
        return QK[self.fmt] * int(self.tiles.shape[1])

    @property
    def parts(self) -> tuple[PackedWeight, ...]:
        return (self,)

    @property
    def nbytes(self) -> int:
        return int(self.tiles.size) if is_numpy(self.tiles) else int(self.tiles.numel())

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """``x [M, K] @ w.T`` -> float32 [M, N] (the C kernel)."""
        return quant_gemm(self.fmt, x, self.tiles)

    def dequantize(self) -> torch.Tensor:
        from .reference import dequantize_tiles

        return dequantize_tiles(self.fmt, _torch_tiles(self.tiles))

    def dequantize_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows ``ids`` (int64, any shape) of :meth:`dequantize`, bit for bit, without the
        rest: ``[*ids.shape, in_features]`` (an embedding lookup on the blocks)."""
        import torch

        flat = ids.reshape(-1).to(torch.int64).contiguous()
        k = self.in_features
        try:
            lib = library(NATIVE_FLAGS)
        except KernelBuildError:  # the reference: the selected tiles, dequantized
            if bool(((flat < 0) | (flat >= self.out_features)).any()):
                raise IndexError(f"an id is outside the {self.out_features} rows") from None
            tiles = _torch_tiles(self.tiles).index_select(
                0, torch.div(flat, 4, rounding_mode="floor"))
            rows = PackedWeight(self.fmt, tiles).dequantize().view(-1, 4, k)
            return rows[torch.arange(flat.numel()), flat % 4].view(*ids.shape, k)
        out = torch.empty((flat.numel(), k), dtype=torch.float32)
        bad = lib.kiln_dequant_rows(FORMAT_IDS[self.fmt], addr(self.tiles),
                                    self.out_features, k, flat.data_ptr(), flat.numel(),
                                    out.data_ptr())
        if bad >= 0:
            raise IndexError(f"row {int(flat[bad])} is outside the {self.out_features} rows")
        return out.view(*ids.shape, k)

    @staticmethod
    def cat(parts: list[Packed]) -> Packed:
        """The row-wise concatenation of weights of one width (fused projections): a
        :class:`PackedConcat` of their parts, which the products read where they lie (no copy:
        fusing the default model's q/k/v and gate/up had copied every tile a second time, 67 ms
        of its 300 ms load); a single part as it is. Past ``MAX_PARTS`` parts, neighbours of
        one format are merged into one buffer (tiles never straddle two parts, since every
        part has a multiple of 4 rows): numpy tiles with numpy, torch tiles with torch."""
        flat = [p for part in parts for p in part.parts]
        if not flat or len({p.in_features for p in flat}) != 1:
            raise ValueError("can only concatenate packed weights of one width")
        if len(flat) == 1:
            return flat[0]
        if len(flat) <= MAX_PARTS:
            return PackedConcat(tuple(flat))
        merged: list[PackedWeight] = []
        for p in flat:
            if merged and merged[-1].fmt == p.fmt:
                merged[-1] = PackedWeight(p.fmt, _cat_tiles(merged[-1].tiles, p.tiles))
            else:
                merged.append(p)
        if len(merged) > MAX_PARTS:
            raise ValueError(f"more than {MAX_PARTS} parts of different formats")
        return merged[0] if len(merged) == 1 else PackedConcat(tuple(merged))


MAX_PARTS = 4  # KILN_MAX_PARTS in quant.h


def _cat_tiles(a: Tiles, b: Tiles) -> Tiles:
    """Two tile buffers one after the other (numpy where both are numpy, else torch)."""
    if is_numpy(a) and is_numpy(b):
        return np.concatenate([a, b])
    import torch

    return torch.cat([_torch_tiles(a), _torch_tiles(b)])


@dataclass(frozen=True)
class PackedConcat:
    """Packed weights (each part in its own format and buffer) stacked row-wise: ``[sum of
    rows, in_features]``. Its product is its parts' products side by side (the C step runs them
    as one product over the parts, reading each where it lies)."""

    parts: tuple[PackedWeight, ...]

    @property
    def out_features(self) -> int:
        return sum(p.out_features for p in self.parts)

    @property
    def in_features(self) -> int:
        return self.parts[0].in_features

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.parts)

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        import torch

        return torch.cat([p.matmul(x) for p in self.parts], dim=1)

    def dequantize(self) -> torch.Tensor:
        import torch

        return torch.cat([p.dequantize() for p in self.parts])

    def dequantize_rows(self, ids: torch.Tensor) -> torch.Tensor:
        return self.dequantize()[ids]


Packed = PackedWeight | PackedConcat


def pack_ggml(raw: torch.Tensor, ggml_type: str) -> PackedWeight:
    """Pack a GGUF tensor's raw blocks (uint8 ``[N, row_bytes]``, N a multiple of 4) of a type in
    :data:`GGML_TYPES` (the layout: :func:`kiln_kernels.tiling.tile_ggml`)."""
    import torch

    if raw.dtype != torch.uint8:
        raise ValueError(f"raw {ggml_type} rows must be uint8")
    fmt, tiles = tile_ggml(raw.detach().numpy(), ggml_type)
    return PackedWeight(fmt, torch.from_numpy(tiles))  # type: ignore[arg-type]


# The dense formats by element type name (dtype_name: "float16" for torch.float16 too).
DENSE_FORMATS = {"float16": "f16", "bfloat16": "bf16", "float32": "f32"}


def pack_dense(w: torch.Tensor) -> PackedWeight:
    """Tile a float16 / bfloat16 / float32 matrix ``[N, K]`` (N a multiple of 4, K of 32) as it
    is: two (or four) bytes a weight, widened exactly in registers."""
    import torch

    fmt = DENSE_FORMATS.get(dtype_name(w))
    if fmt is None or w.dim() != 2 or w.shape[1] % 32 or not w.shape[1]:
        raise ValueError(f"cannot tile a {w.dtype} tensor of shape {tuple(w.shape)}")
    raw = w.contiguous().view(torch.uint8).reshape(w.shape[0], -1)
    _, tiles = tile_ggml(raw.detach().numpy(), fmt.upper())  # F16, BF16, F32: blocks as they are
    return PackedWeight(fmt, torch.from_numpy(tiles))  # type: ignore[arg-type]
