"""The C step on every ISA build of the library (kiln_kernels/cpu/common/isa.h): the whole
step's logits and the K/V it stores are the same bits on each build this CPU runs (AVX-512,
AVX2, plain C), for llama / qwen2 / qwen3 tiny models with head sizes that are multiples of 16
(the vector attention, every register blocking) and one that is not (the scalar attention), GQA,
float32 and float16 KV caches, a decode batch at different context lengths (some over
ATTEND_PART = 512 positions: attended in parts, then merged), a multi-row prefill chunk, and
LoRA rows. Also the rotary table's cos / sin (vmath.h's kiln_cos_sin) against torch's."""

from __future__ import annotations

import ctypes
import dataclasses
from typing import Any

import numpy as np
import pytest
import torch
from kiln_kernels.cpu import available, loader
from kiln_kernels.cpu.cpu_step import CpuStepWeights, _Model, _Step

from tests.kernels.test_kernels_numpy_step import lora_rows
from tests.model.test_cpu_step import quantized_from
from tests.tiny_models import tiny_config

pytestmark = pytest.mark.skipif(not available(), reason="no C compiler for the kernels")
BLOCK = 16
ISAS = loader.supported_isas()
# (context length before the step, new rows): decodes at 1, 17, 100, 530 and 1100 positions
# (the last two over ATTEND_PART) beside an 11-row prefill chunk across the part boundary
SEQS = [(0, 1), (16, 1), (99, 1), (505, 11), (529, 1), (1099, 1)]
TABLE = (1100 + 2 * BLOCK) // BLOCK  # blocks per sequence


def _model(arch: str, head_dim: int, heads: int, kv_heads: int, tie: bool) -> CpuStepWeights:
    cfg = dataclasses.replace(tiny_config(arch, tie=tie), num_heads=heads,
                              num_kv_heads=kv_heads, head_dim=head_dim)
    step = quantized_from(cfg).cpu_step
    assert step is not None
    return step.weights


def _caches(w: CpuStepWeights, dtype: str, seed: int) -> tuple[list[Any], list[Any]]:
    """Random K/V for every position (the head-major layout of kiln.model.kv_cache)."""
    rng = np.random.default_rng(seed)
    nb = len(SEQS) * TABLE

    def one() -> list[Any]:
        return [rng.standard_normal((nb, w.kv_heads, BLOCK, w.head_dim)).astype(dtype)
                .transpose(0, 2, 1, 3) for _ in w.layers]

    return one(), one()


def _step(rows_of: list[tuple[int, int]]) -> dict[str, np.ndarray]:
    """Sequence i's rows at positions start..start+n-1 (its blocks i*TABLE..)."""
    lens: list[int] = []
    tables: list[list[int]] = []
    slots: list[int] = []
    first: list[int] = []
    for i, (start, n) in enumerate(rows_of):
        table = [i * TABLE + b for b in range(TABLE)]
        head = len(lens)
        for pos in range(start, start + n):
            lens.append(pos + 1)
            tables.append(table)
            slots.append(table[pos // BLOCK] * BLOCK + pos % BLOCK)
            first.append(head)
    m = len(lens)
    return {"ctx_lens": np.array(lens, np.int64), "block_tables": np.array(tables, np.int32),
            "slots": np.array(slots, np.int64), "seq_first": np.array(first, np.int64),
            "logit_rows": np.arange(m, dtype=np.int64)}


def _run(w: CpuStepWeights, isa: str, kv_dtype: str, lora: bool) -> list[np.ndarray]:
    """Two steps (the mixed one, then a decode of each sequence) on the ``isa`` build: their
    logits, then the caches."""
    k, v = _caches(w, kv_dtype, seed=11)
    prog = w.bind(k, v, flags=loader.isa_flags(isa))
    assert prog.lib.kiln_isa_name().decode() == isa
    out: list[np.ndarray] = []
    rng = np.random.default_rng(5)
    for n, rows_of in enumerate((SEQS, [(s + n, 1) for s, n in SEQS])):
        step = _step(rows_of)
        m = len(step["ctx_lens"])
        ids = (np.arange(m, dtype=np.int64) * 37 + 3) % w.head.out_features
        x = None if w.embed is not None else \
            rng.standard_normal((m, w.hidden)).astype(np.float32)
        lr = lora_rows(w, m, n) if lora else None
        logits = prog.step(x, step["ctx_lens"], step["block_tables"], step["slots"],
                           step["logit_rows"], lr, step["seq_first"],
                           ids=ids if x is None else None, n_threads=2)
        assert np.isfinite(logits).all()
        out.append(logits)
    return out + [np.ascontiguousarray(c) for c in k + v]


@pytest.mark.parametrize(("arch", "head_dim", "heads", "kv_heads", "tie", "kv_dtype", "lora"), [
    ("llama", 16, 4, 2, True, "float32", False),  # token ids in, the embedding in the step
    ("qwen2", 32, 6, 2, False, "float16", True),  # q/k/v biases, a half cache, LoRA
    ("qwen3", 48, 6, 2, False, "float32", False),  # q/k norms; 3 chunks a head
    ("qwen3", 64, 6, 2, False, "float16", False),
    ("llama", 128, 4, 1, False, "float32", True),  # 8 chunks a head, groups of 4
    ("llama", 24, 4, 2, False, "float32", False),  # not a multiple of 16: the scalar attention
    ("qwen2", 24, 4, 1, False, "float16", False),
])
def test_step_is_the_same_bits_on_every_isa(arch: str, head_dim: int, heads: int, kv_heads: int,
                                            tie: bool, kv_dtype: str, lora: bool) -> None:
    if len(ISAS) < 2:
        pytest.skip("one ISA build on this CPU")
    w = _model(arch, head_dim, heads, kv_heads, tie)
    want = _run(w, ISAS[0], kv_dtype, lora)
    for isa in ISAS[1:]:
        got = _run(w, isa, kv_dtype, lora)
        for n, (g, t) in enumerate(zip(got, want, strict=True)):
            assert g.dtype == t.dtype and g.shape == t.shape
            assert np.array_equal(g.view(np.uint8), t.view(np.uint8)), (isa, ISAS[0], n)


def _cos_sin(isa: str, angle: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    lib = loader.library(loader.isa_flags(isa))
    fn = lib.kiln_rotary_cos_sin
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p]
    fn.restype = None
    c, s = np.empty_like(angle), np.empty_like(angle)
    fn(angle.ctypes.data, angle.size, c.ctypes.data, s.ctypes.data)
    return c, s


def _ulps(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Distance in float32 steps (same-sign values; a sign change counts through zero)."""
    def key(x: np.ndarray) -> np.ndarray:
        i = x.view(np.int32).astype(np.int64)
        return np.where(i < 0, -(i & 0x7FFFFFFF), i)

    return np.abs(key(a) - key(b))


def test_rotary_cos_sin() -> None:
    """The float32 angles the step forms, pos * inv_freq, for positions up to 131072 and two
    thetas: the same bits on every build, within 1 ulp of torch's cos / sin, and the correctly
    rounded values (of float64 cos / sin of the same angle) but for near-midpoint roundings."""
    pos = np.concatenate([np.arange(0, 4096), np.arange(4096, 131073, 37), [131072]])
    angles = []
    for theta in (1e4, 1e6):
        inv = (1.0 / theta ** (np.arange(0, 128, 2, dtype=np.float32) / 128)).astype(np.float32)
        angles.append((pos.astype(np.float32)[:, None] * inv[None, :]).ravel())
    angle = np.concatenate([*angles, np.array([0.0, 1e-30, -1.0, np.pi, -7.5e5], np.float32)])
    angle = angle.astype(np.float32)
    c, s = _cos_sin(ISAS[0], angle)
    for isa in ISAS[1:]:
        c2, s2 = _cos_sin(isa, angle)
        assert np.array_equal(c.view(np.uint32), c2.view(np.uint32)), isa
        assert np.array_equal(s.view(np.uint32), s2.view(np.uint32)), isa
    t = torch.from_numpy(angle)
    for ours, theirs, exact in ((c, torch.cos(t).numpy(), np.cos(angle.astype(np.float64))),
                                (s, torch.sin(t).numpy(), np.sin(angle.astype(np.float64)))):
        assert int(_ulps(ours, theirs).max()) <= 1
        rounded = exact.astype(np.float32)
        assert int(_ulps(ours, rounded).max()) <= 1
        assert np.count_nonzero(ours != rounded) <= angle.size // 100_000


def _attention(isa: str, head_dim: int, group: int, kv_dtype: str) -> np.ndarray:
    """kiln_attend_seq / kiln_attend_merge alone (as cpu_step.c's attention_block calls them)
    over random queries and caches: the attention outputs of SEQS' next rows [M, heads * hd]."""
    lib = loader.library(loader.isa_flags(isa))
    kv_heads, heads = 2, 2 * group
    rng = np.random.default_rng(head_dim * 100 + group)
    nb = len(SEQS) * TABLE
    k, v = (rng.standard_normal((nb, kv_heads, BLOCK, head_dim)).astype(kv_dtype)
            .transpose(0, 2, 1, 3) for _ in range(2))
    step = _step(SEQS)
    lens, tables = step["ctx_lens"], step["block_tables"]
    m_rows, max_ctx = len(lens), int(lens.max())
    nqkv = (heads + 2 * kv_heads) * head_dim
    q = rng.standard_normal((m_rows, nqkv)).astype(np.float32)
    item = k.itemsize
    md = _Model(head_dim=head_dim, heads=heads, kv_heads=kv_heads, block_size=BLOCK,
                scale=head_dim ** -0.5, kv_f16=int(kv_dtype == "float16"),
                kv_sb=k.strides[0] // item, kv_sp=k.strides[1] // item,
                kv_sh=k.strides[2] // item)
    st = _Step(M=m_rows, max_blocks=tables.shape[1], max_ctx=max_ctx,
               ctx_lens=lens.ctypes.data, block_tables=tables.ctypes.data)
    lib.kiln_attend_part.restype = ctypes.c_int64
    psz = int(lib.kiln_attend_part(ctypes.byref(md)))
    n_parts = 1 if psz >= 1 << 62 else -(-max_ctx // psz)
    rec = head_dim + 2
    prow = heads * n_parts * rec
    out = np.zeros((m_rows, heads * head_dim), np.float32)
    parts = np.zeros(m_rows * prow, np.float32)
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    lib.kiln_attend_seq.argtypes = [ptr, ptr, i64, i64, i64, ptr, i64, i64, ptr, ptr, ptr, ptr,
                                    i64, i64, i64, ptr, i64, i64]
    lib.kiln_attend_merge.argtypes = [ptr, i64, i64, ptr]
    first = step["seq_first"]
    for m in range(m_rows):
        if (m - first[m]) % 8:
            continue
        rows = 1
        while rows < 8 and m + rows < m_rows and first[m + rows] == first[m]:
            rows += 1
        for kvh in range(kv_heads):
            for j in range(n_parts):
                scores = np.zeros(rows * group * max_ctx, np.float32)
                lib.kiln_attend_seq(
                    ctypes.byref(md), ctypes.byref(st), m, rows, kvh,
                    q.ctypes.data + 4 * (m * nqkv + kvh * group * head_dim), nqkv, group,
                    k.ctypes.data, v.ctypes.data, scores.ctypes.data,
                    out.ctypes.data + 4 * (m * heads * head_dim + kvh * group * head_dim),
                    heads * head_dim, j * psz, (1 << 62) if j == n_parts - 1 else (j + 1) * psz,
                    parts.ctypes.data + 4 * (m * prow + (kvh * group * n_parts + j) * rec),
                    prow, n_parts * rec)
    if n_parts > 1:
        for m in range(m_rows):
            if lens[m] > psz:
                for h in range(heads):
                    lib.kiln_attend_merge(parts.ctypes.data + 4 * (m * prow + h * n_parts * rec),
                                          -(-int(lens[m]) // psz), head_dim,
                                          out.ctypes.data + 4 * (m * heads + h) * head_dim)
    for m in range(m_rows):  # against float64 softmax attention
        pos = np.arange(lens[m])
        blocks = tables[m][pos // BLOCK]
        for h in range(heads):
            kh, vh = (c[blocks, pos % BLOCK, h // group].astype(np.float64) for c in (k, v))
            s = kh @ q[m, h * head_dim:(h + 1) * head_dim].astype(np.float64) * head_dim ** -0.5
            w = np.exp(s - s.max())
            ref = (w / w.sum()) @ vh
            assert np.abs(out[m, h * head_dim:(h + 1) * head_dim] - ref).max() < 1e-4, (m, h)
    return out


@pytest.mark.parametrize("kv_dtype", ["float32", "float16"])
@pytest.mark.parametrize(("head_dim", "group"), [(16, 1), (32, 4), (48, 3), (64, 2), (128, 4),
                                                 (256, 3), (24, 2), (40, 1)])
def test_attention_is_the_same_bits_on_every_isa(head_dim: int, group: int,
                                                 kv_dtype: str) -> None:
    """The attention kernels alone (no products): every register blocking of the V pass and
    the score blocks, parts merged, the scalar path for 24 and 40."""
    if len(ISAS) < 2:
        pytest.skip("one ISA build on this CPU")
    want = _attention(ISAS[0], head_dim, group, kv_dtype)
    assert np.isfinite(want).all() and np.abs(want).max() > 0
    for isa in ISAS[1:]:
        got = _attention(isa, head_dim, group, kv_dtype)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), isa
