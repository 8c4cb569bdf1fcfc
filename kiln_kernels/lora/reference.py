"""Plain-torch batched LoRA (different adapter per row), the reference for the Triton kernels.

Adapters are stacked and zero-padded to the largest rank: A [S, r_max, H_in], B [S, H_out, r_max]
(zero rows of A / columns of B past an adapter's own rank contribute nothing). Each token row
names its slot (-1: no adapter). The LoRA delta of a row is ``scale * B_slot @ (A_slot @ x)``,
where ``scale`` already folds alpha / r and any composition weight.
"""

from __future__ import annotations

import torch


def lora_shrink_ref(x: torch.Tensor, a_stack: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """x [T, H_in] -> t [T, r_max] float32, t[i] = A[slots[i]] @ x[i] (0 where slot < 0)."""
    t = torch.zeros(x.shape[0], a_stack.shape[1], dtype=torch.float32, device=x.device)
    on = slots >= 0
    if bool(on.any()):
        a = a_stack[slots[on].long()].float()  # [n, r, H_in]
        t[on] = torch.einsum("nrh,nh->nr", a, x[on].float())
    return t


def lora_expand_ref(
    y: torch.Tensor,
    t: torch.Tensor,
    b_stack: torch.Tensor,
    slots: torch.Tensor,
    scales: torch.Tensor,
) -> torch.Tensor:
    """y [T, H_out] += scales[i] * B[slots[i]] @ t[i] for rows with slot >= 0. In place;
    returns y. The sum is formed in float32 and rounded once to y's dtype."""
    on = slots >= 0
    if bool(on.any()):
        b = b_stack[slots[on].long()].float()  # [n, H_out, r]
        delta = torch.einsum("nor,nr->no", b, t[on].float()) * scales[on].float()[:, None]
        y[on] = (y[on].float() + delta).to(y.dtype)
    return y


def lora_ref(
    x: torch.Tensor,
    y: torch.Tensor,
    a_stack: torch.Tensor,
    b_stack: torch.Tensor,
    slots: torch.Tensor,
    scales: torch.Tensor,
) -> torch.Tensor:
    """Shrink then expand: y += scale * B (A x), row by row."""
    return lora_expand_ref(y, lora_shrink_ref(x, a_stack, slots), b_stack, slots, scales)
