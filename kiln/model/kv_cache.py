"""The paged KV cache: per layer, K and V tensors of fixed-size blocks."""

from __future__ import annotations

from typing import Any, Protocol

import torch

from kiln.model.checkpoint.config import ModelConfig
from kiln.model.native.c_model import kv_block_bytes, kv_map, map_of, release_pages
from kiln.model.native.plan import ComputePlan


class PlannedModel(Protocol):
    """What the cache reads of the model it serves (a ``CausalLM``): its config and plan."""

    @property
    def config(self) -> ModelConfig: ...

    @property
    def plan(self) -> ComputePlan: ...


class KVCache:
    """Per layer ``[num_blocks, block_size, num_kv_heads, head_dim]`` K and V tensors.

    Token ``t`` of a sequence lives in slot ``block_table[t // block_size] * block_size +
    t % block_size``; the block allocator (engine) owns which blocks belong to whom.

    ``heads_major`` (for the C step on the CPU; the engine asks for it when the model runs
    there): a block stores its KV heads one after another (``[num_blocks, num_kv_heads,
    block_size, head_dim]`` in memory, seen through a permuted view of the shape above), so the
    C step's attention, which reads one KV head's rows at a time, reads each block in runs of
    ``block_size * head_dim`` elements instead of one row in every ``num_kv_heads`` (measured
    with a plain read loop on this machine's VM: 23.4-24.0 against 17.5-17.7 GB/s). Otherwise
    (the Triton kernels, and the torch path, whose gathers take whole slots) it is contiguous.

    ``zero_pages`` (the CPU, as the compute plan says): each tensor is an anonymous memory map,
    zero by definition and resident only where written; else ``torch.zeros`` on ``device``.
    """

    def __init__(self, cfg: ModelConfig, num_blocks: int, block_size: int, dtype: torch.dtype,
                 device: torch.device, heads_major: bool = False,
                 zero_pages: bool = False) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError("KVCache: num_blocks and block_size must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.dtype = dtype
        self.device = device
        self.heads_major = heads_major
        self.zero_pages = zero_pages
        self.maps: list[Any] = []  # zero_pages: the anonymous maps under the tensors
        self.k: list[torch.Tensor] = [self._alloc(cfg) for _ in range(cfg.num_layers)]
        self.v: list[torch.Tensor] = [self._alloc(cfg) for _ in range(cfg.num_layers)]

    def _alloc(self, cfg: ModelConfig) -> torch.Tensor:
        nb, bs, nkv, hd = self.num_blocks, self.block_size, cfg.num_kv_heads, cfg.head_dim
        shape = (nb, nkv, bs, hd) if self.heads_major else (nb, bs, nkv, hd)
        if self.zero_pages:
            # the tensor keeps the map alive (kiln.model.native.c_model.kv_map: zero pages)
            pages = kv_map(nb * bs * nkv * hd * _element_size(self.dtype), 2 * cfg.num_layers)
            self.maps.append(pages)
            t = torch.frombuffer(pages, dtype=self.dtype).view(shape)
        else:
            t = torch.zeros(shape, dtype=self.dtype, device=self.device)
        return t.permute(0, 2, 1, 3) if self.heads_major else t

    @classmethod
    def over(cls, k: list[Any], v: list[Any], block_size: int, heads_major: bool,
             zero_pages: bool) -> KVCache:
        """A cache over existing CPU buffers (numpy arrays ``[num_blocks, block_size,
        kv_heads, head_dim]``, per layer), shared, not copied: the torch-free C engine's cache
        (``kiln.model.native.c_model``) when the torch engine takes its requests over."""
        cache = cls.__new__(cls)
        cache.num_blocks = int(k[0].shape[0])
        cache.block_size = block_size
        cache.k = [torch.from_numpy(a) for a in k]
        cache.v = [torch.from_numpy(a) for a in v]
        cache.dtype = cache.k[0].dtype
        cache.device = torch.device("cpu")
        cache.heads_major = heads_major
        cache.zero_pages = zero_pages
        cache.maps = [m for m in (map_of(a) for a in [*k, *v]) if m is not None]
        return cache

    def release(self) -> int:
        """Give the cache's memory back, keeping its tensors (zero again); the bytes released,
        0 where it is not held in anonymous maps (a GPU's)."""
        return release_pages(self.maps) if self.zero_pages else 0

    @staticmethod
    def bytes_per_block(cfg: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
        """Bytes one block takes across all layers, K and V together."""
        return kv_block_bytes(cfg, block_size, _element_size(dtype))


def _element_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def kv_cache_for(model: PlannedModel, num_blocks: int, block_size: int, dtype: torch.dtype,
                 device: torch.device) -> KVCache:
    """The cache ``model`` is served with: the layout its compute plan names (head-major blocks
    where its C step runs, contiguous ones for the torch path and CUDA)."""
    return KVCache(model.config, num_blocks, block_size, dtype, device,
                   heads_major=model.plan.kv_layout == "heads-major",
                   zero_pages=model.plan.kv_zero_pages)
