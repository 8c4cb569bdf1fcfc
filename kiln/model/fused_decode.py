"""The CPU fast path: a whole forward step in one C call (``kiln_kernels.quant.decode``).

Used when every projection of the model and its LM head hold packed GGUF weights (see
:mod:`kiln.model.quantized`); LoRA runs here too (CPU stacks of ``kiln.model.lora_slots``) when
the whole step fits. Decode sequences (one new token that
sees its whole context) always run through the C program, so a decoding sequence's numbers never
depend on what else is in its step; short prefill chunks join them while the step stays within
``C_MAX_ROWS`` rows, longer ones run through the torch path (MKL) as a sub-batch.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

import torch
from kiln_kernels.quant import NATIVE_FLAGS, PackedWeight
from kiln_kernels.quant.decode import (
    KV_DTYPES,
    LORA_MODULES,
    DecodeLayer,
    DecodeProgram,
    DecodeWeights,
    LoraRows,
)

from kiln.model.batch import ForwardBatch
from kiln.model.kv_cache import KVCache
from kiln.model.lora import LORA_MODULES as MODEL_LORA_MODULES
from kiln.model.lora_slots import LoraBatch

if TYPE_CHECKING:
    from kiln.model.base import CausalLM
    from kiln.model.layers import DecoderLayer


def decode_weights(model: CausalLM) -> DecodeWeights | None:
    """The C program's view of ``model``, or None when some projection is not packed."""
    cfg = model.config
    head: PackedWeight | None = model.packed_head
    if head is None:
        return None
    layers: list[DecodeLayer] = []
    for module in model.model.layers:
        layer = cast("DecoderLayer", module)
        attn, mlp = layer.self_attn, layer.mlp
        packed = (attn.packed_qkv, attn.packed_o, mlp.packed_gate_up, mlp.packed_down)
        qkv, o, gate_up, down = packed
        if qkv is None or o is None or gate_up is None or down is None:
            return None
        layers.append(DecodeLayer(
            qkv, o, gate_up, down, in_norm=layer.input_layernorm.weight.detach(),
            post_norm=layer.post_attention_layernorm.weight.detach(),
            q_norm=None if attn.q_norm is None else attn.q_norm.weight.detach(),
            k_norm=None if attn.k_norm is None else attn.k_norm.weight.detach(),
            q_bias=None if attn.q_proj.bias is None else attn.q_proj.bias.detach(),
            k_bias=None if attn.k_proj.bias is None else attn.k_proj.bias.detach(),
            v_bias=None if attn.v_proj.bias is None else attn.v_proj.bias.detach()))
    return DecodeWeights(hidden=cfg.hidden_size, inter=cfg.intermediate_size,
                         heads=cfg.num_heads, kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
                         eps=cfg.rms_norm_eps, layers=tuple(layers),
                         final_norm=model.model.norm.weight.detach(), head=head)


if MODEL_LORA_MODULES != LORA_MODULES:  # decode.c indexes the stacks in this order
    raise ImportError("kiln.model.lora and kiln_kernels.quant.decode disagree on LoRA modules")

# Rows a step may send through the C program. Beyond it the step's prefill chunks go to the
# torch path (float32 MKL GEMMs beat the quantized kernels once many rows share the weights).
C_MAX_ROWS = 64


def decode_sequences(batch: ForwardBatch) -> list[int]:
    """Indices of the sequences that decode one token seeing their whole context."""
    qsl = batch.query_start_loc.tolist()
    lens = batch.seq_lens.tolist()
    positions = batch.positions.tolist()
    return [i for i, n in enumerate(lens)
            if qsl[i + 1] - qsl[i] == 1 and positions[qsl[i]] == n - 1]


def c_sequences(batch: ForwardBatch) -> list[int]:
    """The sequences of a step that go through the C program: all of them when the step has at
    most C_MAX_ROWS rows, else its decodes."""
    n_seqs = int(batch.query_start_loc.numel()) - 1
    if int(batch.input_ids.numel()) <= C_MAX_ROWS:
        return list(range(n_seqs))
    return decode_sequences(batch)


class _Unsupported(Exception):
    """This step's LoRA cannot run in the C program (not CPU float32 stacks)."""


def lora_rows(lora: object, rows: torch.Tensor) -> LoraRows | None:
    """The C program's view of a step's LoRA for ``rows`` (None: no adapter in the step)."""
    if lora is None:
        return None
    if not isinstance(lora, LoraBatch) or lora.slots.device.type != "cpu" or (
            lora.slots.dtype != torch.float32):
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


def select_rows(qsl: list[int], seqs: list[int], wanted: list[int]
                ) -> tuple[list[int], list[int], list[tuple[int, int]]]:
    """The rows of ``seqs`` in order; for each, the local index of its sequence's first row; and
    ``(j, local row)`` for every wanted logits row ``wanted[j]`` among them."""
    rows: list[int] = []
    first: list[int] = []
    for i in seqs:
        first.extend([len(rows)] * (qsl[i + 1] - qsl[i]))
        rows.extend(range(qsl[i], qsl[i + 1]))
    local = {r: k for k, r in enumerate(rows)}
    return rows, first, [(j, local[r]) for j, r in enumerate(wanted) if r in local]


def sub_batch(batch: ForwardBatch, seqs: list[int]) -> tuple[ForwardBatch, list[int]]:
    """The batch of only ``seqs`` (logits at their rows among ``batch.logits_indices``), and
    the positions in ``batch.logits_indices`` those logits belong to."""
    rows, first, picked = select_rows(batch.query_start_loc.tolist(), seqs,
                                      batch.logits_indices.tolist())
    new_qsl = [*sorted(set(first)), len(rows)]
    index = torch.tensor(rows, dtype=torch.int64)
    seq_index = torch.tensor(seqs, dtype=torch.int64)
    sub = ForwardBatch(
        input_ids=batch.input_ids.index_select(0, index),
        positions=batch.positions.index_select(0, index),
        query_start_loc=torch.tensor(new_qsl, dtype=torch.int32),
        seq_lens=batch.seq_lens.index_select(0, seq_index),
        block_tables=batch.block_tables.index_select(0, seq_index),
        slot_mapping=batch.slot_mapping.index_select(0, index),
        logits_indices=torch.tensor([r for _, r in picked] or [0], dtype=torch.int64),
        lora=batch.lora)
    return sub, [j for j, _ in picked]


class FusedDecoder:
    """Runs decode sequences through the C program (one bound program per KV cache)."""

    def __init__(self, weights: DecodeWeights, flags: tuple[str, ...] = NATIVE_FLAGS) -> None:
        self.weights = weights
        self.flags = flags  # compiler flags of the library (tests: the portable build)
        self._programs: weakref.WeakKeyDictionary[KVCache, DecodeProgram] = (
            weakref.WeakKeyDictionary())

    def program(self, kv: KVCache) -> DecodeProgram:
        prog = self._programs.get(kv)
        if prog is None:
            prog = self.weights.bind(kv.k, kv.v, self.flags)
            self._programs[kv] = prog
        return prog

    def try_forward(self, model: CausalLM, batch: ForwardBatch, kv: KVCache,
                    rest: Callable[[ForwardBatch, KVCache], torch.Tensor]
                    ) -> torch.Tensor | None:
        """Logits of the step through the C program (with ``rest`` for the sequences it does
        not take), or None when the step is the torch path's: nothing to take, or LoRA on a
        step too long to run whole here (its rows plan covers the whole batch)."""
        seqs = c_sequences(batch)
        n_seqs = int(batch.query_start_loc.numel()) - 1
        if not seqs or (batch.lora is not None and len(seqs) != n_seqs):
            return None
        if kv.dtype not in KV_DTYPES or kv.device.type != "cpu":
            return None
        try:
            return self.forward(model, batch, kv, seqs, rest)
        except _Unsupported:
            return None

    def forward(self, model: CausalLM, batch: ForwardBatch, kv: KVCache,
                seqs: list[int], rest: Callable[[ForwardBatch, KVCache], torch.Tensor]
                ) -> torch.Tensor:
        """Logits ``[len(batch.logits_indices), vocab]``: the rows of ``seqs`` by the C program,
        every other sequence by ``rest`` (the torch path) on its sub-batch."""
        qsl = batch.query_start_loc.tolist()
        wanted = batch.logits_indices.tolist()
        rows, first, picked = select_rows(qsl, seqs, wanted)
        owner = [i for i in seqs for _ in range(qsl[i], qsl[i + 1])]
        index = torch.tensor(rows, dtype=torch.int64)
        lora = lora_rows(batch.lora, index)
        positions = batch.positions.index_select(0, index)
        x = model.model.embed_tokens(batch.input_ids.index_select(0, index))
        cos, sin = model.rotary.cos_sin(positions, x.dtype)
        decoded: torch.Tensor = self.program(kv).step(
            x, cos, sin, positions + 1,
            batch.block_tables.index_select(0, torch.tensor(owner, dtype=torch.int64)),
            batch.slot_mapping.index_select(0, index),
            torch.tensor([k for _, k in picked] or [0], dtype=torch.int64), lora,
            torch.tensor(first, dtype=torch.int64))
        if len(picked) == len(wanted) and len(seqs) == len(qsl) - 1:
            return decoded  # every sequence ran here, logits in the order asked
        out = torch.empty((len(wanted), decoded.shape[1]), dtype=torch.float32)
        if picked:
            out[[j for j, _ in picked]] = decoded[:len(picked)]
        chosen = set(seqs)
        others = [i for i in range(len(qsl) - 1) if i not in chosen]
        if others:
            sub, places = sub_batch(batch, others)
            if places:
                out[places] = rest(sub, kv)
        return out
