"""The torch reference of the grammar token mask: every id a row's bitmask does not allow, and
every id past the mask, set to -inf; nothing else changes."""

from __future__ import annotations

import torch


def disallowed(masks: torch.Tensor, vocab: int) -> torch.Tensor:
    """bool [n, vocab]: True where ``masks`` (int32 [n, words], llguidance's layout: bit ``t % 32``
    of word ``t // 32`` set = token ``t`` allowed) does not allow the id, or does not reach it."""
    shifts = torch.arange(32, dtype=torch.int32, device=masks.device)
    bits = (masks.unsqueeze(-1) >> shifts) & 1  # [n, words, 32]; >> on int32 is arithmetic: & 1
    allowed = bits.reshape(masks.shape[0], -1)[:, :vocab] == 1
    out = torch.ones((masks.shape[0], vocab), dtype=torch.bool, device=masks.device)
    out[:, :allowed.shape[1]] = ~allowed
    return out


def apply_token_mask_ref(logits: torch.Tensor, masks: torch.Tensor, rows: list[int]) -> None:
    """In place: row ``rows[j]`` of ``logits`` [B, vocab] masked by ``masks[j]``."""
    if not rows:
        return
    block = disallowed(masks.to(logits.device), int(logits.shape[1]))
    for j, i in enumerate(rows):
        logits[i].masked_fill_(block[j], float("-inf"))
