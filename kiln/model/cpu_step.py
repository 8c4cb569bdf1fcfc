"""The CPU step: a whole forward step of a ``CausalLM`` in one C call.

Where the plan's step is ``c`` (every projection and the LM head hold packed weights,
kiln.model.quantized, seen by the C program as :func:`cpu_step_weights`; LoRA included as CPU
stacks of kiln.model.lora_slots), every row of every step runs through the C program of kiln_kernels.cpu.cpu_step, whose numbers for a row do not
depend on what else is in its step: a decode row, a prefill chunk of any length and a scored
prompt get the same logits at the same position over the same prefix, bit for bit. A step
longer than group_rows runs as consecutive C steps over its rows in order.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable
from typing import cast

import torch
from kiln_kernels.cpu.arrays import dtype_name
from kiln_kernels.cpu.cpu_step import (
    KV_DTYPES,
    LORA_MODULES,
    CpuStepProgram,
    CpuStepWeights,
    LoraRows,
)
from kiln_kernels.quant import NATIVE_FLAGS, Packed
from torch import nn

from kiln.model.batch import ForwardBatch
from kiln.model.checkpoint.config import ModelConfig
from kiln.model.kv_cache import KVCache
from kiln.model.layers import DecoderLayer, SwiGLUMLP
from kiln.model.lora import LORA_MODULES as MODEL_LORA_MODULES
from kiln.model.lora_slots import LoraBatch
from kiln.model.native.c_model import run_rows
from kiln.model.native.step_weights import step_weights

if MODEL_LORA_MODULES != LORA_MODULES:  # cpu_step.c indexes the stacks in this order
    raise ImportError("kiln.model.lora and kiln_kernels.cpu.cpu_step disagree on LoRA modules")

# the model's token embedding: token ids [T] -> rows [T, hidden]
Embed = Callable[[torch.Tensor], torch.Tensor]


class _Unsupported(Exception):
    """This step's LoRA cannot run in the C program (not CPU float32 stacks)."""


def lora_rows(lora: object, rows: torch.Tensor) -> LoraRows | None:
    """The C program's view of a step's LoRA for ``rows`` (None: no adapter in the step)."""
    if lora is None:
        return None
    if not isinstance(lora, LoraBatch) or lora.slots.dtype != torch.float32:
        raise _Unsupported
    if lora.strategy == "none":
        return None
    a: list[torch.Tensor | None] = []
    bt: list[torch.Tensor | None] = []
    for module in LORA_MODULES:
        pair = lora.slots.stacks(module)
        if pair is None:
            a.append(None)
            bt.append(None)
            continue
        b_t = pair[1].transpose(2, 3)  # the CPU stacks store B^T contiguously
        if not (pair[0].is_contiguous() and b_t.is_contiguous()):
            raise _Unsupported
        a.append(pair[0])
        bt.append(b_t)
    return LoraRows(slot_idx=lora.slot_idx.index_select(1, rows),
                    scales=lora.scales.index_select(1, rows), a=tuple(a), bt=tuple(bt))


class CpuStep:
    """Runs forward steps through the C program (one bound program per KV cache)."""

    def __init__(self, weights: CpuStepWeights, flags: tuple[str, ...] = NATIVE_FLAGS) -> None:
        self.weights = weights
        self.flags = flags  # compiler flags of the library (tests: the portable build)
        self._programs: weakref.WeakKeyDictionary[KVCache, CpuStepProgram] = (
            weakref.WeakKeyDictionary())

    def program(self, kv: KVCache) -> CpuStepProgram:
        prog = self._programs.get(kv)
        if prog is None:
            prog = self.weights.bind(kv.k, kv.v, self.flags)
            self._programs[kv] = prog
        return prog

    def try_forward(self, embed: Embed, batch: ForwardBatch, kv: KVCache
                    ) -> torch.Tensor | None:
        """Logits of the step through the C program, or None when the step is the torch path's
        (a KV cache it cannot read, or LoRA other than CPU float32 slot stacks). ``embed``: the
        model's token embedding (``CausalLM.model.embed_tokens``), run where the C program
        does not hold it packed."""
        if dtype_name(kv.dtype) not in KV_DTYPES:
            return None
        try:
            return self.forward(embed, batch, kv)
        except _Unsupported:
            return None

    def forward(self, embed: Embed, batch: ForwardBatch, kv: KVCache) -> torch.Tensor:
        """Logits ``[len(batch.logits_indices), vocab]`` in the order asked, from C steps of at
        most :func:`group_rows` rows each."""
        prog = self.program(kv)
        # the embedding: in the C step where it is held packed, else the model's module first
        x = None if prog.embeds else embed(batch.input_ids)

        def lora(a: int, b: int) -> LoraRows | None:
            return lora_rows(batch.lora, torch.arange(a, b))

        return torch.from_numpy(run_rows(  # the rows flattened once (batch.rows)
            prog, batch.rows, batch.logits_indices.tolist(), self.weights.heads, x=x,
            lora=None if batch.lora is None else lora))


def cpu_step_weights(cfg: ModelConfig, layers: Iterable[nn.Module],
                     parameters: Iterable[tuple[str, nn.Parameter]], head: Packed | None,
                     embedding: Packed | None = None) -> CpuStepWeights | None:
    """The C program's view of a ``CausalLM`` (``kiln.model.native.step_weights.step_weights``, the
    one layout of them) from its config, decoder layers, named parameters and packed head, or None
    when some projection is not packed; ``embedding``: the token embedding's blocks, looked up
    in the C step (None: the model's ``embed_tokens`` runs first)."""
    products: dict[str, Packed | None] = {}
    for i, module in enumerate(layers):
        layer = cast(DecoderLayer, module)
        attn, mlp, pre = layer.self_attn, layer.mlp, f"model.layers.{i}."
        if not isinstance(mlp, SwiGLUMLP):  # a mixture of experts: no C program
            return None
        products.update({pre + "qkv": attn.packed_qkv, pre + "o": attn.packed_o,
                         pre + "gate_up": mlp.packed_gate_up, pre + "down": mlp.packed_down})
    small = {name: p.detach() for name, p in parameters if p.dim() == 1}
    return step_weights(cfg, products, small, head=head, embed=embedding)
