"""The C sampler (``kiln_kernels/cpu/sampling/``) gives the same bits on every build of the ISA
layer this CPU runs (``loader.supported_isas()``: AVX-512, AVX2, NEON, plain C): the sampled
tokens, the logprobs as raw float32 bits and the counter hash's uniforms, on odd vocabulary
sizes and every path of the sampler (greedy, temperature, top-k by heap and by quickselect,
min-p, top-p by sort and by histograms, penalties, seeds, NaN and -inf logits)."""

from __future__ import annotations

import ctypes
import math

import numpy as np
import pytest
import torch
from kiln_kernels.cpu import loader
from kiln_kernels.sampling.native import native_available, sample_rows, sampler_library

pytestmark = pytest.mark.skipif(not native_available(), reason="no C compiler for the kernels")

ISAS = loader.supported_isas()
VOCABS = (17, 1000, 49152 + 5)


def _lib(isa: str) -> ctypes.CDLL:
    lib = sampler_library(loader.isa_flags(isa))
    assert lib is not None
    assert lib.kiln_isa_name().decode() == isa
    return lib


# (temperature, top_p, min_p, presence, frequency, repetition), top_k, logits kind
ROWS: list[tuple[tuple[float, ...], int, str]] = [
    ((0.0, 1.0, 0.0, 0.0, 0.0, 1.0), 0, "randn"),        # greedy
    ((0.8, 1.0, 0.0, 0.0, 0.0, 1.0), 1, "randn"),        # greedy by top-k 1
    ((0.0, 1.0, 0.0, 1.5, 0.3, 1.3), 0, "randn"),        # greedy after penalties
    ((1.0, 1.0, 0.0, 0.0, 0.0, 1.0), 0, "randn"),        # plain temperature
    ((0.7, 1.0, 0.0, 0.0, 0.0, 1.0), 0, "wide"),
    ((1.0, 1.0, 0.0, 0.0, 0.0, 1.0), 5, "randn"),        # top-k, heap
    ((0.9, 1.0, 0.0, 0.0, 0.0, 1.0), 1500, "randn"),     # top-k, quickselect
    ((1.0, 1.0, 0.05, 0.0, 0.0, 1.0), 0, "wide"),        # min-p
    ((1.2, 0.8, 0.0, 0.0, 0.0, 1.0), 300, "randn"),      # top-p, sorted (few kept)
    ((1.0, 0.9, 0.02, 0.0, 0.0, 1.0), 0, "randn"),       # min-p then top-p
    ((1.0, 0.9, 0.0, 0.0, 0.0, 1.0), 0, "flat"),         # top-p, histograms (many kept)
    ((1.0, 0.3, 0.0, 0.0, 0.0, 1.0), 0, "flat"),
    ((0.5, 0.999, 0.0, 0.0, 0.0, 1.0), 0, "randn"),
    ((1.0, 0.5, 0.0, 0.0, 0.0, 1.0), 0, "ties"),         # every value tied
    ((1.1, 0.95, 0.0, 0.5, 0.2, 1.2), 20, "randn"),      # penalties and every filter
    ((1.0, 0.7, 0.0, -0.5, 0.1, 0.8), 0, "wide"),        # negative penalties
    ((1.0, 1.0, 0.0, 0.0, 0.0, 1.0), 0, "nan_inf"),      # NaN never kept, -inf kept at no cut
    ((1.0, 0.6, 0.0, 0.0, 0.0, 1.0), 0, "nan_inf"),
    ((1.0, 1.0, 0.1, 0.0, 0.0, 1.0), 0, "nan_inf"),
    ((0.0, 1.0, 0.0, 0.0, 0.0, 1.0), 0, "nan_inf"),      # greedy: the first NaN
    ((0.0, 1.0, 0.0, 0.0, 0.0, 1.0), 0, "neg_inf"),      # greedy over all -inf: id 0
    ((1.0, 1.0, 0.0, 0.0, 0.0, 1.0), 0, "neg_inf"),
    ((1.0, 1.0, 0.0, 0.0, 0.0, 1.0), 0, "some_inf"),     # -inf tokens kept, never drawn
]


def _logits(kind: str, v: int, rng: np.random.Generator) -> np.ndarray:
    if kind == "randn":
        return rng.standard_normal(v) * 2
    if kind == "wide":
        return rng.standard_normal(v) * 8
    if kind == "flat":
        return rng.standard_normal(v) * 0.5
    if kind == "ties":
        return np.zeros(v)
    if kind == "neg_inf":
        return np.full(v, -np.inf)
    x = rng.standard_normal(v) * 2
    x[rng.integers(0, v, max(1, v // 7))] = -np.inf
    if kind == "nan_inf":
        x[rng.integers(0, v, max(1, v // 11))] = np.nan
    return x


Batch = tuple[np.ndarray, list[tuple[float, ...]], list[tuple[int, int, int]], list[list[int]]]


def _batch(v: int, seed: int) -> Batch:
    rng = np.random.default_rng(seed + v)
    logits = np.stack([_logits(kind, v, rng) for _, _, kind in ROWS]).astype(np.float32)
    floats = [f for f, _, _ in ROWS]
    seeds = [seed * 7919 + i for i in range(len(ROWS))]
    seeds[3], seeds[4] = 2**64 - 3, -(2**63)
    ints = [(k, s, 11 * i + seed) for i, ((_, k, _), s) in enumerate(zip(ROWS, seeds, strict=True))]
    seen = [rng.integers(0, v, int(rng.integers(0, 30))).tolist() for _ in ROWS]
    return logits, floats, ints, seen


def _run(isa: str, logits: np.ndarray, floats: list[tuple[float, ...]],
         ints: list[tuple[int, int, int]], seen: list[list[int]], n_threads: int = 1) -> tuple[np.ndarray, np.ndarray]:
    got = sample_rows(logits, floats, ints, seen, lib=_lib(isa), n_threads=n_threads)
    assert got is not None
    return np.array(got[0], dtype=np.int64), np.array(got[1], dtype=np.float32).view(np.uint32)


@pytest.mark.skipif(len(ISAS) < 2, reason="one ISA build on this CPU")
@pytest.mark.parametrize("v", VOCABS)
@pytest.mark.parametrize("seed", range(2))
def test_tokens_and_logprobs_are_bitwise_the_same_on_every_isa(v: int, seed: int) -> None:
    batch = _batch(v, seed)
    base_t, base_lp = _run(ISAS[-1], *batch)
    for isa in ISAS[:-1]:
        t, lp = _run(isa, *batch, n_threads=2)
        assert np.array_equal(t, base_t), (isa, np.nonzero(t != base_t))
        assert np.array_equal(lp, base_lp), (isa, np.nonzero(lp != base_lp))
    # the cases did what they are there for
    assert all(0 <= t < v for t in base_t)
    lp = base_lp.view(np.float32)
    greedy = [i for i, (f, k, _) in enumerate(ROWS) if f[0] == 0.0 or k == 1]
    assert all(lp[i] == 0.0 for i in greedy)
    nan_greedy = next(i for i in greedy if ROWS[i][2] == "nan_inf")
    assert base_t[nan_greedy] == int(np.flatnonzero(np.isnan(batch[0][nan_greedy]))[0])
    for i, (_, _, kind) in enumerate(ROWS):
        if kind in ("nan_inf", "some_inf") and i not in greedy:
            assert math.isfinite(batch[0][i, base_t[i]]) and math.isfinite(float(lp[i]))


@pytest.mark.skipif(len(ISAS) < 2, reason="one ISA build on this CPU")
def test_counter_uniforms_are_bitwise_the_same_on_every_isa() -> None:
    from kiln_kernels.sampling.counter_hash import counter_uniform_torch

    seeds = torch.tensor([0, 1, 12345, 2**63 - 1, -1, -(2**63)], dtype=torch.int64)
    steps = torch.tensor([0, 7, 1, 2**40 + 3, 5, 0], dtype=torch.int64)
    want = counter_uniform_torch(seeds, steps, 1000 + 5).numpy().view(np.uint32)
    for isa in ISAS:
        out = np.empty((6, 1000 + 5), dtype=np.float32)
        _lib(isa).kiln_counter_uniform(seeds.data_ptr(), steps.data_ptr(), 6, 1000 + 5,
                                       out.ctypes.data)
        assert np.array_equal(out.view(np.uint32), want), isa
