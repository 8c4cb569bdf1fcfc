"""The C step (kiln_kernels.cpu.cpu_step) on numpy arrays: weights, norms, KV caches, the step's
inputs and LoRA rows as numpy give the very logits (and K/V) that the same values as torch
tensors give, bit for bit. The tiny quantized models of tests/model/test_cpu_step.py."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
import torch
from kiln_kernels.cpu import available
from kiln_kernels.cpu.cpu_step import (
    LORA_MODULES,
    CpuStepLayer,
    CpuStepWeights,
    LoraRows,
    cache_strides,
)
from kiln_kernels.quant import Packed, PackedConcat, PackedWeight

from tests.model.test_cpu_step import BLOCK, quantized_tiny

pytestmark = pytest.mark.skipif(not available(), reason="no C compiler for the kernels")
BLOCKS = 32
TABLE = 8  # blocks per sequence


def _np_packed(p: Packed) -> Packed:
    if isinstance(p, PackedWeight):
        return PackedWeight(p.fmt, p.tiles.numpy().copy())
    return PackedConcat(tuple(PackedWeight(q.fmt, q.tiles.numpy().copy()) for q in p.parts))


def _np(t: Any) -> Any:
    """A weight as its own numpy copy (torch tensors, and numpy arrays such as the rotary
    frequencies, which kiln.model.checkpoint.rope computes without torch)."""
    if t is None:
        return None
    return t.detach().numpy().copy() if hasattr(t, "detach") else np.array(t, copy=True)


def numpy_weights(w: CpuStepWeights) -> CpuStepWeights:
    """The same weights with every tensor a numpy copy (torch never reads them)."""
    layers = tuple(CpuStepLayer(
        _np_packed(x.qkv), _np_packed(x.o), _np_packed(x.gate_up), _np_packed(x.down),
        in_norm=_np(x.in_norm), post_norm=_np(x.post_norm), q_norm=_np(x.q_norm),
        k_norm=_np(x.k_norm), q_bias=_np(x.q_bias), k_bias=_np(x.k_bias),
        v_bias=_np(x.v_bias)) for x in w.layers)
    return dataclasses.replace(
        w, layers=layers, final_norm=_np(w.final_norm), head=_np_packed(w.head),
        inv_freq=_np(w.inv_freq), embed=None if w.embed is None else _np_packed(w.embed))


def numpy_caches(w: CpuStepWeights, dtype: str) -> list[np.ndarray]:
    """Per layer ``[blocks, block_size, kv_heads, dim]`` over a contiguous ``[blocks, kv_heads,
    block_size, dim]`` buffer (the head-major layout of kiln.model.kv_cache)."""
    return [np.zeros((BLOCKS, w.kv_heads, BLOCK, w.head_dim), dtype=dtype).transpose(0, 2, 1, 3)
            for _ in w.layers]


def steps(seqs: list[list[int]], new: list[list[int]]) -> list[dict[str, np.ndarray]]:
    """A prefill step of ``seqs`` then a decode step of ``new`` (one id per sequence): the
    step's inputs as numpy arrays of the types the engine would not pick (int32 positions)."""
    out: list[dict[str, np.ndarray]] = []
    for start, chunks in (([0] * len(seqs), seqs), ([len(s) for s in seqs], new)):
        ids: list[int] = []
        lens: list[int] = []
        tables: list[list[int]] = []
        slots: list[int] = []
        first: list[int] = []
        last: list[int] = []
        for i, (s, chunk) in enumerate(zip(start, chunks, strict=True)):
            table = [i * TABLE + b for b in range(TABLE)]
            head = len(ids)
            for j, tok in enumerate(chunk):
                pos = s + j
                ids.append(tok)
                lens.append(pos + 1)
                tables.append(table)
                slots.append(table[pos // BLOCK] * BLOCK + pos % BLOCK)
                first.append(head)
            last.append(len(ids) - 1)
        out.append({"ids": np.array(ids, dtype=np.int64), "ctx_lens": np.array(lens, np.int32),
                    "block_tables": np.array(tables, dtype=np.int64),
                    "slots": np.array(slots, dtype=np.int64),
                    "logit_rows": np.array(last, dtype=np.int32),
                    "seq_first": np.array(first, dtype=np.int64)})
    return out


def lora_rows(w: CpuStepWeights, m: int, seed: int) -> LoraRows:
    """Two slots of rank 4 on five of the seven modules, every other row without one."""
    rng = np.random.default_rng(seed)
    hd = w.head_dim
    dims = {"q_proj": (w.hidden, w.heads * hd), "k_proj": (w.hidden, w.kv_heads * hd),
            "v_proj": (w.hidden, w.kv_heads * hd), "o_proj": (w.heads * hd, w.hidden),
            "gate_proj": (w.hidden, w.inter), "up_proj": (w.hidden, w.inter),
            "down_proj": (w.inter, w.hidden)}
    a: list[np.ndarray | None] = []
    bt: list[np.ndarray | None] = []
    for module in LORA_MODULES:
        n_in, n_out = dims[module]
        on = module not in ("k_proj", "up_proj")
        shape = (len(w.layers), 2, 4)
        a.append(0.1 * rng.standard_normal((*shape, n_in)).astype(np.float32) if on else None)
        bt.append(0.1 * rng.standard_normal((*shape, n_out)).astype(np.float32) if on else None)
    idx = np.array([[(r % 3) - 1 for r in range(m)]], dtype=np.int64)  # -1, 0, 1, -1, ...
    scales = np.array([[0.5 + 0.25 * r for r in range(m)]], dtype=np.float64)
    return LoraRows(slot_idx=idx, scales=scales, a=tuple(a), bt=tuple(bt))


def torch_lora(lr: LoraRows) -> LoraRows:
    def conv(t: Any) -> Any:
        return None if t is None else torch.from_numpy(t.copy())

    return LoraRows(slot_idx=conv(lr.slot_idx), scales=conv(lr.scales),
                    a=tuple(map(conv, lr.a)), bt=tuple(map(conv, lr.bt)))


def run(w: CpuStepWeights, caches: tuple[list[Any], list[Any]], as_torch: bool,
        with_ids: bool, lora: bool) -> list[np.ndarray]:
    """The logits of the two steps on one program; inputs as torch tensors or numpy."""
    prog = w.bind(*caches)
    rng = np.random.default_rng(7)
    outs = []
    for n, step in enumerate(steps([[5, 9, 33, 7], [100, 3]], [[8], [2]])):
        args = {k: torch.from_numpy(v.copy()) if as_torch else v for k, v in step.items()}
        m = len(step["ids"])
        x: Any = None
        if not with_ids:
            x = rng.standard_normal((m, w.hidden)).astype(np.float32)
            x = torch.from_numpy(x) if as_torch else x
        lr = lora_rows(w, m, n) if lora else None
        if lr is not None and as_torch:
            lr = torch_lora(lr)
        logits = prog.step(x, args["ctx_lens"], args["block_tables"], args["slots"],
                           args["logit_rows"], lr, args["seq_first"],
                           ids=args["ids"] if with_ids else None)
        assert isinstance(logits, np.ndarray) and logits.dtype == np.float32
        assert logits.shape == (len(step["logit_rows"]), w.head.out_features)
        outs.append(logits)
    return outs


@pytest.mark.parametrize(("arch", "tie", "kv_dtype", "lora"), [
    ("llama", True, "float32", False),  # the embedding inside the step: token ids
    ("qwen2", False, "float32", True),  # q/k/v biases, embeddings given, LoRA
    ("qwen3", False, "float16", False),  # q/k norms, a half cache
])
def test_numpy_inputs_give_the_torch_inputs_logits(arch: str, tie: bool, kv_dtype: str,
                                                   lora: bool) -> None:
    model = quantized_tiny(arch, tie)
    step = model.cpu_step
    assert step is not None
    tw = step.weights
    with_ids = tw.embed is not None
    assert with_ids == tie
    nw = numpy_weights(tw)
    torch_caches = torch_caches_like(tw, kv_dtype)
    np_caches = (numpy_caches(tw, kv_dtype), numpy_caches(tw, kv_dtype))
    want = run(tw, torch_caches, as_torch=True, with_ids=with_ids, lora=lora)
    got = run(nw, np_caches, as_torch=False, with_ids=with_ids, lora=lora)
    for g, t in zip(got, want, strict=True):
        assert np.array_equal(g, t)
        assert np.isfinite(g).all()
    for ours, theirs in zip(np_caches[0] + np_caches[1], torch_caches[0] + torch_caches[1],
                            strict=True):
        assert np.array_equal(ours, theirs.numpy())
    assert np.abs(np_caches[0][0]).max() > 0  # the steps wrote K
    mixed = run(nw, torch_caches_like(tw, kv_dtype), as_torch=True, with_ids=with_ids,
                lora=lora)  # numpy weights, torch caches and inputs
    for g, t in zip(mixed, want, strict=True):
        assert np.array_equal(g, t)


def torch_caches_like(w: CpuStepWeights, dtype: str) -> tuple[list[Any], list[Any]]:
    def one() -> list[Any]:
        return [torch.zeros((BLOCKS, w.kv_heads, BLOCK, w.head_dim),
                            dtype=getattr(torch, dtype)).permute(0, 2, 1, 3) for _ in w.layers]

    return one(), one()


def test_cache_strides_of_numpy_views() -> None:
    """Element strides of a permuted numpy view, as of the same torch view; what is not dense
    with dim innermost refused alike."""
    buf = np.zeros((5, 2, BLOCK, 8), dtype=np.float16)
    view = buf.transpose(0, 2, 1, 3)
    assert cache_strides(view) == cache_strides(torch.from_numpy(buf).permute(0, 2, 1, 3)) == (
        2 * BLOCK * 8, 8, BLOCK * 8)
    assert cache_strides(np.zeros((5, BLOCK, 2, 8))) == (BLOCK * 2 * 8, 2 * 8, 8)
    with pytest.raises(ValueError, match="dense"):
        cache_strides(np.zeros((4, 8, 2, 16))[:, ::2])
    with pytest.raises(ValueError, match="innermost"):
        cache_strides(np.zeros((4, 8, 16, 2)).transpose(0, 1, 3, 2))
    with pytest.raises(ValueError, match="innermost"):
        cache_strides(np.zeros((4, 8, 16)))


def test_the_program_refuses_what_it_cannot_read() -> None:
    model = quantized_tiny("llama")
    step = model.cpu_step
    assert step is not None
    w = numpy_weights(step.weights)
    k, v = numpy_caches(w, "float32"), numpy_caches(w, "float32")
    with pytest.raises(ValueError, match="float32 or float16"):
        w.bind([c.astype(np.float64) for c in k], v)
    with pytest.raises(ValueError, match="contiguous float32"):
        dataclasses.replace(w, final_norm=w.final_norm.astype(np.float16)).bind(k, v)
    prog = w.bind(k, v)
    step_in = steps([[1, 2]], [[3]])[0]
    x = np.zeros((2, w.hidden), dtype=np.float32)
    with pytest.raises(ValueError, match="contiguous float32"):
        prog.step(np.zeros((2, 2 * w.hidden), dtype=np.float32)[:, ::2],
                  step_in["ctx_lens"], step_in["block_tables"], step_in["slots"],
                  step_in["logit_rows"])
    logits = prog.step(x, step_in["ctx_lens"], step_in["block_tables"], step_in["slots"],
                       step_in["logit_rows"])
    assert logits.shape == (1, w.head.out_features) and np.isfinite(logits).all()
