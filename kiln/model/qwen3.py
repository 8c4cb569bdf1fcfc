"""Qwen3 dense decoder: Llama blocks plus a per-head RMSNorm on q and k before RoPE."""

from __future__ import annotations

from kiln.model.base import CausalLM
from kiln.model.checkpoint.config import ModelConfig


class Qwen3ForCausalLM(CausalLM):
    arch = "qwen3"

    def __init__(self, cfg: ModelConfig) -> None:
        if cfg.arch != self.arch:
            raise ValueError(f"{type(self).__name__} needs arch {self.arch!r}, got {cfg.arch!r}")
        if not cfg.qk_norm:
            raise ValueError("qwen3 has q/k norm")
        super().__init__(cfg)
