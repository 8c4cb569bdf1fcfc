"""The torch reference of the grammar mask (see the package doc for the contract)."""

from __future__ import annotations

import torch

FLOATS = (torch.float32, torch.bfloat16, torch.float16)


def check_bitmask_args(logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor) -> None:
    """ValueError unless the arguments keep the contract (shapes, dtypes, one device)."""
    if logits.dim() != 2 or logits.dtype not in FLOATS or logits.stride(1) != 1:
        raise ValueError("logits must be [rows, vocab] float32/bfloat16/float16 with unit "
                         "stride along the vocabulary")
    if bitmask.dim() != 2 or bitmask.dtype != torch.int32 or not bitmask.is_contiguous():
        raise ValueError("bitmask must be a contiguous int32 [n, words] tensor")
    if rows.shape != (bitmask.shape[0],) or rows.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"rows must be int32/int64 [{bitmask.shape[0]}]")
    if len({logits.device, bitmask.device, rows.device}) != 1:
        raise ValueError("logits, bitmask and rows must be on one device")


def unpack_bitmask(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    """bool [N, vocab]: True where the token is allowed (ids past the mask: False)."""
    shifts = torch.arange(32, dtype=torch.int64, device=bitmask.device)
    bits = ((bitmask.to(torch.int64)[:, :, None] >> shifts) & 1).reshape(bitmask.shape[0], -1)
    allowed = torch.zeros((bitmask.shape[0], vocab), dtype=torch.bool, device=bitmask.device)
    width = min(vocab, bits.shape[1])
    allowed[:, :width] = bits[:, :width] == 1
    return allowed


def apply_token_bitmask_ref(logits: torch.Tensor, bitmask: torch.Tensor,
                            rows: torch.Tensor) -> None:
    """In place: the disallowed tokens of ``logits[rows[j]]`` (and ids past the mask) -> -inf."""
    check_bitmask_args(logits, bitmask, rows)
    allowed = unpack_bitmask(bitmask, int(logits.shape[1]))
    for j, row in enumerate(rows.tolist()):
        logits[row].masked_fill_(~allowed[j], float("-inf"))
