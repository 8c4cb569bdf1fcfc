"""Model architectures (llama, qwen2, qwen3 over one layer vocabulary), KV cache, loaders."""

from kiln.model.base import CausalLM
from kiln.model.batch import ForwardBatch, build_forward_batch
from kiln.model.config import ModelConfig, UnsupportedModelError
from kiln.model.hashing import model_content_sha256
from kiln.model.kv_cache import KVCache
from kiln.model.loader import LoadedModel, ModelNotFoundError, load_model
from kiln.model.registry import build_model
from kiln.model.weights import WeightLoadError

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
