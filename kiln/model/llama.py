"""Llama-family decoder (Llama 2/3, SmolLM2, Mistral; a sliding window caps the context:
kiln.model.checkpoint.config)."""

from __future__ import annotations

from kiln.model.base import CausalLM
from kiln.model.checkpoint.config import ModelConfig


class LlamaForCausalLM(CausalLM):
    """Llama: RMSNorm pre-norm blocks, GQA attention without biases, SwiGLU MLP, NEOX RoPE."""

    arch = "llama"

    def __init__(self, cfg: ModelConfig) -> None:
        if cfg.arch != self.arch:
            raise ValueError(f"{type(self).__name__} needs arch {self.arch!r}, got {cfg.arch!r}")
        if cfg.qk_norm:
            raise ValueError("llama has no q/k norm")
        super().__init__(cfg)
