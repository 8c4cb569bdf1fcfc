"""Plain-torch paged attention: KV store, decode and prefill over a paged KV cache.

Cache layout: ``k_cache`` / ``v_cache`` are ``[num_blocks, block_size, Hk, D]``. Token ``p`` of a
sequence lives in block ``block_tables[b, p // block_size]`` at offset ``p % block_size``; its
slot is ``block * block_size + offset``. Query head ``h`` reads KV head ``h // (Hq // Hk)`` (GQA).
Softmax and accumulation are float32; outputs have the query dtype.
"""

from __future__ import annotations

import torch


def store_kv_ref(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write k, v [T, Hk, D] into the caches at slot_mapping [T] (slot < 0: skipped). In place."""
    nb, bs, hk, d = k_cache.shape
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].to(torch.long)
    k_cache.view(nb * bs, hk, d)[slots] = k[keep].to(k_cache.dtype)
    v_cache.view(nb * bs, hk, d)[slots] = v[keep].to(v_cache.dtype)


def _gather(cache: torch.Tensor, table: torch.Tensor, n: int) -> torch.Tensor:
    """The first n tokens of one sequence: [n, Hk, D]."""
    bs = cache.shape[1]
    pos = torch.arange(n, device=cache.device)
    blocks = table.to(torch.long)[pos // bs]
    return cache[blocks, pos % bs]


def _attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float
) -> torch.Tensor:
    """q [M, Hq, D], k/v [N, Hk, D], mask [M, N] -> [M, Hq, D] float32."""
    hq, hk = q.shape[1], k.shape[1]
    rep = hq // hk
    kf = k.float().repeat_interleave(rep, dim=1)
    vf = v.float().repeat_interleave(rep, dim=1)
    s = torch.einsum("mhd,nhd->hmn", q.float(), kf) * scale
    s = s.masked_fill(~mask[None], float("-inf"))
    pr = torch.softmax(s, dim=-1).nan_to_num(0.0)
    return torch.einsum("hmn,nhd->mhd", pr, vf)


def paged_decode_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """One query token per sequence: q [B, Hq, D] attends to the first seq_lens[b] cached
    tokens (the query's own K/V already stored). A sequence of length 0 gives zeros."""
    out = torch.zeros_like(q)
    for b in range(q.shape[0]):
        n = int(seq_lens[b])
        if n == 0:
            continue
        k = _gather(k_cache, block_tables[b], n)
        v = _gather(v_cache, block_tables[b], n)
        mask = torch.ones(1, n, dtype=torch.bool, device=q.device)
        out[b] = _attend(q[b : b + 1], k, v, mask, scale)[0].to(q.dtype)
    return out


def prefill_paged_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Varlen causal attention over paged KV with a cached prefix.

    q [T, Hq, D] packs the new tokens of B sequences: sequence b owns rows
    query_start_loc[b] : query_start_loc[b + 1]; its context is seq_lens[b] tokens (prefix +
    new, all already stored in the cache) and the new tokens are its last ones, so new token j
    sits at position seq_lens[b] - n_new + j and sees positions 0..that position.
    """
    out = torch.zeros_like(q)
    qsl = query_start_loc.tolist()
    for b in range(len(qsl) - 1):
        s, e = int(qsl[b]), int(qsl[b + 1])
        n_new, ctx = e - s, int(seq_lens[b])
        if n_new == 0:
            continue
        k = _gather(k_cache, block_tables[b], ctx)
        v = _gather(v_cache, block_tables[b], ctx)
        qpos = torch.arange(ctx - n_new, ctx, device=q.device)
        mask = torch.arange(ctx, device=q.device)[None, :] <= qpos[:, None]
        out[s:e] = _attend(q[s:e], k, v, mask, scale).to(q.dtype)
    return out
