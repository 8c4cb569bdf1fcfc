"""The ISA layer (kiln_kernels/cpu/common/isa.h): its self-check (common/isa_check.c hashes the
bits of every operation on the same inputs) gives one hash on every build this CPU runs, on the
aarch64 (NEON) build under qemu-user, and on the plain build; and the loader's choice of
build."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from kiln_kernels.cpu import loader

from tests.kernels.isa import replay

CHECK = loader.HERE / "common" / "isa_check.c"


def _build(cc: str, isa: str, out: Path) -> Path:
    cmd = [cc, "-O2", *loader.ISA_TARGET_FLAGS[isa], "-ffp-contract=off", str(CHECK), "-o",
           str(out), "-lm"]
    if cc == replay.AARCH64_CC:
        cmd.insert(1, "-static")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out


def _hash(cmd: list[str]) -> tuple[str, str]:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=True)
    name, digest = proc.stdout.split()
    return name, digest


@pytest.fixture(scope="module")
def native_hashes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    try:
        cc = loader.compiler()
    except loader.KernelBuildError:
        pytest.skip("no C compiler")
    d = tmp_path_factory.mktemp("isa")
    out = {}
    for isa in loader.supported_isas():
        name, digest = _hash([str(_build(cc, isa, d / f"check_{isa}"))])
        assert name == isa  # the flags pick the build they say
        out[isa] = digest
    return out


def test_every_native_build_hashes_alike(native_hashes: dict[str, str]) -> None:
    assert "plain" in native_hashes
    assert len(set(native_hashes.values())) == 1, native_hashes


@pytest.mark.skipif(not replay.cross_tools() and not Path("/usr/bin/apt-get").exists(),
                    reason="no aarch64 cross compiler / qemu-user, and no apt-get to install them")
def test_the_neon_build_hashes_alike(native_hashes: dict[str, str], tmp_path: Path) -> None:
    assert replay.cross_tools(), "make setup installs gcc-aarch64-linux-gnu and qemu-user"
    exe = _build(replay.AARCH64_CC, "neon", tmp_path / "check_neon")
    name, digest = _hash([replay.QEMU, str(exe)])
    assert name == "neon"
    assert digest == native_hashes["plain"]


def test_the_loader_picks_the_best_build_or_a_forced_lower_one() -> None:
    have = loader.supported_isas()
    assert have[-1] == "plain"
    assert loader.chosen_isa({}) == have[0]
    assert loader.chosen_isa({"KILN_CPU_ISA": "plain"}) == "plain"
    assert loader.chosen_isa({"KILN_CPU_ISA": " PLAIN "}) == "plain"
    with pytest.raises(ValueError, match="not one of"):
        loader.chosen_isa({"KILN_CPU_ISA": "sse9"})
    missing = [isa for isa in loader.ISAS if isa not in have]
    for isa in missing:
        with pytest.raises(ValueError, match="this CPU runs"):
            loader.chosen_isa({"KILN_CPU_ISA": isa})
    assert loader.isa_forced({"KILN_CPU_ISA": "avx2"}) and not loader.isa_forced({})
    flags = loader.isa_flags("avx2")
    assert "-ffp-contract=off" in flags and "-march=native" not in flags


_ISA_WORDS = re.compile(r"__AVX|__SSE|__ARM_NEON|__aarch64__|immintrin|arm_neon|\b_mm\d*_|KILN_ISA_(?:AVX|NEON)|\bv\w+q_[fsu]\d+\b")


def test_no_kernel_outside_the_layer_names_an_isa() -> None:
    """isa.h is the only C file of the kernels that names an instruction set."""
    offenders = []
    for path in sorted(loader.HERE.rglob("*.[ch]")):
        if path.name == "isa.h":
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if _ISA_WORDS.search(line):
                offenders.append(f"{path.relative_to(loader.HERE)}:{n}: {line.strip()}")
    assert offenders == []
