"""The C step's IEEE half conversions (kiln_kernels/cpu/common/vmath.h, exported by cpu_step.c
for this test), used by a float16 KV cache, against torch's: float32 -> half rounds to nearest
even, half -> float32 is exact; both the scalar functions and the vector store (AVX-512 F16C
where built)."""

from __future__ import annotations

import ctypes

import pytest
import torch
from kiln_kernels.cpu import available as kernels_available
from kiln_kernels.cpu.loader import NATIVE_FLAGS, PORTABLE_FLAGS, load

pytestmark = pytest.mark.skipif(not kernels_available(), reason="no C compiler for the kernels")


def values() -> torch.Tensor:
    gen = torch.Generator().manual_seed(3)
    special = torch.tensor([0.0, -0.0, 1.0, -1.0, 65504.0, 65519.0, 65520.0, 1e6, -1e6,
                            6.1035156e-05, 6.0e-05, 5.96e-08, 2.98e-08, 2.99e-08, 1e-10, 1e-40,
                            float("inf"), float("-inf"), 1.0 + 2**-11, 1.0 + 3 * 2**-11,
                            2049.0, 2051.0, 0.1, 1 / 3])
    halves = torch.arange(0, 1 << 16, dtype=torch.int32).to(torch.int16).view(torch.float16)
    finite = halves[torch.isfinite(halves)].to(torch.float32)
    ties = (finite[:-1] + finite[1:]) / 2  # exactly halfway between neighbours (mostly)
    noise = torch.randn(20000, generator=gen) * torch.logspace(-9, 5, 20000)
    return torch.cat([special, finite, ties[torch.isfinite(ties)], noise])


@pytest.mark.parametrize("flags", [NATIVE_FLAGS, PORTABLE_FLAGS], ids=["native", "portable"])
def test_store_and_widen_match_torch(flags: tuple[str, ...]) -> None:
    lib = load(flags)
    lib.kiln_kv_store_row.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int]
    lib.kiln_kv_store_row.restype = None
    lib.kiln_kv_half_value.argtypes = [ctypes.c_uint16]
    lib.kiln_kv_half_value.restype = ctypes.c_float
    x = values().contiguous()
    n = x.numel() - 5  # a tail past the last 16-lane vector
    out = torch.zeros(n, dtype=torch.float16)
    lib.kiln_kv_store_row(out.data_ptr(), x.data_ptr(), n, 1)
    assert torch.equal(out.view(torch.int16), x[:n].to(torch.float16).view(torch.int16))
    bits = torch.arange(0, 1 << 16, 97, dtype=torch.int32).to(torch.int16)
    want = bits.view(torch.float16).to(torch.float32)
    got = torch.tensor([lib.kiln_kv_half_value(int(b) & 0xFFFF) for b in bits.tolist()])
    finite = torch.isfinite(want)
    assert torch.equal(got[finite], want[finite])
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    assert torch.equal(got[torch.isinf(want)], want[torch.isinf(want)])
