"""Grammar token masks on the logits (structured outputs): the launcher.

``apply_token_mask(logits, masks, rows, impl)`` sets, in place, every id that row ``rows[j]``'s
bitmask ``masks[j]`` does not allow (and every id past the mask) to -inf. ``impl`` is the compute
plan's sampler: ``c`` runs ``cpu/sampling/token_mask.c`` on float32 CPU logits; everything else
(and ``c`` where the C library is missing) runs the torch reference. The result is the same
bits either way: only -inf is written.
"""

from __future__ import annotations

import torch

from .native import apply_token_mask_native
from .reference import apply_token_mask_ref, disallowed

__all__ = ["apply_token_mask", "apply_token_mask_ref", "disallowed"]


def apply_token_mask(logits: torch.Tensor, masks: torch.Tensor, rows: list[int],
                     impl: str = "torch") -> None:
    if impl == "c" and apply_token_mask_native(logits, masks, rows):
        return
    apply_token_mask_ref(logits, masks, rows)
