"""Attention over the paged KV cache: the store, the torch reference, and the dispatch point.

The model calls :func:`paged_attention` once per layer. It writes the new K/V rows into the
cache at ``slot_mapping`` and then attends each sequence's new queries over its cached context
(gathered through its block table up to ``seq_lens``): a new token at position ``p`` sees cache
positions ``<= p``. Per-forward bookkeeping that does not depend on the layer (slot lists, masks)
is computed once by :func:`plan_attention`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

from kiln.model.batch import ForwardBatch


@dataclass(frozen=True)
class SeqPlan:
    q_start: int
    q_end: int
    ctx_slots: torch.Tensor  # int64 [L] cache slots of positions 0..L-1
    mask: torch.Tensor | None  # bool [n_new, L], None when every query sees the whole context


@dataclass(frozen=True)
class DecodeGroup:
    """Sequences with one new token that sees its whole context, attended in ONE call."""

    rows: torch.Tensor  # int64 [B] query rows of the flat batch
    slots: torch.Tensor  # int64 [B, Lmax] cache slots, padded with slot 0
    mask: torch.Tensor | None  # bool [B, 1, 1, Lmax]: real positions; None when no padding


@dataclass(frozen=True)
class AttentionPlan:
    batch: ForwardBatch
    block_size: int
    seqs: tuple[SeqPlan, ...]  # sequences attended one by one (prefill chunks)
    decode: DecodeGroup | None = None
    max_query_len: int = 1
    kernels: Literal["triton", "torch"] = "torch"  # the compute plan's torch_attention


def plan_attention(batch: ForwardBatch, block_size: int,
                   kernels: Literal["triton", "torch"] = "torch") -> AttentionPlan:
    """Layer-independent attention metadata for one forward pass; ``kernels`` is the
    implementation the compute plan (kiln.model.native.plan) names for the torch path."""
    qsl = batch.query_start_loc.tolist()
    lens = batch.seq_lens.tolist()
    positions = batch.positions.tolist()
    device = batch.block_tables.device
    offsets = torch.arange(block_size, device=device, dtype=torch.int64)
    plans: list[SeqPlan] = []
    decode: list[tuple[int, torch.Tensor]] = []
    for i, ctx_len in enumerate(lens):
        qs, qe = qsl[i], qsl[i + 1]
        if qe <= qs:
            continue
        n_blocks = -(-ctx_len // block_size)
        blocks = batch.block_tables[i, :n_blocks].to(torch.int64)
        slots = (blocks[:, None] * block_size + offsets[None, :]).reshape(-1)[:ctx_len]
        pos = positions[qs:qe]
        if len(pos) == 1 and pos[0] == ctx_len - 1:
            decode.append((qs, slots))
            continue
        q_pos = batch.positions[qs:qe].to(device)
        mask = torch.arange(ctx_len, device=device)[None, :] <= q_pos[:, None]
        plans.append(SeqPlan(qs, qe, slots, mask))
    max_q = max([qsl[i + 1] - qsl[i] for i in range(len(lens))], default=1)
    return AttentionPlan(batch=batch, block_size=block_size, seqs=tuple(plans),
                         decode=_decode_group(decode, device), max_query_len=max(1, max_q),
                         kernels=kernels)


def _decode_group(items: list[tuple[int, torch.Tensor]], device: torch.device
                  ) -> DecodeGroup | None:
    if not items:
        return None
    longest = max(len(slots) for _, slots in items)
    padded = torch.zeros((len(items), longest), dtype=torch.int64, device=device)
    lengths = torch.tensor([len(slots) for _, slots in items], device=device)
    for b, (_, slots) in enumerate(items):
        padded[b, :len(slots)] = slots
    mask = None
    if bool((lengths < longest).any()):
        mask = (torch.arange(longest, device=device)[None, :] < lengths[:, None])[:, None, None, :]
    rows = torch.tensor([row for row, _ in items], dtype=torch.int64, device=device)
    return DecodeGroup(rows=rows, slots=padded, mask=mask)


def store_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """Write new K/V rows ``[T, num_kv_heads, head_dim]`` into the cache at ``slot_mapping``
    (caches ``[num_blocks, block_size, num_kv_heads, head_dim]``, contiguous or a permuted
    view: kiln.model.kv_cache)."""
    if k_cache.is_contiguous():  # one row of all KV heads per slot
        nkv, hd = k_cache.shape[2], k_cache.shape[3]
        k_cache.view(-1, nkv, hd).index_copy_(0, slot_mapping, k.to(k_cache.dtype))
        v_cache.view(-1, nkv, hd).index_copy_(0, slot_mapping, v.to(v_cache.dtype))
        return
    idx = _row_index(k_cache, slot_mapping).reshape(-1)
    hd = k_cache.shape[3]
    _row_view(k_cache).index_copy_(0, idx, k.to(k_cache.dtype).reshape(-1, hd))
    _row_view(v_cache).index_copy_(0, idx, v.to(v_cache.dtype).reshape(-1, hd))


def cache_rows(cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """The cached rows ``[*slots.shape, num_kv_heads, head_dim]`` at ``slots``."""
    nkv, hd = cache.shape[2], cache.shape[3]
    if cache.is_contiguous():
        rows = cache.view(-1, nkv, hd).index_select(0, slots.reshape(-1))
    else:  # a head-major cache (the C step's): one row per slot and KV head
        rows = _row_view(cache).index_select(0, _row_index(cache, slots).reshape(-1))
    return rows.view(*slots.shape, nkv, hd)


def _row_view(cache: torch.Tensor) -> torch.Tensor:
    """A dense cache's storage as ``[rows, head_dim]`` (one row per slot and KV head)."""
    hd = cache.shape[3]
    return cache.as_strided((cache.numel() // hd, hd), (hd, 1))


def _row_index(cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """``[*slots.shape, num_kv_heads]``: each slot's row of each KV head in ``_row_view``."""
    bs, nkv, hd = cache.shape[1], cache.shape[2], cache.shape[3]
    sb, sp, sh = cache.stride(0) // hd, cache.stride(1) // hd, cache.stride(2) // hd
    base = torch.div(slots, bs, rounding_mode="floor") * sb + slots % bs * sp
    return base.unsqueeze(-1) + torch.arange(nkv, device=slots.device) * sh


def reference_paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                              plan: AttentionPlan, scale: float, window: int = 0
                              ) -> torch.Tensor:
    """Torch reference: causal attention of ``q [T, H, D]`` over each sequence's cached context
    (only its last ``window`` positions up to the query's own, when ``window`` is set).

    GQA: query head ``h`` reads KV head ``h // (H // num_kv_heads)``.
    """
    out = torch.zeros_like(q)
    group = plan.decode
    if group is not None:  # all single-token decodes at once: [B, H, 1, D] over [B, KV, L, D]
        qd = q.index_select(0, group.rows).unsqueeze(2)  # [B, H, 1, D]
        kd = cache_rows(k_cache, group.slots).transpose(1, 2)
        vd = cache_rows(v_cache, group.slots).transpose(1, 2)
        mask = group.mask
        if window:  # the decode token sits at position len - 1 of its sequence
            lens = plan.batch.seq_lens.index_select(
                0, _decode_seqs(plan, group.rows)).to(torch.int64)
            at = torch.arange(group.slots.shape[1], device=q.device)[None, :]
            near = ((at < lens[:, None]) & (at > lens[:, None] - 1 - window))[:, None, None, :]
            mask = near
        od = F.scaled_dot_product_attention(
            qd, kd.to(q.dtype), vd.to(q.dtype), attn_mask=mask, scale=scale,
            enable_gqa=True)
        out.index_copy_(0, group.rows, od.squeeze(2))
    for sp in plan.seqs:
        qi = q[sp.q_start:sp.q_end].transpose(0, 1).unsqueeze(0)  # [1, H, n, D]
        ki = cache_rows(k_cache, sp.ctx_slots).transpose(0, 1).unsqueeze(0)  # [1, KV, L, D]
        vi = cache_rows(v_cache, sp.ctx_slots).transpose(0, 1).unsqueeze(0)
        mask = sp.mask
        if window:
            q_pos = plan.batch.positions[sp.q_start:sp.q_end].to(q.device)
            at = torch.arange(sp.ctx_slots.shape[0], device=q.device)[None, :]
            mask = (at <= q_pos[:, None]) & (at > q_pos[:, None] - window)
        oi = F.scaled_dot_product_attention(
            qi, ki.to(q.dtype), vi.to(q.dtype), attn_mask=mask, scale=scale,
            enable_gqa=True)
        out[sp.q_start:sp.q_end] = oi[0].transpose(0, 1)
    return out


def _decode_seqs(plan: AttentionPlan, rows: torch.Tensor) -> torch.Tensor:
    """The sequence (index into the batch's sequences) of each decode row."""
    qsl = plan.batch.query_start_loc.to(rows.device)
    return torch.searchsorted(qsl, rows, right=True) - 1


def _cuda_paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                          plan: AttentionPlan, scale: float) -> torch.Tensor:
    """The Triton path: THE single place the Triton kernels of kiln_kernels.attention are
    called — split-K paged decode when every sequence decodes one token, else varlen prefill
    over the paged prefix (which covers mixed prefill + decode steps)."""
    from kiln_kernels.attention import paged_decode, prefill_paged

    batch = plan.batch
    out: torch.Tensor
    if not plan.seqs and plan.decode is not None and q.shape[0] == plan.decode.rows.numel():
        out = paged_decode(q, k_cache, v_cache, batch.block_tables, batch.seq_lens, scale)
    else:
        out = prefill_paged(q, k_cache, v_cache, batch.block_tables, batch.query_start_loc,
                            batch.seq_lens, scale, max_query_len=plan.max_query_len)
    return out


def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                    v_cache: torch.Tensor, plan: AttentionPlan, scale: float,
                    window: int = 0) -> torch.Tensor:
    """Store this step's K/V, then attend. ``q [T, H, D]``, ``k``/``v`` ``[T, KV, D]``;
    ``window``: a query at position p sees only positions after p - window (a sliding layer's;
    the torch reference attends it, on every device)."""
    store_kv(k_cache, v_cache, k, v, plan.batch.slot_mapping)
    if window:
        return reference_paged_attention(q, k_cache, v_cache, plan, scale, window)
    if plan.kernels == "triton":
        return _cuda_paged_attention(q, k_cache, v_cache, plan, scale)
    return reference_paged_attention(q, k_cache, v_cache, plan, scale)
