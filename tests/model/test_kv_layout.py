"""A head-major KV cache keeps a block's KV heads one after another (kiln.model.kv_cache, for the
C step); the C step and the torch path read either layout, and the layout never changes a
number."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from kiln_kernels.cpu import available as kernels_available
from kiln_kernels.cpu.cpu_step import cache_strides

from kiln.model import CausalLM
from kiln.model.batch import build_forward_batch
from kiln.model.kv_cache import KVCache
from tests.model.test_cpu_step import BLOCK, quantized_from
from tests.tiny_models import tiny_config

CPU = torch.device("cpu")


def gqa_model() -> CausalLM:
    cfg = dataclasses.replace(tiny_config("llama"), num_heads=6, num_kv_heads=2, head_dim=64)
    return quantized_from(cfg)


def test_heads_major_caches_keep_a_blocks_heads_apart_in_memory() -> None:
    cfg = tiny_config("llama")
    kv = KVCache(cfg, 5, BLOCK, torch.float32, CPU, heads_major=True)
    k = kv.k[0]
    assert k.shape == (5, BLOCK, cfg.num_kv_heads, cfg.head_dim)
    assert not k.is_contiguous() and k.permute(0, 2, 1, 3).is_contiguous()
    assert cache_strides(k) == (BLOCK * cfg.num_kv_heads * cfg.head_dim, cfg.head_dim,
                                BLOCK * cfg.head_dim)
    flat = KVCache(cfg, 5, BLOCK, torch.float32, CPU)
    assert flat.k[0].is_contiguous()
    assert cache_strides(flat.k[0]) == (BLOCK * cfg.num_kv_heads * cfg.head_dim,
                                        cfg.num_kv_heads * cfg.head_dim, cfg.head_dim)


@pytest.mark.parametrize("heads_major", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_zero_page_caches_are_zero_and_laid_out_as_zeroed_ones(heads_major: bool,
                                                               dtype: torch.dtype) -> None:
    """A cache on the operating system's zero pages (the compute plan's ``kv_zero_pages``, on
    the CPU) has the shape, strides and contents of a ``torch.zeros`` one, page-aligned, and its
    layers do not share memory."""
    cfg = tiny_config("llama")
    lazy = KVCache(cfg, 5, BLOCK, dtype, CPU, heads_major=heads_major, zero_pages=True)
    eager = KVCache(cfg, 5, BLOCK, dtype, CPU, heads_major=heads_major)
    for a, b in zip(lazy.k + lazy.v, eager.k + eager.v, strict=True):
        assert (a.shape, a.stride(), a.dtype) == (b.shape, b.stride(), b.dtype)
        assert torch.equal(a, b) and a.data_ptr() % 4096 == 0
    lazy.k[0].fill_(1.0)
    assert not lazy.v[0].any() and not lazy.k[1].any() and lazy.k[0].all()


def test_the_cpu_plan_serves_from_zero_pages() -> None:
    from kiln.model.kv_cache import kv_cache_for

    model = gqa_model()
    assert model.plan.kv_zero_pages
    assert kv_cache_for(model, 4, BLOCK, torch.float32, CPU).zero_pages


def test_cache_strides_refuse_what_the_c_step_cannot_read() -> None:
    with pytest.raises(ValueError, match="dense"):
        cache_strides(torch.zeros(4, 8, 2, 16)[:, ::2])
    with pytest.raises(ValueError, match="innermost"):
        cache_strides(torch.zeros(4, 8, 16, 2).transpose(2, 3))


def run(model: CausalLM, kv: KVCache, fused: bool) -> tuple[torch.Tensor, list[int]]:
    """Two prompts across KV blocks (one over the 512-position part size), then decodes."""
    fn = model.forward if fused else model._torch_forward
    tbl = [list(range(40)), list(range(40, 80))]
    prompts = [[(7 * i) % 200 + 1 for i in range(530)], [(5 * i) % 150 + 3 for i in range(23)]]
    out = [fn(build_forward_batch([(p, 0, t) for p, t in zip(prompts, tbl, strict=True)],
                                  BLOCK, "all"), kv)]
    lens = [len(p) for p in prompts]
    cur = [int(out[0][n - 1].argmax()) for n in (lens[0], lens[0] + lens[1])]
    for _ in range(4):
        logits = fn(build_forward_batch([([c], n, t) for c, n, t in zip(cur, lens, tbl,
                                                                          strict=True)],
                                        BLOCK), kv)
        out.append(logits)
        cur = logits.argmax(-1).tolist()
        lens = [n + 1 for n in lens]
    return torch.cat(out), cur


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_both_layouts_give_the_same_bits(dtype: torch.dtype) -> None:
    """The C step (float32 and half caches) and the torch path give bitwise the same logits and
    cache contents on a heads-major cache as on a contiguous one."""
    if not kernels_available():
        pytest.skip("no C compiler")
    model = gqa_model()
    paths = [True, False] if dtype == torch.float32 else [True]
    for fused in paths:
        caches = [KVCache(model.config, 80, BLOCK, dtype, CPU, heads_major=hm)
                  for hm in (True, False)]
        (a, ta), (b, tb) = (run(model, kv, fused) for kv in caches)
        assert torch.equal(a, b) and ta == tb
        for layer in range(model.config.num_layers):
            assert torch.equal(caches[0].k[layer], caches[1].k[layer])
            assert torch.equal(caches[0].v[layer], caches[1].v[layer])


def test_a_program_refuses_caches_laid_out_differently() -> None:
    if not kernels_available():
        pytest.skip("no C compiler")
    model = gqa_model()
    assert model.plan.step == "c"
    a = KVCache(model.config, 8, BLOCK, torch.float32, CPU, heads_major=True)
    b = KVCache(model.config, 8, BLOCK, torch.float32, CPU)
    step = model.cpu_step
    assert step is not None
    with pytest.raises(ValueError, match="laid out alike"):
        step.weights.bind(a.k[:1] + b.k[1:], a.v[:1] + b.v[1:])
    step.weights.bind(b.k, b.v)  # one layout throughout: either is accepted
