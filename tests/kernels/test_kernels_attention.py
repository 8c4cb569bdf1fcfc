"""Paged attention: references vs dense attention; Triton vs references."""

from __future__ import annotations

import pytest
import torch
from kiln_kernels.attention import (
    paged_decode,
    paged_decode_ref,
    prefill_paged,
    prefill_paged_ref,
    store_kv,
    store_kv_ref,
)
from kiln_kernels.attention.decode import paged_decode_triton
from kiln_kernels.attention.kv_store import store_kv_triton
from kiln_kernels.attention.prefill import prefill_paged_triton

from tests.numerics import U32, attention_atol

# half precisions on the GPU: a few ulps of the storage type (float16 2^-11, bfloat16 2^-8)
TOL = {torch.float16: 3e-3, torch.bfloat16: 2e-2}


def _setup(
    lens: list[int], bs: int, hk: int, d: int, gen: torch.Generator, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
    """Random caches holding dense per-sequence K/V at shuffled blocks."""
    pages = [(n + bs - 1) // bs for n in lens]
    max_pages = max(1, max(pages))
    nb = sum(pages) + 3
    perm = torch.randperm(nb, generator=gen)
    tables = torch.zeros(len(lens), max_pages, dtype=torch.int32)
    kc = torch.randn(nb, bs, hk, d, generator=gen).to(dtype)  # garbage outside the sequences
    vc = torch.randn(nb, bs, hk, d, generator=gen).to(dtype)
    ks, vs, used = [], [], 0
    for i, n in enumerate(lens):
        tables[i, : pages[i]] = perm[used : used + pages[i]].to(torch.int32)
        used += pages[i]
        k = torch.randn(n, hk, d, generator=gen).to(dtype)
        v = torch.randn(n, hk, d, generator=gen).to(dtype)
        pos = torch.arange(n)
        slots = tables[i].long()[pos // bs] * bs + pos % bs
        store_kv_ref(k, v, kc, vc, slots)
        ks.append(k)
        vs.append(v)
    return kc, vc, tables, ks, vs


def _dense(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal_offset: int) -> torch.Tensor:
    """q [M, Hq, D] over k/v [N, Hk, D]; query i sees keys 0..causal_offset + i."""
    rep = q.shape[1] // k.shape[1]
    qh = q.double().transpose(0, 1)
    kh = k.double().repeat_interleave(rep, 1).transpose(0, 1)
    vh = v.double().repeat_interleave(rep, 1).transpose(0, 1)
    s = qh @ kh.transpose(1, 2) / q.shape[-1] ** 0.5
    m, n = q.shape[0], k.shape[0]
    mask = torch.arange(n)[None, :] <= (causal_offset + torch.arange(m))[:, None]
    s = s.masked_fill(~mask, float("-inf"))
    return (torch.softmax(s, -1) @ vh).transpose(0, 1).float()


def test_store_kv_ref_skips_negative_slots() -> None:
    kc = torch.zeros(2, 4, 1, 3)
    vc = torch.zeros(2, 4, 1, 3)
    k = torch.arange(9.0).reshape(3, 1, 3)
    store_kv(k, -k, kc, vc, torch.tensor([5, -1, 0]))
    assert torch.equal(kc.view(8, 1, 3)[5], k[0]) and torch.equal(vc.view(8, 1, 3)[0], -k[2])
    assert int((kc != 0).sum()) == 5  # k[0] has one zero element, k[1] not written


def test_decode_and_prefill_refs_match_dense() -> None:
    gen = torch.Generator().manual_seed(0)
    lens, bs, hk, hq, d = [1, 9, 20], 4, 2, 4, 8
    kc, vc, tables, ks, vs = _setup(lens, bs, hk, d, gen, torch.float32)
    q = torch.randn(3, hq, d, generator=gen)
    out = paged_decode(q, kc, vc, tables, torch.tensor(lens), d**-0.5)
    for i, n in enumerate(lens):
        torch.testing.assert_close(out[i], _dense(q[i : i + 1], ks[i], vs[i], n)[0])
    new = [1, 4, 20]  # sequence 2 has no prefix; 0 and 1 have a cached prefix
    qp = torch.randn(sum(new), hq, d, generator=gen)
    qsl = torch.tensor([0, 1, 5, 25])
    outp = prefill_paged(qp, kc, vc, tables, qsl, torch.tensor(lens), d**-0.5)
    for i, n in enumerate(lens):
        s, e = int(qsl[i]), int(qsl[i + 1])
        torch.testing.assert_close(outp[s:e], _dense(qp[s:e], ks[i], vs[i], n - new[i]))


def test_store_kv_triton_matches(triton_device: str) -> None:
    gen = torch.Generator().manual_seed(1)
    k = torch.randn(7, 3, 12, generator=gen)
    v = torch.randn(7, 3, 12, generator=gen)
    slots = torch.tensor([3, 0, -1, 17, 9, 22, 5])
    want_k, want_v = torch.zeros(6, 4, 3, 12), torch.zeros(6, 4, 3, 12)
    store_kv_ref(k, v, want_k, want_v, slots)
    dev = triton_device
    got_k, got_v = torch.zeros(6, 4, 3, 12, device=dev), torch.zeros(6, 4, 3, 12, device=dev)
    store_kv_triton(k.to(dev), v.to(dev), got_k, got_v, slots.to(dev))
    assert torch.equal(got_k.cpu(), want_k) and torch.equal(got_v.cpu(), want_v)


@pytest.mark.parametrize(
    ("lens", "bs", "hk", "hq", "d", "splits"),
    [
        ([5, 33, 0, 17], 16, 2, 6, 40, None),
        ([70, 3], 8, 1, 3, 16, 3),
        ([41], 5, 2, 2, 32, 4),
    ],
)
def test_paged_decode_triton_matches(
    triton_device: str,
    lens: list[int],
    bs: int,
    hk: int,
    hq: int,
    d: int,
    splits: int | None,
) -> None:
    gen = torch.Generator().manual_seed(sum(lens) + bs)
    kc, vc, tables, _, _ = _setup(lens, bs, hk, d, gen, torch.float32)
    q = torch.randn(len(lens), hq, d, generator=gen)
    seq = torch.tensor(lens, dtype=torch.int32)
    want = paged_decode_ref(q, kc, vc, tables, seq, 0.3)
    dev = triton_device
    got = paged_decode_triton(
        q.to(dev), kc.to(dev), vc.to(dev), tables.to(dev), seq.to(dev), 0.3, splits=splits
    )
    # float32 both: the attention bound (tests/numerics.py) plus the split merge's rescalings
    bound = attention_atol(q, kc, vc, 0.3, max(lens)) + 8 * U32 * float(vc.abs().max())
    assert (got.cpu() - want).abs().max().item() <= bound


@pytest.mark.parametrize(
    ("lens", "new", "bs", "hk", "hq", "d"),
    [
        ([20, 7, 35], [20, 1, 3], 16, 2, 4, 24),
        ([9, 30], [5, 30], 8, 1, 2, 16),
    ],
)
def test_prefill_triton_matches(
    triton_device: str, lens: list[int], new: list[int], bs: int, hk: int, hq: int, d: int
) -> None:
    gen = torch.Generator().manual_seed(sum(lens) * 3 + d)
    kc, vc, tables, _, _ = _setup(lens, bs, hk, d, gen, torch.float32)
    qsl = torch.tensor([0, *torch.tensor(new).cumsum(0).tolist()], dtype=torch.int32)
    q = torch.randn(sum(new), hq, d, generator=gen)
    seq = torch.tensor(lens, dtype=torch.int32)
    want = prefill_paged_ref(q, kc, vc, tables, qsl, seq, d**-0.5)
    dev = triton_device
    got = prefill_paged_triton(
        q.to(dev), kc.to(dev), vc.to(dev), tables.to(dev), qsl.to(dev), seq.to(dev), d**-0.5
    )
    bound = attention_atol(q, kc, vc, d**-0.5, max(lens)) + 8 * U32 * float(vc.abs().max())
    assert (got.cpu() - want).abs().max().item() <= bound  # + the online softmax's rescalings


def test_attention_validation(triton_device: str) -> None:
    dev = triton_device
    kc = torch.zeros(4, 16, 2, 8, device=dev)
    q = torch.zeros(2, 3, 8, device=dev)
    tables = torch.zeros(2, 1, dtype=torch.int32, device=dev)
    seq = torch.ones(2, dtype=torch.int32, device=dev)
    with pytest.raises(ValueError, match="multiple"):
        paged_decode_triton(q, kc, kc, tables, seq, 1.0)
    with pytest.raises(ValueError, match="block_tables"):
        paged_decode_triton(torch.zeros(2, 4, 8, device=dev), kc, kc, tables[:1], seq, 1.0)
    with pytest.raises(ValueError, match="query_start_loc"):
        prefill_paged_triton(torch.zeros(2, 4, 8, device=dev), kc, kc, tables, seq, seq, 1.0)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_attention_half_gpu(cuda_device: str, dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(7)
    lens = [1000, 37, 300]  # new tokens: 200, 1, 300 (qsl below)
    kc, vc, tables, _, _ = _setup(lens, 16, 8, 128, gen, dtype)
    args = (kc.to(cuda_device), vc.to(cuda_device), tables.to(cuda_device))
    seq = torch.tensor(lens, dtype=torch.int32, device=cuda_device)
    q = torch.randn(3, 32, 128, generator=gen).to(dtype).to(cuda_device)
    torch.testing.assert_close(
        paged_decode(q, *args, seq, 128**-0.5),
        paged_decode_ref(q, *args, seq, 128**-0.5),
        atol=TOL[dtype],
        rtol=TOL[dtype],
    )
    qsl = torch.tensor([0, 200, 201, 501], dtype=torch.int32, device=cuda_device)
    qp = torch.randn(501, 32, 128, generator=gen).to(dtype).to(cuda_device)
    torch.testing.assert_close(
        prefill_paged(qp, *args, qsl, seq, 128**-0.5),
        prefill_paged_ref(qp, *args, qsl, seq, 128**-0.5),
        atol=TOL[dtype],
        rtol=TOL[dtype],
    )
