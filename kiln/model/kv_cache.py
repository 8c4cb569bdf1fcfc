"""The paged KV cache: per layer, K and V tensors of fixed-size blocks."""

from __future__ import annotations

import torch

from kiln.model.config import ModelConfig


class KVCache:
    """Per layer ``[num_blocks, block_size, num_kv_heads, head_dim]`` K and V tensors.

    Token ``t`` of a sequence lives in slot ``block_table[t // block_size] * block_size +
    t % block_size``; the block allocator (engine) owns which blocks belong to whom.
    """

    def __init__(self, cfg: ModelConfig, num_blocks: int, block_size: int, dtype: torch.dtype,
                 device: torch.device) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError("KVCache: num_blocks and block_size must be positive")
        shape = (num_blocks, block_size, cfg.num_kv_heads, cfg.head_dim)
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.dtype = dtype
        self.device = device
        self.k: list[torch.Tensor] = [
            torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.num_layers)]
        self.v: list[torch.Tensor] = [
            torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.num_layers)]

    @staticmethod
    def bytes_per_block(cfg: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
        """Bytes one block takes across all layers, K and V together."""
        elem = torch.empty((), dtype=dtype).element_size()
        return 2 * cfg.num_layers * block_size * cfg.num_kv_heads * cfg.head_dim * elem
