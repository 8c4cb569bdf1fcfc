"""The C kernels must build wherever a C compiler exists: the quant, fused-decode and sampler
tests skip without the library, so a source that stopped compiling would otherwise only show up
as skips. Fails with the compiler's message."""

from __future__ import annotations

import pytest
from kiln_kernels.quant import build


def _compiler() -> str | None:
    try:
        return build.compiler()
    except build.KernelBuildError:
        return None


@pytest.mark.parametrize("flags", [build.NATIVE_FLAGS, build.PORTABLE_FLAGS],
                         ids=["native", "portable"])
def test_the_kernels_build_where_a_compiler_exists(flags: tuple[str, ...]) -> None:
    if _compiler() is None:
        pytest.skip("no C compiler on this machine: Kiln falls back to the torch path")
    lib = build.load(flags)  # raises KernelBuildError with the compiler output on failure
    assert lib.kiln_quant_simd() in (0, 512)
