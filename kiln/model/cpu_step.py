"""The CPU step: a whole forward step in one C call (``kiln_kernels.cpu.cpu_step``).

Used when every projection of the model and its LM head hold packed GGUF weights (see
:mod:`kiln.model.quantized`), LoRA included (CPU stacks of ``kiln.model.lora_slots``). Every
row of every step runs through the C program, whose numbers for a row do not depend on what
else is in its step: a decode row, a prefill chunk of any length and a scored prompt get the
same logits at the same position over the same prefix, bit for bit. A step longer than
:func:`group_rows` runs as consecutive C steps over its rows in order.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, cast

import torch
from kiln_kernels.cpu.cpu_step import (
    KV_DTYPES,
    LORA_MODULES,
    CpuStepLayer,
    CpuStepProgram,
    CpuStepWeights,
    LoraRows,
)
from kiln_kernels.quant import NATIVE_FLAGS, Packed

from kiln.model.kv_cache import KVCache
from kiln.model.lora import LORA_MODULES as MODEL_LORA_MODULES
from kiln.model.lora_slots import LoraBatch

if TYPE_CHECKING:
    from kiln.model.base import CausalLM, ForwardBatch
    from kiln.model.layers import DecoderLayer


def cpu_step_weights(model: CausalLM, embedding: Packed | None = None
                     ) -> CpuStepWeights | None:
    """The C program's view of ``model``, or None when some projection is not packed;
    ``embedding``: the token embedding's blocks, looked up in the C step (None: the model's
    ``embed_tokens`` runs first)."""
    cfg = model.config
    head: Packed | None = model.packed_head
    if head is None:
        return None
    layers: list[CpuStepLayer] = []
    for module in model.model.layers:
        layer = cast("DecoderLayer", module)
        attn, mlp = layer.self_attn, layer.mlp
        packed = (attn.packed_qkv, attn.packed_o, mlp.packed_gate_up, mlp.packed_down)
        qkv, o, gate_up, down = packed
        if qkv is None or o is None or gate_up is None or down is None:
            return None
        layers.append(CpuStepLayer(
            qkv, o, gate_up, down, in_norm=layer.input_layernorm.weight.detach(),
            post_norm=layer.post_attention_layernorm.weight.detach(),
            q_norm=None if attn.q_norm is None else attn.q_norm.weight.detach(),
            k_norm=None if attn.k_norm is None else attn.k_norm.weight.detach(),
            q_bias=None if attn.q_proj.bias is None else attn.q_proj.bias.detach(),
            k_bias=None if attn.k_proj.bias is None else attn.k_proj.bias.detach(),
            v_bias=None if attn.v_proj.bias is None else attn.v_proj.bias.detach()))
    return CpuStepWeights(hidden=cfg.hidden_size, inter=cfg.intermediate_size,
                         heads=cfg.num_heads, kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
                         eps=cfg.rms_norm_eps, layers=tuple(layers),
                         final_norm=model.model.norm.weight.detach(), head=head,
                         inv_freq=model.rotary.inv_freq(torch.device("cpu")), embed=embedding)


if MODEL_LORA_MODULES != LORA_MODULES:  # cpu_step.c indexes the stacks in this order
    raise ImportError("kiln.model.lora and kiln_kernels.cpu.cpu_step disagree on LoRA modules")

# Rows per C step. A longer forward step runs as consecutive C steps over its rows in order; a
# sequence's rows may straddle two, the later one reading the earlier one's K/V from the cache.
# Prefill through C steps of 128-256 rows measured as fast as the torch path (MKL, 512-row
# chunks) on the default model: 512 tokens 0.53-0.57 s against 0.57-0.65 s, 4,096 tokens 8.5-9.0 s
# against 7.9-8.5 s (the torch path's own spread), and faster than 512-row C steps (10.0 s).
C_MAX_ROWS = 128
# ... and at most about this many bytes of attention scores per C step (rows x heads x context
# float32: 128 rows of a 16-head model at context 32,768 would need 268 MB).
C_SCORES_BYTES = 64 << 20


def group_rows(heads: int, max_ctx: int) -> int:
    """Rows per C step for a forward step whose longest context is ``max_ctx``."""
    return max(1, min(C_MAX_ROWS, C_SCORES_BYTES // (4 * heads * max(1, max_ctx))))


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

    def try_forward(self, model: CausalLM, batch: ForwardBatch, kv: KVCache
                    ) -> torch.Tensor | None:
        """Logits of the step through the C program, or None when the step is the torch path's
        (a KV cache it cannot read, or LoRA other than CPU float32 slot stacks)."""
        if kv.dtype not in KV_DTYPES:
            return None
        try:
            return self.forward(model, batch, kv)
        except _Unsupported:
            return None

    def forward(self, model: CausalLM, batch: ForwardBatch, kv: KVCache) -> torch.Tensor:
        """Logits ``[len(batch.logits_indices), vocab]`` in the order asked, from C steps of at
        most :func:`group_rows` rows each."""
        qsl = batch.query_start_loc.tolist()
        wanted = batch.logits_indices.tolist()
        n_rows = qsl[-1]
        owner = [i for i in range(len(qsl) - 1) for _ in range(qsl[i], qsl[i + 1])]
        prog = self.program(kv)
        # the embedding: in the C step where it is held packed, else the model's module first
        ids = batch.input_ids if prog.embeds else None
        x = None if prog.embeds else model.model.embed_tokens(batch.input_ids)
        size = group_rows(self.weights.heads, int(batch.seq_lens.max()))
        out: torch.Tensor | None = None
        for a in range(0, n_rows, size):
            b = min(n_rows, a + size)
            picked = [(j, r - a) for j, r in enumerate(wanted) if a <= r < b]
            lora = None if batch.lora is None else lora_rows(batch.lora, torch.arange(a, b))
            logits: torch.Tensor = prog.step(
                None if x is None else x[a:b], batch.positions[a:b] + 1,
                batch.block_tables.index_select(0, torch.tensor(owner[a:b], dtype=torch.int64)),
                batch.slot_mapping[a:b],
                torch.tensor([k for _, k in picked] or [0], dtype=torch.int64),
                lora,
                torch.tensor([max(qsl[i], a) - a for i in owner[a:b]], dtype=torch.int64),
                ids=None if ids is None else ids[a:b])
            if b == n_rows and a == 0 and picked and len(picked) == len(wanted):
                return logits  # one C step, every logits row in the order asked
            if out is None:
                out = torch.empty((len(wanted), logits.shape[1]), dtype=torch.float32)
            if picked:
                out[[j for j, _ in picked]] = logits[:len(picked)]
        return out if out is not None else torch.empty((0, prog.vocab), dtype=torch.float32)
