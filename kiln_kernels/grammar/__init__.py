"""Grammar token masks: a constrained row's disallowed tokens set to -inf, in place.

``apply_token_bitmask(logits, bitmask, rows)``: ``logits`` [R, V] (float32, bfloat16 or float16,
unit stride along V), ``bitmask`` int32 [N, W] in llguidance's layout (bit ``t % 32`` of word
``t // 32`` set = token ``t`` allowed), ``rows`` [N] int32/int64, distinct: the logits row each
bitmask row applies to. Every token of those rows whose bit is clear, and every token id at or
past ``32 * W`` (padding beyond the tokenizer's vocabulary), becomes -inf; nothing else is
written. Triton on CUDA tensors, the torch reference otherwise; both write only -inf, so their
results are identical.
"""

from __future__ import annotations

import torch

from .reference import apply_token_bitmask_ref, check_bitmask_args

__all__ = ["apply_token_bitmask", "apply_token_bitmask_ref", "check_bitmask_args"]


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor) -> None:
    """In place: see the module doc."""
    if logits.is_cuda:
        from .bitmask import apply_token_bitmask_triton

        apply_token_bitmask_triton(logits, bitmask, rows)
    else:
        apply_token_bitmask_ref(logits, bitmask, rows)
