"""SchedulerOutput -> ForwardBatch -> model.forward -> logits -> sampler -> ModelRunnerOutput."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent.futures import Future

import numpy
import torch

from kiln.engine.block_pool import BlockPool
from kiln.engine.config import EngineConfig, kv_blocks
from kiln.engine.errors import NOTHING_ALLOWED, non_finite
from kiln.engine.grammar import GrammarRows, RowMasks, compiler_for
from kiln.engine.logits_processors import apply_logits_processors
from kiln.engine.lora_mix import LoraMix
from kiln.engine.outputs import ModelRunnerOutput, SampledToken, ScheduledSeq, SchedulerOutput
from kiln.engine.sampler import Sampler
from kiln.engine.scoring import ScoringJob
from kiln.engine.speculative import at_position, verified_output
from kiln.model.base import CausalLM, build_forward_batch
from kiln.model.config import ModelConfig
from kiln.model.kv_cache import KVCache, kv_cache_for
from kiln.model.lora import LoraAdapter
from kiln.model.lora_slots import AdapterSlots, LoraBatch
from kiln.model.plan import torch_dtype, with_kv_cache
from kiln.text.tokenizer import Tokenizer

log = logging.getLogger("kiln.engine")


def kv_num_blocks(cfg: ModelConfig, config: EngineConfig, dtype: torch.dtype) -> int:
    """The KV cache's blocks for ``cfg`` with elements of ``dtype`` (kiln.engine.config.kv_blocks)."""
    return kv_blocks(config, KVCache.bytes_per_block(cfg, config.block_size, dtype),
                     cfg.max_position)


class ModelRunner:
    """Owns the KV cache; executes one scheduled step at a time (engine thread only)."""

    def __init__(self, model: CausalLM, cfg: ModelConfig, config: EngineConfig,
                 dtype: torch.dtype, device: torch.device,
                 tokenizer: Tokenizer | None = None, *, kv: KVCache | None = None,
                 grammar: GrammarRows | None = None) -> None:
        """``kv`` and ``grammar``: a cache and the constrained requests' matchers to take over
        (the torch-free C engine's, ``kiln.engine.c_runner``, when it hands its requests over);
        by default a new cache sized by ``config`` and new matchers."""
        self.model = model
        self.cfg = cfg
        self.config = config
        self.dtype = dtype
        self.block_size = config.block_size
        self.device = device
        # The compute plan (kiln.model.plan): the model's, with this engine's KV element type.
        self.plan = with_kv_cache(model.plan, config.kv_cache_dtype)
        log.info("%s", self.plan.line())
        cache_dtype = torch_dtype(self.plan.kv_dtype)
        self.kv_bytes_per_block = KVCache.bytes_per_block(cfg, config.block_size, cache_dtype)
        if kv is None:
            kv = kv_cache_for(model, kv_num_blocks(cfg, config, cache_dtype), config.block_size,
                              cache_dtype, device)
        self.num_blocks = kv.num_blocks
        self.kv = kv
        self.sampler = Sampler(device, self.plan.sampler, self.plan.grammar_mask)
        self._lora_slots: AdapterSlots | None = None  # created on the first LoRA step
        # the matchers of constrained requests (structured outputs); none without a tokenizer
        if grammar is None and tokenizer is not None:
            grammar = GrammarRows(compiler_for(tokenizer))
        self.grammar = grammar

    @property
    def kv_on_demand(self) -> bool:
        """Whether the KV cache's pages become resident only once written (the CPU's zero-page
        cache, as the compute plan says)."""
        return self.kv.zero_pages

    def release(self, request_ids: list[str]) -> None:
        """Finished requests: drop their per-request state (grammar matchers)."""
        if self.grammar is not None and self.grammar.rows:
            self.grammar.release(request_ids)

    def _start_masks(self, seqs: list[ScheduledSeq]) -> Future[RowMasks] | None:
        """The grammar masks of the step's constrained rows, filled now or, where the compute plan
        says so, while the model runs (None: no row is constrained)."""
        if not any(s.sampling.grammar is not None for s in seqs):
            return None
        if self.grammar is None:
            done: Future[RowMasks] = Future()
            done.set_result(RowMasks((), numpy.zeros((0, 0), dtype=numpy.int32), {
                s.request_id: "this engine has no tokenizer to enforce a grammar with"
                for s in seqs if s.sampling.grammar is not None}))
            return done
        return self.grammar.start(seqs, beside=self.plan.grammar_beside_step)

    @property
    def lora_slots(self) -> AdapterSlots:
        """The device slots holding the adapters of recent steps (max_lora_slots of them)."""
        if self._lora_slots is None:
            self._lora_slots = AdapterSlots(
                self.cfg, self.config.max_lora_slots, max_rank=self.config.max_lora_rank,
                dtype=self.dtype, device=self.device, triton=self.plan.torch_lora == "triton")
        return self._lora_slots

    def swap_weights(self, model: CausalLM) -> None:
        """Serve ``model`` from the next step on, over the same KV cache, matchers and adapter
        slots (an adapter's weights are its own): the caller checked that its architecture,
        shapes and compute plan's KV layout are the serving model's."""
        self.model = model

    def drop_weights(self) -> None:
        """Sleep level 2: let go of the model; nothing runs until ``swap_weights``."""
        self.model = None  # type: ignore[assignment]

    def release_kv(self) -> int:
        """Give the KV cache's memory back (``KVCache.release``); the bytes released."""
        return self.kv.release()

    def scoring_job(self, pool: BlockPool, prompt_ids: Sequence[int], top_k: int,
                    mix: LoraMix = ()) -> ScoringJob:
        """A prompt-scoring job over this runner's model and KV cache, borrowing its blocks from
        ``pool`` (the scheduler's), under the adapter mix ``mix`` (empty: the base model). Raises
        ValueError for a bad prompt or top_k."""
        mixes = [list(mix)]

        def plan(n: int) -> LoraBatch:
            return LoraBatch.build(mixes, [n], self.lora_slots)  # type: ignore[arg-type]

        return ScoringJob(self.model, self.kv, pool, list(prompt_ids), top_k,
                          lora=plan if mix else None)

    def _lora_batch(self, seqs: list[ScheduledSeq]) -> LoraBatch | None:
        """The per-row adapter plan of a step (pins its slots), or None for a base-only step."""
        if not any(s.lora for s in seqs):
            return None
        mixes: list[list[tuple[LoraAdapter | str, float]]] = []
        for s in seqs:
            mix: list[tuple[LoraAdapter | str, float]] = []
            for adapter, scale in s.lora:
                if not isinstance(adapter, LoraAdapter):
                    raise TypeError(f"Request.lora holds a {type(adapter).__name__}, "
                                    "not a LoraAdapter")
                mix.append((adapter, scale))
            mixes.append(mix)
        return LoraBatch.build(mixes, [s.num_tokens for s in seqs], self.lora_slots)

    @property
    def verifies_drafts(self) -> bool:
        """Whether a step's drafted decodes are verified here (kiln.engine.speculative): where
        the C step runs, whose rows do not depend on how many a step holds."""
        return self.plan.step == "c" and self.device.type == "cpu"

    @torch.inference_mode()
    def execute(self, so: SchedulerOutput) -> ModelRunnerOutput:
        if so.is_empty:
            return ModelRunnerOutput({})
        drafted = any(s.draft for s in so.seqs)
        batch = build_forward_batch(
            [(s.token_ids, s.start_pos, s.block_table) for s in so.seqs],
            self.block_size, "all" if drafted else "last", self.device)
        if drafted:  # every row of a drafted decode, each sampled as its position
            picked, seqs = verify_rows(so.seqs)
            batch.logits_indices = batch.logits_indices[picked or [0]]
            rows = picked
        else:
            rows = [i for i, s in enumerate(so.seqs) if s.sample]
            # Logits only for sequences that sample (at least one row, so the model runs as
            # usual).
            batch.logits_indices = batch.logits_indices[rows or [0]]
            seqs = [so.seqs[i] for i in rows]
        lora = self._lora_batch(so.seqs)
        batch.lora = lora
        pending = self._start_masks(seqs)
        try:
            logits = self.model.forward(batch, self.kv)
        finally:
            if lora is not None:
                lora.release()
            masks = pending.result() if pending is not None else None  # also when forward fails
        if not rows:
            return ModelRunnerOutput({})
        errors: dict[str, str] = dict(masks.errors) if masks is not None else {}
        # A row whose logits hold inf or NaN (an overflowing LoRA mix, a broken checkpoint) has
        # no distribution to sample: it ends in an error, never in a made-up token. One sum per
        # row finds them (~13 us for a 49k vocabulary).
        finite = torch.isfinite(logits.sum(dim=1)).tolist()
        if drafted:  # a draft row that is not finite ends its sequence's rows, not the request
            finite = drafts_cut(so.seqs, seqs, finite)
        keep = [i for i, ok in enumerate(finite) if ok and seqs[i].request_id not in errors]
        errors.update({seqs[i].request_id: non_finite(seqs[i].lora)
                       for i, ok in enumerate(finite) if ok is False})
        if masks is not None and masks.rows:
            # row j of the masks belongs to step row masks.rows[j]; a grammar mask is never empty
            logits = self.sampler.constrain(logits, masks.bits, [int(i) for i in masks.rows])
        if len(keep) < len(seqs):
            logits, seqs = logits[keep], [seqs[i] for i in keep]
            if not seqs:
                return ModelRunnerOutput({}, errors)
        if any(s.sampling.processes_logits for s in seqs):
            logits = apply_logits_processors(logits, seqs)  # after the check: masks write -inf
            # a grammar mask is never empty; with allowed_token_ids, min_tokens or bad_words
            # (alone or together) a row can be
            alive = torch.isfinite(logits).any(dim=1).tolist()
            errors.update({s.request_id: NOTHING_ALLOWED
                           for s, ok in zip(seqs, alive, strict=True) if not ok})
            if not all(alive):
                logits = logits[[i for i, ok in enumerate(alive) if ok]]
                seqs = [s for s, ok in zip(seqs, alive, strict=True) if ok]
        if not seqs:
            return ModelRunnerOutput({}, errors)
        tokens, logprobs = self.sampler.sample(logits, seqs)
        tops = self.sampler.token_logprobs(logits, seqs, tokens)
        samples = [SampledToken(t, lp, top)
                   for t, lp, top in zip(tokens, logprobs, tops, strict=True)]
        if drafted:
            return verified_output(seqs, samples, errors)
        return ModelRunnerOutput({s.request_id: tok for s, tok in zip(seqs, samples, strict=True)},
                                 errors)


# -- verifying drafts (kiln.engine.speculative) -------------------------------------------------
def verify_rows(steps: Sequence[ScheduledSeq]) -> tuple[list[int], list[ScheduledSeq]]:
    """A drafted step's logit rows (indices into every row of the step) and, per row, the
    sequence as plain decoding would sample that position: its output index as the counter and
    the output so far plus the drafts before it as the history. A sequence that does not sample
    gives no row; an undrafted one its last."""
    picked: list[int] = []
    rows: list[ScheduledSeq] = []
    at = 0
    for seq in steps:
        n = seq.num_tokens
        if seq.sample:
            wanted = 1 + len(seq.draft)
            for j in range(wanted):
                picked.append(at + n - wanted + j)
                rows.append(at_position(seq, j))
        at += n
    return picked, rows


def drafts_cut(steps: Sequence[ScheduledSeq], rows: Sequence[ScheduledSeq],
               finite: list[bool]) -> list[bool | None]:
    """``finite`` per row, with a drafted sequence's rows from its first non-finite draft row on
    marked None (dropped without an error: plain decoding meets that row only if the drafts
    before it are kept, and then fails there); a first row keeps its verdict."""
    out: list[bool | None] = list(finite)
    cut: set[str] = set()
    seen: dict[str, int] = {}
    for i, row in enumerate(rows):
        j = seen.get(row.request_id, 0)
        seen[row.request_id] = j + 1
        if j and (row.request_id in cut or not finite[i]):
            cut.add(row.request_id)
            out[i] = None
    return out
