"""Batched multi-adapter LoRA: reference vs per-row matmuls; Triton vs reference."""

from __future__ import annotations

import pytest
import torch
from kiln_kernels.lora import lora_expand, lora_expand_ref, lora_ref, lora_shrink, lora_shrink_ref
from kiln_kernels.lora.sgmv import lora_expand_triton, lora_shrink_triton

from tests.numerics import reorder_rtol


def _stacks(
    ranks: list[int], h_in: int, h_out: int, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
    r_max = max(ranks)
    a = torch.zeros(len(ranks), r_max, h_in)
    b = torch.zeros(len(ranks), h_out, r_max)
    mats = []
    for i, r in enumerate(ranks):
        ai = torch.randn(r, h_in, generator=gen)
        bi = torch.randn(h_out, r, generator=gen)
        a[i, :r] = ai
        b[i, :, :r] = bi
        mats.append((ai, bi))
    return a, b, mats


def test_reference_matches_per_adapter_matmuls() -> None:
    gen = torch.Generator().manual_seed(0)
    a, b, mats = _stacks([2, 8, 5], 12, 9, gen)
    x = torch.randn(6, 12, generator=gen)
    y0 = torch.randn(6, 9, generator=gen)
    slots = torch.tensor([1, -1, 0, 2, 1, -1])
    scales = torch.tensor([0.5, 3.0, 2.0, 1.0, -1.0, 1.0])
    y = lora_ref(x, y0.clone(), a, b, slots, scales)
    for i in range(6):
        s = int(slots[i])
        want = y0[i] if s < 0 else y0[i] + scales[i] * (mats[s][1] @ (mats[s][0] @ x[i]))
        torch.testing.assert_close(y[i], want)
    t = lora_shrink(x, a, slots)
    assert t.dtype == torch.float32 and bool((t[1] == 0).all())
    assert bool((t[2, 2:] == 0).all())  # rank-2 adapter padded with zeros
    y2 = lora_expand(y0.clone(), t, b, slots, scales)
    torch.testing.assert_close(y2, y)


@pytest.mark.parametrize(
    ("rows", "ranks", "h_in", "h_out"),
    [(1, [4], 16, 16), (7, [3, 16, 8], 300, 70), (5, [1, 2], 33, 260)],
)
def test_triton_matches_reference(
    triton_device: str, rows: int, ranks: list[int], h_in: int, h_out: int
) -> None:
    gen = torch.Generator().manual_seed(rows * 100 + h_in)
    a, b, _ = _stacks(ranks, h_in, h_out, gen)
    x = torch.randn(rows, h_in, generator=gen)
    y0 = torch.randn(rows, h_out, generator=gen)
    slots = torch.randint(-1, len(ranks), (rows,), generator=gen)
    scales = torch.rand(rows, generator=gen) * 2
    want_t = lora_shrink_ref(x, a, slots)
    want_y = lora_expand_ref(y0.clone(), want_t, b, slots, scales)
    dev = triton_device
    got_t = lora_shrink_triton(x.to(dev), a.to(dev), slots.to(dev))
    # sums of h_in (shrink), then rank + 1 (expand) terms in another order: bounded relative
    # to the sums of |terms|, which the references give when run on absolute values
    mag_t = lora_shrink_ref(x.abs(), a.abs(), slots)
    assert bool(((got_t.cpu() - want_t).abs() <= reorder_rtol(h_in) * mag_t).all())
    y = y0.clone().to(dev)
    got_y = lora_expand_triton(y, got_t, b.to(dev), slots.to(dev), scales.to(dev))
    assert got_y.data_ptr() == y.data_ptr()
    mag_y = lora_expand_ref(y0.abs(), mag_t, b.abs(), slots, scales.abs())
    bound = reorder_rtol(h_in, max(ranks) + 1) * mag_y
    assert bool(((got_y.cpu() - want_y).abs() <= bound).all())


def test_validation(triton_device: str) -> None:
    dev = triton_device
    x = torch.zeros(3, 8, device=dev)
    a = torch.zeros(2, 4, 8, device=dev)
    with pytest.raises(ValueError, match="slots"):
        lora_shrink_triton(x, a, torch.zeros(2, dtype=torch.int32, device=dev))
    with pytest.raises(ValueError, match="a_stack"):
        lora_shrink_triton(x, a[:, :, :7], torch.zeros(3, dtype=torch.int32, device=dev))
    with pytest.raises(ValueError, match="t must"):
        lora_expand_triton(
            torch.zeros(3, 5, device=dev),
            torch.zeros(3, 3, device=dev),
            torch.zeros(2, 5, 4, device=dev),
            torch.zeros(3, dtype=torch.int32, device=dev),
            torch.ones(3, device=dev),
        )


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_lora_half_gpu(cuda_device: str, dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(9)
    a, b, _ = _stacks([8, 16, 64], 2048, 4096, gen)
    a, b = (a * 0.02).to(dtype).to(cuda_device), (b * 0.02).to(dtype).to(cuda_device)
    x = torch.randn(37, 2048, generator=gen).to(dtype).to(cuda_device)
    y0 = torch.randn(37, 4096, generator=gen).to(dtype).to(cuda_device)
    slots = torch.randint(-1, 3, (37,), generator=gen).to(cuda_device)
    scales = torch.rand(37, generator=gen).to(cuda_device)
    want = lora_ref(x, y0.clone(), a, b, slots, scales)
    t = lora_shrink(x, a, slots)
    got = lora_expand(y0.clone(), t, b, slots, scales)
    tol = 2e-2 if dtype == torch.bfloat16 else 3e-3
    torch.testing.assert_close(got, want, atol=tol, rtol=tol)
