"""The CPU quantized-weight kernels (kiln_kernels.quant) against their torch references and
gguf-py: packing is exact; products match the dequantized GEMM (native and portable builds) and
rows never depend on the batch, in every format (those of test_kernels_formats.py too)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from kiln_kernels import quant
from kiln_kernels.cpu import PORTABLE_FLAGS
from kiln_kernels.cpu import available as kernels_available
from kiln_kernels.quant import (
    GGML_BLOCK_BYTES,
    MAX_PARTS,
    PackedConcat,
    PackedWeight,
    gemm_ref,
    pack_ggml,
    quant_gemm,
    tile_rows,
    untile,
)
from kiln_kernels.testing import random_raw
from kiln_kernels.tiling import GGML_TYPES

from tests.gguf_blocks import gguf_dequantize
from tests.numerics import matmul_bound

pytestmark = pytest.mark.skipif(not kernels_available(), reason="no C compiler for the kernels")


# the widths of the products: the tiled 32-weight formats one block, the model's width and more
# than one chunk; the formats kept as the file's blocks one and three blocks
GEMM_WIDTHS = [(t, k) for t, (qk, _) in sorted(GGML_TYPES.items())
               for k in ((32, 576, 1088) if t in GGML_BLOCK_BYTES else (qk, 3 * qk))]
# the widths of the batch test: the 32-weight formats over more than one chunk (1088 = 34
# blocks), the others two 256-weight blocks (or 512 plain floats)
BATCH_K = {"Q4_0": 1088, "Q4_1": 1088, "Q8_0": 1088}


@pytest.mark.parametrize("ggml_type", sorted(GGML_BLOCK_BYTES))
def test_packing_gives_gguf_weights_bit_for_bit(ggml_type: str) -> None:
    raw = random_raw(ggml_type, 12, 96)
    pw = pack_ggml(raw, ggml_type)
    assert (pw.out_features, pw.in_features) == (12, 96)
    assert torch.equal(pw.dequantize(), gguf_dequantize(raw, ggml_type))


@pytest.mark.parametrize("fmt_type", ["Q4_1", "Q8_0"])
def test_tiles_round_trip(fmt_type: str) -> None:
    pw = pack_ggml(random_raw(fmt_type, 8, 64), fmt_type)
    qs, sc = untile(pw.fmt, pw.tiles)
    assert torch.equal(tile_rows(pw.fmt, qs, sc), pw.tiles)


@pytest.mark.parametrize(("ggml_type", "k"), GEMM_WIDTHS)
# every pass shape (1..12 rows), and 13, 24, 33 rows (split into passes; the L1 panel from 32)
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 24, 33])
def test_gemm_matches_reference(ggml_type: str, k: int, m: int) -> None:
    """Every format, the AVX-512 (native) build."""
    pw = pack_ggml(random_raw(ggml_type, 20, k, seed=k + m), ggml_type)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
    got = pw.matmul(x)
    assert got.shape == (m, 20)
    # the same float32 weights summed in another order: 2 gamma_k * sum |terms| (numerics.py)
    assert bool(((got - gemm_ref(pw.fmt, x, pw.tiles)).abs()
                 <= matmul_bound(x, pw.dequantize())).all())


@pytest.mark.parametrize("ggml_type", sorted(GGML_TYPES))
def test_a_row_never_depends_on_the_batch(ggml_type: str) -> None:
    """Every format: bit-identical rows alone, in every pass shape and across passes."""
    k = BATCH_K.get(ggml_type, 512)
    pw = pack_ggml(random_raw(ggml_type, 16, k, seed=4), ggml_type)
    x = torch.randn(37, k, generator=torch.Generator().manual_seed(1))
    full = pw.matmul(x)
    for i in range(37):
        assert torch.equal(full[i], pw.matmul(x[i:i + 1].clone())[0])
    for n in range(2, 26):  # every pass shape, and splits into 2 and 3 passes
        assert torch.equal(full[3:3 + n], pw.matmul(x[3:3 + n].clone()))
    assert torch.equal(full, torch.cat([pw.matmul(x[:13].clone()), pw.matmul(x[13:].clone())]))


@pytest.mark.parametrize("ggml_type", sorted(GGML_TYPES))
def test_portable_build_matches_reference(ggml_type: str) -> None:
    """Every format, the portable build (two blocks wide)."""
    k = 2 * GGML_TYPES[ggml_type][0]
    pw = pack_ggml(random_raw(ggml_type, 8, k, seed=2), ggml_type)
    x = torch.randn(3, k, generator=torch.Generator().manual_seed(2))
    got = quant_gemm(pw.fmt, x, pw.tiles, flags=PORTABLE_FLAGS)
    # another summation order over the same weights (numerics.matmul_bound)
    assert bool(((got - gemm_ref(pw.fmt, x, pw.tiles)).abs()
                 <= matmul_bound(x, pw.dequantize())).all())


def test_fused_projection_is_the_concatenation() -> None:
    a = pack_ggml(random_raw("Q4_1", 8, 64, seed=1), "Q4_1")
    b = pack_ggml(random_raw("Q4_1", 4, 64, seed=2), "Q4_1")
    both = PackedWeight.cat([a, b])
    x = torch.randn(2, 64)
    assert torch.equal(both.matmul(x), torch.cat([a.matmul(x), b.matmul(x)], dim=1))
    c = pack_ggml(random_raw("Q8_0", 4, 64), "Q8_0")  # another format: a PackedConcat
    assert torch.equal(PackedWeight.cat([a, c]).matmul(x), torch.cat([a.matmul(x), c.matmul(x)],
                                                                     dim=1))
    with pytest.raises(ValueError):  # another width
        PackedWeight.cat([a, pack_ggml(random_raw("Q8_0", 4, 96), "Q8_0")])


def test_more_parts_than_the_step_takes_merge_neighbours_of_one_format() -> None:
    """Past MAX_PARTS parts, neighbours of one format share one buffer (the product is still
    the parts' products side by side); past MAX_PARTS formats the fusion is refused."""
    q4 = [pack_ggml(random_raw("Q4_1", 4, 64, seed=s), "Q4_1") for s in range(MAX_PARTS + 1)]
    x = torch.randn(3, 64)
    want = torch.cat([p.matmul(x) for p in q4], dim=1)
    merged = PackedWeight.cat(list(q4))
    assert isinstance(merged, PackedWeight)
    assert torch.equal(merged.matmul(x), want)
    q8 = pack_ggml(random_raw("Q8_0", 4, 64, seed=9), "Q8_0")
    mixed = PackedWeight.cat([*q4[:MAX_PARTS], q8])
    assert isinstance(mixed, PackedConcat) and [p.fmt for p in mixed.parts] == ["q4", "q8"]
    assert torch.equal(mixed.matmul(x), torch.cat([want[:, :4 * MAX_PARTS], q8.matmul(x)], 1))
    with pytest.raises(ValueError):
        PackedWeight.cat([q4[0], q8] * 3)


def test_bad_inputs_are_refused() -> None:
    pw = pack_ggml(random_raw("Q8_0", 4, 64), "Q8_0")
    with pytest.raises(ValueError):
        pw.matmul(torch.randn(2, 32))  # wrong width
    with pytest.raises(ValueError):
        pw.matmul(torch.randn(2, 64, dtype=torch.float64))
    with pytest.raises(ValueError):
        pack_ggml(torch.zeros(4, 30, dtype=torch.uint8), "Q4_1")  # not whole blocks
    with pytest.raises(ValueError):
        pack_ggml(torch.zeros(4, 20, dtype=torch.uint8), "Q5_K")
    with pytest.raises(ValueError):
        tile_rows("q4", torch.zeros(6, 16, dtype=torch.uint8), torch.zeros(6, 1, 2))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
def test_kernels_share_torchs_openmp_runtime() -> None:
    maps = Path("/proc/self/maps").read_text().splitlines()
    runtimes = {line.split()[-1] for line in maps if "libgomp" in line or "libiomp" in line}
    assert len(runtimes) <= 1, runtimes


@pytest.mark.parametrize("ggml_type", sorted(GGML_BLOCK_BYTES))
def test_rows_dequantize_alone_as_in_the_whole(ggml_type: str,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """An embedding lookup on the blocks: rows ``ids`` (any shape, repeats, every row of a
    tile) are :meth:`dequantize`'s rows bit for bit, from C and from the torch reference; an id
    outside the rows is refused."""
    pw = pack_ggml(random_raw(ggml_type, 24, 96, seed=5), ggml_type)
    whole = pw.dequantize()
    ids = torch.tensor([[0, 1, 2, 3], [23, 5, 5, 12]])
    assert torch.equal(pw.dequantize_rows(ids), whole[ids])
    with pytest.raises(IndexError):
        pw.dequantize_rows(torch.tensor([3, 24]))
    with pytest.raises(IndexError):
        pw.dequantize_rows(torch.tensor([-1]))

    def unavailable(flags: tuple[str, ...]) -> None:
        raise quant.KernelBuildError("no compiler here")

    monkeypatch.setattr(quant, "library", unavailable)
    assert torch.equal(pw.dequantize_rows(ids), whole[ids])
