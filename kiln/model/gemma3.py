"""Gemma 3's text decoder (transformers' ``gemma3_text``): the Llama block with sliding-window
layers (five to one global layer, each with its own rotary base), embeddings scaled by
sqrt(hidden), (1 + w) RMSNorms before and after the attention and the MLP (the loader adds the
1: ``ModelConfig.norm_shift``), q/k norms, GeGLU and the attention scale of
``query_pre_attn_scalar``: every one a ``ModelConfig`` field the layers read. The torch path runs
it (the C step runs the plain block only: ``kiln.model.native.step_weights``)."""

from __future__ import annotations

from kiln.model.base import CausalLM
from kiln.model.checkpoint.config import ModelConfig


class Gemma3ForCausalLM(CausalLM):
    arch = "gemma3"

    def __init__(self, cfg: ModelConfig) -> None:
        if cfg.arch != self.arch:
            raise ValueError(f"{type(self).__name__} needs arch {self.arch!r}, got {cfg.arch!r}")
        if not (cfg.qk_norm and cfg.sandwich_norms):
            raise ValueError("gemma3 has q/k norms and norms around each block")
        super().__init__(cfg)
