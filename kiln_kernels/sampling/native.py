"""The CPU sampler in C (``kiln_kernels/cpu/sampling/sample.c``): the reference's semantics (``reference.py``)
row by row, rows over the library's threads (:func:`kiln_kernels.cpu.threads`), on per-thread
scratch instead of [rows, vocab] tensors.

Penalties come as a sparse history: per row, the ids seen and their output counts (0 marks a
prompt-only id), so nothing of vocabulary size is built for them. Tokens equal the reference's
except where a top-p cumulative sum or two noisy scores tie to within the last bits of the ISA
layer's own e^x / ln x versus torch's; logprobs agree to rounding (tested). Every build of the
library (AVX-512, AVX2, NEON, plain C) gives the same tokens and logprob bits
(tests/kernels/test_isa_sampling.py).

Importing this module does not import torch: :func:`sample_rows` takes numpy logits (or torch
ones) and imports torch only for a row with min-p active; the tensor-based functions import it
when called.
"""

from __future__ import annotations

import ctypes
import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..cpu import NATIVE_FLAGS, KernelBuildError, library, threads
from ..cpu import available as native_available
from ..cpu.arrays import (
    Array,
    addr,
    aligned_empty,
    contiguous,
    dtype_name,
    on_cpu,
    shape,
    strides,
)

if TYPE_CHECKING:
    import torch

    from .params import SamplingTensors


class _Batch(ctypes.Structure):
    _fields_ = [(n, ctypes.c_int64) for n in ("B", "V", "ld")] + [
        (n, ctypes.c_void_p) for n in (
            "logits", "temperature", "top_p", "log_min_p", "repetition", "frequency", "presence",
            "top_k", "seeds", "steps", "seen_off", "seen_ids", "seen_counts", "scratch",
            "tokens", "logprobs")]


@dataclass(frozen=True)
class SeenTokens:
    """Per row ``offsets[b]:offsets[b + 1]`` of ``ids`` (int64) and ``counts`` (int32): the ids a
    row has seen, with their output counts (an id may repeat; counts add up; 0: prompt only)."""

    offsets: torch.Tensor
    ids: torch.Tensor
    counts: torch.Tensor

    @staticmethod
    def from_lists(rows: list[list[int]]) -> SeenTokens:
        """Each row's generated token ids (one count per occurrence)."""
        import torch

        offsets = [0]
        flat: list[int] = []
        for r in rows:
            flat.extend(r)
            offsets.append(len(flat))
        ids = torch.tensor(flat, dtype=torch.int64)
        return SeenTokens(torch.tensor(offsets, dtype=torch.int64), ids,
                          torch.ones(len(flat), dtype=torch.int32))

    @staticmethod
    def from_dense(p: SamplingTensors) -> SeenTokens:
        """From ``p.output_counts`` and ``p.prompt_mask``."""
        import torch

        seen = p.prompt_mask | (p.output_counts > 0)
        rows, ids = torch.nonzero(seen, as_tuple=True)
        offsets = torch.zeros(p.batch + 1, dtype=torch.int64)
        offsets[1:] = torch.cumsum(torch.bincount(rows, minlength=p.batch), 0)
        return SeenTokens(offsets, ids.to(torch.int64).cpu(),
                          p.output_counts[rows, ids].to(torch.int32).cpu())


_U64 = 1 << 64
_scratch = threading.local()  # per calling thread: the engine thread keeps one buffer


def _scratch_for(lib: ctypes.CDLL, vocab: int, n_threads: int) -> np.ndarray:
    need = int(lib.kiln_sample_scratch_floats(vocab, n_threads))
    buf: np.ndarray | None = getattr(_scratch, "buf", None)
    if buf is None or buf.size != need:
        buf = aligned_empty(need, zero=True)  # the marks must start at zero
        _scratch.buf = buf
    return buf


def sample_native(logits: torch.Tensor, p: SamplingTensors, seen: SeenTokens, *,
                  flags: tuple[str, ...] = NATIVE_FLAGS,
                  ) -> tuple[torch.Tensor, torch.Tensor] | None:
    """-> (token ids int64 [B], logprobs float32 [B]) like ``sample_reference``, or None where
    the C library is not available. ``logits``: float32 [B, V] on the CPU. The parameters come
    from ``p`` (its dense counts unused). ``flags`` pick the library build (tests: every ISA
    build, ``loader.isa_flags``; all give the same bits)."""
    import torch

    lib = sampler_library(flags)
    if lib is None:
        return None
    floats = list(zip(*(getattr(p, n).float().tolist() for n in FLOAT_COLUMNS), strict=True))
    ints = list(zip(*(getattr(p, n).tolist() for n in INT_COLUMNS), strict=True))
    out = _sample(lib, logits, floats, ints, seen.offsets.tolist(), seen.ids.tolist(),
                  seen.counts.tolist())
    return (torch.tensor(out[0], dtype=torch.int64),
            torch.tensor(out[1], dtype=torch.float32))


# The per-row parameters of sample_rows, in order (SamplingTensors' names).
FLOAT_COLUMNS = ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty",
                 "repetition_penalty")
INT_COLUMNS = ("top_k", "seeds", "steps")


def sampler_library(flags: tuple[str, ...] = NATIVE_FLAGS) -> ctypes.CDLL | None:
    """The C library the sampler runs on, for ``flags``; None where it cannot be built here. The
    engine's sampler takes it once (``sample_rows``'s ``lib``), not at every step."""
    try:
        return library(flags)
    except KernelBuildError:
        return None


def sample_rows(logits: Array, floats: Sequence[tuple[float, ...]],
                ints: Sequence[tuple[int, int, int]], seen: Sequence[Sequence[int]],
                flags: tuple[str, ...] = NATIVE_FLAGS, lib: ctypes.CDLL | None = None,
                n_threads: int | None = None) -> tuple[list[int], list[float]] | None:
    """``sample_native`` for the engine's step, without a tensor per parameter: per row the
    FLOAT_COLUMNS and INT_COLUMNS values (a seed any int: its low 64 bits, as the wire's uint64
    seeds and their int64 bit patterns alike) and the generated token ids the
    penalties count (one per occurrence). -> (token ids, logprobs), or None without the C
    library. The same numbers as ``sample_native`` (tested). ``lib``: the library
    (``sampler_library``), looked up for ``flags`` when not given; ``n_threads``: the call's
    threads (default: ``threads()``, asked at each call).

    ``logits``: float32 ``[B, V]`` with unit stride along V (else copied dense), a numpy array
    or a CPU torch tensor; the same results for either. Torch is not imported, except where a
    row has min-p active (finite, > 0): its threshold is torch's float32 ``log`` of min-p, as
    the torch reference takes it, so that the tokens match the reference bit for bit."""
    lib = lib if lib is not None else sampler_library(flags)
    if lib is None:
        return None
    offsets = [0]
    ids: list[int] = []
    for row in seen:
        ids.extend(row)
        offsets.append(len(ids))
    return _sample(lib, logits, floats, ints, offsets, ids, [1] * len(ids), n_threads)


def _sample(lib: ctypes.CDLL, logits: Array, floats: Sequence[tuple[float, ...]],
            ints: Sequence[tuple[int, ...]], offsets: list[int], ids: list[int],
            counts: list[int], n_threads: int | None = None) -> tuple[list[int], list[float]]:
    if not on_cpu(logits) or dtype_name(logits) != "float32" or len(shape(logits)) != 2:
        raise ValueError("the C sampler takes float32 [B, V] logits on the CPU")
    b, v = shape(logits)
    if b == 0:
        return [], []
    if len(floats) != b or len(ints) != b:
        raise ValueError(f"sampling parameters for {len(floats)} rows, logits for {b}")
    if len(offsets) != b + 1:
        raise ValueError(f"seen offsets must have {b + 1} entries")
    x = logits if strides(logits)[1] == 1 else contiguous(logits)
    f32, i64 = ctypes.c_float * b, ctypes.c_int64 * b
    temperature, top_p, min_p, presence, frequency, repetition = (
        f32(*col) for col in zip(*floats, strict=True))  # rounded to float32 here
    for i in range(b):  # inactive repetition penalties (non-finite, <= 0) are 1
        if not (math.isfinite(repetition[i]) and repetition[i] > 0):
            repetition[i] = 1.0
    log_min_p = f32(*([-math.inf] * b))
    active = [i for i in range(b) if math.isfinite(min_p[i]) and min_p[i] > 0]
    if active:  # torch's float32 log, as the reference takes it (so torch is imported here)
        import torch

        logs = torch.log(torch.tensor([min(min_p[i], 1.0) for i in active], dtype=torch.float32))
        for i, value in zip(active, logs.tolist(), strict=True):
            log_min_p[i] = value
    top_k_col, seed_col, step_col = zip(*ints, strict=True)
    top_k, steps = i64(*top_k_col), i64(*step_col)
    seeds = (ctypes.c_uint64 * b)(*(v % _U64 for v in seed_col))  # sample.c: as int64 bits
    seen_ids = (ctypes.c_int64 * len(ids))(*(min(max(t, 0), v - 1) for t in ids))
    seen_counts = (ctypes.c_int32 * len(counts))(*counts)
    seen_off = (ctypes.c_int64 * (b + 1))(*offsets)
    tokens, logprobs = i64(), f32()
    n_threads = threads() if n_threads is None else n_threads
    scratch = _scratch_for(lib, v, n_threads)
    arrays = {"temperature": temperature, "top_p": top_p, "log_min_p": log_min_p,
              "repetition": repetition, "frequency": frequency, "presence": presence,
              "top_k": top_k, "seeds": seeds, "steps": steps, "seen_off": seen_off,
              "seen_ids": seen_ids, "seen_counts": seen_counts, "tokens": tokens,
              "logprobs": logprobs}
    batch = _Batch(B=b, V=v, ld=strides(x)[0], logits=addr(x), scratch=addr(scratch),
                   **{k: ctypes.addressof(a) for k, a in arrays.items()})  # type: ignore[arg-type]
    lib.kiln_sample(ctypes.byref(batch), max(1, min(n_threads, b)))
    return [int(t) for t in tokens], [float(x) for x in logprobs]


def counter_uniform_native(seeds: torch.Tensor, steps: torch.Tensor, vocab: int
                           ) -> torch.Tensor | None:
    """The sampler's ``counter_uniform`` (float32 [B, vocab], the same bits) from the C library
    (``counter.c``), or None where the library cannot be built."""
    import torch

    try:
        lib = library(NATIVE_FLAGS)
    except KernelBuildError:
        return None
    s = seeds.to(device="cpu", dtype=torch.int64).contiguous()
    t = steps.to(device="cpu", dtype=torch.int64).contiguous()
    out = torch.empty((s.shape[0], vocab), dtype=torch.float32)
    lib.kiln_counter_uniform(s.data_ptr(), t.data_ptr(), s.shape[0], vocab, out.data_ptr())
    return out


__all__ = ["FLOAT_COLUMNS", "INT_COLUMNS", "SeenTokens", "counter_uniform_native",
           "native_available", "sample_native", "sample_rows", "sampler_library"]
