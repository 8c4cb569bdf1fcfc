"""Plain-torch RMSNorm and rotary embedding (the references for the Triton kernels)."""

from __future__ import annotations

import torch


def rms_norm_ref(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (normed, new_residual). With a residual, h = x + residual (rounded to x.dtype) is both
    normalized and returned as the new residual; without one the new residual is x itself.
    Statistics are computed in float32; the result has x's dtype."""
    h = x if residual is None else (x.float() + residual.float()).to(x.dtype)
    hf = h.float()
    inv = torch.rsqrt(hf.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (hf * inv * weight.float()).to(x.dtype), h


def rope_inv_freq(rotary_dim: int, theta: float) -> torch.Tensor:
    """float32 [rotary_dim // 2]: theta ** (-2i / rotary_dim)."""
    if rotary_dim <= 0 or rotary_dim % 2:
        raise ValueError(f"rotary_dim must be a positive even number, got {rotary_dim}")
    i = torch.arange(0, rotary_dim, 2, dtype=torch.float64)
    return (1.0 / (theta ** (i / rotary_dim))).to(torch.float32)


def rotary_ref(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """NEOX / rotate_half rotary embedding of x [T, H, D] at positions [T]; the first
    2 * len(inv_freq) channels rotate, the rest pass through. Computed in float32."""
    half = inv_freq.shape[0]
    ang = positions.to(torch.float32)[:, None] * inv_freq.to(torch.float32)[None, :]
    cos = torch.cos(ang)[:, None, :]
    sin = torch.sin(ang)[:, None, :]
    xf = x.float()
    x1 = xf[..., :half]
    x2 = xf[..., half : 2 * half]
    out = xf.clone()
    out[..., :half] = x1 * cos - x2 * sin
    out[..., half : 2 * half] = x2 * cos + x1 * sin
    return out.to(x.dtype)


def apply_rotary_ref(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    return rotary_ref(q, positions, inv_freq), rotary_ref(k, positions, inv_freq)
