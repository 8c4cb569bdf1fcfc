"""Qwen2 / Qwen2.5 decoder: Llama blocks plus biases on the q/k/v projections."""

from __future__ import annotations

from kiln.model.base import CausalLM
from kiln.model.checkpoint.config import ModelConfig


class Qwen2ForCausalLM(CausalLM):
    arch = "qwen2"

    def __init__(self, cfg: ModelConfig) -> None:
        if cfg.arch != self.arch:
            raise ValueError(f"{type(self).__name__} needs arch {self.arch!r}, got {cfg.arch!r}")
        if not cfg.qkv_bias or cfg.qk_norm:
            raise ValueError("qwen2 has q/k/v biases and no q/k norm")
        super().__init__(cfg)
