"""Attention over the paged KV cache: the store, the torch reference, and the dispatch point.

The model calls :func:`paged_attention` once per layer. It writes the new K/V rows into the
cache at ``slot_mapping`` and then attends each sequence's new queries over its cached context
(gathered through its block table up to ``seq_lens``): a new token at position ``p`` sees cache
positions ``<= p``. Per-forward bookkeeping that does not depend on the layer (slot lists, masks)
is computed once by :func:`plan_attention`.
"""

from __future__ import annotations

from dataclasses import dataclass

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
class AttentionPlan:
    batch: ForwardBatch
    block_size: int
    seqs: tuple[SeqPlan, ...]


def plan_attention(batch: ForwardBatch, block_size: int) -> AttentionPlan:
    """Layer-independent attention metadata for one forward pass."""
    qsl = batch.query_start_loc.tolist()
    lens = batch.seq_lens.tolist()
    positions = batch.positions.tolist()
    device = batch.block_tables.device
    offsets = torch.arange(block_size, device=device, dtype=torch.int64)
    plans: list[SeqPlan] = []
    for i, ctx_len in enumerate(lens):
        qs, qe = qsl[i], qsl[i + 1]
        if qe <= qs:
            continue
        n_blocks = -(-ctx_len // block_size)
        blocks = batch.block_tables[i, :n_blocks].to(torch.int64)
        slots = (blocks[:, None] * block_size + offsets[None, :]).reshape(-1)[:ctx_len]
        pos = positions[qs:qe]
        if len(pos) == 1 and pos[0] == ctx_len - 1:
            mask = None
        else:
            q_pos = batch.positions[qs:qe].to(device)
            mask = torch.arange(ctx_len, device=device)[None, :] <= q_pos[:, None]
        plans.append(SeqPlan(qs, qe, slots, mask))
    return AttentionPlan(batch=batch, block_size=block_size, seqs=tuple(plans))


def store_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """Write new K/V rows ``[T, num_kv_heads, head_dim]`` into the cache at ``slot_mapping``."""
    nkv, hd = k_cache.shape[2], k_cache.shape[3]
    k_cache.view(-1, nkv, hd).index_copy_(0, slot_mapping, k.to(k_cache.dtype))
    v_cache.view(-1, nkv, hd).index_copy_(0, slot_mapping, v.to(v_cache.dtype))


def reference_paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                              plan: AttentionPlan, scale: float) -> torch.Tensor:
    """Torch reference: causal attention of ``q [T, H, D]`` over each sequence's cached context.

    GQA: query head ``h`` reads KV head ``h // (H // num_kv_heads)``.
    """
    nkv, hd = k_cache.shape[2], k_cache.shape[3]
    kc = k_cache.view(-1, nkv, hd)
    vc = v_cache.view(-1, nkv, hd)
    out = torch.zeros_like(q)
    for sp in plan.seqs:
        qi = q[sp.q_start:sp.q_end].transpose(0, 1).unsqueeze(0)  # [1, H, n, D]
        ki = kc.index_select(0, sp.ctx_slots).transpose(0, 1).unsqueeze(0)  # [1, KV, L, D]
        vi = vc.index_select(0, sp.ctx_slots).transpose(0, 1).unsqueeze(0)
        oi = F.scaled_dot_product_attention(
            qi, ki.to(q.dtype), vi.to(q.dtype), attn_mask=sp.mask, scale=scale,
            enable_gqa=True)
        out[sp.q_start:sp.q_end] = oi[0].transpose(0, 1)
    return out


def _cuda_paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                          plan: AttentionPlan, scale: float) -> torch.Tensor:
    """CUDA path. THE single place where kiln_kernels.attention (Triton prefill-with-prefix
    and decode kernels) will be called; until those are wired in it runs the reference."""
    return reference_paged_attention(q, k_cache, v_cache, plan, scale)


def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                    v_cache: torch.Tensor, plan: AttentionPlan, scale: float) -> torch.Tensor:
    """Store this step's K/V, then attend. ``q [T, H, D]``, ``k``/``v`` ``[T, KV, D]``."""
    store_kv(k_cache, v_cache, k, v, plan.batch.slot_mapping)
    if q.is_cuda:
        return _cuda_paged_attention(q, k_cache, v_cache, plan, scale)
    return reference_paged_attention(q, k_cache, v_cache, plan, scale)
