"""The torch-free engine executor: the C step over numpy buffers, and the torch runner beside
it for the steps that need torch.

On the CPU, a GGUF whose every matrix has a C kernel runs every step in one C call
(``kiln.model.c_model``), and what a plain request needs besides (the grammar masks, the
sampler, the finite check) is C and numpy too. So ``kiln serve`` loads such a model without
importing torch (0.65 s of a ~1 s start on the default model, and ~200 MiB of RSS), and this
executor runs the steps.

A step with a row that needs torch (a LoRA adapter, logprobs, logits processors) or a prompt
scoring job goes to the torch engine's ``ModelRunner``, built on first need: torch is imported,
the ``CausalLM`` is built over the same tile arrays, and it takes the same KV cache and the
constrained requests' matchers as they are. Both run the same C program on the same bytes, so
a sequence's numbers do not depend on which of the two ran a step (tested), and the step after
runs here again when none of its rows needs torch: one logprobs request no longer moves the
server to the torch engine for good. Everything the torch runner does stays there, in one
place; this module has only the plain step and the choice of path per step
(:meth:`CRunner.path_of`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING

import numpy
from kiln_kernels.cpu import threads
from kiln_kernels.grammar.native import apply_token_bitmask_native
from kiln_kernels.sampling.native import sample_rows, sampler_library

from kiln.engine.config import EngineConfig, kv_blocks
from kiln.engine.errors import EngineError, non_finite
from kiln.engine.grammar import GrammarRows, RowMasks, compiler_for
from kiln.engine.lora_mix import LoraMix
from kiln.engine.outputs import ModelRunnerOutput, SampledToken, ScheduledSeq, SchedulerOutput
from kiln.engine.request import parameters
from kiln.engine.speculative import at_position, verified_output
from kiln.model.plan import ComputePlan, c_step_plan, with_kv_cache

if TYPE_CHECKING:
    from kiln.engine.block_pool import BlockPool
    from kiln.engine.runner import ModelRunner
    from kiln.engine.scoring import ScoringJob
    from kiln.model.base import CausalLM
    from kiln.model.c_model import CModel
    from kiln.text.tokenizer import Tokenizer

log = logging.getLogger("kiln.engine")


def without_drafts(so: SchedulerOutput) -> SchedulerOutput:
    """``so`` with every drafted decode cut back to its last token (run plainly)."""
    if not any(s.draft for s in so.seqs):
        return so
    seqs = [dataclasses.replace(s, token_ids=s.token_ids[:len(s.token_ids) - len(s.draft)],
                                draft=()) if s.draft else s for s in so.seqs]
    return dataclasses.replace(so, seqs=seqs, num_batched_tokens=sum(s.num_tokens for s in seqs))


def needs_torch(seq: ScheduledSeq) -> bool:
    """Whether a scheduled row needs the torch runner: an adapter, logprobs (the sampled token's
    and the top alternatives', ``Sampler.token_logprobs``) or logits processors."""
    sp = seq.sampling
    return bool(seq.lora) or sp.logprobs is not None or sp.processes_logits


class _Cache:
    """The KV arrays of the C engine, as ``AsyncEngine.kv_on_demand`` reads them."""

    zero_pages = True  # anonymous maps: resident only once written

    def __init__(self, k: list[numpy.ndarray], v: list[numpy.ndarray], block_size: int) -> None:
        self.k, self.v, self.block_size = k, v, block_size
        self.num_blocks = int(k[0].shape[0])


class CRunner:
    """Runs scheduled steps through the C step of a :class:`~kiln.model.c_model.CModel`
    (engine thread only), and a step that needs torch through a ``ModelRunner`` over the same
    tiles and KV cache (``path_of``)."""

    def __init__(self, model: CModel, config: EngineConfig,
                 tokenizer: Tokenizer | None = None) -> None:
        self.model = model
        self.config = config
        self.block_size = config.block_size
        self.plan: ComputePlan = with_kv_cache(c_step_plan(), config.kv_cache_dtype)
        log.info("%s", self.plan.line())
        kv_dtype = self.plan.kv_dtype
        self.kv_bytes_per_block = model.bytes_per_block(config.block_size, kv_dtype)
        self.num_blocks = kv_blocks(config, self.kv_bytes_per_block, model.config.max_position)
        k, v = model.kv_arrays(self.num_blocks, config.block_size, kv_dtype)
        self.kv = _Cache(k, v, config.block_size)
        self.program = model.bind(k, v)
        self._lib = sampler_library()
        # the C calls' threads, asked once (torch's default, found without torch; threads())
        self.threads = threads()
        self.tokenizer = tokenizer
        self.grammar = GrammarRows(compiler_for(tokenizer)) if tokenizer is not None else None
        self._torch: ModelRunner | None = None
        # Whether every step goes to the torch runner: its model (an HF folder swapped in by a
        # weight update) has no C program (swap_weights).
        self.torch_only = False
        # the path of each step run (path_of): the last one, and how many of each
        self.last_path = "c"
        self.steps = {"c": 0, "torch": 0}

    @property
    def kv_on_demand(self) -> bool:
        """The KV arrays are anonymous maps: resident only once written."""
        return self.kv.zero_pages

    # -- the torch runner beside the C step -------------------------------------------------

    def path_of(self, so: SchedulerOutput) -> str:
        """Which runner takes a step: ``"torch"`` when a row needs it (``needs_torch``) or the
        model has no C program, else ``"c"``: decided per step, nothing is kept."""
        if self.torch_only or any(self._needs_torch(s) for s in so.seqs):
            return "torch"
        return "c"

    def torch_runner(self) -> ModelRunner:
        """The torch engine's runner over this model's tiles, KV cache and matchers, built on
        first use (imports torch: ~0.65 s, once) and kept for the steps that need it."""
        if self._torch is None:
            from kiln.model.loader import torch_model

            log.info("a request needs torch: the torch runner is built beside the C step")
            self._build_torch(torch_model(self.model))
        assert self._torch is not None
        return self._torch

    def _build_torch(self, model: CausalLM) -> None:
        import torch

        from kiln.engine.runner import ModelRunner
        from kiln.model.kv_cache import KVCache

        kv = KVCache.over(self.kv.k, self.kv.v, self.block_size, heads_major=True,
                          zero_pages=True)
        self._torch = ModelRunner(model, self.model.config, self.config, torch.float32,
                                  torch.device("cpu"), self.tokenizer, kv=kv,
                                  grammar=self.grammar)

    def swap_weights(self, model: CModel | CausalLM) -> None:
        """Serve ``model`` (same architecture and shapes, checked by the caller) from the next
        step on, over the same KV cache and matchers: a ``CModel`` is bound to the KV arrays
        (and, where the torch runner was built, becomes its ``CausalLM`` too); a ``CausalLM``
        (an HF folder loaded with torch) has no C program, so the torch runner takes every step
        from then on (``torch_only``)."""
        from kiln.model.c_model import CModel

        if isinstance(model, CModel):
            self.model, self.torch_only = model, False
            self.program = model.bind(self.kv.k, self.kv.v)  # (after drop_weights too)
            if self._torch is not None:
                from kiln.model.loader import torch_model

                self._torch.swap_weights(torch_model(model))
            return
        self.program, self.torch_only = None, True  # type: ignore[assignment]
        if self._torch is None:
            self._build_torch(model)
        else:
            self._torch.swap_weights(model)

    def drop_weights(self) -> None:
        """Sleep level 2: let go of the model (its tiles freed once nothing else holds them);
        nothing runs until ``swap_weights`` gives one back."""
        self.model = None  # type: ignore[assignment]
        self.program = None  # type: ignore[assignment]  # until swap_weights binds one
        if self._torch is not None:
            self._torch.drop_weights()

    def release_kv(self) -> int:
        """Give the KV cache's memory back (its maps stay, zero again); the bytes released.
        The torch runner, if it took over, holds the same maps."""
        from kiln.model.c_model import map_of, release_pages

        maps = [m for m in (map_of(a) for a in self.kv.k + self.kv.v) if m is not None]
        return release_pages(maps)

    def scoring_job(self, pool: BlockPool, prompt_ids: Sequence[int], top_k: int,
                    mix: LoraMix = ()) -> ScoringJob:
        """Prompt scoring: the torch runner's (``ModelRunner.scoring_job``)."""
        return self.torch_runner().scoring_job(pool, prompt_ids, top_k, mix)

    def release(self, request_ids: list[str]) -> None:
        """Finished requests: drop their per-request state (grammar matchers)."""
        if self._torch is not None:
            self._torch.release(request_ids)
        elif self.grammar is not None and self.grammar.rows:
            self.grammar.release(request_ids)

    # -- the plain step --------------------------------------------------------------------

    @property
    def verifies_drafts(self) -> bool:
        """Whether a step's drafted decodes are verified (kiln.engine.speculative): by the C
        step here; a step the torch runner takes keeps its drafts where that runner verifies
        them too (``ModelRunner.verifies_drafts``: the same C step under it), else runs
        plainly."""
        return not self.torch_only or (self._torch is not None and self._torch.verifies_drafts)

    def execute(self, so: SchedulerOutput) -> ModelRunnerOutput:
        self.last_path = self.path_of(so)
        self.steps[self.last_path] += 1
        if self.last_path == "torch":
            runner = self.torch_runner()
            return runner.execute(so if runner.verifies_drafts else without_drafts(so))
        if so.is_empty:
            return ModelRunnerOutput({})
        rows = [i for i, s in enumerate(so.seqs) if s.sample]
        seqs = [so.seqs[i] for i in rows]
        pending = self._start_masks(seqs)
        drafted = any(s.draft for s in so.seqs)
        try:  # a row's numbers do not depend on the rest of its step, nor on its row count
            last = self.model.forward(
                self.program, [(s.token_ids, s.start_pos, s.block_table) for s in so.seqs],
                [1 + len(s.draft) if s.sample else 1 for s in so.seqs] if drafted else "last",
                self.threads)
        finally:
            masks = pending.result() if pending is not None else None
        if not rows:
            return ModelRunnerOutput({})
        if drafted:
            return self._verify(so, last, masks)
        logits = last if len(rows) == len(so.seqs) else numpy.ascontiguousarray(last[rows])
        errors: dict[str, str] = dict(masks.errors) if masks is not None else {}
        finite = numpy.isfinite(logits.sum(axis=1)).tolist()  # one sum per row finds them
        errors.update({seqs[i].request_id: non_finite(seqs[i].lora)
                       for i, ok in enumerate(finite) if not ok})
        if masks is not None and masks.rows:
            bits = numpy.ascontiguousarray(masks.bits, dtype=numpy.int32)
            if not apply_token_bitmask_native(logits, bits, [int(i) for i in masks.rows]):
                raise EngineError("generation_error", "the C grammar mask is unavailable", 500)
        keep = [i for i, ok in enumerate(finite) if ok and seqs[i].request_id not in errors]
        if len(keep) < len(seqs):
            logits, seqs = numpy.ascontiguousarray(logits[keep]), [seqs[i] for i in keep]
            if not seqs:
                return ModelRunnerOutput({}, errors)
        sampled = sample_rows(logits, *parameters(seqs),
                              [s.output_token_ids if s.sampling.uses_penalties else ()
                               for s in seqs], lib=self._lib, n_threads=self.threads)
        if sampled is None:  # no C library: a C engine is never built then
            raise EngineError("generation_error", "the C sampler is unavailable", 500)
        tokens, logprobs = sampled
        return ModelRunnerOutput({
            s.request_id: SampledToken(t, lp, None)
            for s, t, lp in zip(seqs, tokens, logprobs, strict=True)
        }, errors)

    def _verify(self, so: SchedulerOutput, logits: numpy.ndarray, masks: RowMasks | None
                ) -> ModelRunnerOutput:
        """A step with drafted decodes (drafted rows are plain: the scheduler drafts no
        constrained request; the step's constrained rows get their masks): every row sampled as
        plain decoding samples its position, the counter its output index and the history the
        output so far plus the drafts before it. A drafted sequence's samples stop at its first
        row whose logits are not finite (plain decoding meets that row only if the drafts before
        it are kept, and then fails there)."""
        at = 0
        owners: list[tuple[ScheduledSeq, int]] = []  # (the row's sequence, its index in it)
        keep: list[int] = []
        errors: dict[str, str] = dict(masks.errors) if masks is not None else {}
        first_row: dict[int, int] = {}  # a sampling sequence's index -> its first kept row
        finite = numpy.isfinite(logits.sum(axis=1)).tolist()
        index = -1  # among the sampling sequences (the masks' numbering)
        for seq in so.seqs:
            if not seq.sample:  # a prompt chunk: one row returned, nothing sampled
                at += 1
                continue
            index += 1
            n = 1 + len(seq.draft)
            if seq.request_id in errors:  # its mask could not be made: no sample
                at += n
                continue
            for j in range(n):
                if not finite[at + j]:
                    if j == 0:
                        errors[seq.request_id] = non_finite(seq.lora)
                    break
                if j == 0:
                    first_row[index] = len(keep)
                owners.append((seq, j))
                keep.append(at + j)
            at += n
        if not keep:
            return ModelRunnerOutput({}, errors)
        kept = numpy.ascontiguousarray(logits[keep])
        if masks is not None and masks.rows:
            bits = numpy.ascontiguousarray(masks.bits, dtype=numpy.int32)
            mine = [(b, first_row[int(i)]) for b, i in enumerate(masks.rows)
                    if int(i) in first_row]
            if mine and not apply_token_bitmask_native(
                    kept, numpy.ascontiguousarray(bits[[b for b, _ in mine]]),
                    [r for _, r in mine]):
                raise EngineError("generation_error", "the C grammar mask is unavailable", 500)
        rows = [at_position(seq, j) for seq, j in owners]
        sampled = sample_rows(kept, *parameters(rows),
                              [r.output_token_ids if r.sampling.uses_penalties else ()
                               for r in rows], lib=self._lib, n_threads=self.threads)
        if sampled is None:
            raise EngineError("generation_error", "the C sampler is unavailable", 500)
        tokens, logprobs = sampled
        return verified_output(rows, [SampledToken(t, lp, None)
                                      for t, lp in zip(tokens, logprobs, strict=True)], errors)

    def _needs_torch(self, seq: ScheduledSeq) -> bool:
        # a constrained row without a tokenizer: the torch runner's answer (a request error)
        return needs_torch(seq) or (self.grammar is None and seq.sampling.grammar is not None)

    def _start_masks(self, seqs: list[ScheduledSeq]) -> Future[RowMasks] | None:
        """The grammar masks of the step's constrained rows, filled inline (the CPU step uses
        every core; ``ComputePlan.grammar_beside_step``), or None when no row is constrained."""
        if self.grammar is None or not any(s.sampling.grammar is not None for s in seqs):
            return None
        return self.grammar.start(seqs, beside=self.plan.grammar_beside_step)
