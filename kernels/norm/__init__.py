"""RMSNorm (with fused residual add) and NEOX rotary embedding.

The dispatchers use Triton for CUDA tensors and the torch references otherwise.
"""

from __future__ import annotations

import torch

from .reference import apply_rotary_ref, rms_norm_ref, rope_inv_freq, rotary_ref

__all__ = [
    "apply_rotary",
    "apply_rotary_ref",
    "rms_norm",
    "rms_norm_ref",
    "rope_inv_freq",
    "rotary_ref",
]


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (normed, new_residual); see ``rms_norm_ref``."""
    if x.is_cuda:
        from .rmsnorm import rms_norm_triton

        return rms_norm_triton(x, weight, eps, residual)
    return rms_norm_ref(x, weight, eps, residual)


def apply_rotary(
    q: torch.Tensor,
    k: torch.Tensor,
    positions: torch.Tensor,
    theta: float = 10000.0,
    inv_freq: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """NEOX rotary on q [T, Hq, D] and k [T, Hk, D]; returns new tensors. ``inv_freq``
    (float32 [D/2], e.g. with Llama-3 scaling applied) overrides ``theta``."""
    if inv_freq is None:
        inv_freq = rope_inv_freq(q.shape[-1], theta).to(q.device)
    if q.is_cuda:
        from .rotary import rotary_triton

        return rotary_triton(q, positions, inv_freq), rotary_triton(k, positions, inv_freq)
    return apply_rotary_ref(q, k, positions, inv_freq)
