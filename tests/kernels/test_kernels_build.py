"""The C kernels must build wherever a C compiler exists: the quant, CPU-step and sampler
tests skip without the library, so a source that stopped compiling would otherwise only show up
as skips. Fails with the compiler's message."""

from __future__ import annotations

import subprocess

import pytest
from kiln_kernels.cpu import loader as build


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
    # the native build is the ISA layer's build the loader chose (common/isa.h); portable plain C
    isa = build.chosen_isa() if flags == build.NATIVE_FLAGS else "plain"
    assert lib.kiln_isa_name().decode() == isa
    # the products' register width in bits
    assert lib.kiln_quant_simd() == {"avx512": 512, "avx2": 256, "neon": 128, "plain": 0}[isa]


def test_the_attention_kernel_keeps_its_prefetches() -> None:
    """GCC deletes a loop of _mm_prefetch calls as dead code (it once dropped every prefetch of
    attention.c unnoticed): the AVX-512 build's assembly must still hold them."""
    cc = _compiler()
    if cc is None:
        pytest.skip("no C compiler on this machine")
    if build.chosen_isa() != "avx512":
        pytest.skip("the AVX-512 attention path is not built on this CPU")
    flags = [f for f in build.NATIVE_FLAGS if f not in ("-shared", "-fPIC")]
    source = build.HERE / "step" / "attention.c"
    includes = [f"-I{d}" for d in build.INCLUDE_DIRS]
    proc = subprocess.run([cc, *flags, *includes, "-S", "-o", "-", str(source)],
                          capture_output=True, text=True, timeout=120, check=True)
    assert proc.stdout.count("prefetcht0") >= 4
