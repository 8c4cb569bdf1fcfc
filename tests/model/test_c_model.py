"""The torch-free C model (kiln.model.native.c_model.CModel) against the torch-loaded model of the
same GGUF file: the same logits bit for bit (prefills of several sequences, decodes, steps longer
than one C step, float16 caches), the same plan and KV layout; loading without torch in the
process; and the files it declines (no stored rotary frequencies, a matrix without a kernel)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import numpy as np
import pytest
import torch
from kiln_kernels.cpu import available as kernels_available
from kiln_kernels.cpu.cpu_step import cache_strides

from kiln.model.base import CausalLM
from kiln.model.batch import build_forward_batch
from kiln.model.checkpoint.locate import default_model_path
from kiln.model.gguf_loader import load_gguf
from kiln.model.kv_cache import KVCache
from kiln.model.native.c_model import CModel, group_rows
from kiln.model.native.plan import c_step_plan, with_kv_cache
from tests.model.test_block_formats import Q4_K_M, k_config, raw_weights
from tests.tiny_models import random_tensors, tiny_config, write_tiny_gguf

pytestmark = pytest.mark.skipif(not kernels_available(), reason="no C compiler for the kernels")

BLOCK = 16
BLOCKS = 48
Seqs = Sequence[tuple[Sequence[int], int, Sequence[int]]]


def tiny_gguf(folder: Path, kind: str) -> Path:
    """A tiny GGUF: ``arch-tie-format``; F32 and Q8_0 on the tiny config, Q4_K_M (K-quants, one
    PackedConcat per fused q/k/v) on one whose widths are multiples of 256."""
    arch, tie, fmt = kind.split("-")
    path = folder / f"{kind}.gguf"
    if fmt == "q4km":
        cfg = k_config(arch, tie=tie == "tied")
        tensors, blocks = raw_weights(cfg, Q4_K_M, seed=5)
        return write_tiny_gguf(path, cfg, tensors, blocks=blocks)
    cfg = tiny_config(arch, tie=tie == "tied")
    return write_tiny_gguf(path, cfg, random_tensors(cfg, seed=5), q8=fmt == "q8")


def torch_load(path: Path) -> CausalLM:
    model = load_gguf(path, torch.float32, torch.device("cpu")).model
    assert model.plan.step == "c"
    return model


def both(path: Path) -> tuple[CausalLM, CModel]:
    """The torch-loaded model (which fills the rotary cache), then the C model."""
    model = torch_load(path)
    cm = CModel.load(path, None)
    assert cm is not None
    return model, cm


def run_both(model: CausalLM, cm: CModel, steps: list[tuple[Seqs, Literal["last", "all"]]],
             kv_dtype: str = "float32") -> list[np.ndarray]:
    """Each step through both, over a KVCache and kv_arrays; the logits equal bit for bit, and
    the caches too at the end."""
    kv = KVCache(model.config, BLOCKS, BLOCK, getattr(torch, kv_dtype), torch.device("cpu"),
                 heads_major=True, zero_pages=True)
    k, v = cm.kv_arrays(BLOCKS, BLOCK, kv_dtype)
    prog = cm.bind(k, v)
    out = []
    for seqs, want in steps:
        got = cm.forward(prog, seqs, want)
        ref = model.forward(build_forward_batch(seqs, BLOCK, want), kv).numpy()
        assert got.dtype == np.float32 and got.shape == ref.shape
        assert np.array_equal(got, ref)
        out.append(got)
    for mine, theirs in zip(k + v, kv.k + kv.v, strict=True):
        assert np.array_equal(mine, theirs.numpy())
    return out


def greedy_steps(model: CausalLM, prompts: list[list[int]], decodes: int
                 ) -> list[tuple[Seqs, Literal["last", "all"]]]:
    """A prefill of every prompt (logits of every row), then ``decodes`` steps of all of them,
    fed the torch model's argmax (run here on a cache of its own)."""
    tables = [[s * 8 + b for b in range(8)] for s in range(len(prompts))]
    first = [(p, 0, t) for p, t in zip(prompts, tables, strict=True)]
    steps: list[tuple[Seqs, Literal["last", "all"]]] = [(first, "all")]
    kv = KVCache(model.config, BLOCKS, BLOCK, torch.float32, torch.device("cpu"),
                 heads_major=True, zero_pages=True)
    model.forward(build_forward_batch(first, BLOCK, "all"), kv)
    cur = model.forward(build_forward_batch(first, BLOCK), kv).argmax(-1).tolist()
    lens = [len(p) for p in prompts]
    for _ in range(decodes):
        step = [([c], n, t) for c, n, t in zip(cur, lens, tables, strict=True)]
        steps.append((step, "last"))
        cur = model.forward(build_forward_batch(step, BLOCK), kv).argmax(-1).tolist()
        lens = [n + 1 for n in lens]
    return steps


PROMPTS = [[5, 9, 33, 7, 1], [100, 3], [42] * 19]  # the last spans two KV blocks


@pytest.mark.parametrize("kind", ["llama-tied-f32", "llama-untied-q8", "qwen2-untied-q4km",
                                  "qwen3-tied-q4km", "qwen3-untied-f32", "llama-tied-q4km"])
def test_logits_equal_the_torch_models(tmp_path: Path, kind: str) -> None:
    model, cm = both(tiny_gguf(tmp_path, kind))
    assert cm.config == model.config and cm.vocab_size == model.config.vocab_size
    run_both(model, cm, greedy_steps(model, PROMPTS, decodes=6))


@pytest.mark.parametrize("kind", ["qwen2-untied-q4km", "llama-tied-q8"])
def test_a_float16_cache(tmp_path: Path, kind: str) -> None:
    model, cm = both(tiny_gguf(tmp_path, kind))
    run_both(model, cm, greedy_steps(model, PROMPTS, decodes=4), kv_dtype="float16")


def test_steps_longer_than_one_c_step(tmp_path: Path) -> None:
    """180 rows: two C steps, a sequence straddling them; every row's logits, then the last."""
    model, cm = both(tiny_gguf(tmp_path, "qwen3-untied-q4km"))
    prompts = [[(7 * i + s) % 500 for i in range(60)] for s in range(3)]
    assert 3 * 60 > group_rows(cm.config.num_heads, 60)
    tables = [[s * 8 + b for b in range(8)] for s in range(3)]
    seqs = [(p, 0, t) for p, t in zip(prompts, tables, strict=True)]
    later = [(p[:30], 60, t) for p, t in zip(prompts, tables, strict=True)]
    run_both(model, cm, [(seqs, "all"), (later, "last"), ([([1], 90, tables[1])], "last")])


def test_the_default_model(tmp_path: Path) -> None:
    path = default_model_path()
    model, cm = both(path)
    run_both(model, cm, greedy_steps(model, [[1, 2, 3, 4, 5, 6], list(range(200, 300))], 3))


def test_the_c_step_plan_is_the_torch_models(tmp_path: Path) -> None:
    model, _ = both(tiny_gguf(tmp_path, "qwen2-untied-q4km"))
    for kv_dtype in ("auto", "float16"):
        assert with_kv_cache(c_step_plan(), kv_dtype) == with_kv_cache(model.plan, kv_dtype)
    assert c_step_plan().kv_dtype == "float32"


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_kv_arrays_are_laid_out_as_the_kv_cache(tmp_path: Path, dtype: str) -> None:
    model, cm = both(tiny_gguf(tmp_path, "llama-tied-q8"))
    kv = KVCache(model.config, 5, 8, getattr(torch, dtype), torch.device("cpu"),
                 heads_major=True, zero_pages=True)
    k, v = cm.kv_arrays(5, 8, dtype)
    assert len(k) == len(v) == model.config.num_layers
    for arr, ref in zip(k + v, kv.k + kv.v, strict=True):
        assert arr.shape == tuple(ref.shape) and arr.dtype == np.dtype(dtype)
        assert arr.strides == tuple(s * arr.itemsize for s in ref.stride())
        assert cache_strides(arr) == cache_strides(ref)
        assert arr.ctypes.data % mmap_page() == 0 and not arr.any() and arr.flags.writeable
        view = torch.from_numpy(arr)  # a torch view of the buffer is a KVCache tensor
        assert view.stride() == ref.stride() and view.data_ptr() == arr.ctypes.data
    assert not np.shares_memory(k[0], k[1])
    assert cm.bytes_per_block(8, dtype) == KVCache.bytes_per_block(model.config, 8,
                                                                  getattr(torch, dtype))
    with pytest.raises(ValueError, match="dtype"):
        cm.kv_arrays(5, 8, "bfloat16")
    with pytest.raises(ValueError, match="positive"):
        cm.kv_arrays(0, 8, dtype)


def mmap_page() -> int:
    import mmap

    return mmap.PAGESIZE


def test_forward_refuses_what_build_forward_batch_refuses(tmp_path: Path) -> None:
    _, cm = both(tiny_gguf(tmp_path, "llama-tied-q8"))
    prog = cm.bind(*cm.kv_arrays(4, BLOCK, "float32"))
    bad: list[Seqs] = [[], [([], 0, [0])], [([1] * 17, 0, [0])]]
    for seqs in bad:
        with pytest.raises(ValueError):
            cm.forward(prog, seqs)
    with pytest.raises(IndexError):
        cm.forward(prog, [([cm.vocab_size], 0, [0])])


def test_the_torch_model_of_a_c_model_shares_its_tiles(tmp_path: Path) -> None:
    """``kiln.model.loader.torch_model`` (the engine's handover) builds the torch model over the
    C model's own tile arrays: no second copy of the weights, the same C step."""
    from kiln.model.loader import torch_model

    _, cm = both(tiny_gguf(tmp_path, "qwen2-untied-q4km"))
    model = torch_model(cm)
    step = model.cpu_step
    assert step is not None
    ours = {p.tiles.ctypes.data for layer in cm.weights.layers
            for w in (layer.qkv, layer.o, layer.gate_up, layer.down) for p in w.parts}
    theirs = {p.tiles.data_ptr() for layer in step.weights.layers
              for w in (layer.qkv, layer.o, layer.gate_up, layer.down) for p in w.parts}
    assert ours == theirs and len(ours) >= 4 * cm.config.num_layers
    assert cm.tiles  # the C model's own map of tiles is left as it was
    run_both(model, cm, greedy_steps(model, [[1, 2, 3], [4, 5, 6, 7]], 2))
