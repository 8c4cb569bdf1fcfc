"""The products and row lookups (matmul/gemm.c, blocks*.h) are bit-identical on every build of
the ISA layer (common/isa.h) this CPU runs: each output accumulates lo * x0 then hi * x1 block by
block from zero, then one reduction tree, whatever the ISA, the register blocking or M (the
panel path from 32 rows included), in every weight format."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from kiln_kernels.cpu import available as kernels_available
from kiln_kernels.cpu import loader
from kiln_kernels.quant import FORMAT_IDS, pack_ggml, quant_gemm
from kiln_kernels.testing import random_raw
from kiln_kernels.tiling import GGML_TYPES

pytestmark = pytest.mark.skipif(not kernels_available(), reason="no C compiler for the kernels")

ISAS = loader.supported_isas()
# (M, N): M = 1..8 and 11 the register-blocked shapes and their remainders, 33 the panel path
SHAPES = [(1, 8), (2, 4), (3, 12), (5, 8), (7, 4), (8, 12), (11, 8), (33, 8)]


def _widths(ggml_type: str) -> tuple[int, ...]:
    qk = GGML_TYPES[ggml_type][0]
    return (32, 96, 608) if qk == 32 else (qk, 3 * qk)


def _bits(t: torch.Tensor) -> np.ndarray:
    return t.contiguous().numpy().view(np.uint32)


@pytest.mark.parametrize("ggml_type", sorted(GGML_TYPES))
def test_products_are_the_same_bits_on_every_isa(ggml_type: str) -> None:
    assert "plain" in ISAS
    for k in _widths(ggml_type):
        for m, n in SHAPES:
            pw = pack_ggml(random_raw(ggml_type, n, k, seed=7 * k + m), ggml_type)
            x = torch.randn(m, k, generator=torch.Generator().manual_seed(m + k))
            x[0, :3] = torch.tensor([0.0, -0.0, 1e-30])  # zeros and a tiny value among them
            want = _bits(quant_gemm(pw.fmt, x, pw.tiles, flags=loader.isa_flags("plain")))
            for isa in ISAS:
                got = _bits(quant_gemm(pw.fmt, x, pw.tiles, flags=loader.isa_flags(isa)))
                assert np.array_equal(got, want), (ggml_type, isa, m, n, k)


@pytest.mark.parametrize("ggml_type", sorted(GGML_TYPES))
def test_rows_are_the_same_bits_on_every_isa(ggml_type: str) -> None:
    k = _widths(ggml_type)[-1]
    pw = pack_ggml(random_raw(ggml_type, 12, k, seed=3), ggml_type)
    tiles = torch.as_tensor(pw.tiles).contiguous()
    ids = torch.tensor([0, 5, 11, 3, 3, 8], dtype=torch.int64)
    outs = {}
    for isa in ISAS:
        out = torch.empty((ids.numel(), k), dtype=torch.float32)
        bad = loader.library(loader.isa_flags(isa)).kiln_dequant_rows(
            FORMAT_IDS[pw.fmt], tiles.data_ptr(), 12, k, ids.data_ptr(), ids.numel(),
            out.data_ptr())
        assert bad == -1
        outs[isa] = _bits(out)
    for isa in ISAS:
        assert np.array_equal(outs[isa], outs["plain"]), (ggml_type, isa)
    # and they are the weights the products use: a one-hot x picks them out (the sums start
    # from +0, so a -0 weight comes back +0: compared as values)
    x = torch.eye(k)
    want = outs["plain"].view(np.float32)
    for isa in ISAS:
        y = quant_gemm(pw.fmt, x, pw.tiles, flags=loader.isa_flags(isa))  # [k, 12]
        assert np.array_equal(y.T[ids].contiguous().numpy(), want), (ggml_type, isa)


@pytest.mark.parametrize("ggml_type", ["Q4_0", "Q6_K", "BF16"])
def test_many_rows_taken_part_by_part_are_each_rows_own_product(ggml_type: str) -> None:
    """A prefill's rows go through the tiles a part at a time (gemm.c, rows_per_part: parts of
    64 rows at K = 3072, the last under 96 whole): each row's outputs are its product alone."""
    k, m, n = 3072, 270, 8
    pw = pack_ggml(random_raw(ggml_type, n, k, seed=5), ggml_type)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(9))
    for isa in ISAS:
        flags = loader.isa_flags(isa)
        whole = _bits(quant_gemm(pw.fmt, x, pw.tiles, flags=flags))
        alone = np.concatenate([_bits(quant_gemm(pw.fmt, x[i:i + 1], pw.tiles, flags=flags))
                                for i in range(m)])
        assert np.array_equal(whole, alone), isa
