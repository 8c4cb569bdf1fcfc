"""Input checks shared by the paged-attention launchers."""

from __future__ import annotations

import torch

_FLOATS = (torch.float32, torch.float16, torch.bfloat16)
_INTS = (torch.int32, torch.int64)


def check_paged(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    batch: int,
) -> tuple[int, int]:
    """Validate a query [*, Hq, D] against caches [NB, BS, Hk, D]; -> (Hk, block_size)."""
    if q.dtype not in _FLOATS:
        raise ValueError(f"q dtype must be float32/float16/bfloat16, got {q.dtype}")
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError("k_cache and v_cache must be [num_blocks, block_size, Hk, D] of one shape")
    if k_cache.dtype != v_cache.dtype or k_cache.dtype not in _FLOATS:
        raise ValueError("caches must share a float dtype")
    _, bs, hk, d = k_cache.shape
    hq = q.shape[1]
    if q.shape[2] != d:
        raise ValueError(f"head dim {q.shape[2]} != cache head dim {d}")
    if hk == 0 or hq % hk:
        raise ValueError(f"query heads {hq} must be a multiple of KV heads {hk}")
    if k_cache.stride(3) != 1 or v_cache.stride() != k_cache.stride():
        raise ValueError("caches must be contiguous in D and share strides")
    if block_tables.dim() != 2 or block_tables.shape[0] != batch or block_tables.dtype not in _INTS:
        raise ValueError(f"block_tables must be int32/int64 [{batch}, max_blocks]")
    if seq_lens.shape != (batch,) or seq_lens.dtype not in _INTS:
        raise ValueError(f"seq_lens must be int32/int64 [{batch}]")
    if block_tables.stride(1) != 1:
        raise ValueError("block_tables must be contiguous in its last dimension")
    devs = {t.device for t in (q, k_cache, v_cache, block_tables, seq_lens)}
    if len(devs) != 1:
        raise ValueError("all tensors must be on one device")
    return int(hk), int(bs)
