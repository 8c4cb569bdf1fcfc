"""The causal-LM base: embeddings -> decoder layers -> final norm -> logits at chosen rows, and
its input, the flat forward batch (new tokens of many sequences plus paged-attention metadata).
Where the model's compute plan says ``step=c`` a whole step runs in one C call
(``kiln.model.cpu_step.CpuStep``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal, cast

import numpy as np
import torch
from kiln_kernels.quant import Packed, PackedWeight
from torch import nn

from kiln.model.attention import AttentionPlan, plan_attention
from kiln.model.c_model import StepRows, flatten
from kiln.model.config import ModelConfig
from kiln.model.cpu_step import CpuStep
from kiln.model.kv_cache import KVCache
from kiln.model.layers import DecoderLayer, LoraHook, RMSNorm, RotaryEmbedding
from kiln.model.plan import ComputePlan, model_plan, without_packed
from kiln.model.quantized import (
    NO_ROUTE,
    PackedEmbedding,
    PackedParts,
    RowRoute,
    cpu_step_weights,
    packed_parts,
    project,
)


@dataclass
class ForwardBatch:
    input_ids: torch.Tensor  # int64 [T]  new tokens of all sequences, concatenated
    positions: torch.Tensor  # int64 [T]  absolute position of each new token
    query_start_loc: torch.Tensor  # int32 [B+1] new tokens of seq i are rows qsl[i]:qsl[i+1]
    seq_lens: torch.Tensor  # int32 [B]  tokens in the cache for seq i AFTER this step
    block_tables: torch.Tensor  # int32 [B, max_blocks_per_seq], padded with 0
    slot_mapping: torch.Tensor  # int64 [T]  cache slot block_id*block_size+offset per new token
    logits_indices: torch.Tensor  # int64 [L]  rows of the flat batch to return logits for
    rows: StepRows  # the same rows as numpy (``flatten``'s: the C step reads them)
    lora: object | None = None  # filled by the LoRA issue; models ignore None

    @classmethod
    def build(cls, seqs: Sequence[tuple[Sequence[int], int, Sequence[int]]], block_size: int,
              logits: Literal["last", "all"] = "last",
              device: torch.device | str = "cpu") -> ForwardBatch:
        return build_forward_batch(seqs, block_size, logits, device)


def build_forward_batch(seqs: Sequence[tuple[Sequence[int], int, Sequence[int]]],
                        block_size: int,
                        logits: Literal["last", "all"] | Sequence[int] = "last",
                        device: torch.device | str = "cpu") -> ForwardBatch:
    """Build a batch from ``(new_tokens, start_pos, block_table)`` per sequence.

    ``start_pos`` is the number of tokens already in the cache for that sequence; the block
    table must cover ``start_pos + len(new_tokens)`` tokens. ``logits="last"`` returns one
    row per sequence (its last new token), ``"all"`` every row, a list of ints each sequence's
    last ``logits[s]`` rows (``kiln.model.c_model.flatten``).
    """
    rows = flatten(seqs, block_size, logits)  # the rows, flattened once (kiln.model.c_model)
    dev = torch.device(device)

    def tensor(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(a).to(dev)

    return ForwardBatch(
        input_ids=tensor(rows.ids), positions=tensor(rows.positions),
        query_start_loc=tensor(rows.query_start_loc), seq_lens=tensor(rows.seq_lens),
        block_tables=tensor(rows.tables), slot_mapping=tensor(rows.slots),
        logits_indices=tensor(rows.logit_rows), rows=rows)


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
        self.packed_head: Packed | None = None  # set by attach_packed
        self.packed_embedding: PackedWeight | None = None  # the token embedding's blocks
        self._cpu_step: CpuStep | None = None  # the C step, when every weight is packed
        self._plan: ComputePlan | None = None  # decided by kiln.model.plan (lazily, once)
        self._plan_override: ComputePlan | None = None  # packed_disabled's torch-only plan

    @property
    def plan(self) -> ComputePlan:
        """The model's compute plan (kiln.model.plan): which implementation runs its steps."""
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
        parts: PackedParts = packed_parts(self, packed)
        for module, (qkv, o, gate_up, down) in zip(self.model.layers, parts.layers, strict=True):
            layer = cast("DecoderLayer", module)
            layer.self_attn.set_packed(qkv, o)
            layer.mlp.set_packed(gate_up, down)
        self.packed_head = parts.head
        self._cpu_step = None
        weights = cpu_step_weights(self, parts.embedding)
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
        there: kiln.model.quantized.packed_disabled materializes released ones)."""
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
        cos, sin = self.rotary.cos_sin(batch.positions, x.dtype)
        for i, layer in enumerate(self.model.layers):
            x = layer(x, cos, sin, kv.k[i], kv.v[i], plan, lora, route)
        return x, decode

    def forward(self, batch: ForwardBatch, kv: KVCache) -> torch.Tensor:
        with torch.inference_mode():
            cpu_step = self.cpu_step
            if cpu_step is not None:  # it declines steps it cannot take (None)
                logits = cpu_step.try_forward(self, batch, kv)
                if logits is not None:
                    return logits
            return self._torch_forward(batch, kv)

    def _torch_forward(self, batch: ForwardBatch, kv: KVCache) -> torch.Tensor:
        with torch.inference_mode():
            hidden, decode = self._hidden(batch, kv)
            x = self.model.norm(hidden.index_select(0, batch.logits_indices))
            route = (NO_ROUTE if decode is None
                     else RowRoute.from_mask(decode.index_select(0, batch.logits_indices)))
            return project(x, self.output_weight(), self.packed_head, route).to(torch.float32)
