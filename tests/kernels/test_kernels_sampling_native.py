"""The C sampler (kiln_kernels.sampling.native) against the torch reference: same tokens, logprobs
to rounding, every filter path (heap and quickselect top-k, sorted and histogram top-p, min-p,
penalties with repeated and prompt-only ids), batch invariance."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from kiln_kernels.cpu.loader import NATIVE_FLAGS, PORTABLE_FLAGS
from kiln_kernels.sampling import SamplingTensors, sample_reference
from kiln_kernels.sampling.native import (
    FLOAT_COLUMNS,
    SeenTokens,
    native_available,
    sample_native,
    sample_rows,
)
from kiln_kernels.sampling.params import to_int64_bits

from tests.numerics import logsoftmax_atol, sampling_scale

pytestmark = pytest.mark.skipif(not native_available(), reason="no C compiler for the kernels")


def _native(logits: torch.Tensor, p: SamplingTensors,
            flags: tuple[str, ...] = NATIVE_FLAGS) -> tuple[torch.Tensor, torch.Tensor]:
    got = sample_native(logits, p, SeenTokens.from_dense(p), flags=flags)
    assert got is not None
    return got


def _assert_same(logits: torch.Tensor, p: SamplingTensors,
                 flags: tuple[str, ...] = NATIVE_FLAGS) -> None:
    want_t, want_lp = sample_reference(logits, p)
    got_t, got_lp = _native(logits, p, flags)
    assert torch.equal(got_t, want_t)
    assert (got_lp - want_lp).abs().max().item() <= logsoftmax_atol(logits.shape[-1],
                                                                    sampling_scale(logits, p))



def _rows(b: int, seed: int, v: int, gen: torch.Generator) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for i in range(b):
        out = torch.randint(0, v, (int(torch.randint(0, 40, (1,), generator=gen)),),
                            generator=gen).tolist()
        rows.append({
            "temperature": [0.0, 1.0, 0.7, 1.0, 1.0, 0.5, 1.2, 1.0, 0.9, 1.1][i % 10],
            "top_k": [0, 20, 0, 0, 50, 0, 1500, 1, 0, 3][i % 10],
            "top_p": [1.0, 0.95, 0.9, 1.0, 0.8, 1.0, 0.99, 1.0, 0.5, 0.6][i % 10],
            "min_p": [0.0, 0.0, 0.0, 0.05, 0.0, 0.1, 0.0, 0.0, 0.0, 0.02][i % 10],
            "presence_penalty": [1.5, 1.5, 0.0, 0.0, 0.5, -0.5, 0.0, 0.0, 0.0, 0.2][i % 10],
            "frequency_penalty": [0.0, 0.0, 0.3, 0.0, 0.0, 0.1, 0.0, 0.0, 0.0, 0.0][i % 10],
            "repetition_penalty": [1.0, 1.0, 1.2, 1.0, 1.0, 1.1, 1.0, 0.8, 1.0, 1.3][i % 10],
            "output_tokens": out, "prompt_tokens": [2, 5, i] if i % 3 == 0 else [],
            "seed": seed * 1000 + 17 * i - 3, "step": i + seed})
    return rows


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("v", [211, 49152])
def test_mixed_rows_match_the_reference(seed: int, v: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(10, v, generator=gen) * (1 + seed)
    _assert_same(logits, SamplingTensors.build(_rows(10, seed, v, gen), v))


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("top_p", [0.3, 0.9, 0.999])
def test_top_p_over_many_kept_tokens_matches(seed: int, top_p: float) -> None:
    """No top-k on flat logits: tens of thousands kept, so the histogram path finds the cut."""
    gen = torch.Generator().manual_seed(seed)
    v = 60_000
    logits = torch.randn(3, v, generator=gen) * 0.5
    p = SamplingTensors.build([{"temperature": 1.0, "top_p": top_p, "seed": seed + i}
                               for i in range(3)], v)
    _assert_same(logits, p)


def test_ties_at_the_thresholds_are_all_kept() -> None:
    xs = torch.tensor([[3.0, 2.0, 2.0, 2.0, 1.0] + [0.0] * 20])
    for seed in range(40):  # top-k 2 keeps the three tied 2.0s as the reference does
        p = SamplingTensors.build([{"temperature": 1.0, "top_k": 2, "seed": seed}], 25)
        _assert_same(xs, p)
    flat = torch.zeros(2, 6000)  # every value tied: top-p keeps them all
    p = SamplingTensors.build([{"top_p": 0.5, "seed": 1}, {"top_p": 0.9, "seed": 2}], 6000)
    _assert_same(flat, p)


def test_greedy_rows_with_penalties_are_bitwise_the_reference() -> None:
    gen = torch.Generator().manual_seed(9)
    logits = torch.randn(4, 500, generator=gen) * 3
    top = logits.argmax(dim=1).tolist()
    rows: list[dict[str, Any]] = [
        {"temperature": 0.0, "presence_penalty": 9.0, "output_tokens": [top[0]] * 3},
        {"temperature": 0.0, "repetition_penalty": 50.0, "prompt_tokens": [top[1]]},
        {"temperature": 0.0, "frequency_penalty": 2.0, "output_tokens": [top[2], top[2]]},
        {"temperature": 0.0}]
    p = SamplingTensors.build(rows, 500)
    got_t, got_lp = _native(logits, p)
    want_t, _ = sample_reference(logits, p)
    assert torch.equal(got_t, want_t)
    assert got_t.tolist()[:3] != top[:3] and got_t.tolist()[3] == top[3]
    assert torch.equal(got_lp, torch.zeros(4))


def test_a_row_never_depends_on_its_batch() -> None:
    gen = torch.Generator().manual_seed(4)
    v = 3000
    logits = torch.randn(10, v, generator=gen) * 2
    p = SamplingTensors.build(_rows(10, 4, v, gen), v)
    full_t, full_lp = _native(logits, p)
    for i in range(10):
        one_t, one_lp = _native(logits[i:i + 1].clone(), p.select([i]))
        assert one_t.item() == full_t[i].item() and one_lp.item() == full_lp[i].item()


def test_seen_tokens_from_lists_equal_the_dense_counts() -> None:
    p = SamplingTensors.build([{"output_tokens": [4, 4, 9], "presence_penalty": 1.0,
                                "frequency_penalty": 0.5, "temperature": 0.0},
                               {"output_tokens": [], "temperature": 0.0}], 12)
    logits = torch.arange(24, dtype=torch.float32).reshape(2, 12).flip(1).contiguous()
    dense = sample_native(logits, p, SeenTokens.from_dense(p))
    lists = sample_native(logits, p, SeenTokens.from_lists([[4, 4, 9], []]))
    assert dense is not None and lists is not None
    assert torch.equal(dense[0], lists[0])


def test_bad_inputs_are_refused() -> None:
    p = SamplingTensors.build([{}], 8)
    with pytest.raises(ValueError, match="float32"):
        sample_native(torch.zeros(1, 8, dtype=torch.float16), p, SeenTokens.from_dense(p))
    with pytest.raises(ValueError, match="offsets"):
        sample_native(torch.zeros(1, 8), p, SeenTokens.from_lists([[], []]))


def test_penalized_logits_enter_the_logprob_exactly() -> None:
    """Two tokens, the second penalized: its logprob pins the penalized value."""
    logits = torch.zeros(4, 2)
    rows = [{"frequency_penalty": 0.3, "output_tokens": [1, 1, 1], "seed": 1},
            {"presence_penalty": 0.7, "output_tokens": [1], "seed": 2},
            {"repetition_penalty": 1.7, "prompt_tokens": [1], "seed": 3},
            {"frequency_penalty": -0.2, "presence_penalty": 0.1, "output_tokens": [1, 1],
             "seed": 4}]
    logits[2, 1] = -0.8  # repetition multiplies a negative logit
    p = SamplingTensors.build(rows, 2)
    want_t, want_lp = sample_reference(logits, p)
    got_t, got_lp = _native(logits, p)
    assert torch.equal(got_t, want_t)
    assert (got_lp - want_lp).abs().max().item() <= logsoftmax_atol(logits.shape[-1],
                                                                    sampling_scale(logits, p))


@pytest.mark.parametrize("top_p", [0.2, 0.7])
def test_the_top_p_cut_over_many_kept_tokens_is_the_references(top_p: float) -> None:
    """300 draws over 20,000 kept tokens each: a cut off by ~1% of the mass would change some."""
    gen = torch.Generator().manual_seed(11)
    v, b = 20_000, 300
    logits = (torch.randn(1, v, generator=gen) * 0.7).expand(b, v).contiguous()
    p = SamplingTensors.build([{"top_p": top_p, "seed": 5 * i + 1} for i in range(b)], v)
    _assert_same(logits, p)


@pytest.mark.parametrize("v", [5, 16, 37, 100])
def test_greedy_argmax_edge_cases_match_torch(v: int) -> None:
    """First of tied maxima, the maximum in the tail past the last 16-lane chunk, NaN first."""
    gen = torch.Generator().manual_seed(v)
    cases = [torch.randn(v, generator=gen), torch.zeros(v), torch.full((v,), float("-inf"))]
    tied = torch.randn(v, generator=gen)
    tied[[1, v - 1]] = 9.0
    tail = torch.randn(v, generator=gen)
    tail[-1] = 9.0
    nan = torch.randn(v, generator=gen)
    nan[[v // 2, v - 1]] = float("nan")
    cases += [tied, tail, nan]
    logits = torch.stack(cases)
    p = SamplingTensors.build([{"temperature": 0.0}] * len(cases), v)
    got, _ = _native(logits, p)
    assert got.tolist() == torch.argmax(logits, dim=1).tolist()


@pytest.mark.parametrize("seed", range(3))
def test_the_portable_build_matches_the_reference(seed: int) -> None:
    """The plain-C build (no vector registers): mixed rows, and a flat top-p row (histograms)."""
    gen = torch.Generator().manual_seed(seed)
    v = 5000
    logits = torch.randn(10, v, generator=gen) * 2
    _assert_same(logits, SamplingTensors.build(_rows(10, seed, v, gen), v), PORTABLE_FLAGS)
    flat = torch.randn(2, 20_000, generator=gen) * 0.5
    p = SamplingTensors.build([{"top_p": 0.8, "seed": seed}, {"top_p": 0.3, "seed": seed + 9}],
                              20_000)
    _assert_same(flat, p, PORTABLE_FLAGS)


@pytest.mark.parametrize("seed", range(3))
def test_sample_rows_matches_the_reference(seed: int) -> None:
    """The engine's list entry point (no tensor per parameter): the reference's tokens and
    logprobs, including inactive repetition penalties (<= 0, inf, nan, below float32) and
    min-p values that are nan or round to zero."""
    v = 3001
    gen = torch.Generator().manual_seed(seed)
    rows = _rows(10, seed, v, gen)
    odd = [(0.0, float("nan")), (-1.0, 1e-50), (float("inf"), 0.0), (float("nan"), 0.05),
           (1e-50, 0.0)]
    for row, (rep, min_p) in zip(rows[5:], odd, strict=True):
        row["repetition_penalty"], row["min_p"] = rep, min_p
    for row in rows:
        row["prompt_tokens"] = []  # the engine's rows count generated tokens only
    logits = torch.randn(10, v, generator=gen) * 2
    p = SamplingTensors.build(rows, v)
    want_t, want_lp = sample_reference(logits, p)
    got = sample_rows(
        logits,
        [tuple(float(r[n]) for n in FLOAT_COLUMNS) for r in rows],
        [(int(r["top_k"]), int(r["seed"]), int(r["step"])) for r in rows],
        [r["output_tokens"] for r in rows])
    assert got is not None
    assert got[0] == want_t.tolist()
    bound = logsoftmax_atol(logits.shape[-1], sampling_scale(logits, SamplingTensors.build(rows, 1)))
    assert (torch.tensor(got[1]) - want_lp).abs().max().item() <= bound


def test_sample_rows_takes_a_seeds_low_64_bits() -> None:
    """A wire seed past int64 (uint64) and its int64 bit pattern sample alike, as the reference
    does with the bit pattern (SamplingTensors holds seeds as int64 bits)."""
    v = 777
    logits = torch.randn(3, v, generator=torch.Generator().manual_seed(5))
    floats = [(1.0, 1.0, 0.0, 0.0, 0.0, 1.0)] * 3
    big = [2**64 - 5, 2**63, 2**64 + 11]
    bits = [to_int64_bits(s) for s in big]
    assert bits == [-5, -2**63, 11]
    got = sample_rows(logits, floats, [(0, s, 4) for s in big], [[]] * 3)
    assert got is not None
    assert got == sample_rows(logits, floats, [(0, s, 4) for s in bits], [[]] * 3)
    rows = [{"temperature": 1.0, "seed": s, "step": 4} for s in big]
    want_t, _ = sample_reference(logits, SamplingTensors.build(rows, v))
    assert got[0] == want_t.tolist()


@pytest.mark.parametrize("top_k", [0, 40])  # the dense threshold and the top-k fast path
def test_min_p_above_one_keeps_the_top_token(top_k: int) -> None:
    """No filter may leave a row without a token: min_p above 1 keeps what 1 keeps (the top
    token and its ties), in the reference, its top-k fast path and C alike. It had picked id 0."""
    gen = torch.Generator().manual_seed(7)
    v = 5000
    logits = torch.randn(4, v, generator=gen) * 3
    rows = [{"temperature": 0.8, "top_k": top_k, "min_p": mp, "seed": 5 + i}
            for i, mp in enumerate([1.0, 1.01, 2.0, 1e30])]
    p = SamplingTensors.build(rows, v)
    tokens, logprobs = sample_reference(logits, p)
    assert torch.equal(tokens, torch.argmax(logits, dim=1))
    assert torch.equal(logprobs, torch.zeros(4))
    _assert_same(logits, p)
