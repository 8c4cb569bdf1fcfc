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


def _buffers(w: Any, dtype: str, blocks: int = BLOCKS) -> list[np.ndarray]:
    """K then V per layer: contiguous [blocks, kv_heads, block, dim] (head-major)."""
    return [np.zeros((blocks, w.kv_heads, BLOCK, w.head_dim), dtype=dtype)
            for _ in range(2 * len(w.layers))]


def _run(w: Any, plan: list[dict[str, np.ndarray]], dtype: str,
         flags: tuple[str, ...], blocks: int = BLOCKS) -> list[np.ndarray]:
    bufs = _buffers(w, dtype, blocks)
    views = [b.transpose(0, 2, 1, 3) for b in bufs]
    prog = w.bind(views[0::2], views[1::2], flags=flags)
    out = []
    for s in plan:
        x = s["x"].copy() if "x" in s else None
        out.append(prog.step(x, s["ctx_lens"], s["block_tables"], s["slots"], s["logit_rows"],
                             seq_first=s["seq_first"], ids=s.get("ids"), n_threads=THREADS))
    return out


def _strides(w: Any, dtype: str, blocks: int = BLOCKS) -> tuple[int, int, int]:
    from kiln_kernels.cpu.cpu_step import cache_strides
    return cache_strides(_buffers(w, dtype, blocks)[0].transpose(0, 2, 1, 3))


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


FORMATS = ("Q4_0", "Q4_1", "Q8_0", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
           "IQ4_NL", "IQ4_XS", "F16", "BF16", "F32")


def every_format_model(kv_heads: int = 2, head_dim: int = 64) -> Any:
    """A random 4-layer model whose projections, head and embedding hold every GGUF format the
    products read (hidden 256: the K-quants' blocks), q/k/v fused from parts of three formats."""
    from kiln_kernels.cpu.cpu_step import CpuStepLayer, CpuStepWeights
    from kiln_kernels.quant import PackedConcat, pack_ggml
    from kiln_kernels.testing import random_raw

    hidden, inter, heads, vocab = 256, 512, 4, 260
    rng = np.random.default_rng(5)
    counter = iter(range(1000))

    def packed(fmt: str, n: int, k: int) -> Any:
        return pack_ggml(random_raw(fmt, n, k, seed=next(counter), amp=0.08), fmt)

    def norm(n: int) -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    fmt = iter(FORMATS * 4)
    layers = []
    for _ in range(4):
        qkv = PackedConcat((packed(next(fmt), heads * head_dim, hidden),
                            packed(next(fmt), kv_heads * head_dim, hidden),
                            packed(next(fmt), kv_heads * head_dim, hidden)))
        layers.append(CpuStepLayer(
            qkv=qkv, o=packed(next(fmt), hidden, heads * head_dim),
            gate_up=packed(next(fmt), 2 * inter, hidden), down=packed(next(fmt), hidden, inter),
            in_norm=norm(hidden), post_norm=norm(hidden), q_norm=norm(head_dim),
            k_norm=norm(head_dim)))
    inv_freq = (10000.0 ** (-np.arange(0, head_dim, 2) / head_dim)).astype(np.float32)
    return CpuStepWeights(hidden=hidden, inter=inter, heads=heads, kv_heads=kv_heads,
                          head_dim=head_dim, eps=1e-6, layers=tuple(layers),
                          final_norm=norm(hidden), head=packed("Q6_K", vocab, hidden),
                          inv_freq=inv_freq, embed=packed("Q8_0", vocab, hidden))


LONG_TABLE = 40  # blocks per sequence: 640 positions
LONG_BLOCKS = 2 * LONG_TABLE


def _every_format_plan() -> list[dict[str, np.ndarray]]:
    """Chunks of a 530-token prompt (past one attention part, ATTEND_PART = 512, so its rows'
    parts merge) beside a short one, then a decode step of both: the engine's steps, each row
    attending to its own sequence."""
    seqs = [[(7 * i) % 250 + 1 for i in range(530)], [100, 3, 4]]
    out: list[dict[str, np.ndarray]] = []
    done = [0, 0]
    for chunk in (128, 128, 128, 128, 18, 1):
        ids: list[int] = []
        lens: list[int] = []
        tables: list[list[int]] = []
        slots: list[int] = []
        first: list[int] = []
        last: list[int] = []
        for i, seq in enumerate(seqs):
            take = seq[done[i]:done[i] + chunk] if done[i] < len(seq) else []
            if chunk == 1:
                take = [9]
            if not take:
                continue
            table = [i * LONG_TABLE + b for b in range(LONG_TABLE)]
            head = len(ids)
            for j, tok in enumerate(take):
                pos = done[i] + j
                ids.append(tok)
                lens.append(pos + 1)
                tables.append(table)
                slots.append(table[pos // BLOCK] * BLOCK + pos % BLOCK)
                first.append(head)
            last.append(len(ids) - 1)
            done[i] += len(take)
        out.append({"ids": np.array(ids, np.int64), "ctx_lens": np.array(lens, np.int64),
                    "block_tables": np.array(tables, np.int32),
                    "slots": np.array(slots, np.int64), "seq_first": np.array(first, np.int64),
                    "logit_rows": np.array(last, np.int64)})
    return out


@pytest.mark.slow
def test_every_format_gives_the_same_logits_on_every_native_build() -> None:
    w = every_format_model()
    plan = _every_format_plan()
    runs = {isa: _run(w, plan, "float32", loader.isa_flags(isa), LONG_BLOCKS)
            for isa in loader.supported_isas()}
    want = runs["plain"]
    assert all(np.isfinite(x).all() for x in want)
    for isa, got in runs.items():
        for g, t in zip(got, want, strict=True):
            assert np.array_equal(g.view(np.uint32), t.view(np.uint32)), isa


@pytest.mark.slow
@pytest.mark.skipif(not _cross_available() and shutil.which("apt-get") is None,
                    reason="no aarch64 cross compiler / qemu-user, and no apt-get to install them")
def test_every_format_gives_the_same_logits_on_aarch64(tmp_path: Path) -> None:
    assert _cross_available(), "make setup installs gcc-aarch64-linux-gnu and qemu-user"
    w = every_format_model()
    plan = _every_format_plan()
    f = replay.replay_file(w, _buffers(w, "float16", LONG_BLOCKS),
                           _strides(w, "float16", LONG_BLOCKS), BLOCK, plan, THREADS)
    f.write(tmp_path / "steps.bin")
    want = b"".join(x.tobytes() for x in _run(w, plan, "float16", loader.isa_flags("plain"),
                                              LONG_BLOCKS))
    driver = replay.build_driver(tmp_path / "replay_arm", cc=replay.AARCH64_CC,
                                 flags=loader.ISA_TARGET_FLAGS["neon"])
    got = replay.run_driver(driver, tmp_path / "steps.bin", tmp_path / "out.bin", qemu=True)
    assert got == want


@pytest.mark.slow
def test_the_default_models_step_is_the_same_on_every_native_build() -> None:
    """SmolLM2-135M's own Q4_1 / Q8_0 weights: a 20-token prefill chunk and a decode step."""
    from tests.tiny_models import default_model

    step = default_model().model.cpu_step
    assert step is not None
    w = step.weights
    prompt = [(37 * i) % 4000 + 10 for i in range(20)]
    plan = steps([prompt], [[42]])
    runs = {isa: _run(w, plan, "float32", loader.isa_flags(isa))
            for isa in loader.supported_isas()}
    want = runs["plain"]
    assert all(np.isfinite(x).all() for x in want)
    for isa, got in runs.items():
        for g, t in zip(got, want, strict=True):
            assert np.array_equal(g.view(np.uint32), t.view(np.uint32)), isa
