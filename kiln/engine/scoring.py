"""Prompt-logprob scoring (docs/behavior.md §8), run on the engine thread by ``run_exclusive``, one
chunk per call (``ScoringJob``), so running streams keep decoding between the chunks. On the
quantized CPU model a chunk runs through the C step (the decode step's per-row numbers).

The prompt goes through the model in chunks over temporarily borrowed KV blocks, so later chunks
attend to earlier ones through the paged cache; on the torch path the final norm and the output
projection run on at most ``proj_rows`` rows at a time, and the C step returns one chunk's logits
(64 x vocab floats). Nothing of size ``[prompt tokens x vocab]`` ever exists.

Position ``p >= 1`` scores the observed token ``prompt[p]`` from the row of position ``p - 1``:
its float32 full-vocabulary log-softmax value, and its rank by raw logit. The top-K ids are sorted
by raw logit descending, ties to the lower id. An observed token inside the top K takes its
1-based place there; otherwise its rank is the count of tokens whose logit is >= its own
(pessimistic ties).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from kiln.engine.block_pool import BlockPool
from kiln.engine.errors import EngineError
from kiln.engine.outputs import PositionScore
from kiln.model.base import CausalLM
from kiln.model.batch import ForwardBatch, build_forward_batch
from kiln.model.kv_cache import KVCache

__all__ = ["CHUNK_TOKENS", "PROJ_ROWS", "ScoringJob", "score_prompt", "score_rows",
           "scoring_batch", "top_k_ids"]

# Prompt tokens per forward pass. The attention scores of one chunk over a 4,096-token context
# are heads x 64 x 4096 floats (9 MiB on SmolLM2) per layer, so peak memory stays flat.
CHUNK_TOKENS = 64
PROJ_ROWS = 32  # rows per norm + output projection (32 x 49152 fp32 logits = 6 MiB)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def scoring_batch(tokens: Sequence[int], start: int, block_table: Sequence[int],
                  block_size: int, device: torch.device, lora: object | None = None) -> ForwardBatch:
    """The one place a scoring forward batch is built (one sequence, every row kept).

    ``lora`` is what ``ForwardBatch.lora`` should carry when scoring under an adapter."""
    batch = build_forward_batch([(tokens, start, block_table)], block_size, "all", device)
    batch.lora = lora
    return batch


def score_prompt(model: CausalLM, kv: KVCache, pool: BlockPool, prompt_ids: Sequence[int],
                 top_k: int, *, chunk_tokens: int = CHUNK_TOKENS, proj_rows: int = PROJ_ROWS,
                 lora: object | None = None) -> list[PositionScore]:
    """One PositionScore per prompt position >= 1, the whole prompt at once (engine thread only:
    it borrows KV blocks from ``pool`` and writes into ``kv``; they are returned before this
    returns or raises). ``ScoringJob`` does the same in slices.

    ``lora`` is None (base model) or a callable giving the adapter plan for a chunk of n tokens
    (released after that chunk's forward)."""
    job = ScoringJob(model, kv, pool, prompt_ids, top_k, chunk_tokens=chunk_tokens,
                     proj_rows=proj_rows, lora=lora)
    try:
        while not job.step():
            pass
    finally:
        job.close()
    return job.scores


class ScoringJob:
    """``score_prompt`` one chunk per ``step()`` call, so that an engine can run its own steps in
    between (each call on the engine thread). The first call borrows the prompt's KV blocks from
    the pool; the last call, or ``close()``, returns them. Arguments are checked on creation
    (ValueError), the blocks on the first call (EngineError ``kv_cache_exhausted``)."""

    def __init__(self, model: CausalLM, kv: KVCache, pool: BlockPool, prompt_ids: Sequence[int],
                 top_k: int, *, chunk_tokens: int = CHUNK_TOKENS, proj_rows: int = PROJ_ROWS,
                 lora: object | None = None) -> None:
        vocab = model.output_weight().shape[0]
        if not prompt_ids:
            raise ValueError("score_prompt: empty prompt")
        if not 0 <= top_k <= vocab:
            raise ValueError(f"score_prompt: top_k must be in 0..{vocab}, got {top_k}")
        if chunk_tokens <= 0 or proj_rows <= 0:
            raise ValueError("score_prompt: chunk_tokens and proj_rows must be positive")
        bad = [t for t in prompt_ids if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"score_prompt: token id {bad[0]} is outside the vocabulary "
                             f"({vocab})")
        self.model, self.kv, self.pool = model, kv, pool
        self.ids = list(prompt_ids)
        self.top_k, self.chunk_tokens, self.proj_rows = top_k, chunk_tokens, proj_rows
        self.lora = lora
        # Only positions 0..n-2 produce a scored row; the last token is observed, never fed.
        self.fed = len(self.ids) - 1
        self.next = 0  # the first position not fed yet
        self.scores: list[PositionScore] = []
        self._blocks: list[int] | None = None

    @property
    def done(self) -> bool:
        return self.next >= self.fed

    def step(self) -> bool:
        """Feed and score the next chunk; True once every position is scored (blocks returned).
        On an exception the blocks are returned too."""
        if self.done:
            return True
        try:
            if self._blocks is None:
                self._blocks = self._borrow()
            start, end = self.next, min(self.fed, self.next + self.chunk_tokens)
            with torch.inference_mode():
                self.scores.extend(self._chunk(start, end))
            self.next = end
        except BaseException:
            self.close()
            raise
        if self.done:
            self.close()
        return self.done

    def close(self) -> None:
        """Return the borrowed blocks (engine thread; idempotent)."""
        if self._blocks is not None:
            self.pool.free(self._blocks)
            self._blocks = None

    @property
    def blocks_needed(self) -> int:
        return _cdiv(self.fed, self.kv.block_size)

    @property
    def started(self) -> bool:
        """Whether the job holds its blocks (the first step borrowed them)."""
        return self._blocks is not None

    def _borrow(self) -> list[int]:
        need = self.blocks_needed
        if need > self.pool.num_blocks:  # bigger than the whole cache: no retry can help
            raise EngineError(
                "context_length_exceeded",
                f"Scoring a {len(self.ids)}-token prompt needs {need} KV cache blocks; the cache "
                f"has {self.pool.num_blocks} in all.", 400)
        if self.pool.num_free_blocks < need:
            raise EngineError(
                "kv_cache_exhausted",
                f"Scoring a {len(self.ids)}-token prompt needs {need} KV cache blocks; "
                f"only {self.pool.num_free_blocks} are free. Retry later.", 503)
        return self.pool.allocate(need)

    def _chunk(self, start: int, end: int) -> list[PositionScore]:
        model, kv, lora, blocks = self.model, self.kv, self.lora, self._blocks
        assert blocks is not None
        bs = kv.block_size
        plan = lora(end - start) if callable(lora) else lora
        batch = scoring_batch(self.ids[start:end], start, blocks[:_cdiv(end, bs)], bs, kv.device,
                              plan)
        try:
            logits_all = self._c_step_logits(batch)
            hidden = model.hidden_states(batch, kv) if logits_all is None else None
        finally:
            release = getattr(plan, "release", None)
            if callable(lora) and release is not None:
                release()  # a per-chunk plan pins adapter slots until its forward is done
        out: list[PositionScore] = []
        for r0 in range(0, end - start, self.proj_rows):
            if logits_all is not None:
                logits = logits_all[r0:r0 + self.proj_rows]
            else:
                assert hidden is not None
                logits = model.soft_cap(F.linear(
                    model.model.norm(hidden[r0:r0 + self.proj_rows]),
                    model.output_weight()).to(torch.float32))
            first = start + r0  # position of the first row; it predicts ids[first + 1]
            if not bool(torch.isfinite(logits).all()):
                raise EngineError("generation_error",
                                  f"non-finite logits while scoring positions {first + 1}.."
                                  f"{first + len(logits)}", 500)
            observed = torch.tensor(self.ids[first + 1:first + 1 + len(logits)],
                                    dtype=torch.int64, device=kv.device)
            out.extend(score_rows(logits, observed, self.top_k))
        return out

    def _c_step_logits(self, batch: ForwardBatch) -> torch.Tensor | None:
        """Every row's logits from the C step where it takes this chunk (the quantized CPU
        model), else None (then the torch path: norm and projection in slices). The C step's
        numbers for a row do not depend on how rows are grouped, so a scored position gets,
        bit for bit, the logits a one-row decode step computes there over the same prefix; and
        it is faster here (1,000 tokens, both paths in one process: 2.3-2.4 s against 3.9-4.0 s
        on the torch path)."""
        model = self.model
        cpu_step = model.cpu_step  # where the compute plan's step is "c"
        if cpu_step is None:
            return None
        return cpu_step.try_forward(model.model.embed_tokens, batch, self.kv)


def top_k_ids(logits: torch.Tensor, k: int) -> torch.Tensor:
    """``[R, k]`` ids of each row's k largest logits, descending, ties to the lower id."""
    if k == 0:
        return torch.empty((logits.shape[0], 0), dtype=torch.int64, device=logits.device)
    vals, idx = torch.topk(logits, k, dim=1)
    # topk's order among equal values is unspecified: sort by id, then stably by value.
    idx, perm = idx.sort(dim=1)
    vals = vals.gather(1, perm)
    ids = idx.gather(1, vals.sort(dim=1, descending=True, stable=True).indices)
    # Where a run of equal logits straddles the k-th place, topk may have kept higher ids.
    kth = vals.min(dim=1, keepdim=True).values
    for r in ((logits >= kth).sum(dim=1) > k).nonzero().flatten().tolist():
        cand = (logits[r] >= kth[r]).nonzero().flatten()  # ascending ids
        ids[r] = cand[logits[r, cand].sort(descending=True, stable=True).indices[:k]]
    return ids


def score_rows(logits: torch.Tensor, observed: torch.Tensor, top_k: int) -> list[PositionScore]:
    """Score ``observed[i]`` against float32 raw logits row ``i`` (``logits`` is ``[R, vocab]``)."""
    obs = observed.to(torch.int64).view(-1, 1)
    logprobs = torch.log_softmax(logits, dim=-1)
    obs_logit = logits.gather(1, obs)
    rank = (logits >= obs_logit).sum(dim=1)
    ids = top_k_ids(logits, top_k)
    if top_k > 0:
        hit = ids == obs
        place = hit.to(torch.int64).argmax(dim=1) + 1
        rank = torch.where(hit.any(dim=1), place, rank)
    obs_lp = logprobs.gather(1, obs).flatten().tolist()
    top_lp = logprobs.gather(1, ids).tolist()
    return [
        PositionScore(token_id=t, logprob=lp, rank=rk, top_ids=tids, top_logprobs=tlps)
        for t, lp, rk, tids, tlps in zip(obs.flatten().tolist(), obs_lp, rank.tolist(),
                                         ids.tolist(), top_lp, strict=True)
    ]
