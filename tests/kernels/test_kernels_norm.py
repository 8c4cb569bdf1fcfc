"""RMSNorm and rotary: Triton vs reference, and the references vs first principles."""

from __future__ import annotations

import math

import pytest
import torch
from kiln_kernels.norm import apply_rotary, rms_norm, rms_norm_ref, rope_inv_freq, rotary_ref
from kiln_kernels.norm.rmsnorm import rms_norm_triton
from kiln_kernels.norm.rotary import rotary_triton

from tests.numerics import U32, gamma


def pair_norm(x: torch.Tensor) -> float:
    """An upper bound of a rotated pair's norm, whichever dimensions it pairs."""
    return math.sqrt(2) * float(x.abs().max())

# half precisions (GPU only): a few ulps of the storage type (float16 2^-11, bfloat16 2^-8)
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


def test_rms_norm_reference_by_hand() -> None:
    x = torch.tensor([[3.0, 4.0]])
    w = torch.tensor([1.0, 2.0])
    out, res = rms_norm_ref(x, w, 0.0)
    rms = (12.5) ** 0.5
    torch.testing.assert_close(out, torch.tensor([[3.0 / rms, 8.0 / rms]]))
    assert res is x
    out2, res2 = rms_norm(torch.tensor([[1.0, 2.0]]), w, 0.0, residual=torch.tensor([[2.0, 2.0]]))
    torch.testing.assert_close(res2, x)
    torch.testing.assert_close(out2, out)


@pytest.mark.parametrize("with_res", [False, True])
@pytest.mark.parametrize("shape", [(1, 7), (5, 3, 100), (13, 576)])
def test_rms_norm_triton_matches(
    triton_device: str, shape: tuple[int, ...], with_res: bool
) -> None:
    gen = torch.Generator().manual_seed(len(shape) + shape[-1])
    x = torch.randn(shape, generator=gen)
    w = torch.randn(shape[-1], generator=gen)
    r = torch.randn(shape, generator=gen) if with_res else None
    want, want_res = rms_norm_ref(x, w, 1e-6, r)
    dev = triton_device
    got, got_res = rms_norm_triton(x.to(dev), w.to(dev), 1e-6, None if r is None else r.to(dev))
    # the mean of d squares in another order (gamma_d), its rsqrt and the products (a few
    # ulps): each output element within that, relative to its own size; x + r rounds once
    rtol = 2 * (gamma(shape[-1]) + 8 * U32)
    assert bool(((got.cpu() - want).abs() <= rtol * want.abs() + 1e-30).all())
    assert torch.equal(got_res.cpu(), want_res)


def test_rms_norm_validation(triton_device: str) -> None:
    x = torch.randn(2, 8, device=triton_device)
    with pytest.raises(ValueError, match="weight"):
        rms_norm_triton(x, torch.ones(7, device=triton_device), 1e-6)
    with pytest.raises(ValueError, match="residual"):
        rms_norm_triton(x, torch.ones(8, device=triton_device), 1e-6, torch.randn(2, 9))


def test_rotary_reference_matches_complex_rotation() -> None:
    gen = torch.Generator().manual_seed(0)
    t, h, d = 5, 3, 8
    x = torch.randn(t, h, d, generator=gen, dtype=torch.float64)
    pos = torch.tensor([0, 1, 7, 100, 3])
    inv = rope_inv_freq(d, 10000.0)
    got = rotary_ref(x.float(), pos, inv)
    z = torch.complex(x[..., : d // 2], x[..., d // 2 :])
    rot = (
        z
        * torch.polar(torch.ones(t, d // 2, dtype=torch.float64), pos[:, None] * inv.double())[
            :, None, :
        ]
    )
    want = torch.cat([rot.real, rot.imag], -1).float()
    # float32 angles pos * inv round at u * |angle|, cos/sin and the products add a few ulps:
    # a rotated pair moves by that angle error times its norm
    angle = float(pos.max()) * float(inv.max())
    assert (got - want).abs().max().item() <= (2 * U32 * angle + 8 * U32) * pair_norm(x)
    torch.testing.assert_close(got[0], x[0].float())  # position 0 is the identity


def test_rotary_preserves_norm_and_relative_positions() -> None:
    gen = torch.Generator().manual_seed(2)
    q = torch.randn(1, 1, 16, generator=gen)
    k = torch.randn(1, 1, 16, generator=gen)
    inv = rope_inv_freq(16, 10000.0)

    def score(pq: int, pk: int) -> float:
        rq = rotary_ref(q, torch.tensor([pq]), inv)
        rk = rotary_ref(k, torch.tensor([pk]), inv)
        return float((rq * rk).sum())

    # equal in exact arithmetic; the angles (<= 26 rad) round at u * 26 each, the 16-term dot
    # product in any order at gamma_16, relative to |q| |k|
    bound = (4 * U32 * 26 + 2 * gamma(16) + 8 * U32) * float(q.norm() * k.norm())
    assert abs(score(10, 4) - score(26, 20)) <= bound
    assert abs(score(10, 4) - score(10, 5)) > 1000 * bound  # a real shift is far past it


@pytest.mark.parametrize(("t", "h", "d", "rot"), [(3, 5, 64, 64), (7, 2, 24, 16), (1, 9, 32, 32)])
def test_rotary_triton_matches(triton_device: str, t: int, h: int, d: int, rot: int) -> None:
    gen = torch.Generator().manual_seed(t * h + d)
    x = torch.randn(t, h, d, generator=gen)
    pos = torch.randint(0, 4096, (t,), generator=gen)
    inv = rope_inv_freq(rot, 1_000_000.0)
    want = rotary_ref(x, pos, inv)
    dev = triton_device
    got = rotary_triton(x.to(dev), pos.to(dev), inv.to(dev))
    # two float32 rotations: each one's angle within u * |angle| (<= 4096 rad) plus its cos/sin
    bound = 2 * (2 * U32 * float(pos.max()) * float(inv.max()) + 8 * U32) * pair_norm(x)
    assert (got.cpu() - want).abs().max().item() <= bound
    xi = x.clone().to(dev)
    same = rotary_triton(xi, pos.to(dev), inv.to(dev), inplace=True)
    assert same.data_ptr() == xi.data_ptr()
    assert (xi.cpu() - want).abs().max().item() <= bound


def test_apply_rotary_dispatch_gqa() -> None:
    q = torch.randn(4, 6, 16)
    k = torch.randn(4, 2, 16)
    pos = torch.arange(4)
    rq, rk = apply_rotary(q, k, pos, theta=500.0)
    inv = rope_inv_freq(16, 500.0)
    torch.testing.assert_close(rq, rotary_ref(q, pos, inv))
    torch.testing.assert_close(rk, rotary_ref(k, pos, inv))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_norm_and_rotary_half_gpu(cuda_device: str, dtype: torch.dtype) -> None:
    x = torch.randn(33, 4096, device=cuda_device, dtype=dtype)
    r = torch.randn(33, 4096, device=cuda_device, dtype=dtype)
    w = torch.randn(4096, device=cuda_device, dtype=dtype)
    got = rms_norm(x, w, 1e-6, r)
    want = rms_norm_ref(x, w, 1e-6, r)
    for g, e in zip(got, want, strict=True):
        torch.testing.assert_close(g, e, atol=TOL[dtype], rtol=TOL[dtype])
    q = torch.randn(33, 16, 128, device=cuda_device, dtype=dtype)
    pos = torch.randint(0, 30000, (33,), device=cuda_device)
    inv = rope_inv_freq(128, 1e6).to(cuda_device)
    torch.testing.assert_close(
        rotary_triton(q, pos, inv), rotary_ref(q, pos, inv), atol=TOL[dtype], rtol=TOL[dtype]
    )
