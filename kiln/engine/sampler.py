"""Batched sampling: the rows' SamplingParams and history -> kiln_kernels.sampling.

The compute plan (kiln.model.native.plan) names the sampler. ``c``: the C sampler (``sample_rows``)
takes the rows' parameters and their penalty history as plain lists (a step builds no tensor for
them); ``triton`` and ``torch`` (also where the C library is missing) get dense [rows, vocab]
counts. Both are batch-invariant: a row's token depends
only on its logits, its parameters and (seed, step), so a seeded request samples the same tokens
alone or in any batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy
import torch
from kiln_kernels.grammar import apply_token_bitmask, apply_token_bitmask_ref
from kiln_kernels.grammar.native import apply_token_bitmask_native
from kiln_kernels.sampling import SamplingTensors, sample_reference
from kiln_kernels.sampling.native import FLOAT_COLUMNS, INT_COLUMNS, sample_rows, sampler_library
from kiln_kernels.sampling.params import to_int64_bits
from kiln_kernels.sampling.reference import apply_penalties

from kiln.engine.outputs import ScheduledSeq, TokenLogprobs
from kiln.engine.request import F32_MAX, LOGPROB_FLOOR, parameters
from kiln.engine.scoring import top_k_ids

__all__ = ["F32_MAX", "LOGPROB_FLOOR", "Sampler"]


class Sampler:
    def __init__(self, device: torch.device, impl: Literal["c", "triton", "torch"],
                 mask_impl: Literal["c", "triton", "torch"] = "torch") -> None:
        self.device = device
        self.impl = impl  # the compute plan's sampler
        self.mask_impl = mask_impl  # the compute plan's grammar_mask
        # the C sampler's library, taken once (None where it cannot be built: the torch path)
        self._c_lib = sampler_library() if impl == "c" else None
        self._zero_counts = torch.zeros((0, 0), dtype=torch.int32, device=device)
        self._zero_mask = torch.zeros((0, 0), dtype=torch.bool, device=device)

    def sample(
        self, logits: torch.Tensor, seqs: Sequence[ScheduledSeq]
    ) -> tuple[list[int], list[float]]:
        """-> (token id, behaviour logprob) per row of ``logits`` (one row per seq, in order)."""
        if logits.shape[0] != len(seqs):
            raise ValueError(f"sampler: {logits.shape[0]} logit rows for {len(seqs)} sequences")
        if not seqs:
            return [], []
        if self._c_lib is not None and logits.dtype == torch.float32:
            native: tuple[list[int], list[float]] | None = sample_rows(
                logits, *parameters(seqs),
                [s.output_token_ids if s.sampling.uses_penalties else () for s in seqs],
                lib=self._c_lib)
            if native is not None:
                return native
        p = self.build(seqs, int(logits.shape[1]))
        if self.impl == "triton":
            from kiln_kernels.sampling.sampler import sample_triton

            tokens, logprobs = sample_triton(logits, p)
        else:
            tokens, logprobs = sample_reference(logits, p)
        return [int(t) for t in tokens.tolist()], [float(x) for x in logprobs.tolist()]

    def constrain(self, logits: torch.Tensor, bits: numpy.ndarray,
                  rows: list[int]) -> torch.Tensor:
        """The grammar masks applied, by the compute plan's ``grammar_mask``: ``bits[j]``
        (llguidance's int32 bitmask words) masks row ``rows[j]``; a disallowed token's logit
        becomes -inf, and so does every id past the mask (padding beyond the tokenizer's
        vocabulary). ``c`` masks the CPU's float32 ``logits`` (the step's own, fresh from the
        model) in place (``cpu/sampling/token_mask.c``); otherwise a copy is masked, by the
        Triton kernel (``triton``, CUDA) or the torch reference (kiln_kernels.grammar). Other
        rows keep their values bit for bit."""
        if not rows:
            return logits
        bitmask = torch.from_numpy(numpy.ascontiguousarray(bits, dtype=numpy.int32))
        if self.mask_impl == "c" and apply_token_bitmask_native(logits, bitmask, rows):
            return logits
        out = logits.clone()
        bitmask = bitmask.to(out.device)
        row_ids = torch.tensor(rows, dtype=torch.int32).to(out.device)
        if self.mask_impl == "triton":  # the op's launcher: Triton on CUDA tensors
            apply_token_bitmask(out, bitmask, row_ids)
        else:
            apply_token_bitmask_ref(out, bitmask, row_ids)
        return out

    def token_logprobs(self, logits: torch.Tensor, seqs: Sequence[ScheduledSeq],
                       tokens: Sequence[int]) -> list[TokenLogprobs | None]:
        """For the rows whose request wants logprobs: the sampled token's logprob and the top
        alternatives under the distribution the sampler drew from before its filters: the
        penalized logits over the temperature (a greedy row: the penalized logits alone), in
        float32. A greedy row without penalties is torch.log_softmax of its logits, as the
        scoring route computes it."""
        want = [i for i, s in enumerate(seqs) if s.sampling.logprobs is not None]
        out: list[TokenLogprobs | None] = [None] * len(seqs)
        if not want:
            return out
        sub = [seqs[i] for i in want]
        rows = logits[want].to(torch.float32)
        if any(s.sampling.uses_penalties for s in sub):
            rows = apply_penalties(rows, self.build(sub, int(logits.shape[1])))
        temps = [1.0 if s.sampling.greedy else min(s.sampling.temperature, F32_MAX)
                 for s in sub]  # the temperature request.parameters gives the samplers
        if any(t != 1.0 for t in temps):
            rows = rows / torch.tensor(temps, dtype=torch.float32, device=rows.device)[:, None]
        lp = torch.log_softmax(rows, dim=-1)
        k = max((int(s.sampling.logprobs or 0) for s in sub
                 if s.sampling.logprob_token_ids is None), default=0)
        ids = top_k_ids(lp, k)
        chosen = torch.tensor([tokens[i] for i in want], dtype=torch.int64, device=lp.device)
        chosen_lp = lp.gather(1, chosen[:, None]).flatten().tolist()
        top_lp = lp.gather(1, ids).tolist()
        for j, (i, s) in enumerate(zip(want, sub, strict=True)):
            named = s.sampling.logprob_token_ids
            if named is not None:  # the request's own ids, in its order; -inf as OpenAI's floor
                vals = lp[j, torch.tensor(named, dtype=torch.int64, device=lp.device)].tolist()
                out[i] = TokenLogprobs(float(chosen_lp[j]), named,
                                       tuple(max(v, LOGPROB_FLOOR) for v in vals))
                continue
            n = int(s.sampling.logprobs or 0)
            # a masked token (allowed_token_ids, min_tokens) has logprob -inf: not an alternative
            top = [(t, v) for t, v in zip(ids[j, :n].tolist(), top_lp[j][:n], strict=True)
                   if v != float("-inf")]
            out[i] = TokenLogprobs(float(chosen_lp[j]), tuple(t for t, _ in top),
                                   tuple(v for _, v in top))
        return out

    def columns(self, seqs: Sequence[ScheduledSeq]) -> dict[str, torch.Tensor]:
        """The rows' sampling parameters, one [B] tensor each (SamplingTensors' names): two
        tensors built per step, the float and the integer parameters, viewed by column."""
        float_rows, int_rows = parameters(seqs)
        floats = torch.tensor(float_rows, dtype=torch.float32)
        ints = torch.tensor([(k, to_int64_bits(seed), step) for k, seed, step in int_rows],
                            dtype=torch.int64)  # seeds as their int64 bit patterns
        floats, ints = floats.to(self.device), ints.to(self.device)  # no copy on the CPU
        cols = {name: floats[:, i].contiguous() for i, name in enumerate(FLOAT_COLUMNS)}
        cols.update({name: ints[:, i].contiguous() for i, name in enumerate(INT_COLUMNS)})
        cols["top_k"] = cols["top_k"].to(torch.int32)
        return cols

    def build(self, seqs: Sequence[ScheduledSeq], vocab: int) -> SamplingTensors:
        counts, mask = self._history(seqs, vocab)
        return SamplingTensors(**self.columns(seqs), output_counts=counts, prompt_mask=mask)

    def _history(self, seqs: Sequence[ScheduledSeq], vocab: int
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        """Output counts and the (always empty) prompt mask: as in Kiln (docs/behavior.md §5.3) the
        repetition penalty covers generated tokens only, which the counts already carry."""
        b = len(seqs)
        count_rows: list[int] = []
        count_ids: list[int] = []
        for i, s in enumerate(seqs):
            if not s.sampling.uses_penalties:
                continue
            count_rows.extend([i] * len(s.output_token_ids))
            count_ids.extend(s.output_token_ids)
        if count_ids:
            counts = torch.zeros((b, vocab), dtype=torch.int32, device=self.device)
            idx = self._index(count_rows, count_ids, vocab)
            counts.index_put_(idx, torch.ones(len(count_ids), dtype=torch.int32,
                                              device=self.device), accumulate=True)
        else:
            counts = self._zeros_counts(b, vocab)
        return counts, self._zeros_mask(b, vocab)

    def _index(self, rows: list[int], ids: list[int], vocab: int
               ) -> tuple[torch.Tensor, torch.Tensor]:
        r = torch.tensor(rows, dtype=torch.long, device=self.device)
        t = torch.tensor(ids, dtype=torch.long, device=self.device).clamp_(0, vocab - 1)
        return r, t

    def _zeros_counts(self, b: int, vocab: int) -> torch.Tensor:
        if self._zero_counts.shape[0] < b or self._zero_counts.shape[1] != vocab:
            self._zero_counts = torch.zeros((max(b, 8), vocab), dtype=torch.int32,
                                            device=self.device)
        return self._zero_counts[:b]

    def _zeros_mask(self, b: int, vocab: int) -> torch.Tensor:
        if self._zero_mask.shape[0] < b or self._zero_mask.shape[1] != vocab:
            self._zero_mask = torch.zeros((max(b, 8), vocab), dtype=torch.bool,
                                          device=self.device)
        return self._zero_mask[:b]
