"""The formats kept as the file's own blocks (Q5_0, Q5_1, Q2_K ... Q6_K, F16, BF16, F32, IQ4_NL,
IQ4_XS): their weights are gguf-py's bit for bit (torch reference, C row lookups, the products'
own dequantization), the tiles hold the file's blocks, and weights of different formats stack
row-wise into one product. Products against the reference and batch invariance, for these and
every other format: test_kernels_quant.py."""

from __future__ import annotations

import pytest
import torch
from kiln_kernels.cpu import available as kernels_available
from kiln_kernels.quant import (
    GGML_TYPES,
    PackedConcat,
    PackedWeight,
    pack_ggml,
)
from kiln_kernels.quant.formats import untile_raw
from kiln_kernels.testing import random_raw
from kiln_kernels.tiling import RAW_BLOCK

from tests.gguf_blocks import gguf_dequantize

pytestmark = pytest.mark.skipif(not kernels_available(), reason="no C compiler for the kernels")

NEW_TYPES = ["Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "F16", "BF16", "F32",
             "IQ4_NL", "IQ4_XS"]


def width(ggml_type: str, blocks: int) -> int:
    return GGML_TYPES[ggml_type][0] * blocks


@pytest.mark.parametrize("ggml_type", NEW_TYPES)
def test_weights_are_gguf_bit_for_bit(ggml_type: str) -> None:
    """The torch reference (dequantize) and the C lookups (dequantize_rows, every row of every
    tile, repeats) give gguf-py's float32 values, bit for bit (compared as integers, so NaN-free
    and signed zeros included)."""
    k = width(ggml_type, 3)
    raw = random_raw(ggml_type, 12, k, seed=3)
    pw = pack_ggml(raw, ggml_type)
    assert (pw.out_features, pw.in_features) == (12, k)
    want = gguf_dequantize(raw, ggml_type)
    assert torch.equal(pw.dequantize().view(torch.int32), want.view(torch.int32))
    ids = torch.tensor([[0, 1, 2, 3], [11, 5, 5, 8]])
    assert torch.equal(pw.dequantize_rows(ids).view(torch.int32), want[ids].view(torch.int32))
    with pytest.raises(IndexError):
        pw.dequantize_rows(torch.tensor([12]))


@pytest.mark.parametrize("ggml_type", NEW_TYPES)
def test_products_use_gguf_weights_bit_for_bit(ggml_type: str) -> None:
    """The in-register dequantization itself: one-hot activation rows pick single weights out
    of the products, which must then be gguf-py's values exactly (every other term is a zero
    product); K rows take the L1-panel path, 5 rows the register-blocked one."""
    k = width(ggml_type, 2)
    raw = random_raw(ggml_type, 8, k, seed=7)
    want = gguf_dequantize(raw, ggml_type).t()  # [K, N]: row i is every weight of column i
    got = pack_ggml(raw, ggml_type).matmul(torch.eye(k))
    nonzero = want != 0  # a zero weight's sign can go either way in the sum
    assert torch.equal(got[nonzero], want[nonzero])
    few = pack_ggml(raw, ggml_type).matmul(torch.eye(k)[3:8].contiguous())
    assert torch.equal(few[nonzero[3:8]], want[3:8][nonzero[3:8]])


@pytest.mark.parametrize("ggml_type", NEW_TYPES)
def test_tiles_hold_the_files_blocks(ggml_type: str) -> None:
    """The tiles are the rows' blocks, byte for byte, only interleaved 4 rows at a time."""
    raw = random_raw(ggml_type, 8, width(ggml_type, 2), seed=1)
    pw = pack_ggml(raw, ggml_type)
    assert pw.nbytes == raw.numel()
    assert torch.equal(untile_raw(pw.tiles, RAW_BLOCK[pw.fmt]).reshape(8, -1), raw)


def test_weights_of_different_formats_stack_row_wise() -> None:
    """A fused projection whose parts the file stores in different types (Q4_K_M: q/k in Q4_K,
    v in Q6_K): one PackedConcat of the parts as they lie (no copy), its product the parts'
    products side by side, bit for bit; different widths are refused."""
    q = pack_ggml(random_raw("Q4_K", 8, 256, seed=1), "Q4_K")
    k = pack_ggml(random_raw("Q4_K", 4, 256, seed=2), "Q4_K")
    v = pack_ggml(random_raw("Q6_K", 4, 256, seed=3), "Q6_K")
    qkv = PackedWeight.cat([q, k, v])
    assert isinstance(qkv, PackedConcat)
    assert [p.fmt for p in qkv.parts] == ["q4_k", "q4_k", "q6_k"]
    assert [p.tiles.data_ptr() for p in qkv.parts] == [w.tiles.data_ptr() for w in (q, k, v)]
    assert (qkv.out_features, qkv.in_features) == (16, 256)
    x = torch.randn(5, 256)
    assert torch.equal(qkv.matmul(x), torch.cat([q.matmul(x), k.matmul(x), v.matmul(x)], dim=1))
    assert torch.equal(qkv.dequantize(), torch.cat([q.dequantize(), k.dequantize(),
                                                    v.dequantize()]))
    with pytest.raises(ValueError):
        PackedWeight.cat([q, pack_ggml(random_raw("Q5_0", 4, 512), "Q5_0")])


def test_bad_raw_blocks_are_refused() -> None:
    with pytest.raises(ValueError):
        pack_ggml(torch.zeros(4, 100, dtype=torch.uint8), "Q4_K")  # not whole super-blocks
    with pytest.raises(ValueError):
        pack_ggml(torch.zeros(4, 100, dtype=torch.uint8), "Q3_K")
    with pytest.raises(ValueError):
        pack_ggml(torch.zeros(6, 210, dtype=torch.uint8), "Q6_K")  # rows not in fours
    with pytest.raises(ValueError):
        pack_ggml(torch.zeros(4, 110, dtype=torch.uint8), "IQ3_S")  # no kernel
