"""The torch side of the runner (``kiln.engine.runner.Runner``), imported when a step first needs
it: the torch model's forward over a paged ``KVCache`` (LoRA adapter slots included), prompt
scoring over it, and :class:`TorchLogitRows`: the logit rows' operations on torch tensors, with
what only torch has here (the logprobs' log-softmax, the logits processors).

On the CPU with a C model, the torch model (``kiln.model.loader.torch_model``) runs the same C
program over the same tiles and KV arrays, so a row's numbers do not depend on which side ran
its step (tested); a GPU's, or an HF folder loaded with torch, is the only model there is.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy
import torch

from kiln.engine.block_pool import BlockPool
from kiln.engine.config import EngineConfig, kv_blocks
from kiln.engine.errors import NOTHING_ALLOWED
from kiln.engine.logits_processors import apply_logits_processors
from kiln.engine.lora_mix import LoraMix
from kiln.engine.outputs import SampledToken, ScheduledSeq
from kiln.engine.sampler import Sampler
from kiln.engine.scoring import ScoringJob
from kiln.model.base import CausalLM
from kiln.model.batch import build_forward_batch
from kiln.model.checkpoint.config import ModelConfig
from kiln.model.kv_cache import KVCache
from kiln.model.lora import LoraAdapter
from kiln.model.lora_slots import AdapterSlots, LoraBatch
from kiln.model.native.plan import ComputePlan


def kv_num_blocks(cfg: ModelConfig, config: EngineConfig, dtype: torch.dtype) -> int:
    """The KV cache's blocks for ``cfg`` with elements of ``dtype`` (kiln.engine.config.kv_blocks)."""
    return kv_blocks(config, KVCache.bytes_per_block(cfg, config.block_size, dtype),
                     cfg.max_position)


class TorchStep:
    """A torch ``CausalLM`` over a paged KV cache: a step's logits, with its rows' adapters."""

    def __init__(self, model: CausalLM, cfg: ModelConfig, config: EngineConfig, kv: KVCache,
                 dtype: torch.dtype, device: torch.device, plan: ComputePlan) -> None:
        self.model, self.cfg, self.config, self.kv = model, cfg, config, kv
        self.dtype, self.device, self.plan = dtype, device, plan
        self._lora_slots: AdapterSlots | None = None  # created on the first LoRA step

    @property
    def verifies_drafts(self) -> bool:
        """Whether a drafted step's rows are those of plain decoding: where the model runs the
        C step, whose rows do not depend on how many a step holds (kiln.engine.speculative)."""
        return self.plan.step == "c" and self.device.type == "cpu"

    @property
    def lora_slots(self) -> AdapterSlots:
        """The device slots holding the adapters of recent steps (max_lora_slots of them)."""
        if self._lora_slots is None:
            self._lora_slots = AdapterSlots(
                self.cfg, self.config.max_lora_slots, max_rank=self.config.max_lora_rank,
                dtype=self.dtype, device=self.device, triton=self.plan.torch_lora == "triton")
        return self._lora_slots

    @torch.inference_mode()
    def forward(self, seqs: Sequence[ScheduledSeq], want: list[int]) -> torch.Tensor:
        """The logits of each sequence's last ``want[s]`` rows, in order (the runner's
        skeleton; ``kiln.model.native.c_model.flatten``'s ``want``)."""
        batch = build_forward_batch([(s.token_ids, s.start_pos, s.block_table) for s in seqs],
                                    self.config.block_size, want, self.device)
        lora = self._lora_batch(seqs)
        batch.lora = lora
        try:
            return self.model.forward(batch, self.kv)
        finally:
            if lora is not None:
                lora.release()

    def _lora_batch(self, seqs: Sequence[ScheduledSeq]) -> LoraBatch | None:
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

    def scoring_job(self, pool: BlockPool, prompt_ids: Sequence[int], top_k: int,
                    mix: LoraMix = ()) -> ScoringJob:
        """A prompt-scoring job over this model and KV cache, borrowing its blocks from ``pool``
        (the scheduler's), under the adapter mix ``mix`` (empty: the base model). Raises
        ValueError for a bad prompt or top_k."""
        mixes = [list(mix)]

        def plan(n: int) -> LoraBatch:
            return LoraBatch.build(mixes, [n], self.lora_slots)  # type: ignore[arg-type]

        return ScoringJob(self.model, self.kv, pool, list(prompt_ids), top_k,
                          lora=plan if mix else None)


class TorchLogitRows:
    """Torch logits (``kiln.engine.logit_rows.LogitRows``): the torch ``Sampler`` by the compute
    plan, the logits processors, and the logprobs of the rows that ask for them."""

    def __init__(self, device: torch.device, plan: ComputePlan) -> None:
        self.sampler = Sampler(device, plan.sampler, plan.grammar_mask)

    @staticmethod
    def tensor(logits: torch.Tensor | numpy.ndarray) -> torch.Tensor:
        """``logits`` as a tensor (the C step's numpy rows viewed, not copied)."""
        return torch.from_numpy(logits) if isinstance(logits, numpy.ndarray) else logits

    def finite(self, logits: torch.Tensor) -> list[bool]:
        return [bool(x) for x in torch.isfinite(logits.sum(dim=1)).tolist()]

    def take(self, logits: torch.Tensor, rows: list[int]) -> torch.Tensor:
        return logits[rows]

    def constrain(self, logits: torch.Tensor, bits: numpy.ndarray, rows: list[int]
                  ) -> torch.Tensor:
        return self.sampler.constrain(logits, bits, rows)

    def process(self, logits: torch.Tensor, seqs: list[ScheduledSeq], errors: dict[str, str]
                ) -> tuple[torch.Tensor, list[ScheduledSeq]]:
        if not any(s.sampling.processes_logits for s in seqs):
            return logits, seqs
        logits = apply_logits_processors(logits, seqs)  # after the finite check: masks -inf
        # a grammar mask is never empty; with allowed_token_ids, min_tokens or bad_words (alone
        # or together) a row can be
        alive = torch.isfinite(logits).any(dim=1).tolist()
        errors.update({s.request_id: NOTHING_ALLOWED
                       for s, ok in zip(seqs, alive, strict=True) if not ok})
        if all(alive):
            return logits, seqs
        return (logits[[i for i, ok in enumerate(alive) if ok]],
                [s for s, ok in zip(seqs, alive, strict=True) if ok])

    def sample(self, logits: torch.Tensor, seqs: Sequence[ScheduledSeq]) -> list[SampledToken]:
        tokens, logprobs = self.sampler.sample(logits, seqs)
        tops = self.sampler.token_logprobs(logits, seqs, tokens)
        return [SampledToken(t, lp, top) for t, lp, top in zip(tokens, logprobs, tops, strict=True)]


__all__ = ["TorchLogitRows", "TorchStep", "kv_num_blocks"]
