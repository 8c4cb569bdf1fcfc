"""The grammar mask in Triton: one program per (bitmask row, block of token ids)."""

# Triton @jit functions cannot carry Python type annotations (Triton reads them itself).
# mypy: disable-error-code="untyped-decorator,no-untyped-def"
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .reference import check_bitmask_args

BLOCK = 1024  # token ids per program


@triton.jit
def _kernel(
    logits_ptr, mask_ptr, rows_ptr,
    V, W, stride_row,
    BLOCK: tl.constexpr,
):  # fmt: skip
    j = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    in_vocab = offs < V
    word = offs // 32
    # a token past the mask's words reads 0: disallowed (padding beyond the tokenizer's vocab)
    bits = tl.load(mask_ptr + j * W + word, mask=in_vocab & (word < W), other=0)
    allowed = ((bits >> (offs % 32).to(tl.int32)) & 1) != 0
    row = tl.load(rows_ptr + j).to(tl.int64)
    ninf = tl.full([BLOCK], float("-inf"), dtype=logits_ptr.dtype.element_ty)
    tl.store(logits_ptr + row * stride_row + offs, ninf, mask=in_vocab & ~allowed)


def apply_token_bitmask_triton(logits: torch.Tensor, bitmask: torch.Tensor,
                               rows: torch.Tensor) -> None:
    """In place; same contract as ``apply_token_bitmask_ref``."""
    check_bitmask_args(logits, bitmask, rows)
    n, vocab = int(bitmask.shape[0]), int(logits.shape[1])
    if n == 0 or vocab == 0:
        return
    _kernel[(n, triton.cdiv(vocab, BLOCK))](
        logits, bitmask, rows, vocab, int(bitmask.shape[1]), logits.stride(0), BLOCK=BLOCK)
