"""Paged attention: KV-cache store, decode (split-K) and prefill over paged KV with a prefix.

The dispatchers use Triton for CUDA tensors and the torch references otherwise. See
``reference.py`` for the cache layout and the exact semantics.
"""

from __future__ import annotations

import torch

from .reference import paged_decode_ref, prefill_paged_ref, store_kv_ref

__all__ = [
    "paged_decode",
    "paged_decode_ref",
    "prefill_paged",
    "prefill_paged_ref",
    "store_kv",
    "store_kv_ref",
]


def store_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Scatter k, v [T, Hk, D] into the caches at slot_mapping [T] (negative: skip). In place."""
    if k.is_cuda:
        from .kv_store import store_kv_triton

        store_kv_triton(k, v, k_cache, v_cache, slot_mapping)
    else:
        store_kv_ref(k, v, k_cache, v_cache, slot_mapping)


def paged_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """q [B, Hq, D], one token per sequence -> [B, Hq, D]."""
    if q.is_cuda:
        from .decode import paged_decode_triton

        return paged_decode_triton(q, k_cache, v_cache, block_tables, seq_lens, scale)
    return paged_decode_ref(q, k_cache, v_cache, block_tables, seq_lens, scale)


def prefill_paged(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    max_query_len: int | None = None,
) -> torch.Tensor:
    """Varlen causal attention of new tokens q [T, Hq, D] over their paged context -> [T, Hq, D]."""
    if q.is_cuda:
        from .prefill import prefill_paged_triton

        return prefill_paged_triton(
            q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale, max_query_len
        )
    return prefill_paged_ref(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale)
