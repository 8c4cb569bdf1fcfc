"""Sampling: reference semantics, counter hash, batch invariance, Triton == reference."""

from __future__ import annotations

import math

import pytest
import torch
import triton
import triton.language as tl
from kiln_kernels.sampling import (
    SamplingTensors,
    apply_penalties,
    counter_uniform,
    sample,
    sample_reference,
)
from kiln_kernels.sampling.counter_hash_triton import tl_row_state, tl_uniform
from kiln_kernels.sampling.sampler import sample_triton

from tests.numerics import logsoftmax_atol, sampling_scale

M32 = 0xFFFFFFFF


def _py_hash(seed: int, step: int, tok: int) -> int:
    """Independent plain-int murmur3_32 of [seed_lo, seed_hi, step_lo, step_hi, tok]."""

    def rotl(x: int, r: int) -> int:
        return ((x << r) | (x >> (32 - r))) & M32

    h = 0
    seed %= 1 << 64
    step %= 1 << 64
    for k in (seed & M32, seed >> 32, step & M32, step >> 32, tok):
        k = (rotl((k * 0xCC9E2D51) & M32, 15) * 0x1B873593) & M32
        h = (rotl(h ^ k, 13) * 5 + 0xE6546B64) & M32
    h ^= 20
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & M32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & M32
    return h ^ (h >> 16)


def _rows(n: int, **kw: object) -> list[dict[str, object]]:
    return [dict(kw, seed=i) for i in range(n)]


def test_counter_uniform_matches_plain_integer_hash() -> None:
    seeds = [0, 1, 12345, 2**63 - 1, 2**64 - 1, 2**63]
    steps = [0, 7, 1, 2**40 + 3, 5, 0]
    p = SamplingTensors.build(
        [{"seed": s, "step": t} for s, t in zip(seeds, steps, strict=True)], 40
    )
    u = counter_uniform(p.seeds, p.steps, 40)
    for i, (s, t) in enumerate(zip(seeds, steps, strict=True)):
        for tok in (0, 1, 17, 39):
            want = ((_py_hash(s, t, tok) >> 9) + 0.5) / 2**23
            assert u[i, tok].item() == want


def test_counter_uniform_range_and_spread() -> None:
    seeds = torch.arange(64, dtype=torch.int64) * 7919 - 100
    steps = torch.arange(64, dtype=torch.int64)
    u = counter_uniform(seeds, steps, 512)
    assert u.dtype == torch.float32 and u.shape == (64, 512)
    assert bool((u > 0).all()) and bool((u < 1).all())
    assert abs(u.mean().item() - 0.5) < 0.01
    hist = torch.histc(u, bins=10, min=0.0, max=1.0) / u.numel()
    assert bool(((hist - 0.1).abs() < 0.01).all())
    # rows with different seeds or steps differ
    assert not torch.equal(u[0], u[1])
    u2 = counter_uniform(seeds, steps + 1, 512)
    assert not torch.equal(u, u2)


def test_counter_uniform_extremes_stay_inside_open_interval() -> None:
    from kiln_kernels.sampling.counter_hash import counter_hash

    h = counter_hash(
        torch.arange(4096, dtype=torch.int64), torch.zeros(4096, dtype=torch.int64), 64
    )
    assert int(h.max()) < 2**32 and int(h.min()) >= 0
    from kiln_kernels.sampling.counter_hash import hash_to_uniform

    u = hash_to_uniform(torch.tensor([0, 511, 512, 2**31, 2**32 - 1], dtype=torch.int64))
    assert 0.0 < u[0].item() == u[1].item() < u[2].item() < u[3].item() < u[4].item() < 1.0
    assert bool(torch.isfinite(-torch.log(-torch.log(u))).all())


@triton.jit
def _uniform_kernel(key_ptr, out_ptr, V, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    state = tl_row_state(
        tl.load(key_ptr + row * 4).to(tl.uint32),
        tl.load(key_ptr + row * 4 + 1).to(tl.uint32),
        tl.load(key_ptr + row * 4 + 2).to(tl.uint32),
        tl.load(key_ptr + row * 4 + 3).to(tl.uint32),
    )
    offs = tl.arange(0, BLOCK)
    u = tl_uniform(state, offs.to(tl.uint32))
    tl.store(out_ptr + row * V + offs, u, mask=offs < V)


def test_counter_uniform_triton_bit_identical(triton_device: str) -> None:
    from kiln_kernels.sampling.counter_hash import split_u64

    seeds = torch.tensor([0, -1, 2**62 + 12345, -(2**63), 99], dtype=torch.int64)
    steps = torch.tensor([0, 3, 2**33 + 1, 1, -2], dtype=torch.int64)
    s_lo, s_hi = split_u64(seeds)
    t_lo, t_hi = split_u64(steps)
    key = torch.stack([s_lo, s_hi, t_lo, t_hi], 1).contiguous().to(triton_device)
    out = torch.empty((5, 100), dtype=torch.float32, device=triton_device)
    _uniform_kernel[(5,)](key, out, 100, BLOCK=128)
    assert torch.equal(out.cpu(), counter_uniform(seeds, steps, 100))


def test_penalties_by_hand() -> None:
    logits = torch.tensor([[2.0, -2.0, 1.0, 0.5, -1.0]])
    p = SamplingTensors.build(
        [
            {
                "repetition_penalty": 2.0,
                "frequency_penalty": 0.25,
                "presence_penalty": 0.5,
                "output_tokens": [0, 0, 1],
                "prompt_tokens": [2],
            }
        ],
        5,
    )
    got = apply_penalties(logits, p)
    # tok0: 2/2 - 0.25*2 - 0.5 = 0 ; tok1: -2*2 - 0.25 - 0.5 = -4.75 ; tok2 (prompt): 1/2 = 0.5
    want = torch.tensor([[0.0, -4.75, 0.5, 0.5, -1.0]])
    torch.testing.assert_close(got, want)


def test_penalties_on_seen_entries_equal_the_dense_formula() -> None:
    gen = torch.Generator().manual_seed(7)
    b, v = 6, 300
    logits = torch.randn(b, v, generator=gen) * 4
    rows = [{"temperature": 0.0, "repetition_penalty": 1.3, "presence_penalty": 1.5,
             "frequency_penalty": -0.4,
             "output_tokens": torch.randint(0, v, (40,), generator=gen).tolist(),
             "prompt_tokens": list(range(i * 10, i * 10 + 50))}
            for i in range(b - 1)] + [{"temperature": 0.0}]
    p = SamplingTensors.build(rows, v)
    logits_before = logits.clone()
    got = apply_penalties(logits, p)
    assert torch.equal(logits, logits_before)  # the input is not modified
    r = p.repetition_penalty[:, None]
    seen = p.prompt_mask | (p.output_counts > 0)
    dense = torch.where(seen, torch.where(logits > 0, logits / r, logits * r), logits)
    dense = dense - p.frequency_penalty[:, None] * p.output_counts.to(torch.float32)
    dense = dense - p.presence_penalty[:, None] * (p.output_counts > 0).to(torch.float32)
    assert torch.equal(got, dense)
    assert torch.equal(got[-1], logits[-1])  # no history, no change


def test_greedy_applies_penalties_and_breaks_ties_low() -> None:
    logits = torch.tensor([[5.0, 1.0, 3.0, 3.0], [1.0, 2.0, 2.0, 0.0]])
    p = SamplingTensors.build(
        [
            {"temperature": 0.0, "output_tokens": [0], "presence_penalty": 4.0},
            {"temperature": 0.0},
        ],
        4,
    )
    tok, lp = sample_reference(logits, p)
    assert tok.tolist() == [2, 1]
    assert lp.tolist() == [0.0, 0.0]


def test_top_k_one_is_greedy() -> None:
    logits = torch.randn(3, 50)
    p = SamplingTensors.build(_rows(3, top_k=1, temperature=2.0), 50)
    tok, lp = sample_reference(logits, p)
    assert torch.equal(tok, logits.argmax(1))
    assert bool((lp == 0).all())


def _kept_sets(logits: torch.Tensor, rows: list[dict[str, object]], n: int = 300) -> set[int]:
    """Every token id drawn over n seeds for one parameter row."""
    v = logits.shape[1]
    p = SamplingTensors.build([dict(rows[0], seed=s) for s in range(n)], v)
    tok, _ = sample_reference(logits.expand(n, v), p)
    return set(tok.tolist())


def test_filters_restrict_the_candidate_set() -> None:
    probs = torch.tensor([0.4, 0.3, 0.15, 0.1, 0.05])
    logits = probs.log()[None, :]
    assert _kept_sets(logits, [{"top_k": 2}]) == {0, 1}
    # top_p 0.8: cumulative 0.4, 0.7, 0.85 -> cut after index 2 (inclusive)
    assert _kept_sets(logits, [{"top_p": 0.8}]) == {0, 1, 2}
    # min_p 0.3: keep p >= 0.12
    assert _kept_sets(logits, [{"min_p": 0.3}]) == {0, 1, 2}
    # order: top_k 4 -> renormalize -> min_p 0.3 (p >= 0.12 of kept) -> top_p 0.5
    assert _kept_sets(logits, [{"top_k": 4, "min_p": 0.3, "top_p": 0.5}]) == {0, 1}
    assert _kept_sets(logits, [{"top_p": 0.0}]) == {0, 1, 2, 3, 4}  # 0 = off


def test_logprob_is_filtered_log_softmax() -> None:
    torch.manual_seed(1)
    logits = torch.randn(4, 37)
    p = SamplingTensors.build(_rows(4, temperature=0.7, top_k=5), 37)
    tok, lp = sample_reference(logits, p)
    x = logits / 0.7
    kth = x.topk(5, dim=1).values[:, -1:]
    filt = torch.where(x >= kth, x, torch.full_like(x, -math.inf))
    want = torch.log_softmax(filt, 1).gather(1, tok[:, None]).squeeze(1)
    torch.testing.assert_close(lp, want)
    assert bool((x >= kth).gather(1, tok[:, None]).all())


def test_frequencies_follow_softmax() -> None:
    logits = torch.tensor([[1.0, 0.0, -0.5, 2.0, 0.3, -2.0]])
    n = 6000
    p = SamplingTensors.build(_rows(n, temperature=0.9), 6)
    tok, _ = sample_reference(logits.expand(n, 6), p)
    freq = torch.bincount(tok, minlength=6).float() / n
    want = torch.softmax(logits[0] / 0.9, 0)
    assert float((freq - want).abs().max()) < 0.02
    p = SamplingTensors.build(_rows(n, top_k=3), 6)
    tok, _ = sample_reference(logits.expand(n, 6), p)
    freq = torch.bincount(tok, minlength=6).float() / n
    kept = torch.tensor([True, False, False, True, True, False])
    want = torch.softmax(torch.where(kept, logits[0], -math.inf), 0)
    assert float((freq - want).abs().max()) < 0.02


def _mixed_params(b: int, v: int, gen: torch.Generator) -> SamplingTensors:
    rows = []
    for i in range(b):
        out = torch.randint(0, v, (int(torch.randint(0, 9, (1,), generator=gen)),), generator=gen)
        rows.append(
            {
                "temperature": [0.0, 0.5, 1.0, 1.3][i % 4],
                "top_k": [0, 5, 40, 0, 2][i % 5],
                "top_p": [1.0, 0.9, 0.0, 0.5][i % 4],
                "min_p": [0.0, 0.0, 0.1][i % 3],
                "presence_penalty": 0.4 * (i % 2),
                "frequency_penalty": 0.2 * (i % 3),
                "repetition_penalty": [1.0, 1.2][i % 2],
                "output_tokens": out.tolist(),
                "prompt_tokens": [1, 3, i],
                "seed": 1000 * i - 7,
                "step": i * 3,
            }
        )
    return SamplingTensors.build(rows, v)


def test_batch_invariance_and_determinism() -> None:
    gen = torch.Generator().manual_seed(3)
    b, v = 9, 211
    logits = torch.randn(b, v, generator=gen) * 2
    p = _mixed_params(b, v, gen)
    tok, lp = sample_reference(logits, p)
    tok2, lp2 = sample_reference(logits, p)
    assert torch.equal(tok, tok2) and torch.equal(lp, lp2)
    order = [7, 2, 5]
    sub_t, sub_lp = sample_reference(logits[order], p.select(order))
    assert torch.equal(sub_t, tok[order])
    torch.testing.assert_close(sub_lp, lp[order])
    one_t, _ = sample(logits[4:5], p.select([4]))
    assert one_t.item() == tok[4].item()


@pytest.mark.parametrize(("b", "v"), [(1, 17), (9, 333), (5, 2100)])
def test_triton_matches_reference(triton_device: str, b: int, v: int) -> None:
    gen = torch.Generator().manual_seed(b * 31 + v)
    logits = torch.randn(b, v, generator=gen) * 3
    p = _mixed_params(b, v, gen)
    want_t, want_lp = sample_reference(logits, p)
    got_t, got_lp = sample_triton(logits.to(triton_device), p.to(triton_device))
    assert torch.equal(got_t.cpu(), want_t)
    assert (got_lp.cpu() - want_lp).abs().max().item() <= logsoftmax_atol(v, sampling_scale(logits, p))
    if b > 3:  # batch invariance on the Triton path as well
        sub = [b - 1, 0]
        sub_t, _ = sample_triton(logits[sub].to(triton_device), p.select(sub).to(triton_device))
        assert sub_t.cpu().tolist() == [want_t[b - 1].item(), want_t[0].item()]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_triton_matches_reference_half_gpu(cuda_device: str, dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(5)
    b, v = 33, 32000
    logits = (torch.randn(b, v, generator=gen) * 3).to(dtype)
    p = _mixed_params(b, v, gen)
    want_t, want_lp = sample_reference(logits, p)
    got_t, got_lp = sample(logits.to(cuda_device), p.to(cuda_device))
    assert torch.equal(got_t.cpu(), want_t)
    torch.testing.assert_close(got_lp.cpu(), want_lp, atol=1e-3, rtol=1e-3)


def test_input_validation() -> None:
    p = SamplingTensors.build([{}], 10)
    with pytest.raises(ValueError, match="logits"):
        sample_reference(torch.zeros(10), p)
    with pytest.raises(ValueError, match="output_counts"):
        sample_reference(torch.zeros(1, 11), p)
    with pytest.raises(ValueError, match="dtype"):
        sample_reference(torch.zeros(1, 10, dtype=torch.int32), p)


def test_sparse_noise_path_equals_dense() -> None:
    """Hashing only the surviving tokens gives the same tokens and logprobs as the dense path."""
    from kiln_kernels.sampling import reference

    gen = torch.Generator().manual_seed(7)
    vocab = 3000
    logits = torch.randn(6, vocab, generator=gen) * 3
    rows = [{"temperature": 0.8, "top_k": k, "top_p": tp, "seed": 11 + i, "step": i}
            for i, (k, tp) in enumerate([(20, 1.0), (0, 0.9), (5, 0.5), (40, 0.95), (1, 1.0),
                                         (0, 1.0)])]
    p = SamplingTensors.build(rows, vocab)
    sparse = reference.sample_reference(logits, p)
    saved = reference.SPARSE_FRACTION
    try:
        reference.SPARSE_FRACTION = 2.0  # force the dense path everywhere
        dense = reference.sample_reference(logits, p)
    finally:
        reference.SPARSE_FRACTION = saved
    assert torch.equal(sparse[0], dense[0])
    torch.testing.assert_close(sparse[1], dense[1])


@pytest.mark.parametrize("seed", range(6))
def test_top_k_candidate_path_equals_the_dense_path(seed: int,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows with top-k on are sampled over their k candidates: the same tokens as the dense
    path (min-p, top-p, mixed k, greedy rows beside), logprobs to rounding."""
    from kiln_kernels.sampling import reference

    gen = torch.Generator().manual_seed(seed)
    b, v = 9, 4000
    logits = torch.randn(b, v, generator=gen) * (1 + seed)
    rows = [{"temperature": 0.5 + 0.2 * i, "top_k": [20, 5, 40, 1, 64, 3, 20, 7, 33][i],
             "top_p": [1.0, 0.9, 0.5, 1.0, 0.95, 0.8, 0.3, 1.0, 0.99][i],
             "min_p": [0.0, 0.0, 0.05, 0.0, 0.0, 0.2, 0.0, 0.01, 0.0][i],
             "seed": seed * 100 + i, "step": i} for i in range(b)]
    rows[4]["temperature"] = 0.0  # a greedy row in the batch
    p = SamplingTensors.build(rows, v)
    fast = reference.sample_reference(logits, p)
    monkeypatch.setattr(reference, "sample_topk_rows", lambda xs, sub: None)
    dense = reference.sample_reference(logits, p)
    assert torch.equal(fast[0], dense[0])
    assert (fast[1] - dense[1]).abs().max().item() <= logsoftmax_atol(v, sampling_scale(logits, p))


def test_ties_at_the_kth_value_fall_back_to_the_dense_path() -> None:
    from kiln_kernels.sampling.candidates import sample_topk_rows

    xs = torch.tensor([[3.0, 2.0, 2.0, 2.0, 1.0]])
    p = SamplingTensors.build([{"temperature": 1.0, "top_k": 2, "seed": 1}], 5)
    assert sample_topk_rows(xs, p) is None  # three tokens tie at the 2nd value: all are kept
    tok, _ = sample_reference(xs, p)
    assert int(tok[0]) in (0, 1, 2, 3)


def test_native_counter_uniform_is_bitwise_the_torch_lanes() -> None:
    from kiln_kernels.cpu import available as kernels_available
    from kiln_kernels.sampling.counter_hash import counter_uniform_torch
    from kiln_kernels.sampling.native import counter_uniform_native

    if not kernels_available():
        pytest.skip("no C compiler for the kernels")
    seeds = torch.tensor([0, 1, -1, 2**62 + 12345, -(2**63), 987654321], dtype=torch.int64)
    steps = torch.tensor([0, 7, 2**40 + 3, 1, -5, 123456], dtype=torch.int64)
    got = counter_uniform_native(seeds, steps, 5003)
    assert got is not None
    assert torch.equal(got, counter_uniform_torch(seeds, steps, 5003))
