"""NEOX-style (rotate_half) rotary embedding in Triton: one program per token, all heads."""

# Triton @jit functions cannot carry Python type annotations (Triton reads them itself).
# mypy: disable-error-code="untyped-decorator,no-untyped-def"
from __future__ import annotations

import torch
import triton
import triton.language as tl

_FLOATS = (torch.float32, torch.float16, torch.bfloat16)


@triton.jit
def _kernel(
    x_ptr, out_ptr, pos_ptr, inv_ptr,
    H, stride_t, stride_h, out_stride_t, out_stride_h,
    HALF: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    dmask = d < HALF
    mask = (h < H)[:, None] & dmask[None, :]
    pos = tl.load(pos_ptr + t).to(tl.float32)
    ang = pos * tl.load(inv_ptr + d, mask=dmask, other=0.0)
    cos = tl.cos(ang)[None, :]
    sin = tl.sin(ang)[None, :]
    src = x_ptr + t * stride_t + h[:, None] * stride_h + d[None, :]
    dst = out_ptr + t * out_stride_t + h[:, None] * out_stride_h + d[None, :]
    x1 = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF, mask=mask, other=0.0).to(tl.float32)
    ty = out_ptr.dtype.element_ty
    tl.store(dst, (x1 * cos - x2 * sin).to(ty), mask=mask)
    tl.store(dst + HALF, (x2 * cos + x1 * sin).to(ty), mask=mask)


def rotary_triton(
    x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, inplace: bool = False
) -> torch.Tensor:
    """Rotate x [T, H, D] (last dim contiguous) at positions [T]; channels past
    2 * len(inv_freq) pass through. Returns x itself when ``inplace``, else a new tensor."""
    if x.dim() != 3 or x.dtype not in _FLOATS:
        raise ValueError("x must be a float32/float16/bfloat16 tensor [T, H, D]")
    t, h, d = x.shape
    half = inv_freq.shape[0]
    if inv_freq.dim() != 1 or 2 * half > d or half == 0:
        raise ValueError(f"inv_freq must be 1-D with 0 < 2*len <= D={d}")
    if positions.shape != (t,):
        raise ValueError(f"positions must have shape [{t}], got {list(positions.shape)}")
    if positions.device != x.device or inv_freq.device != x.device:
        raise ValueError("x, positions and inv_freq must be on one device")
    if x.stride(2) != 1:
        raise ValueError("x must be contiguous in its last dimension")
    out = x if inplace else x.clone()
    if t == 0 or h == 0:
        return out
    block_d = int(triton.next_power_of_2(half))
    # Enough heads per program for ~2k elements of work, bounded by the head count.
    block_h = min(int(triton.next_power_of_2(h)), max(1, 2048 // block_d))
    _kernel[(t, triton.cdiv(h, block_h))](
        x, out, positions.contiguous(), inv_freq.to(torch.float32).contiguous(),
        h, x.stride(0), x.stride(1), out.stride(0), out.stride(1),
        HALF=half, BLOCK_H=block_h, BLOCK_D=block_d,
    )  # fmt: skip
    return out
