"""Grammar token masks: a constrained row's disallowed tokens set to -inf, in place.

``apply_token_bitmask(logits, bitmask, rows)``: ``logits`` [R, V] (float32, bfloat16 or float16,
unit stride along V), ``bitmask`` int32 [N, W] in llguidance's layout (bit ``t % 32`` of word
``t // 32`` set = token ``t`` allowed), ``rows`` [N] int32/int64, distinct: the logits row each
bitmask row applies to. Every token of those rows whose bit is clear, and every token id at or
past ``32 * W`` (padding beyond the tokenizer's vocabulary), becomes -inf; nothing else is
written. Triton on CUDA tensors, the torch reference otherwise; both write only -inf, so their
results are identical.

The torch reference's names are imported on first use (PEP 562), so that importing the C mask's
binding (:mod:`.native`, numpy or torch logits) does not import torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from .reference import apply_token_bitmask_ref, check_bitmask_args

_REFERENCE = ("apply_token_bitmask_ref", "check_bitmask_args")

__all__ = ["apply_token_bitmask", "apply_token_bitmask_ref", "check_bitmask_args"]


def __getattr__(name: str) -> Any:
    if name in _REFERENCE:
        return getattr(importlib.import_module(f"{__name__}.reference"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor) -> None:
    """In place: see the module doc."""
    if logits.is_cuda:
        from .bitmask import apply_token_bitmask_triton

        apply_token_bitmask_triton(logits, bitmask, rows)
    else:
        from .reference import apply_token_bitmask_ref

        apply_token_bitmask_ref(logits, bitmask, rows)
