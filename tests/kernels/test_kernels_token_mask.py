"""The grammar token mask (kiln_kernels.token_mask): the C kernel against the torch reference,
bit for bit (both only write -inf), on vocabularies that are and are not multiples of 32, masks
shorter than the vocabulary (padding ids), all-allowed and single-token words, and rows left out.
Also the reference against a plain Python reading of llguidance's bit layout."""

from __future__ import annotations

import pytest
import torch
from kiln_kernels.cpu import available
from kiln_kernels.token_mask import apply_token_mask, apply_token_mask_ref, disallowed
from kiln_kernels.token_mask.native import apply_token_mask_native


def _masks(n: int, words: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    raw = torch.randint(-(2**31), 2**31 - 1, (n, words), dtype=torch.int64, generator=gen)
    masks = raw.to(torch.int32)
    masks[:, 0] = -1  # a word allowing everything (every bit set)
    if words > 1:
        masks[:, 1] = 1 << 5  # a word allowing one token
    return masks


def test_reference_reads_llguidance_layout() -> None:
    masks = torch.tensor([[0b1001, -1]], dtype=torch.int32)  # tokens 0, 3 and 32..63 allowed
    block = disallowed(masks, 70)
    allowed = [t for t in range(70) if not block[0, t]]
    assert allowed == [0, 3, *range(32, 64)]  # 64..69 lie past the mask: padding


@pytest.mark.skipif(not available(), reason="no C compiler for the kernels")
@pytest.mark.parametrize(("vocab", "words"), [(64, 2), (70, 2), (70, 3), (1000, 32), (49152, 1536)])
def test_c_equals_reference(vocab: int, words: int) -> None:
    gen = torch.Generator().manual_seed(vocab)
    logits = torch.randn(5, vocab, generator=gen)
    masks = _masks(3, words, vocab)
    rows = [4, 0, 2]  # any order; rows 1 and 3 untouched
    want, got = logits.clone(), logits.clone()
    apply_token_mask_ref(want, masks, rows)
    assert apply_token_mask_native(got, masks, rows)
    assert torch.equal(torch.isinf(got), torch.isinf(want))
    assert torch.equal(got[torch.isfinite(got)], want[torch.isfinite(want)])
    for i in (1, 3):
        assert torch.equal(got[i], logits[i])


def test_launcher_falls_back_off_the_c_path() -> None:
    logits = torch.randn(2, 40, dtype=torch.float64)  # not float32: the reference runs
    masks = torch.tensor([[1, 0]], dtype=torch.int32)
    assert not apply_token_mask_native(logits.clone(), masks, [1])
    apply_token_mask(logits, masks, [1], impl="c")
    assert torch.isfinite(logits[1]).nonzero().flatten().tolist() == [0]
    assert torch.isfinite(logits[0]).all()


@pytest.mark.skipif(not available(), reason="no C compiler for the kernels")
def test_c_refuses_a_row_outside_the_batch() -> None:
    with pytest.raises(IndexError):
        apply_token_mask_native(torch.zeros(2, 32), torch.zeros((1, 1), dtype=torch.int32), [2])
