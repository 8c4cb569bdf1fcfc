"""Content hash of a model's weights (provenance): computed lazily, once per model."""

from __future__ import annotations

import hashlib
import weakref

import torch

_CACHE: weakref.WeakKeyDictionary[torch.nn.Module, str] = weakref.WeakKeyDictionary()


def tensor_sha256_update(h: hashlib._Hash, name: str, tensor: torch.Tensor) -> None:
    """Feed name, dtype, shape and raw bytes of one tensor into ``h``."""
    t = tensor.detach().contiguous().cpu()
    header = f"{name}\0{str(t.dtype).removeprefix('torch.')}\0{list(t.shape)}\0"
    h.update(header.encode("utf-8"))
    h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())


def model_content_sha256(model: torch.nn.Module) -> str:
    """sha256 over every parameter and buffer (name, dtype, shape, bytes), sorted by name."""
    cached = _CACHE.get(model)
    if cached is not None:
        return cached
    h = hashlib.sha256()
    state = model.state_dict()
    if any(t.is_meta for t in state.values()):  # released float32 copies of packed weights
        from kiln.model.quantized import float32_state_dict

        state = float32_state_dict(model)  # type: ignore[arg-type]
    for name in sorted(state):
        tensor_sha256_update(h, name, state[name])
    digest = h.hexdigest()
    _CACHE[model] = digest
    return digest
