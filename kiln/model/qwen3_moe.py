"""Qwen3-MoE (transformers' ``qwen3_moe``): Qwen3's attention (q/k norms) with a mixture of
experts in place of the MLP on its sparse layers (``kiln.model.layers.MoEMLP``: softmax top-k
routing, the step's tokens grouped by expert). The torch path runs it (the C step runs the
plain block only: ``kiln.model.native.step_weights``)."""

from __future__ import annotations

from kiln.model.base import CausalLM
from kiln.model.checkpoint.config import ModelConfig


class Qwen3MoeForCausalLM(CausalLM):
    arch = "qwen3_moe"

    def __init__(self, cfg: ModelConfig) -> None:
        if cfg.arch != self.arch:
            raise ValueError(f"{type(self).__name__} needs arch {self.arch!r}, got {cfg.arch!r}")
        if not cfg.qk_norm or not cfg.num_experts:
            raise ValueError("qwen3_moe has q/k norms and experts")
        super().__init__(cfg)
