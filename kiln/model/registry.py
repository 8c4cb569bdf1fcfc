"""Architecture name -> model class."""

from __future__ import annotations

from kiln.model.base import CausalLM
from kiln.model.checkpoint.config import ModelConfig, UnsupportedModelError
from kiln.model.gemma3 import Gemma3ForCausalLM
from kiln.model.llama import LlamaForCausalLM
from kiln.model.qwen2 import Qwen2ForCausalLM
from kiln.model.qwen3 import Qwen3ForCausalLM
from kiln.model.qwen3_moe import Qwen3MoeForCausalLM

MODEL_CLASSES: dict[str, type[CausalLM]] = {
    "llama": LlamaForCausalLM,
    "qwen2": Qwen2ForCausalLM,
    "qwen3": Qwen3ForCausalLM,
    "gemma3": Gemma3ForCausalLM,
    "qwen3_moe": Qwen3MoeForCausalLM,
}


def build_model(cfg: ModelConfig) -> CausalLM:
    """An (uninitialised-weights) model for ``cfg`` on the current default device."""
    cls = MODEL_CLASSES.get(cfg.arch)
    if cls is None:
        raise UnsupportedModelError(f"unsupported architecture {cfg.arch!r}")
    return cls(cfg)
