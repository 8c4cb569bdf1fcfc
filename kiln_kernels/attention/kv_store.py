"""KV-cache store in Triton: scatter k, v [T, Hk, D] into the paged caches at slot_mapping."""

# Triton @jit functions cannot carry Python type annotations (Triton reads them itself).
# mypy: disable-error-code="untyped-decorator,no-untyped-def"
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _kernel(
    k_ptr, v_ptr, kc_ptr, vc_ptr, slot_ptr,
    HD, stride_k, stride_v,
    BLOCK: tl.constexpr,
):  # fmt: skip
    t = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    if slot < 0:  # padding token: nothing to store
        return
    mask = offs < HD
    k = tl.load(k_ptr + t * stride_k + offs, mask=mask)
    v = tl.load(v_ptr + t * stride_v + offs, mask=mask)
    tl.store(kc_ptr + slot * HD + offs, k.to(kc_ptr.dtype.element_ty), mask=mask)
    tl.store(vc_ptr + slot * HD + offs, v.to(vc_ptr.dtype.element_ty), mask=mask)


def store_kv_triton(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """In place; same contract as ``store_kv_ref``."""
    if k.dim() != 3 or k.shape != v.shape:
        raise ValueError("k and v must be [T, Hk, D] of one shape")
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError("k_cache and v_cache must be [num_blocks, block_size, Hk, D] of one shape")
    t, hk, d = k.shape
    if tuple(k_cache.shape[2:]) != (hk, d):
        raise ValueError(f"cache heads/dim {list(k_cache.shape[2:])} != k's {[hk, d]}")
    if slot_mapping.shape != (t,) or slot_mapping.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"slot_mapping must be int32/int64 [{t}]")
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("caches must be contiguous")
    if len({x.device for x in (k, v, k_cache, v_cache, slot_mapping)}) != 1:
        raise ValueError("all tensors must be on one device")
    if t == 0:
        return
    k2 = k.reshape(t, hk * d)
    v2 = v.reshape(t, hk * d)
    if k2.stride(1) != 1 or v2.stride(1) != 1:
        k2, v2 = k2.contiguous(), v2.contiguous()
    hd = hk * d
    # One token row per program along axis 0; rows wider than 2048 elements split on axis 1.
    block = min(2048, int(triton.next_power_of_2(hd)))
    _kernel[(t, triton.cdiv(hd, block))](
        k2, v2, k_cache, v_cache, slot_mapping, hd, k2.stride(0), v2.stride(0), BLOCK=block
    )
