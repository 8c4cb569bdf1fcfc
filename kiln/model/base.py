"""The causal-LM base: embeddings -> decoder layers -> final norm -> logits at chosen rows, of a
flat forward batch (``kiln.model.batch``). Where the model's compute plan says ``step=c`` a
whole step runs in one C call (``kiln.model.cpu_step.CpuStep``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import cast

import torch
from kiln_kernels.quant import Packed, PackedWeight
from torch import nn

from kiln.model.attention import AttentionPlan, plan_attention
from kiln.model.batch import ForwardBatch
from kiln.model.checkpoint.config import ModelConfig
from kiln.model.cpu_step import CpuStep, cpu_step_weights
from kiln.model.kv_cache import KVCache
from kiln.model.layers import DecoderLayer, LoraHook, RMSNorm, RotaryEmbedding
from kiln.model.native.plan import ComputePlan, model_plan, without_packed
from kiln.model.quantized import (
    NO_ROUTE,
    PackedEmbedding,
    PackedParts,
    RowRoute,
    packed_parts,
    project,
)


class DecoderStack(nn.Module):
    """HF's inner ``model`` module: ``embed_tokens``, ``layers``, ``norm``."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        # Left uninitialised (the loaders fill every weight): nn.Embedding's default normal_
        # init, run on the meta device, imports torch's Python decompositions, ~1.1 s of load.
        self.embed_tokens: nn.Embedding | PackedEmbedding = nn.Embedding(
            cfg.vocab_size, cfg.hidden_size, _weight=torch.empty(cfg.vocab_size, cfg.hidden_size))
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class CausalLM(nn.Module):
    """A decoder-only LM over the paged KV cache.

    ``forward(batch, kv)`` runs the flat batch of new tokens, writes their K/V into ``kv`` and
    returns float32 logits ``[len(batch.logits_indices), vocab]``.
    """

    config: ModelConfig

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.model = DecoderStack(cfg)
        self.lm_head: nn.Linear | None = (
            None if cfg.tie_word_embeddings
            else nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False))
        self.rotary = RotaryEmbedding(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)
        # the sliding layers' own rotary base (Gemma), unscaled; None: every layer's is rotary
        self.rotary_local: RotaryEmbedding | None = (
            RotaryEmbedding(cfg.head_dim, cfg.rope_local_theta) if cfg.rope_local_theta
            else None)
        self.packed_head: Packed | None = None  # set by attach_packed
        self.packed_embedding: PackedWeight | None = None  # the token embedding's blocks
        self._cpu_step: CpuStep | None = None  # the C step, when every weight is packed
        self._plan: ComputePlan | None = None  # decided by kiln.model.native.plan (lazily, once)
        self._plan_override: ComputePlan | None = None  # packed_disabled's torch-only plan

    @property
    def plan(self) -> ComputePlan:
        """The model's compute plan (kiln.model.native.plan): which implementation runs its
        steps."""
        if self._plan_override is not None:
            return self._plan_override
        if self._plan is None:
            ref = self.model.norm.weight  # never released: the model's device and dtype
            self._plan = model_plan(ref.device, ref.dtype,
                                    packed=self.packed_head is not None or self._any_packed(),
                                    c_step=self._cpu_step is not None)
        return self._plan

    @property
    def cpu_step(self) -> CpuStep | None:
        """The CPU step's runner where the plan's step is ``c`` (else None)."""
        return self._cpu_step if self.plan.step == "c" else None

    def _any_packed(self) -> bool:
        for module in self.model.layers:
            layer = cast("DecoderLayer", module)
            if layer.self_attn.has_packed or layer.mlp.has_packed:
                return True
        return False

    def attach_packed(self, packed: dict[str, PackedWeight]) -> int:
        """Take packed weights (kiln.model.quantized.packed_parts: keyed by HF parameter
        names); returns the bytes attached. The plan follows from what was attached."""
        parts: PackedParts = packed_parts(packed, self.config.num_layers, self.lm_head is None)
        for module, (qkv, o, gate_up, down) in zip(self.model.layers, parts.layers, strict=True):
            layer = cast("DecoderLayer", module)
            layer.self_attn.set_packed(qkv, o)
            layer.mlp.set_packed(gate_up, down)
        self.packed_head = parts.head
        self._cpu_step = None
        weights = cpu_step_weights(self.config, self.model.layers, self.named_parameters(),
                                   self.packed_head, parts.embedding)
        self._cpu_step = None if weights is None else CpuStep(weights)
        self.packed_embedding = None if self._cpu_step is None else parts.embedding
        self._plan = None
        total = parts.nbytes
        if self.packed_embedding is not None and self.lm_head is not None:
            total += self.packed_embedding.nbytes
        return total

    def use_cpu_step_build(self, flags: tuple[str, ...]) -> None:
        """Run the CPU step on the C library built with ``flags`` (tests: the portable build)."""
        if self._cpu_step is None:
            raise ValueError("this model has no CPU step")
        self._cpu_step = CpuStep(self._cpu_step.weights, flags=flags)

    @contextlib.contextmanager
    def torch_only(self) -> Iterator[None]:
        """Run the torch path on float32 weights only for the duration (the weights must be
        there: kiln.model.float32_copies.packed_disabled materializes released ones)."""
        saved = self._plan_override
        self._plan_override = without_packed(self.plan)
        try:
            yield
        finally:
            self._plan_override = saved

    def output_weight(self) -> torch.Tensor:
        """The ``[vocab, hidden]`` output projection (the embedding when tied)."""
        return self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    def hidden_states(self, batch: ForwardBatch, kv: KVCache) -> torch.Tensor:
        """Last-layer hidden states ``[T, hidden]`` (before the final norm) of every row."""
        return self._hidden(batch, kv)[0]

    def _decode_rows(self, batch: ForwardBatch, plan: AttentionPlan) -> torch.Tensor | None:
        """bool [T]: the rows that are a sequence's single decode token (None: no packed path)."""
        if not self.plan.packed_rows or plan.decode is None:
            return None
        mask = torch.zeros(batch.input_ids.shape[0], dtype=torch.bool)
        mask[plan.decode.rows] = True
        return mask

    def _hidden(self, batch: ForwardBatch, kv: KVCache
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if len(kv.k) != self.config.num_layers:
            raise ValueError("KV cache has a different number of layers than the model")
        lora = batch.lora
        if lora is not None and not isinstance(lora, LoraHook):
            raise TypeError(f"ForwardBatch.lora must be a LoraHook, got {type(lora).__name__}")
        plan = plan_attention(batch, kv.block_size, self.plan.torch_attention)
        decode = self._decode_rows(batch, plan)
        route = NO_ROUTE if decode is None else RowRoute.from_mask(decode)
        x = self.model.embed_tokens(batch.input_ids)
        cfg = self.config
        if cfg.embed_scale != 1.0:  # Gemma: times sqrt(hidden) in the embedding's dtype
            x = x * torch.tensor(cfg.embed_scale, dtype=x.dtype)
        cos, sin = self.rotary.cos_sin(batch.positions, x.dtype)
        local = (cos, sin) if self.rotary_local is None else self.rotary_local.cos_sin(
            batch.positions, x.dtype)
        for i, layer in enumerate(self.model.layers):
            c, s = local if cfg.window(i) else (cos, sin)
            x = layer(x, c, s, kv.k[i], kv.v[i], plan, lora, route)
        return x, decode

    def soft_cap(self, logits: torch.Tensor) -> torch.Tensor:
        """The final logits' soft cap, ``c * tanh(logits / c)``, where the model has one."""
        c = self.config.final_logit_softcap
        return logits if not c else torch.tanh(logits / c) * c

    def forward(self, batch: ForwardBatch, kv: KVCache) -> torch.Tensor:
        with torch.inference_mode():
            cpu_step = self.cpu_step
            if cpu_step is not None:  # it declines steps it cannot take (None)
                logits = cpu_step.try_forward(self.model.embed_tokens, batch, kv)
                if logits is not None:
                    return logits
            return self._torch_forward(batch, kv)

    def _torch_forward(self, batch: ForwardBatch, kv: KVCache) -> torch.Tensor:
        with torch.inference_mode():
            hidden, decode = self._hidden(batch, kv)
            x = self.model.norm(hidden.index_select(0, batch.logits_indices))
            route = (NO_ROUTE if decode is None
                     else RowRoute.from_mask(decode.index_select(0, batch.logits_indices)))
            return self.soft_cap(
                project(x, self.output_weight(), self.packed_head, route).to(torch.float32))
