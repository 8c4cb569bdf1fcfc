"""The same bits on every ISA, for the whole C step: the logits of a prefill step and a decode
step of tiny llama / qwen2 / qwen3 models (Q4_1 projections, Q8_0 head; float32 and float16 KV
caches) from every build of the kernels this CPU runs, and from the aarch64 (NEON) build run
under qemu-user through tests/kernels/isa/step_replay.c, are equal bit for bit."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from kiln_kernels.cpu import available, loader

from tests.kernels.isa import replay
from tests.kernels.test_kernels_numpy_step import BLOCKS, numpy_weights, steps
from tests.model.test_cpu_step import BLOCK, quantized_tiny

pytestmark = pytest.mark.skipif(not available(), reason="no C compiler for the kernels")

CASES = [("llama", True, "float32"), ("qwen2", False, "float32"), ("qwen3", False, "float16")]
THREADS = 2


def _case(arch: str, tie: bool) -> tuple[Any, list[dict[str, np.ndarray]]]:
    model = quantized_tiny(arch, tie)
    assert model.cpu_step is not None
    w = numpy_weights(model.cpu_step.weights)
    rng = np.random.default_rng(11)
    plan = steps([[5, 9, 33, 7, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14], [100, 3]],
                 [[8], [2]])
    if w.embed is None:  # embeddings given
        for s in plan:
            s["x"] = rng.standard_normal((len(s.pop("ids")), w.hidden)).astype(np.float32)
    return w, plan


def _buffers(w: Any, dtype: str) -> list[np.ndarray]:
    """K then V per layer: contiguous [blocks, kv_heads, block, dim] (head-major)."""
    return [np.zeros((BLOCKS, w.kv_heads, BLOCK, w.head_dim), dtype=dtype)
            for _ in range(2 * len(w.layers))]


def _run(w: Any, plan: list[dict[str, np.ndarray]], dtype: str,
         flags: tuple[str, ...]) -> list[np.ndarray]:
    bufs = _buffers(w, dtype)
    views = [b.transpose(0, 2, 1, 3) for b in bufs]
    prog = w.bind(views[0::2], views[1::2], flags=flags)
    out = []
    for s in plan:
        x = s["x"].copy() if "x" in s else None
        out.append(prog.step(x, s["ctx_lens"], s["block_tables"], s["slots"], s["logit_rows"],
                             seq_first=s["seq_first"], ids=s.get("ids"), n_threads=THREADS))
    return out


def _strides(w: Any, dtype: str) -> tuple[int, int, int]:
    from kiln_kernels.cpu.cpu_step import cache_strides
    return cache_strides(_buffers(w, dtype)[0].transpose(0, 2, 1, 3))


@pytest.mark.parametrize(("arch", "tie", "dtype"), CASES)
def test_every_native_build_gives_the_same_logits(arch: str, tie: bool, dtype: str) -> None:
    w, plan = _case(arch, tie)
    runs = {isa: _run(w, plan, dtype, loader.isa_flags(isa)) for isa in loader.supported_isas()}
    want = runs["plain"]
    assert all(np.isfinite(x).all() for x in want)
    for isa, got in runs.items():
        for g, t in zip(got, want, strict=True):
            assert np.array_equal(g.view(np.uint32), t.view(np.uint32)), isa


def _cross_available() -> bool:
    """The aarch64 compiler and qemu-user, which `make setup` installs where apt-get can."""
    return replay.cross_tools()


@pytest.mark.slow
@pytest.mark.skipif(not _cross_available() and shutil.which("apt-get") is None,
                    reason="no aarch64 cross compiler / qemu-user, and no apt-get to install them")
@pytest.mark.parametrize(("arch", "tie", "dtype"), CASES)
def test_the_aarch64_build_gives_the_same_logits(arch: str, tie: bool, dtype: str,
                                                 tmp_path: Path) -> None:
    assert _cross_available(), "make setup installs gcc-aarch64-linux-gnu and qemu-user"
    w, plan = _case(arch, tie)
    f = replay.replay_file(w, _buffers(w, dtype), _strides(w, dtype), BLOCK, plan, THREADS)
    f.write(tmp_path / "steps.bin")
    want = b"".join(x.tobytes() for x in _run(w, plan, dtype, loader.isa_flags("plain")))
    driver = replay.build_driver(tmp_path / "replay_arm", cc=replay.AARCH64_CC,
                                 flags=loader.ISA_TARGET_FLAGS["neon"])
    got = replay.run_driver(driver, tmp_path / "steps.bin", tmp_path / "out.bin", qemu=True)
    assert len(got) == len(want)
    assert got == want


def test_the_replay_driver_replays_a_native_build(tmp_path: Path) -> None:
    """The driver itself: built for this CPU's best ISA, it gives the loaded library's logits."""
    w, plan = _case("qwen2", False)
    f = replay.replay_file(w, _buffers(w, "float32"), _strides(w, "float32"), BLOCK, plan,
                           THREADS)
    f.write(tmp_path / "steps.bin")
    isa = loader.chosen_isa()
    want = b"".join(x.tobytes() for x in _run(w, plan, "float32", loader.isa_flags(isa)))
    driver = replay.build_driver(tmp_path / "replay", cc=loader.compiler(),
                                 flags=loader.ISA_TARGET_FLAGS[isa])
    assert replay.run_driver(driver, tmp_path / "steps.bin", tmp_path / "out.bin",
                             qemu=False) == want
