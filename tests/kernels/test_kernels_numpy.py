"""The CPU kernels' bindings without torch: importing them leaves torch unimported, they take
numpy arrays where they took torch tensors, and they give the same results for either (the C
step: tests/kernels/test_kernels_numpy_step.py)."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch
from kiln_kernels.cpu import available, threads
from kiln_kernels.cpu.arrays import addr, dtype_name, strides
from kiln_kernels.cpu.loader import physical_cores
from kiln_kernels.grammar import apply_token_bitmask_ref
from kiln_kernels.grammar.native import apply_token_bitmask_native
from kiln_kernels.quant import MAX_PARTS, PackedConcat, PackedWeight
from kiln_kernels.sampling.native import sample_rows

NO_TORCH_MODULES = ("kiln_kernels.cpu", "kiln_kernels.cpu.cpu_step", "kiln_kernels.quant",
                    "kiln_kernels.sampling.native", "kiln_kernels.grammar.native")

needs_c = pytest.mark.skipif(not available(), reason="no C compiler for the kernels")


def _run(code: str, **env: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={**os.environ, **env})
    return out.stdout.strip()


def test_the_bindings_import_without_torch() -> None:
    code = ("import importlib, sys\n"
            f"for m in {NO_TORCH_MODULES!r}: importlib.import_module(m)\n"
            "from kiln_kernels.quant import (FORMAT_IDS, MAX_PARTS, QK, TILE_BYTES, Packed,\n"
            "                                PackedConcat, PackedWeight)\n"
            "print('torch' in sys.modules)\n")
    assert _run(code) == "False"


def test_numpy_buffers_run_the_c_sampler_and_mask_without_torch() -> None:
    """Sampling (no min-p), the grammar mask, thread count and packed-weight shapes on numpy:
    torch stays unimported; a min-p row then imports it (its float32 log is torch's)."""
    code = (
        "import sys\n"
        "import numpy as np\n"
        "from kiln_kernels.cpu import available, threads\n"
        "from kiln_kernels.grammar.native import apply_token_bitmask_native\n"
        "from kiln_kernels.quant import PackedWeight\n"
        "from kiln_kernels.sampling.native import sample_rows\n"
        "assert threads() >= 1\n"
        "w = PackedWeight.cat([PackedWeight('q8', np.zeros((2, 3, 144), np.uint8))] * 2)\n"
        "assert (w.out_features, w.in_features, w.nbytes) == (16, 96, 2 * 2 * 3 * 144)\n"
        "logits = np.random.default_rng(0).standard_normal((2, 64)).astype(np.float32)\n"
        "if available():\n"
        "    mask = np.array([[5, 0]], dtype=np.int32)\n"
        "    assert apply_token_bitmask_native(logits, mask, [1])\n"
        "    assert np.isinf(logits[1]).sum() == 62\n"
        "    got = sample_rows(logits, [(0.0, 1.0, 0.0, 0.0, 0.0, 1.0),\n"
        "                               (1.0, 0.9, 0.0, 0.5, 0.0, 1.1)],\n"
        "                      [(0, 1, 0), (5, 7, 3)], [[1], [2, 2]])\n"
        "    assert got is not None and got[0][0] == int(np.argmax(logits[0]))\n"
        "print('torch' in sys.modules)\n"
        "if available():\n"
        "    sample_rows(logits[:1], [(1.0, 1.0, 0.1, 0.0, 0.0, 1.0)], [(0, 1, 0)], [[]])\n"
        "    print('torch' in sys.modules)\n")
    assert _run(code).split() == (["False", "True"] if available() else ["False"])


@pytest.mark.parametrize(("package", "names"), [
    ("kiln_kernels.quant", ("dequantize_q4", "dequantize_q8", "dequantize_tiles", "gemm_ref",
                            "tile_rows", "untile")),
    ("kiln_kernels.sampling", ("SamplingTensors", "apply_penalties", "counter_uniform", "filter_threshold", "greedy_rows",
                               "sample_reference")),
    ("kiln_kernels.grammar", ("apply_token_bitmask_ref", "check_bitmask_args")),
])
def test_the_lazy_exports_resolve(package: str, names: tuple[str, ...]) -> None:
    """Each lazily exported name is the function of its module, also after its module's
    import."""
    pkg = importlib.import_module(package)
    importlib.import_module("kiln_kernels.sampling.counter_hash")
    for name in names:
        assert name in pkg.__all__
        obj = getattr(pkg, name)
        assert callable(obj) and not isinstance(obj, type(sys)), name
    with pytest.raises(AttributeError):
        _ = pkg.no_such_name


def test_threads_is_torchs_thread_count() -> None:
    assert threads() == torch.get_num_threads() >= 1
    assert physical_cores() >= 1


def test_threads_without_torch_follow_the_environment() -> None:
    code = ("import sys\n"
            "from kiln_kernels.cpu import threads\n"
            "print(threads(), 'torch' in sys.modules)\n")
    assert _run(code, OMP_NUM_THREADS="3") == "3 False"
    assert _run(code, OMP_NUM_THREADS="3", MKL_NUM_THREADS="2") == "2 False"
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env=env).stdout.split()
    assert out == [str(physical_cores()), "False"]  # torch's default: the physical cores


def test_array_helpers_agree_on_numpy_and_torch() -> None:
    t = torch.zeros(4, 3, 5, 2).permute(0, 2, 1, 3)
    a = np.zeros((4, 3, 5, 2), dtype=np.float32).transpose(0, 2, 1, 3)
    assert strides(a) == strides(t) == tuple(t.stride())
    assert dtype_name(a) == dtype_name(t) == dtype_name(torch.float32) == "float32"
    assert dtype_name(np.float16) == dtype_name(torch.float16) == "float16"
    assert addr(a) == a.ctypes.data and addr(t) == t.data_ptr() and addr(None) == 0


def test_packed_weights_over_numpy_tiles() -> None:
    """Shapes, bytes and the merge past MAX_PARTS parts (numpy.concatenate) without torch; the
    products and dequantizing take numpy tiles too, through torch."""
    rng = np.random.default_rng(1)
    parts = [PackedWeight("q8" if i % 2 else "f32", rng.integers(
        0, 255, (2, 1, 144 if i % 2 else 512), dtype=np.uint8)) for i in range(MAX_PARTS)]
    assert isinstance(PackedWeight.cat([*parts]), PackedConcat)
    extra = PackedWeight("q8", rng.integers(0, 255, (1, 1, 144), dtype=np.uint8))
    merged = PackedWeight.cat([*parts, extra])  # the last two q8 parts become one buffer
    assert isinstance(merged, PackedConcat) and len(merged.parts) == MAX_PARTS
    last = merged.parts[-1]
    assert isinstance(last.tiles, np.ndarray) and last.out_features == 12
    assert np.array_equal(last.tiles, np.concatenate([parts[-1].tiles, extra.tiles]))
    assert merged.out_features == 4 * (2 * MAX_PARTS + 1) and merged.in_features == 32
    f32 = parts[0]
    f32.tiles.view(np.float32).reshape(-1)[:] = rng.standard_normal(f32.tiles.size // 4).astype(np.float32)
    as_torch = PackedWeight("f32", torch.from_numpy(f32.tiles.copy()))
    assert torch.equal(f32.dequantize(), as_torch.dequantize())
    read_only = f32.tiles.copy()
    read_only.flags.writeable = False  # as tiles over a mapped file may be: read, never written
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert torch.equal(PackedWeight("f32", read_only).dequantize(), as_torch.dequantize())
        if available():
            x = torch.randn(3, 32)
            assert torch.equal(PackedWeight("f32", read_only).matmul(x), as_torch.matmul(x))
            assert torch.equal(f32.matmul(x), as_torch.matmul(x))


@needs_c
def test_sample_rows_on_numpy_logits_equals_torch() -> None:
    """Greedy rows, temperature with top-k / top-p and seeds, penalties over seen tokens, min-p:
    the same tokens and logprobs for numpy logits as for the same torch logits."""
    rng = np.random.default_rng(3)
    v = 2001
    logits = (rng.standard_normal((6, v)) * 2).astype(np.float32)
    floats = [(0.0, 1.0, 0.0, 0.0, 0.0, 1.0), (0.0, 1.0, 0.0, 1.5, 0.3, 1.2),
              (0.8, 0.9, 0.0, 0.0, 0.0, 1.0), (1.0, 0.95, 0.0, 0.5, 0.1, 1.1),
              (1.2, 1.0, 0.05, 0.0, 0.0, 1.0), (0.7, 0.5, 0.0, -0.5, 0.2, 0.9)]
    ints = [(0, 1, 0), (0, 2, 5), (40, 3, 1), (0, 2**64 - 5, 7), (100, 11, 2), (3, -9, 4)]
    seen = [[], [int(logits[1].argmax()), 5, 5], [], [1, 2, 3] * 4, [9], [int(logits[5].argmax())]]
    want = sample_rows(torch.from_numpy(logits.copy()), floats, ints, seen)
    got = sample_rows(logits, floats, ints, seen)
    assert want is not None and got == want
    no_min_p = [(*f[:2], 0.0, *f[3:]) for f in floats]
    assert sample_rows(logits, no_min_p, ints, seen) == sample_rows(
        torch.from_numpy(logits), no_min_p, ints, seen)
    strided = np.repeat(logits, 2, axis=0)[::2]  # rows apart in memory, unit stride along V
    assert sample_rows(strided, floats, ints, seen) == want
    assert sample_rows(np.asfortranarray(logits), floats, ints, seen) == want  # copied dense


@needs_c
@pytest.mark.parametrize(("vocab", "words"), [(70, 3), (1000, 32)])
def test_the_grammar_mask_on_numpy_equals_torch(vocab: int, words: int) -> None:
    rng = np.random.default_rng(vocab)
    logits = rng.standard_normal((5, vocab)).astype(np.float32)
    bitmask = rng.integers(-(2**31), 2**31 - 1, (3, words), dtype=np.int64).astype(np.int32)
    bitmask[:, 0] = -1
    rows = [4, 0, 2]
    want = torch.from_numpy(logits.copy())
    assert apply_token_bitmask_native(want, torch.from_numpy(bitmask), rows)
    got = logits.copy()
    assert apply_token_bitmask_native(got, bitmask, rows)
    assert np.array_equal(got, want.numpy())
    ref = torch.from_numpy(logits.copy())
    apply_token_bitmask_ref(ref, torch.from_numpy(bitmask), torch.tensor(rows))
    assert np.array_equal(got, ref.numpy())
    mixed = logits.copy()  # numpy logits, a torch bitmask
    assert apply_token_bitmask_native(mixed, torch.from_numpy(bitmask), rows)
    assert np.array_equal(mixed, got)
    assert not apply_token_bitmask_native(logits.astype(np.float64), bitmask, rows)
    assert not apply_token_bitmask_native(logits, bitmask.astype(np.int64), rows)


def test_aligned_empty_sits_on_a_cache_line() -> None:
    from kiln_kernels.cpu.arrays import ALIGN, aligned_empty

    for shape in (1, 7, (3, 5), (8, 49152)):
        for _ in range(4):  # numpy's own allocations are 16-byte aligned: several addresses
            a = aligned_empty(shape)
            assert a.ctypes.data % ALIGN == 0 and a.dtype == np.float32
            assert a.shape == ((shape,) if isinstance(shape, int) else shape)
            assert a.flags.c_contiguous and a.flags.writeable
    z = aligned_empty((4, 9), "int64", zero=True)
    assert z.ctypes.data % ALIGN == 0 and z.dtype == np.int64 and not z.any()
