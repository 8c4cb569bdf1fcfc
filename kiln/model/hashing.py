"""Content hash of a model's weights (provenance): computed lazily, once per model."""

from __future__ import annotations

import hashlib
import weakref
from typing import cast

import torch

from kiln.model.base import CausalLM
from kiln.model.float32_copies import float32_state_dict
from kiln.model.lora import tensor_sha256_update

_CACHE: weakref.WeakKeyDictionary[torch.nn.Module, str] = weakref.WeakKeyDictionary()


def model_content_sha256(model: torch.nn.Module) -> str:
    """sha256 over every parameter and buffer (name, dtype, shape, bytes), sorted by name."""
    cached = _CACHE.get(model)
    if cached is not None:
        return cached
    h = hashlib.sha256()
    state = model.state_dict()
    if any(t.is_meta for t in state.values()):  # released float32 copies of packed weights
        state = float32_state_dict(cast(CausalLM, model))
    for name in sorted(state):
        tensor_sha256_update(h, name, state[name])
    digest = h.hexdigest()
    _CACHE[model] = digest
    return digest
