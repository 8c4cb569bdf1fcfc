"""The C decode step (kiln.model.cpu_step.CpuStep) against the torch path of the same model.

Tiny llama / qwen2 (q/k/v bias) / qwen3 (q/k norm) models get quantized weights (Q4_1 layers,
Q8_0 head, written as GGML blocks here) so both paths hold the very same weights; the default
model is the real GGUF. Mixed steps (prefill chunks beside decodes) split the batch, and a
decoding sequence gets the same numbers whatever else is in its step.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from kiln_kernels.cpu import available as kernels_available
from kiln_kernels.cpu.cpu_step import CpuStepProgram
from kiln_kernels.cpu.loader import PORTABLE_FLAGS
from kiln_kernels.quant import PackedWeight, pack_ggml

from kiln.model import CausalLM, LoadedModel
from kiln.model.batch import build_forward_batch
from kiln.model.checkpoint.config import ModelConfig
from kiln.model.float32_copies import attach_packed
from kiln.model.kv_cache import KVCache
from kiln.model.lora import LORA_MODULES, LoraAdapter, load_adapter
from kiln.model.lora_slots import AdapterSlots, LoraBatch
from kiln.model.native import c_model as cpu_step  # the CPU step's row grouping (group_rows)
from kiln.model.native.c_model import C_MAX_ROWS
from tests.model.test_lora import write_peft
from tests.numerics import (
    U16,
    assert_close_scaled,
    assert_logits_close,
    assert_same_argmax,
    forward_rtol,
)
from tests.tiny_models import model_from_tensors, random_tensors, tiny_config

pytestmark = pytest.mark.skipif(not kernels_available(), reason="no C compiler for the kernels")
BLOCK = 16


def quantize_q8_0(w: torch.Tensor) -> torch.Tensor:
    """GGML Q8_0 blocks of a float32 [N, K] matrix (uint8 [N, K/32 * 34])."""
    n, k = w.shape
    blocks = w.reshape(n, k // 32, 32)
    d = (blocks.abs().amax(-1) / 127).clamp_min(1e-8).to(torch.float16)
    q = torch.round(blocks / d.to(torch.float32)[..., None]).clamp(-127, 127).to(torch.int8)
    return torch.cat((d.view(torch.uint8).reshape(n, k // 32, 2), q.view(torch.uint8)),
                     dim=2).reshape(n, -1)


def quantize_q4_1(w: torch.Tensor) -> torch.Tensor:
    """GGML Q4_1 blocks of a float32 [N, K] matrix (uint8 [N, K/32 * 20])."""
    n, k = w.shape
    blocks = w.reshape(n, k // 32, 32)
    lo, hi = blocks.amin(-1), blocks.amax(-1)
    d = ((hi - lo) / 15).clamp_min(1e-8).to(torch.float16)
    m = lo.to(torch.float16)
    q = torch.round((blocks - m.to(torch.float32)[..., None]) / d.to(torch.float32)[..., None])
    q = q.clamp(0, 15).to(torch.uint8)
    packed = q[..., :16] | (q[..., 16:] << 4)
    return torch.cat((d.view(torch.uint8).reshape(n, k // 32, 2),
                      m.view(torch.uint8).reshape(n, k // 32, 2), packed), dim=2).reshape(n, -1)


def quantized_tiny(arch: str, tie: bool = False) -> CausalLM:
    """A tiny model whose projections and head are quantized (the float32 weights are set to
    the dequantized values, so the torch path and the C path hold the same weights)."""
    return quantized_from(tiny_config(arch, tie=tie))


def quantized_from(cfg: ModelConfig) -> CausalLM:
    tie = cfg.tie_word_embeddings
    tensors = random_tensors(cfg, seed=3)
    packed: dict[str, PackedWeight] = {}
    head = "model.embed_tokens.weight" if tie else "lm_head.weight"
    for name, w in tensors.items():
        if name.endswith("_proj.weight"):
            packed[name] = pack_ggml(quantize_q4_1(w), "Q4_1")
        elif name == head:
            packed[name] = pack_ggml(quantize_q8_0(w), "Q8_0")
        else:
            continue
        tensors[name] = packed[name].dequantize()
    model = model_from_tensors(cfg, tensors)
    attach_packed(model, packed)
    assert model.plan.step == "c"
    return model


def new_cache(model: CausalLM) -> KVCache:
    return KVCache(model.config, 32, BLOCK, torch.float32, torch.device("cpu"))


def tables(n: int) -> list[list[int]]:
    return [[s * 8 + b for b in range(8)] for s in range(n)]


def check_paths(got: torch.Tensor, want: torch.Tensor, model: CausalLM, context: int) -> None:
    """The C step against the torch path on the same weights: all float32, so they differ in
    summation order and elementwise rounding only (tests/numerics.py); argmax where clear."""
    assert_logits_close(got, want, model.config, context)
    assert_same_argmax(got, want, model.config, context)


def compare_greedy(model: CausalLM, prompts: list[list[int]], steps: int) -> None:
    """Greedy decode through torch, then the C step fed the same tokens; logits compared."""
    torch_tokens, ref = greedy_run(model, "torch", prompts, steps)
    _, fused = greedy_run(model, "fused", prompts, steps, follow=torch_tokens)
    check_paths(fused, ref, model, max(len(p) for p in prompts) + steps)


def greedy_run(model: CausalLM, forward: str, prompts: list[list[int]], steps: int,
               follow: list[list[int]] | None = None) -> tuple[list[list[int]], torch.Tensor]:
    """Prefill every prompt, then ``steps`` decode steps of all of them together, each feeding
    its argmax — or, with ``follow``, another run's tokens, so that a near-tie argmax of one
    path cannot send the two runs down different texts."""
    kv = new_cache(model)
    fn = model.forward if forward == "fused" else model._torch_forward
    tbl = tables(len(prompts))
    first = [(p, 0, t) for p, t in zip(prompts, tbl, strict=True)]
    logits = fn(build_forward_batch(first, BLOCK), kv)
    out = [logits]
    cur = logits.argmax(-1).tolist() if follow is None else follow[0]
    tokens = [cur]
    lens = [len(p) for p in prompts]
    for _ in range(steps):
        step = [([c], n, t) for c, n, t in zip(cur, lens, tbl, strict=True)]
        batch = build_forward_batch(step, BLOCK)
        logits = fn(batch, kv)
        out.append(logits)
        cur = logits.argmax(-1).tolist() if follow is None else follow[len(tokens)]
        tokens.append(cur)
        lens = [n + 1 for n in lens]
    return tokens, torch.stack(out)


@pytest.mark.parametrize(("arch", "tie"), [("llama", False), ("llama", True), ("qwen2", False),
                                           ("qwen3", False)])
def test_cpu_step_matches_torch_path(arch: str, tie: bool) -> None:
    model = quantized_tiny(arch, tie)
    prompts = [[5, 9, 33, 7], [100, 3], [42] * 19]  # the last spans two KV blocks
    compare_greedy(model, prompts, steps=12)


@pytest.mark.parametrize("head_dim", [64, 128])  # the register-blocked V paths (4 and 8 chunks)
def test_attention_head_sizes_match_torch_path(head_dim: int) -> None:
    """GQA groups of 3, prefill chunks of 40 and 23 rows (tasks of 8 rows, query groups with
    tails), contexts across KV blocks, then decodes; the C step against the torch path."""
    cfg = dataclasses.replace(tiny_config("llama"), num_heads=6, num_kv_heads=2,
                              head_dim=head_dim)
    model = quantized_from(cfg)
    prompts = [[(7 * i) % 200 + 1 for i in range(40)], [(5 * i) % 150 + 3 for i in range(23)]]
    compare_greedy(model, prompts, steps=5)


def test_long_contexts_attend_in_parts() -> None:
    """Contexts over ATTEND_PART (512) positions are attended in parts and merged: a prefill
    chunk across the 1024 boundary and a decode at 600 positions match the torch path, and the
    decode row is bitwise the same alone or beside the chunk."""
    cfg = dataclasses.replace(tiny_config("llama"), num_heads=6, num_kv_heads=2, head_dim=64)
    model = quantized_from(cfg)
    caches = [KVCache(model.config, 2 * 72, BLOCK, torch.float32, torch.device("cpu"))
              for _ in range(3)]
    a_tbl, b_tbl = list(range(72)), list(range(72, 144))
    a_ids = [(11 * i) % 250 + 1 for i in range(1040)]
    b_ids = [(13 * i) % 240 + 2 for i in range(600)]
    for kv in caches:  # identical contents: the torch path fills all three
        model._torch_forward(build_forward_batch([(a_ids[:1020], 0, a_tbl),
                                                  (b_ids[:599], 0, b_tbl)], BLOCK), kv)
    step = [(a_ids[1020:1028], 1020, a_tbl), (b_ids[599:600], 599, b_tbl)]
    got = model.forward(build_forward_batch(step, BLOCK, "all"), caches[0])
    want = model._torch_forward(build_forward_batch(step, BLOCK, "all"), caches[1])
    assert_logits_close(got, want, cfg, 1028)
    alone = model.forward(build_forward_batch(step[1:], BLOCK, "all"), caches[2])
    assert torch.equal(got[-1], alone[0])
    for n in range(3):  # decodes at 1029.. and 601.. positions
        dec = [([a_ids[1028 + n]], 1028 + n, a_tbl), ([b_ids[n]], 600 + n, b_tbl)]
        got = model.forward(build_forward_batch(dec, BLOCK), caches[0])
        want = model._torch_forward(build_forward_batch(dec, BLOCK), caches[1])
        assert_logits_close(got, want, cfg, 1031)


def test_the_step_leaves_denormals_on() -> None:
    """The C step flushes denormals on its threads and restores them: torch arithmetic after a
    step (on the calling thread and on the pool's threads) still produces denormal floats."""
    model = quantized_tiny("llama")
    greedy_run(model, "fused", [[5, 9, 33, 7]], steps=2)
    tiny = torch.full((1 << 20,), 1e-39, dtype=torch.float32)  # large: the thread pool runs it
    assert bool((tiny * 1.0 != 0).all())
    assert float(torch.tensor(2e-39) * 0.5) != 0.0


@pytest.mark.parametrize("flags", ["native", "portable"])
def test_half_kv_cache_matches_the_torch_path(flags: str) -> None:
    """A float16 KV cache (--kv-cache-dtype float16): the C step stores K/V rounded to half as
    torch does and reads them widened; against the torch path on the same kind of cache, with
    prefill chunks, decodes, a context over one 512-position part, and batch invariance."""
    cfg = dataclasses.replace(tiny_config("qwen3"), num_heads=6, num_kv_heads=2, head_dim=64)
    model = quantized_from(cfg)
    assert model.plan.step == "c"
    if flags == "portable":
        model.use_cpu_step_build(PORTABLE_FLAGS)
    caches = [KVCache(model.config, 2 * 48, BLOCK, torch.float16, torch.device("cpu"))
              for _ in range(3)]
    a_tbl, b_tbl = list(range(48)), list(range(48, 96))
    a_ids = [(11 * i) % 250 + 1 for i in range(700)]
    b_ids = [(13 * i) % 240 + 2 for i in range(40)]
    for kv in caches:
        model._torch_forward(build_forward_batch([(a_ids[:600], 0, a_tbl)], BLOCK), kv)
    steps = [[(a_ids[600:606], 600, a_tbl), (b_ids[:30], 0, b_tbl)],  # chunks through C
             [(a_ids[606:607], 606, a_tbl), (b_ids[30:31], 30, b_tbl)]]  # decodes
    for step in steps:
        got = model.forward(build_forward_batch(step, BLOCK, "all"), caches[0])
        want = model._torch_forward(build_forward_batch(step, BLOCK, "all"), caches[1])
        # K/V rounded to half from float32 values that differ by the forward bound may land one
        # half ulp apart; in the worst case every entry of every layer's K and V does
        half_rtol = forward_rtol(cfg, 607) + 2 * U16 * cfg.num_layers
        assert_close_scaled(got, want, half_rtol, float(want.abs().max()), "half-cache logits")
        for layer in range(cfg.num_layers):  # half values within one rounding of torch's
            for ours, theirs in ((caches[0].k[layer], caches[1].k[layer]),
                                 (caches[0].v[layer], caches[1].v[layer])):
                a, b = ours.double(), theirs.double()
                slack = forward_rtol(cfg, 607) * float(b.abs().max()) + 2.0**-24  # + subnormal
                assert bool(((a - b).abs() <= 2 * U16 * torch.maximum(a.abs(), b.abs())
                             + slack).all()), layer
    alone = model.forward(build_forward_batch(steps[0][:1], BLOCK, "all"), caches[2])
    model.forward(build_forward_batch(steps[0][1:], BLOCK, "all"), caches[2])
    last = model.forward(build_forward_batch(steps[1][:1], BLOCK, "all"), caches[2])
    assert alone.shape[0] == 6
    assert torch.equal(last[0], got[0])  # the decode row alone = beside another sequence


def _two_decoding(model: CausalLM) -> tuple[KVCache, KVCache, list[list[int]]]:
    kv, alone_kv = new_cache(model), new_cache(model)
    tbl = tables(3)
    first = [(p, 0, t) for p, t in zip([[7, 8, 9], [11, 12]], tbl[:2], strict=True)]
    for cache in (kv, alone_kv):
        model.forward(build_forward_batch(first, BLOCK), cache)
    return kv, alone_kv, tbl


def test_portable_build_matches_torch_path() -> None:
    """The scalar C paths (no AVX-512): GEMM, attention, exp, LoRA-free step."""
    model = quantized_tiny("qwen3")
    assert model.plan.step == "c"
    model.use_cpu_step_build(PORTABLE_FLAGS)
    prompts = [[5, 9, 33, 7], [42] * 19]
    compare_greedy(model, prompts, steps=6)


@pytest.mark.parametrize("chunk", [5, C_MAX_ROWS + 3])  # one C step / two C steps
def test_decodes_beside_a_prefill_chunk(chunk: int) -> None:
    model = quantized_tiny("qwen3")
    caches = [KVCache(model.config, 48, BLOCK, torch.float32, torch.device("cpu"))
              for _ in range(3)]
    tbl = [list(range(8)), list(range(8, 16)), list(range(16, 48))]
    for cache in caches[:2]:
        model.forward(build_forward_batch([([7, 8, 9], 0, tbl[0]), ([11, 12], 0, tbl[1])],
                                          BLOCK), cache)
    # One step: sequences 0 and 1 decode, sequence 2 prefills a chunk.
    step = [([3], 3, tbl[0]), ([4], 2, tbl[1]), (list(range(20, 20 + chunk)), 0, tbl[2])]
    mixed = model.forward(build_forward_batch(step, BLOCK, "all"), caches[0])
    decodes_alone = model.forward(build_forward_batch(step[:2], BLOCK), caches[1])
    chunk_alone = model.forward(build_forward_batch(step[2:], BLOCK, "all"), caches[2])
    prefill_ref = model._torch_forward(build_forward_batch(step[2:], BLOCK, "all"), caches[1])
    assert torch.equal(mixed[:2], decodes_alone)  # a decode row does not see its neighbours
    assert torch.equal(mixed[2:], chunk_alone)  # nor does a prefill row, at any chunk length
    assert_logits_close(mixed[2:], prefill_ref, model.config, chunk)


def test_prefill_logits_do_not_depend_on_the_chunking(monkeypatch: pytest.MonkeyPatch) -> None:
    """A prompt's logits are the same bits prefilled in one step (longer than the old 64-row
    limit of the C step), in 8-row chunks (the cap while others decode), or in C steps of one
    row each (a step split by the scores budget)."""
    model = quantized_tiny("qwen2")
    prompt, tbl = [(i * 7) % 50 + 1 for i in range(100)], tables(1)[0]
    whole = model.forward(build_forward_batch([(prompt, 0, tbl)], BLOCK, "all"), new_cache(model))
    kv = new_cache(model)
    chunked = torch.cat([model.forward(build_forward_batch([(prompt[p:p + 8], p, tbl)], BLOCK,
                                                           "all"), kv)
                         for p in range(0, len(prompt), 8)])
    assert torch.equal(whole, chunked)
    monkeypatch.setattr(cpu_step, "C_SCORES_BYTES", 1)
    assert cpu_step.group_rows(model.config.num_heads, len(prompt)) == 1
    rows = model.forward(build_forward_batch([(prompt, 0, tbl)], BLOCK, "all"), new_cache(model))
    assert torch.equal(whole, rows)


def test_prefill_chunks_through_the_c_step_match_torch() -> None:
    model = quantized_tiny("qwen2")
    kv, ref_kv = new_cache(model), new_cache(model)
    tbl = tables(2)
    chunks = [[(list(range(1, 11)), 0, tbl[0]), (list(range(30, 37)), 0, tbl[1])],
              [(list(range(11, 30)), 10, tbl[0]), ([37], 7, tbl[1])]]  # spans blocks
    for step in chunks:
        batch = build_forward_batch(step, BLOCK, "all")
        got = model.forward(batch, kv)
        want = model._torch_forward(build_forward_batch(step, BLOCK, "all"), ref_kv)
        assert_logits_close(got, want, model.config, 30)


def test_logits_of_chosen_rows_only() -> None:
    model = quantized_tiny("llama")
    kv = new_cache(model)
    tbl = tables(2)
    model.forward(build_forward_batch([([1, 2, 3], 0, tbl[0]), ([4, 5], 0, tbl[1])], BLOCK), kv)
    batch = build_forward_batch([([6], 3, tbl[0]), ([7], 2, tbl[1])], BLOCK)
    batch.logits_indices = batch.logits_indices[[1]]
    ref_kv = new_cache(model)
    model.forward(build_forward_batch([([1, 2, 3], 0, tbl[0]), ([4, 5], 0, tbl[1])], BLOCK),
                  ref_kv)
    full = model.forward(build_forward_batch([([6], 3, tbl[0]), ([7], 2, tbl[1])], BLOCK), ref_kv)
    assert torch.equal(model.forward(batch, kv), full[1:])


def test_default_model_decodes_through_the_c_step(smollm: LoadedModel) -> None:
    model = smollm.model
    assert model.plan.step == "c", "the default GGUF should get the C decode step"
    prompt = smollm.tokenizer.encode("The capital of France is")
    compare_greedy(model, [prompt, prompt[:3]], steps=8)


class _NoDelta:
    """A LoraHook that is not a LoraBatch (the C step cannot read it: torch path)."""

    def apply(self, layer: int, module: str, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return y


def test_foreign_lora_hooks_take_the_torch_path() -> None:
    model = quantized_tiny("llama")
    plain = model.forward(build_forward_batch([([1], 0, tables(1)[0])], BLOCK), new_cache(model))
    batch = build_forward_batch([([1], 0, tables(1)[0])], BLOCK)
    batch.lora = _NoDelta()
    with_hook = model.forward(batch, new_cache(model))
    ref = model._torch_forward(build_forward_batch([([1], 0, tables(1)[0])], BLOCK),
                               new_cache(model))
    assert torch.equal(with_hook, ref)
    assert_logits_close(with_hook, plain, model.config, 1)


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
def test_lora_in_the_c_step_matches_torch(arch: str, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    model = quantized_tiny(arch)
    cfg = model.config
    full = load_adapter(write_peft(tmp_path / "a", cfg, r=4, alpha=8, targets=LORA_MODULES,
                                   seed=1), cfg)
    some = load_adapter(write_peft(tmp_path / "b", cfg, r=8, alpha=8,
                                   targets=("q_proj", "v_proj", "down_proj"), seed=2), cfg)
    mixes: list[list[tuple[LoraAdapter | str, float]]] = [
        [(full, 1.0)], [], [(full, 0.5), (some, 2.0)]]
    prompts = [[5, 9, 33, 7], [100, 3], [(i * 5) % 90 + 1 for i in range(100)]]
    results = []
    seen: list[bool] = []
    step_fn = CpuStepProgram.step

    def spy(self: CpuStepProgram, *args: Any, **kwargs: Any) -> np.ndarray:
        seen.append(args[5] is not None)  # the LoRA rows
        return step_fn(self, *args, **kwargs)

    monkeypatch.setattr(CpuStepProgram, "step", spy)
    monkeypatch.setattr(cpu_step, "C_MAX_ROWS", 16)  # the prefill step: 7 C calls
    for path in ("fused", "torch"):
        slots = AdapterSlots(cfg, max_slots=4)
        kv = new_cache(model)
        fn = model.forward if path == "fused" else model._torch_forward
        tbl = tables(3)
        steps = [[(p, 0, t) for p, t in zip(prompts, tbl, strict=True)]]
        lens = [len(p) for p in prompts]
        for d in range(4):
            steps.append([([60 + d], n + d, t) for n, t in zip(lens, tbl, strict=True)])
        outs = []
        for step in steps:
            batch = build_forward_batch(step, BLOCK, "all")
            with LoraBatch.build(mixes, [len(new) for new, _, _ in step], slots) as lb:
                batch.lora = lb
                outs.append(fn(batch, kv))
        results.append(torch.cat(outs))
    assert seen == [True] * 11  # every step ran in C, with its LoRA
    assert_logits_close(results[0], results[1], cfg, 104)  # rank-8 LoRA sums: in the margin
