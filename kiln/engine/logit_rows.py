"""What the runner does to a step's logit rows once the model has run: find the rows that are not
finite, apply the grammar masks, the logits processors, and sample. One protocol, two holders of
the arrays:

- :class:`CLogitRows`: numpy arrays and the C kernels (the token mask, ``sample_rows``): a plain
  step of the C model imports no torch;
- ``kiln.engine.torch_step.TorchLogitRows``: torch tensors and the torch ``Sampler`` with what
  only it has (logprobs' log-softmax, the logits processors), on the CPU or a GPU.

``kiln.engine.runner.Runner`` picks one per step and runs the same skeleton over it, so a row's
path from logits to token is written once. Imports no torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy
from kiln_kernels.grammar.native import apply_token_bitmask_native
from kiln_kernels.sampling.native import sample_rows

from kiln.engine.errors import EngineError
from kiln.engine.outputs import SampledToken, ScheduledSeq
from kiln.engine.request import parameters


class LogitRows(Protocol):
    """The operations on a step's logits ``[rows, vocab]`` (float32) the runner's skeleton
    uses; ``logits`` is the holder's array type."""

    def finite(self, logits: Any) -> list[bool]:
        """Per row, whether every logit is finite (one sum per row finds them)."""
        ...

    def take(self, logits: Any, rows: list[int]) -> Any:
        """Rows ``rows`` of ``logits``, in that order."""
        ...

    def constrain(self, logits: Any, bits: numpy.ndarray, rows: list[int]) -> Any:
        """The grammar masks: ``bits[j]`` masks row ``rows[j]`` (a disallowed token's logit
        becomes -inf); other rows keep their values bit for bit."""
        ...

    def process(self, logits: Any, seqs: list[ScheduledSeq], errors: dict[str, str]
                ) -> tuple[Any, list[ScheduledSeq]]:
        """The logits processors of the rows that set them; a row left with nothing allowed
        gets its error in ``errors`` and is dropped."""
        ...

    def sample(self, logits: Any, seqs: Sequence[ScheduledSeq]) -> list[SampledToken]:
        """One token per row (row ``i`` sampled as ``seqs[i]`` says)."""
        ...


class CLogitRows:
    """Numpy logits and the C kernels: the C model's plain steps (no logprobs, no logits
    processors: ``kiln.engine.runner.needs_torch_rows``)."""

    def __init__(self, lib: Any, n_threads: int) -> None:
        self._lib = lib  # kiln_kernels.sampling.native.sampler_library()
        self.threads = n_threads  # the C calls' threads

    def finite(self, logits: numpy.ndarray) -> list[bool]:
        return [bool(x) for x in numpy.isfinite(logits.sum(axis=1))]

    def take(self, logits: numpy.ndarray, rows: list[int]) -> numpy.ndarray:
        return numpy.ascontiguousarray(logits[rows])

    def constrain(self, logits: numpy.ndarray, bits: numpy.ndarray, rows: list[int]
                  ) -> numpy.ndarray:
        if rows and not apply_token_bitmask_native(
                logits, numpy.ascontiguousarray(bits, dtype=numpy.int32), rows):
            raise EngineError("generation_error", "the C grammar mask is unavailable", 500)
        return logits

    def process(self, logits: numpy.ndarray, seqs: list[ScheduledSeq], errors: dict[str, str]
                ) -> tuple[numpy.ndarray, list[ScheduledSeq]]:
        if any(s.sampling.processes_logits for s in seqs):  # the runner's choice prevents it
            raise EngineError("generation_error", "logits processors need the torch rows", 500)
        return logits, seqs

    def sample(self, logits: numpy.ndarray, seqs: Sequence[ScheduledSeq]
               ) -> list[SampledToken]:
        sampled = sample_rows(logits, *parameters(seqs),
                              [s.output_token_ids if s.sampling.uses_penalties else ()
                               for s in seqs], lib=self._lib, n_threads=self.threads)
        if sampled is None:  # no C library: a C model is never loaded then
            raise EngineError("generation_error", "the C sampler is unavailable", 500)
        tokens, logprobs = sampled
        return [SampledToken(t, lp, None) for t, lp in zip(tokens, logprobs, strict=True)]


__all__ = ["CLogitRows", "LogitRows"]
