"""Paged-attention decode in Triton with split-K.

``_kernel`` (grid B x Hk x S): one program per (sequence, KV head, split). It handles the whole
GQA group of query heads that share the KV head, so every K/V page is read once per group, and
walks its share of the sequence's pages one page (``block_size`` tokens) at a time with an online
softmax, writing an unnormalized partial (acc, max, sum) per split. ``_reduce_kernel``
(grid B x Hq) merges the S partials. Decode is bandwidth-bound, so scores use broadcast
multiply-sum rather than tensor cores.
"""

# Triton @jit functions cannot carry Python type annotations (Triton reads them itself).
# mypy: disable-error-code="untyped-decorator,no-untyped-def"
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .checks import check_paged

_NEG = -1.0e30  # finite "minus infinity": an empty split stays NaN-free


@triton.jit
def _kernel(
    q_ptr, kc_ptr, vc_ptr, bt_ptr, len_ptr, acc_ptr, ml_ptr,
    scale, Hq, HD, S, pages_per_split,
    stride_qb, stride_qh, stride_bt, stride_cb, stride_cs, stride_ch,
    BLOCK_SIZE: tl.constexpr, GROUP: tl.constexpr, G_PAD: tl.constexpr,
    BS_PAD: tl.constexpr, D_PAD: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0).to(tl.int64)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    g = tl.arange(0, G_PAD)
    d = tl.arange(0, D_PAD)
    n = tl.arange(0, BS_PAD)
    gmask = g < GROUP
    dmask = d < HD
    heads = kvh * GROUP + g
    q = tl.load(
        q_ptr + b * stride_qb + heads[:, None] * stride_qh + d[None, :],
        mask=gmask[:, None] & dmask[None, :], other=0.0,
    ).to(tl.float32) * scale  # fmt: skip
    seq_len = tl.load(len_ptr + b)
    n_pages = tl.cdiv(seq_len, BLOCK_SIZE)
    p_start = split * pages_per_split
    p_end = tl.minimum(p_start + pages_per_split, n_pages)
    m_i = tl.full((G_PAD,), _NEG, tl.float32)
    l_i = tl.zeros((G_PAD,), tl.float32)
    acc = tl.zeros((G_PAD, D_PAD), tl.float32)
    for page in range(p_start, p_end):
        blk = tl.load(bt_ptr + b * stride_bt + page).to(tl.int64)
        pos = page * BLOCK_SIZE + n
        nmask = (n < BLOCK_SIZE) & (pos < seq_len)
        off = blk * stride_cb + n[:, None] * stride_cs + kvh * stride_ch + d[None, :]
        kvmask = nmask[:, None] & dmask[None, :]
        k = tl.load(kc_ptr + off, mask=kvmask, other=0.0).to(tl.float32)
        v = tl.load(vc_ptr + off, mask=kvmask, other=0.0).to(tl.float32)
        s = tl.sum(q[:, None, :] * k[None, :, :], axis=2)
        s = tl.where(nmask[None, :], s, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)
        m_i = m_new
    # partial layout: acc [B, Hq, S, HD], ml [B, Hq, S, 2]
    row = (b * Hq + heads) * S + split
    tl.store(acc_ptr + row[:, None] * HD + d[None, :], acc, mask=gmask[:, None] & dmask[None, :])
    tl.store(ml_ptr + row * 2, m_i, mask=gmask)
    tl.store(ml_ptr + row * 2 + 1, l_i, mask=gmask)


@triton.jit
def _reduce_kernel(
    acc_ptr, ml_ptr, out_ptr, Hq, HD, S, stride_ob, stride_oh,
    S_PAD: tl.constexpr, D_PAD: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    s = tl.arange(0, S_PAD)
    d = tl.arange(0, D_PAD)
    smask = s < S
    row = (b * Hq + h) * S + s
    m = tl.load(ml_ptr + row * 2, mask=smask, other=_NEG)
    lsum = tl.load(ml_ptr + row * 2 + 1, mask=smask, other=0.0)
    acc = tl.load(acc_ptr + row[:, None] * HD + d[None, :], mask=smask[:, None] & (d < HD)[None, :],
                  other=0.0)  # fmt: skip
    w = tl.exp(m - tl.max(m, axis=0))
    total = tl.maximum(tl.sum(w * lsum, axis=0), 1e-30)
    o = tl.sum(w[:, None] * acc, axis=0) / total
    tl.store(
        out_ptr + b * stride_ob + h * stride_oh + d, o.to(out_ptr.dtype.element_ty), mask=d < HD
    )


def num_splits(batch: int, kv_heads: int, max_pages: int, device: torch.device) -> int:
    """Split the context so B * Hk * S programs fill the GPU (~4 per SM), but give every split at
    least 4 pages (64 tokens at block 16) so the reduce stays cheap; at most 32 splits."""
    sms = (
        torch.cuda.get_device_properties(device).multi_processor_count
        if device.type == "cuda"
        else 4
    )
    want = triton.cdiv(4 * sms, max(1, batch * kv_heads))
    return int(max(1, min(32, want, triton.cdiv(max_pages, 4))))


def paged_decode_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    splits: int | None = None,
) -> torch.Tensor:
    """Same contract as ``paged_decode_ref``; ``splits`` overrides the split-K heuristic."""
    if q.dim() != 3:
        raise ValueError("q must be [B, Hq, D]")
    bsz, hq, d = q.shape
    hk, bs = check_paged(q, k_cache, v_cache, block_tables, seq_lens, bsz)
    out = torch.empty_like(q)
    if bsz == 0:
        return out
    q = q if q.stride(2) == 1 else q.contiguous()
    max_pages = max(1, block_tables.shape[1])
    s = splits if splits is not None else num_splits(bsz, hk, max_pages, q.device)
    s = max(1, min(int(s), max_pages))
    pps = triton.cdiv(max_pages, s)
    acc = torch.empty((bsz, hq, s, d), dtype=torch.float32, device=q.device)
    ml = torch.empty((bsz, hq, s, 2), dtype=torch.float32, device=q.device)
    group = hq // hk
    d_pad = int(triton.next_power_of_2(d))
    _kernel[(bsz, hk, s)](
        q, k_cache, v_cache, block_tables, seq_lens, acc, ml,
        float(scale), hq, d, s, pps,
        q.stride(0), q.stride(1), block_tables.stride(0),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        BLOCK_SIZE=bs, GROUP=group, G_PAD=int(triton.next_power_of_2(group)),
        BS_PAD=int(triton.next_power_of_2(bs)), D_PAD=d_pad,
    )  # fmt: skip
    _reduce_kernel[(bsz, hq)](
        acc, ml, out, hq, d, s, out.stride(0), out.stride(1),
        S_PAD=int(triton.next_power_of_2(s)), D_PAD=d_pad,
    )  # fmt: skip
    return out
