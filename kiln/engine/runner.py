"""The runner: SchedulerOutput -> the model's logits -> grammar masks, processors -> sampler ->
ModelRunnerOutput, one step at a time on the engine thread. One class for every model:

- a **C model** (``kiln.model.native.c_model.CModel``: a GGUF loaded without torch, the CPU path
  ``kiln serve`` runs by default) runs its steps through its C program over numpy KV arrays,
  and its logit rows through the C kernels (``kiln.engine.logit_rows.CLogitRows``): a plain
  step imports no torch;
- a **torch model** (``kiln.model.base.CausalLM``: a GPU's, or an HF folder loaded with torch)
  runs through ``kiln.engine.torch_step``.

What needs torch is decided per step, by what the step's rows ask for (:meth:`Runner.path_of`):
an adapter makes the step's forward torch's (the C model's torch twin over the same tiles and
KV arrays, built on first need, with the same numbers: tested); logprobs or logits processors
make its logit rows torch's (the C step's numpy logits viewed as a tensor). Nothing is kept
from one step to the next: a server that answered a ``logprobs`` or an adapter request serves
the next plain one on the C path again. Scoring jobs run on the torch side.

The skeleton (:meth:`Runner.execute`) is written once; the two sides differ only in the
forward and in the array operations of ``LogitRows``. Imports no torch.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Literal

import numpy

from kiln.engine.config import EngineConfig, kv_blocks
from kiln.engine.errors import non_finite
from kiln.engine.grammar import GrammarRows, RowMasks, compiler_for
from kiln.engine.logit_rows import CLogitRows, LogitRows
from kiln.engine.lora_mix import LoraMix
from kiln.engine.outputs import ModelRunnerOutput, ScheduledSeq, SchedulerOutput
from kiln.engine.speculative import at_position, verified_output
from kiln.model.native.plan import ComputePlan, c_step_plan, with_kv_cache

if TYPE_CHECKING:
    import torch

    from kiln.engine.block_pool import BlockPool
    from kiln.engine.scoring import ScoringJob
    from kiln.engine.torch_step import TorchLogitRows, TorchStep
    from kiln.model.base import CausalLM
    from kiln.model.checkpoint.config import ModelConfig
    from kiln.model.kv_cache import KVCache
    from kiln.model.native.c_model import CModel
    from kiln.text.tokenizer import Tokenizer

log = logging.getLogger("kiln.engine")

Side = Literal["c", "torch"]


def without_drafts(so: SchedulerOutput) -> SchedulerOutput:
    """``so`` with every drafted decode cut back to its last token (run plainly)."""
    if not any(s.draft for s in so.seqs):
        return so
    seqs = [dataclasses.replace(s, token_ids=s.token_ids[:len(s.token_ids) - len(s.draft)],
                                draft=()) if s.draft else s for s in so.seqs]
    return dataclasses.replace(so, seqs=seqs, num_batched_tokens=sum(s.num_tokens for s in seqs))


def needs_torch_rows(seq: ScheduledSeq) -> bool:
    """Whether a scheduled row's logits go through torch: logprobs (the sampled token's and the
    top alternatives', ``Sampler.token_logprobs``) or logits processors."""
    sp = seq.sampling
    return sp.logprobs is not None or sp.processes_logits


class CArrays:
    """The C model's KV arrays (numpy, heads-major), as ``AsyncEngine.kv_on_demand`` reads
    them."""

    zero_pages = True  # anonymous maps: resident only once written

    def __init__(self, k: list[numpy.ndarray], v: list[numpy.ndarray], block_size: int) -> None:
        self.k, self.v, self.block_size = k, v, block_size
        self.num_blocks = int(k[0].shape[0])


class Runner:
    """Owns the KV cache and the constrained requests' matchers; executes one scheduled step at
    a time (engine thread only). Build it with :meth:`for_c_model` or :meth:`for_torch_model`
    (``kiln.engine.core.build_core`` picks by what was loaded)."""

    def __init__(self, config: EngineConfig, plan: ComputePlan, cfg: ModelConfig,
                 tokenizer: Tokenizer | None) -> None:
        self.config = config
        self.block_size = config.block_size
        self.cfg = cfg
        self.plan = plan
        log.info("%s", plan.line())
        self.tokenizer = tokenizer
        # the matchers of constrained requests (structured outputs); none without a tokenizer
        self.grammar = GrammarRows(compiler_for(tokenizer)) if tokenizer is not None else None
        self.c_model: CModel | None = None  # the C model and its program over the KV arrays
        self.program: Any = None
        self.c_rows: CLogitRows | None = None
        self._torch: TorchStep | None = None  # the torch model, where there is one (yet)
        self._torch_rows: TorchLogitRows | None = None
        self.kv: CArrays | KVCache
        self.num_blocks = 0
        self.kv_bytes_per_block = 0
        # the side of each step run (path_of): the last one, and how many of each
        self.last_path: Side = "c"
        self.steps = {"c": 0, "torch": 0}

    @classmethod
    def for_c_model(cls, model: CModel, config: EngineConfig,
                    tokenizer: Tokenizer | None = None) -> Runner:
        """The runner of a C model: its KV arrays allocated here (numpy maps), its program bound
        to them; the torch side built on first need."""
        from kiln_kernels.cpu import threads
        from kiln_kernels.sampling.native import sampler_library

        runner = cls(config, with_kv_cache(c_step_plan(), config.kv_cache_dtype), model.config,
                     tokenizer)
        kv_dtype = runner.plan.kv_dtype
        runner.kv_bytes_per_block = model.bytes_per_block(config.block_size, kv_dtype)
        runner.num_blocks = kv_blocks(config, runner.kv_bytes_per_block,
                                      model.config.max_position)
        k, v = model.kv_arrays(runner.num_blocks, config.block_size, kv_dtype)
        runner.kv = CArrays(k, v, config.block_size)
        runner.c_model, runner.program = model, model.bind(k, v)
        # the C calls' threads, asked once (torch's default, found without torch: threads())
        runner.c_rows = CLogitRows(sampler_library(), threads())
        return runner

    @classmethod
    def for_torch_model(cls, model: CausalLM, cfg: ModelConfig, config: EngineConfig,
                        dtype: torch.dtype, device: torch.device,
                        tokenizer: Tokenizer | None = None) -> Runner:
        """The runner of a torch model: a new KV cache sized by ``config`` for it."""
        from kiln.engine.torch_step import TorchLogitRows, TorchStep, kv_num_blocks
        from kiln.model.devices import torch_dtype
        from kiln.model.kv_cache import KVCache, kv_cache_for

        runner = cls(config, with_kv_cache(model.plan, config.kv_cache_dtype), cfg, tokenizer)
        cache_dtype = torch_dtype(runner.plan.kv_dtype)
        runner.kv_bytes_per_block = KVCache.bytes_per_block(cfg, config.block_size, cache_dtype)
        kv = kv_cache_for(model, kv_num_blocks(cfg, config, cache_dtype), config.block_size,
                          cache_dtype, device)
        runner.kv, runner.num_blocks = kv, kv.num_blocks
        runner._torch = TorchStep(model, cfg, config, kv, dtype, device, runner.plan)
        runner._torch_rows = TorchLogitRows(device, runner.plan)
        return runner

    # -- the model, its KV cache and its torch side ------------------------------------------

    @property
    def model(self) -> CModel | CausalLM:
        """The model served: the C model where there is one, else the torch model."""
        if self.c_model is not None:
            return self.c_model
        assert self._torch is not None
        return self._torch.model

    @property
    def kv_on_demand(self) -> bool:
        """Whether the KV cache's pages become resident only once written (the CPU's zero-page
        cache, as the compute plan says)."""
        return self.kv.zero_pages

    def torch_step(self) -> TorchStep:
        """The torch side: the torch model's, or the C model's torch twin over the same tiles,
        KV arrays and matchers, built on first need (imports torch: ~0.65 s, once)."""
        if self._torch is None:
            assert self.c_model is not None and isinstance(self.kv, CArrays)
            from kiln.model.loader import torch_model

            log.info("a request needs the torch model: built beside the C step")
            self._torch = self._torch_twin(torch_model(self.c_model))
        return self._torch

    def _torch_twin(self, model: CausalLM) -> TorchStep:
        import torch

        from kiln.engine.torch_step import TorchStep
        from kiln.model.kv_cache import KVCache

        assert isinstance(self.kv, CArrays)
        kv = KVCache.over(self.kv.k, self.kv.v, self.block_size, heads_major=True,
                          zero_pages=True)
        return TorchStep(model, self.cfg, self.config, kv, torch.float32, torch.device("cpu"),
                         model.plan)

    @property
    def torch_kv(self) -> KVCache:
        """The torch side's KV cache: the torch model's own, or a C model's arrays as its torch
        twin sees them (the same memory)."""
        return self.torch_step().kv

    def torch_rows(self) -> TorchLogitRows:
        """The torch operations on logit rows (imports torch on first need)."""
        if self._torch_rows is None:
            import torch

            from kiln.engine.torch_step import TorchLogitRows

            self._torch_rows = TorchLogitRows(torch.device("cpu"), self.plan)
        return self._torch_rows

    def swap_weights(self, model: CModel | CausalLM) -> None:
        """Serve ``model`` (same architecture and shapes, checked by the caller) from the next
        step on, over the same KV cache, matchers and adapter slots: a ``CModel`` is bound to
        the C model's KV arrays (and becomes its torch twin's model too, where that was built);
        a ``CausalLM`` (an HF folder loaded with torch) has no C program, so the torch side
        takes every step from then on."""
        from kiln.model.native.c_model import CModel

        if isinstance(model, CModel):
            assert isinstance(self.kv, CArrays), "a C model over a torch model's cache"
            self.c_model, self.program = model, model.bind(self.kv.k, self.kv.v)
            if self._torch is not None:
                from kiln.model.loader import torch_model

                self._torch.model = torch_model(model)
            return
        self.c_model = self.program = None  # a C model's program goes; its KV arrays stay
        if self._torch is None:
            self._torch = self._torch_twin(model)
        self._torch.model = model

    def drop_weights(self) -> None:
        """Sleep level 2: let go of the model (its tiles freed once nothing else holds them);
        nothing runs until ``swap_weights`` gives one back."""
        if self.c_model is not None:
            self.c_model = self.program = None
        if self._torch is not None:
            self._torch.model = None  # type: ignore[assignment]

    def release_kv(self) -> int:
        """Give the KV cache's memory back (its maps stay, zero again); the bytes released."""
        if isinstance(self.kv, CArrays):
            from kiln.model.native.c_model import map_of, release_pages

            maps = [m for m in (map_of(a) for a in self.kv.k + self.kv.v) if m is not None]
            return release_pages(maps)
        return self.kv.release()

    def scoring_job(self, pool: BlockPool, prompt_ids: Sequence[int], top_k: int,
                    mix: LoraMix = ()) -> ScoringJob:
        """Prompt scoring: the torch side's (``TorchStep.scoring_job``)."""
        return self.torch_step().scoring_job(pool, prompt_ids, top_k, mix)

    def release(self, request_ids: list[str]) -> None:
        """Finished requests: drop their per-request state (grammar matchers)."""
        if self.grammar is not None and self.grammar.rows:
            self.grammar.release(request_ids)

    # -- one step ----------------------------------------------------------------------------

    def path_of(self, so: SchedulerOutput) -> tuple[Side, Side]:
        """Which side runs a step's forward and which its logit rows, decided per step: the
        forward is torch's where a row has an adapter or the model has no C program, the rows
        are torch's where the forward is or a row wants logprobs or logits processors
        (:func:`needs_torch_rows`); else both are the C model's."""
        forward: Side = "torch" if self.program is None or any(s.lora for s in so.seqs) else "c"
        if forward == "torch" or self.c_rows is None:
            return forward, "torch"
        return forward, "torch" if any(needs_torch_rows(s) for s in so.seqs) else "c"

    @property
    def verifies_drafts(self) -> bool:
        """Whether a step's drafted decodes are verified (kiln.engine.speculative): by the C
        program, or by a torch model that runs the C step (``TorchStep.verifies_drafts``); a
        step whose forward does not keeps its drafts out (``without_drafts``)."""
        return self.program is not None or (
            self._torch is not None and self._torch.verifies_drafts)

    def execute(self, so: SchedulerOutput) -> ModelRunnerOutput:
        forward, rows_side = self.path_of(so)
        self.last_path = "c" if (forward, rows_side) == ("c", "c") else "torch"
        self.steps[self.last_path] += 1
        if so.is_empty:
            return ModelRunnerOutput({})
        if forward == "torch" and not self.torch_step().verifies_drafts:
            so = without_drafts(so)
        # each sampling sequence's last 1 + len(draft) rows (a drafted decode's verify rows);
        # a prompt chunk's none (at least one row in all, so the model runs as usual)
        want = [1 + len(s.draft) if s.sample else 0 for s in so.seqs]
        sampling = [s for s in so.seqs if s.sample]
        if not sampling:
            want[0] = 1
        pending = self._start_masks(sampling)
        try:  # a row's numbers do not depend on the rest of its step, nor on its row count
            if forward == "c":
                logits: Any = self.c_model.forward(  # type: ignore[union-attr]
                    self.program, [(s.token_ids, s.start_pos, s.block_table) for s in so.seqs],
                    want, self.c_rows.threads if self.c_rows else None)
            else:
                logits = self.torch_step().forward(so.seqs, want)
        finally:
            masks = pending.result() if pending is not None else None  # also when forward fails
        if not sampling:
            return ModelRunnerOutput({})
        if rows_side == "c":
            assert self.c_rows is not None
            return sample_step(self.c_rows, sampling, logits, masks)
        ops = self.torch_rows()
        return sample_step(ops, sampling, ops.tensor(logits), masks)

    def _start_masks(self, seqs: list[ScheduledSeq]) -> Future[RowMasks] | None:
        """The grammar masks of the step's constrained rows, filled now or, where the compute
        plan says so, while the model runs (None: no row is constrained)."""
        if not any(s.sampling.grammar is not None for s in seqs):
            return None
        if self.grammar is None:
            done: Future[RowMasks] = Future()
            done.set_result(RowMasks((), numpy.zeros((0, 0), dtype=numpy.int32), {
                s.request_id: "this engine has no tokenizer to enforce a grammar with"
                for s in seqs if s.sampling.grammar is not None}))
            return done
        return self.grammar.start(seqs, beside=self.plan.grammar_beside_step)


def sample_step(ops: LogitRows, seqs: list[ScheduledSeq], logits: Any,
                masks: RowMasks | None) -> ModelRunnerOutput:
    """A step's samples from its logits: ``seqs`` are the step's sampling sequences in order,
    each with ``1 + len(seq.draft)`` rows of ``logits`` (a drafted decode's verify rows). Every
    row is sampled as plain decoding samples its position (``at_position``: the counter its
    output index, the history the output so far plus the drafts before it). A row whose logits
    are not finite (an overflowing LoRA mix, a broken checkpoint) has no distribution to sample:
    a sequence's first such row ends it in an error, never in a made-up token; a draft row's
    ends that sequence's rows (plain decoding meets it only if the drafts before it are kept,
    and then fails there). Grammar masks (``masks.rows`` numbers ``seqs``) apply to a
    sequence's first row: the scheduler drafts no constrained request."""
    errors: dict[str, str] = dict(masks.errors) if masks is not None else {}
    finite = ops.finite(logits)
    keep: list[int] = []  # the rows sampled, and for each the sequence at its position
    rows: list[ScheduledSeq] = []
    first_row: dict[int, int] = {}  # a sequence's index in seqs -> its first row in keep
    at = 0
    for index, seq in enumerate(seqs):
        n = 1 + len(seq.draft)
        if seq.request_id not in errors:  # (its mask could not be made: no sample)
            for j in range(n):
                if not finite[at + j]:
                    if j == 0:
                        errors[seq.request_id] = non_finite(seq.lora)
                    break
                if j == 0:
                    first_row[index] = len(keep)
                keep.append(at + j)
                rows.append(at_position(seq, j))
        at += n
    if not keep:
        return ModelRunnerOutput({}, errors)
    if len(keep) < at:
        logits = ops.take(logits, keep)
    if masks is not None and masks.rows:
        mine = [(b, first_row[int(i)]) for b, i in enumerate(masks.rows) if int(i) in first_row]
        if mine:
            logits = ops.constrain(logits, masks.bits[[b for b, _ in mine]],
                                   [r for _, r in mine])
    logits, rows = ops.process(logits, rows, errors)
    if not rows:
        return ModelRunnerOutput({}, errors)
    return verified_output(rows, ops.sample(logits, rows), errors)


__all__ = ["CArrays", "Runner", "needs_torch_rows", "sample_step", "without_drafts"]
