"""The grammar mask in C (kiln_kernels.grammar.native) against the torch reference, bit for bit
(both only write -inf): vocabularies that are and are not multiples of 32, masks shorter than the
vocabulary (padding ids), all-allowed and single-token words, rows in any order and rows left
out; and where the C path declines (not float32), so the caller runs the reference."""

from __future__ import annotations

import pytest
import torch
from kiln_kernels.cpu import available
from kiln_kernels.grammar import apply_token_bitmask_ref
from kiln_kernels.grammar.native import apply_token_bitmask_native

pytestmark = pytest.mark.skipif(not available(), reason="no C compiler for the kernels")


def _bitmask(n: int, words: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    raw = torch.randint(-(2**31), 2**31 - 1, (n, words), dtype=torch.int64, generator=gen)
    bitmask = raw.to(torch.int32)
    bitmask[:, 0] = -1  # a word allowing everything (every bit set)
    if words > 1:
        bitmask[:, 1] = 1 << 5  # a word allowing one token
    return bitmask


@pytest.mark.parametrize(("vocab", "words"), [(64, 2), (70, 2), (70, 3), (1000, 32),
                                              (49152, 1536)])
def test_c_equals_reference(vocab: int, words: int) -> None:
    gen = torch.Generator().manual_seed(vocab)
    logits = torch.randn(5, vocab, generator=gen)
    bitmask = _bitmask(3, words, vocab)
    rows = [4, 0, 2]  # any order; rows 1 and 3 untouched
    want, got = logits.clone(), logits.clone()
    apply_token_bitmask_ref(want, bitmask, torch.tensor(rows, dtype=torch.int32))
    assert apply_token_bitmask_native(got, bitmask, rows)
    assert torch.equal(torch.isinf(got), torch.isinf(want))
    assert torch.equal(got[torch.isfinite(got)], want[torch.isfinite(want)])
    for i in (1, 3):
        assert torch.equal(got[i], logits[i])


def test_c_declines_what_it_does_not_take() -> None:
    bitmask = torch.tensor([[1, 0]], dtype=torch.int32)
    assert not apply_token_bitmask_native(torch.randn(2, 40, dtype=torch.bfloat16), bitmask, [1])
    assert not apply_token_bitmask_native(torch.randn(2, 40), bitmask, [0, 1])  # shape mismatch


def test_c_refuses_a_row_outside_the_batch() -> None:
    with pytest.raises(IndexError):
        apply_token_bitmask_native(torch.zeros(2, 32), torch.zeros((1, 1), dtype=torch.int32), [2])
