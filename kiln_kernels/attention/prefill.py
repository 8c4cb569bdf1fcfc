"""Prefill attention over paged KV with a cached prefix (causal, varlen), in Triton.

``_kernel`` (grid B x Hq x ceil(max_new / BLOCK_M)): one program per (sequence, query head,
tile of BLOCK_M new tokens). It walks the sequence's pages from position 0 up to the tile's last
query position, one page per step, with an online softmax and tensor-core dots. All K/V (the
prefix and the new tokens) are read from the cache, so the new tokens must be stored first.
"""

# Triton @jit functions cannot carry Python type annotations (Triton reads them itself).
# mypy: disable-error-code="untyped-decorator,no-untyped-def"
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .checks import check_paged

_NEG = -1.0e30


@triton.jit
def _kernel(
    q_ptr, kc_ptr, vc_ptr, bt_ptr, qsl_ptr, len_ptr, out_ptr,
    scale, HD,
    stride_qt, stride_qh, stride_ot, stride_oh, stride_bt, stride_cb, stride_cs, stride_ch,
    GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_M: tl.constexpr,
    BS_PAD: tl.constexpr, D_PAD: tl.constexpr, IEEE: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    tile = tl.program_id(2)
    q_start = tl.load(qsl_ptr + b)
    n_new = tl.load(qsl_ptr + b + 1) - q_start
    if tile * BLOCK_M >= n_new:
        return
    ctx = tl.load(len_ptr + b)
    kvh = h // GROUP
    rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    rmask = rows < n_new
    qpos = ctx - n_new + rows
    d = tl.arange(0, D_PAD)
    dmask = d < HD
    n = tl.arange(0, BS_PAD)
    tok = (q_start + rows).to(tl.int64)
    q = tl.load(q_ptr + tok[:, None] * stride_qt + h * stride_qh + d[None, :],
                mask=rmask[:, None] & dmask[None, :], other=0.0)  # fmt: skip
    m_i = tl.full((BLOCK_M,), _NEG, tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, D_PAD), tl.float32)
    last = ctx - n_new + tl.minimum(tile * BLOCK_M + BLOCK_M, n_new)  # exclusive key bound
    for page in range(0, tl.cdiv(last, BLOCK_SIZE)):
        blk = tl.load(bt_ptr + b * stride_bt + page).to(tl.int64)
        kpos = page * BLOCK_SIZE + n
        nmask = (n < BLOCK_SIZE) & (kpos < ctx)
        off = blk * stride_cb + n[:, None] * stride_cs + kvh * stride_ch + d[None, :]
        kvmask = nmask[:, None] & dmask[None, :]
        k = tl.load(kc_ptr + off, mask=kvmask, other=0.0).to(q.dtype)
        v = tl.load(vc_ptr + off, mask=kvmask, other=0.0).to(q.dtype)
        if IEEE:
            s = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
        s = s * scale
        allowed = nmask[None, :] & (kpos[None, :] <= qpos[:, None])
        s = tl.where(allowed, s, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        if IEEE:
            pv = tl.dot(p, v.to(tl.float32), input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype), v)
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    o = acc / tl.maximum(l_i, 1e-30)[:, None]
    tl.store(out_ptr + tok[:, None] * stride_ot + h * stride_oh + d[None, :],
             o.to(out_ptr.dtype.element_ty), mask=rmask[:, None] & dmask[None, :])  # fmt: skip


def prefill_paged_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    max_query_len: int | None = None,
) -> torch.Tensor:
    """Same contract as ``prefill_paged_ref``. ``max_query_len`` (the most new tokens of any
    sequence) sizes the grid; without it the launcher reads query_start_loc (a host sync)."""
    if q.dim() != 3:
        raise ValueError("q must be [T, Hq, D]")
    bsz = seq_lens.shape[0] if seq_lens.dim() == 1 else -1
    hk, bs = check_paged(q, k_cache, v_cache, block_tables, seq_lens, bsz)
    if query_start_loc.shape != (bsz + 1,) or query_start_loc.dtype not in (
        torch.int32,
        torch.int64,
    ):
        raise ValueError(f"query_start_loc must be int32/int64 [{bsz + 1}]")
    if query_start_loc.device != q.device:
        raise ValueError("query_start_loc must be on q's device")
    out = torch.zeros_like(q)
    t, hq, d = q.shape
    if t == 0 or bsz == 0:
        return out
    if max_query_len is None:
        max_query_len = int((query_start_loc[1:] - query_start_loc[:-1]).max())
    if max_query_len <= 0:
        return out
    q = q if q.stride(2) == 1 else q.contiguous()
    # 64-row tiles amortize each K/V page over many queries; short chunks use 16 (tl.dot's
    # minimum) so a decode-sized chunk does not waste a 64-row tile.
    block_m = 16 if max_query_len <= 16 else 64
    d_pad = max(16, int(triton.next_power_of_2(d)))
    _kernel[(bsz, hq, triton.cdiv(max_query_len, block_m))](
        q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, out,
        float(scale), d,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1), block_tables.stride(0),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        GROUP=hq // hk, BLOCK_SIZE=bs, BLOCK_M=block_m,
        BS_PAD=max(16, int(triton.next_power_of_2(bs))), D_PAD=d_pad,
        IEEE=q.dtype == torch.float32,
    )  # fmt: skip
    return out
