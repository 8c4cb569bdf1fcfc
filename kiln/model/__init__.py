"""Model architectures (llama, qwen2, qwen3 over one layer vocabulary), KV cache, loaders.

The torch-free part is two folders: ``checkpoint/`` (a checkpoint's files read without torch)
and ``native/`` (the model as the C kernels run it, and the compute plan); the modules here are
the torch side, and the loader that picks a side. The names below are imported on first use
(PEP 562), so that importing a torch-free module (``kiln.model.checkpoint.gguf_index``,
``kiln.model.checkpoint.locate``) does not import torch."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kiln.model.base import CausalLM
    from kiln.model.batch import ForwardBatch, build_forward_batch
    from kiln.model.checkpoint.config import ModelConfig, UnsupportedModelError, WeightLoadError
    from kiln.model.checkpoint.locate import ModelNotFoundError
    from kiln.model.hashing import model_content_sha256
    from kiln.model.kv_cache import KVCache
    from kiln.model.loader import LoadedModel, load_model
    from kiln.model.registry import build_model

_WHERE = {
    "CausalLM": "base", "ForwardBatch": "batch", "build_forward_batch": "batch",
    "ModelConfig": "checkpoint.config", "UnsupportedModelError": "checkpoint.config",
    "model_content_sha256": "hashing", "KVCache": "kv_cache", "LoadedModel": "loader",
    "load_model": "loader", "ModelNotFoundError": "checkpoint.locate", "build_model": "registry",
    "WeightLoadError": "checkpoint.config",
}

__all__ = [
    "CausalLM",
    "ForwardBatch",
    "KVCache",
    "LoadedModel",
    "ModelConfig",
    "ModelNotFoundError",
    "UnsupportedModelError",
    "WeightLoadError",
    "build_forward_batch",
    "build_model",
    "load_model",
    "model_content_sha256",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'kiln.model' has no attribute {name!r}")
    return getattr(importlib.import_module(f"kiln.model.{module}"), name)
