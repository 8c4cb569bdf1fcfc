"""LoRA shrink / expand in Triton for a batch whose rows use different adapters.

Both kernels run one program per (token row, output tile) and read that row's adapter through its
slot index, so a batch mixing any number of adapters is one launch each. Rows are independent
GEMVs against an r_max x H matrix: for decode batches that is the same traffic as a segmented
(SGMV) GEMM; long prefills of one adapter would gain from grouping rows by slot (not done here).
"""

# Triton @jit functions cannot carry Python type annotations (Triton reads them itself).
# mypy: disable-error-code="untyped-decorator,no-untyped-def"
from __future__ import annotations

import torch
import triton
import triton.language as tl

_FLOATS = (torch.float32, torch.float16, torch.bfloat16)


@triton.jit
def _shrink_kernel(
    x_ptr, a_ptr, slot_ptr, t_ptr,
    H_IN, R, stride_x, stride_as, stride_ar,
    BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    r = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)
    rmask = r < R
    slot = tl.load(slot_ptr + row).to(tl.int64)
    acc = tl.zeros((BLOCK_R,), tl.float32)
    if slot >= 0:
        for k0 in range(0, H_IN, BLOCK_K):
            k = k0 + tl.arange(0, BLOCK_K)
            kmask = k < H_IN
            x = tl.load(x_ptr + row * stride_x + k, mask=kmask, other=0.0).to(tl.float32)
            a = tl.load(a_ptr + slot * stride_as + r[:, None] * stride_ar + k[None, :],
                        mask=rmask[:, None] & kmask[None, :], other=0.0).to(tl.float32)  # fmt: skip
            acc += tl.sum(a * x[None, :], axis=1)
    tl.store(t_ptr + row * R + r, acc, mask=rmask)


@triton.jit
def _expand_kernel(
    y_ptr, t_ptr, b_ptr, slot_ptr, scale_ptr,
    H_OUT, R, stride_y, stride_bs, stride_bo,
    R_PAD: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + row).to(tl.int64)
    if slot < 0:
        return
    o = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    omask = o < H_OUT
    r = tl.arange(0, R_PAD)
    rmask = r < R
    t = tl.load(t_ptr + row * R + r, mask=rmask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + slot * stride_bs + o[:, None] * stride_bo + r[None, :],
                mask=omask[:, None] & rmask[None, :], other=0.0).to(tl.float32)  # fmt: skip
    scale = tl.load(scale_ptr + row).to(tl.float32)
    delta = tl.sum(b * t[None, :], axis=1) * scale
    yp = y_ptr + row * stride_y + o
    y = tl.load(yp, mask=omask, other=0.0).to(tl.float32)
    tl.store(yp, (y + delta).to(y_ptr.dtype.element_ty), mask=omask)


def _check_slots(slots: torch.Tensor, rows: int, dev: torch.device) -> None:
    # Slot values are not range-checked: that would force a host sync on every launch.
    if slots.shape != (rows,) or slots.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"slots must be int32/int64 [{rows}]")
    if slots.device != dev:
        raise ValueError("slots must be on the same device as the activations")


def lora_shrink_triton(x: torch.Tensor, a_stack: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """Same contract as ``lora_shrink_ref``."""
    if x.dim() != 2 or x.dtype not in _FLOATS:
        raise ValueError("x must be a float tensor [T, H_in]")
    if a_stack.dim() != 3 or a_stack.shape[2] != x.shape[1]:
        raise ValueError(f"a_stack must be [S, r_max, {x.shape[1]}]")
    if a_stack.device != x.device:
        raise ValueError("a_stack must be on x's device")
    _check_slots(slots, x.shape[0], x.device)
    t_rows, h_in = x.shape
    r = a_stack.shape[1]
    out = torch.empty((t_rows, r), dtype=torch.float32, device=x.device)
    if t_rows == 0 or r == 0:
        return out.zero_()
    x = x if x.stride(1) == 1 else x.contiguous()
    a = a_stack.contiguous()
    # Ranks are small (<= 128): up to 16 rank rows per program, 256-wide K chunks keep the
    # A tile at <= 4k elements per iteration.
    block_r = min(16, int(triton.next_power_of_2(r)))
    block_k = min(256, int(triton.next_power_of_2(h_in)))
    _shrink_kernel[(t_rows, triton.cdiv(r, block_r))](
        x, a, slots, out, h_in, r, x.stride(0), a.stride(0), a.stride(1),
        BLOCK_R=block_r, BLOCK_K=block_k,
    )  # fmt: skip
    return out


def lora_expand_triton(
    y: torch.Tensor,
    t: torch.Tensor,
    b_stack: torch.Tensor,
    slots: torch.Tensor,
    scales: torch.Tensor,
) -> torch.Tensor:
    """Same contract as ``lora_expand_ref`` (adds into y in place and returns it)."""
    if y.dim() != 2 or y.dtype not in _FLOATS or y.stride(1) != 1:
        raise ValueError("y must be a float tensor [T, H_out], contiguous in its last dimension")
    rows, h_out = y.shape
    if b_stack.dim() != 3 or b_stack.shape[1] != h_out:
        raise ValueError(f"b_stack must be [S, {h_out}, r_max]")
    r = b_stack.shape[2]
    if t.shape != (rows, r):
        raise ValueError(f"t must be [{rows}, {r}]")
    if scales.shape != (rows,):
        raise ValueError(f"scales must be [{rows}]")
    if len({z.device for z in (y, t, b_stack, scales)}) != 1:
        raise ValueError("all tensors must be on one device")
    _check_slots(slots, rows, y.device)
    if rows == 0 or r == 0:
        return y
    b = b_stack.contiguous()
    # The whole rank fits one tile; 128 output features per program keep B tiles <= 16k elements.
    r_pad = int(triton.next_power_of_2(r))
    block_n = min(128, int(triton.next_power_of_2(h_out)))
    _expand_kernel[(rows, triton.cdiv(h_out, block_n))](
        y, t.contiguous(), b, slots, scales.to(torch.float32).contiguous(),
        h_out, r, y.stride(0), b.stride(0), b.stride(1),
        R_PAD=r_pad, BLOCK_N=block_n,
    )  # fmt: skip
    return y
