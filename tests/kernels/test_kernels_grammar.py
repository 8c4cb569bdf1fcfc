"""The grammar mask (kiln_kernels.grammar): the torch reference against the bits one by one, and
the Triton kernel against the reference, bit for bit (both only write -inf)."""

from __future__ import annotations

import pytest
import torch
from kiln_kernels.grammar import apply_token_bitmask, apply_token_bitmask_ref
from kiln_kernels.grammar.bitmask import BLOCK, apply_token_bitmask_triton


def _case(rows: int, vocab: int, mask_vocab: int, masked: list[int], dtype: torch.dtype,
          device: str, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn((rows, vocab), generator=g).to(dtype)
    words = (mask_vocab + 31) // 32
    bitmask = torch.randint(-2**31, 2**31, (len(masked), words), generator=g, dtype=torch.int64)
    return (logits.to(device), bitmask.to(torch.int32).to(device),
            torch.tensor(masked, dtype=torch.int32, device=device))


def test_the_reference_follows_the_bits() -> None:
    logits, bitmask, rows = _case(4, 100, 70, [2, 0], torch.float32, "cpu", 0)
    words = bitmask.shape[1]  # 3 words: ids 96..99 are past the mask
    before = logits.clone()
    apply_token_bitmask_ref(logits, bitmask, rows)
    for j, row in enumerate(rows.tolist()):
        for t in range(100):
            word = int(bitmask[j, t // 32]) & 0xFFFFFFFF if t < 32 * words else 0
            want = before[row, t].item() if (word >> (t % 32)) & 1 else float("-inf")
            assert logits[row, t].item() == want, (row, t)
    for row in (1, 3):  # rows without a mask keep every value
        assert torch.equal(logits[row], before[row])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("vocab", "mask_vocab"), [
    (1000, 1000),  # not a multiple of 32 nor of the block
    (BLOCK * 2 + 33, BLOCK * 2 + 5),  # padding ids past the mask: disallowed
    (200, 260),  # a mask wider than the logits: the extra bits are ignored
    (64, 64),
])
def test_triton_matches_the_reference(triton_device: str, dtype: torch.dtype, vocab: int,
                                      mask_vocab: int) -> None:
    logits, bitmask, rows = _case(5, vocab, mask_vocab, [4, 1, 2], dtype, triton_device, vocab)
    want = logits.cpu().clone()
    apply_token_bitmask_ref(want, bitmask.cpu(), rows.cpu())
    apply_token_bitmask_triton(logits, bitmask, rows)
    assert torch.equal(logits.cpu(), want)  # bit-identical: both write only -inf


def test_all_allowed_and_none_allowed(triton_device: str) -> None:
    logits, _, rows = _case(2, 100, 100, [0, 1], torch.float32, triton_device, 1)
    before = logits.clone()
    bitmask = torch.tensor([[-1] * 4, [0] * 4], dtype=torch.int32, device=triton_device)
    apply_token_bitmask_triton(logits, bitmask, rows)
    assert torch.equal(logits[0], before[0])
    assert bool(torch.isneginf(logits[1]).all())


def test_the_launcher_runs_the_reference_off_cuda() -> None:
    logits, bitmask, rows = _case(3, 90, 90, [1], torch.float32, "cpu", 2)
    want = logits.clone()
    apply_token_bitmask_ref(want, bitmask, rows)
    apply_token_bitmask(logits, bitmask, rows)
    assert torch.equal(logits, want)


@pytest.mark.parametrize("bad", ["dtype", "rows", "rows_dtype", "layout"])
def test_bad_arguments_are_refused(bad: str) -> None:
    logits, bitmask, rows = _case(3, 40, 40, [0], torch.float32, "cpu", 3)
    if bad == "dtype":
        bitmask = bitmask.to(torch.int64)
    elif bad == "rows":
        rows = torch.tensor([0, 1], dtype=torch.int32)
    elif bad == "rows_dtype":
        rows = rows.to(torch.float32)
    else:
        logits = logits.t().contiguous().t()
    with pytest.raises(ValueError):
        apply_token_bitmask_ref(logits, bitmask, rows)
