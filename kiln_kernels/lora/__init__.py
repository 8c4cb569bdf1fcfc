"""Batched multi-adapter LoRA (shrink / expand). Triton on CUDA, torch references otherwise."""

from __future__ import annotations

import torch

from .reference import lora_expand_ref, lora_ref, lora_shrink_ref

__all__ = ["lora_expand", "lora_expand_ref", "lora_ref", "lora_shrink", "lora_shrink_ref"]


def lora_shrink(x: torch.Tensor, a_stack: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """x [T, H_in], A [S, r_max, H_in], slots [T] -> float32 [T, r_max] (0 for slot -1)."""
    if x.is_cuda:
        from .sgmv import lora_shrink_triton

        return lora_shrink_triton(x, a_stack, slots)
    return lora_shrink_ref(x, a_stack, slots)


def lora_expand(
    y: torch.Tensor,
    t: torch.Tensor,
    b_stack: torch.Tensor,
    slots: torch.Tensor,
    scales: torch.Tensor,
) -> torch.Tensor:
    """y [T, H_out] += scales[:, None] * (t @ B_slot^T) per row, in place; returns y."""
    if y.is_cuda:
        from .sgmv import lora_expand_triton

        return lora_expand_triton(y, t, b_stack, slots, scales)
    return lora_expand_ref(y, t, b_stack, slots, scales)
