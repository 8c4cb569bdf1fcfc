"""The CPU sampler in C (``kernels/quant/sample.c``): the reference's semantics (``reference.py``)
row by row, rows over torch's threads, on per-thread scratch instead of [rows, vocab] tensors.

Penalties come as a sparse history: per row, the ids seen and their output counts (0 marks a
prompt-only id), so nothing of vocabulary size is built for them. Tokens equal the reference's
except where a top-p cumulative sum or two noisy scores tie to within the last bits of libm
versus torch transcendentals; logprobs agree to rounding (tested).
"""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass

import torch

from ..quant import NATIVE_FLAGS, KernelBuildError
from ..quant import _library as _quant_library
from ..quant import kernels_available as native_available
from .params import SamplingTensors
from .reference import active_repetition


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
        seen = p.prompt_mask | (p.output_counts > 0)
        rows, ids = torch.nonzero(seen, as_tuple=True)
        offsets = torch.zeros(p.batch + 1, dtype=torch.int64)
        offsets[1:] = torch.cumsum(torch.bincount(rows, minlength=p.batch), 0)
        return SeenTokens(offsets, ids.to(torch.int64).cpu(),
                          p.output_counts[rows, ids].to(torch.int32).cpu())


_scratch = threading.local()  # per calling thread: the engine thread keeps one buffer


def _scratch_for(lib: ctypes.CDLL, vocab: int, threads: int) -> torch.Tensor:
    need = int(lib.kiln_sample_scratch_floats(vocab, threads))
    buf: torch.Tensor | None = getattr(_scratch, "buf", None)
    if buf is None or buf.numel() != need:
        buf = torch.zeros(need, dtype=torch.float32)  # the marks must start at zero
        _scratch.buf = buf
    return buf


def sample_native(logits: torch.Tensor, p: SamplingTensors | None, seen: SeenTokens, *,
                  columns: dict[str, torch.Tensor] | None = None,
                  flags: tuple[str, ...] = NATIVE_FLAGS,
                  ) -> tuple[torch.Tensor, torch.Tensor] | None:
    """-> (token ids int64 [B], logprobs float32 [B]) like ``sample_reference``, or None where
    the C library is not available. ``logits``: float32 [B, V] on the CPU. The parameters come
    from ``p`` (its dense counts unused) or ``columns`` (the same names, [B] each). ``flags``
    pick the library build (tests: the portable one, without AVX-512)."""
    if logits.device.type != "cpu" or logits.dtype != torch.float32 or logits.dim() != 2:
        raise ValueError("sample_native takes float32 [B, V] logits on the CPU")
    try:
        lib = _quant_library(flags)
    except KernelBuildError:
        return None
    b, v = logits.shape
    cols = columns if columns is not None else _columns(p)
    x = logits if logits.stride(1) == 1 else logits.contiguous()
    mp, rep = cols["min_p"].float(), cols["repetition_penalty"].float()
    log_min_p = torch.where(torch.isfinite(mp) & (mp > 0), torch.log(mp.clamp(min=1e-45)),
                            torch.full_like(mp, float("-inf")))
    keep = {
        "temperature": cols["temperature"].float().contiguous(),
        "top_p": cols["top_p"].float().contiguous(),
        "log_min_p": log_min_p.float().contiguous(),
        "repetition": active_repetition(rep).contiguous(),
        "frequency": cols["frequency_penalty"].float().contiguous(),
        "presence": cols["presence_penalty"].float().contiguous(),
        "top_k": cols["top_k"].to(torch.int64).contiguous(),
        "seeds": cols["seeds"].to(torch.int64).contiguous(),
        "steps": cols["steps"].to(torch.int64).contiguous(),
        "seen_off": seen.offsets.to(torch.int64).contiguous(),
        "seen_ids": seen.ids.to(torch.int64).clamp(0, v - 1).contiguous(),
        "seen_counts": seen.counts.to(torch.int32).contiguous(),
    }
    if int(keep["seen_off"].numel()) != b + 1:
        raise ValueError(f"seen offsets must have {b + 1} entries")
    threads = max(1, min(torch.get_num_threads(), b))
    scratch = _scratch_for(lib, v, torch.get_num_threads())
    tokens = torch.empty(b, dtype=torch.int64)
    logprobs = torch.empty(b, dtype=torch.float32)
    batch = _Batch(B=b, V=v, ld=x.stride(0), logits=x.data_ptr(), scratch=scratch.data_ptr(),
                   tokens=tokens.data_ptr(), logprobs=logprobs.data_ptr(),
                   **{k: t.data_ptr() for k, t in keep.items()})
    lib.kiln_sample(ctypes.byref(batch), threads)
    return tokens, logprobs


def _columns(p: SamplingTensors | None) -> dict[str, torch.Tensor]:
    if p is None:
        raise ValueError("sample_native needs SamplingTensors or columns")
    return {"temperature": p.temperature, "top_p": p.top_p, "min_p": p.min_p,
            "repetition_penalty": p.repetition_penalty, "frequency_penalty": p.frequency_penalty,
            "presence_penalty": p.presence_penalty, "top_k": p.top_k, "seeds": p.seeds,
            "steps": p.steps}


__all__ = ["SeenTokens", "native_available", "sample_native"]
