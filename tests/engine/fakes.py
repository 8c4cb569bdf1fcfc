"""A fake model runner that really uses the paged KV layout.

It writes each computed token into its slot of a simulated KV cache and predicts the next token
from the context it *reads back* through the block table, so wrong block tables, stale prefix
hits or lost tokens after preemption change the generated tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from kiln.engine.lora_mix import LoraMix
from kiln.engine.outputs import ModelRunnerOutput, SampledToken, SchedulerOutput

if TYPE_CHECKING:
    from kiln.engine.block_pool import BlockPool
    from kiln.engine.scoring import ScoringJob
    from kiln.model.native.plan import ComputePlan

VOCAB = 50


class NoModel:
    """The rest of ``kiln.engine.executor.Executor`` for a double without a model: no plan, no
    KV geometry, no drafts verified, no scoring and no weights (TypeError, as a real engine
    answers a request it cannot serve with an error)."""

    plan: ComputePlan | None = None
    kv_bytes_per_block: int | None = None
    kv_on_demand = False
    verifies_drafts = False

    def release(self, request_ids: list[str]) -> None:
        pass

    def release_kv(self) -> int:
        return 0

    def drop_weights(self) -> None:
        raise TypeError("this executor holds no weights")

    def swap_weights(self, model: Any) -> None:
        raise TypeError("this executor holds no weights")

    def scoring_job(self, pool: BlockPool, prompt_ids: Sequence[int], top_k: int,
                    mix: LoraMix = ()) -> ScoringJob:
        raise TypeError("scoring needs an engine over a model runner")


class FakeRunner(NoModel):
    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.block_size = block_size
        self.kv: list[int | None] = [None] * (num_blocks * block_size)
        self.steps: list[SchedulerOutput] = []
        self.fail_next = False

    def execute(self, so: SchedulerOutput) -> ModelRunnerOutput:
        self.steps.append(so)
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("boom")
        bs = self.block_size
        sampled: dict[str, SampledToken] = {}
        for seq in so.seqs:
            for i, tok in enumerate(seq.token_ids):
                pos = seq.start_pos + i
                self.kv[seq.block_table[pos // bs] * bs + pos % bs] = tok
            if not seq.sample:
                continue
            end = seq.start_pos + len(seq.token_ids)
            context = [self.kv[seq.block_table[p // bs] * bs + p % bs] for p in range(end)]
            assert None not in context, "read an unwritten KV slot"
            tok = next_token([int(t) for t in context if t is not None], seq.seed, seq.step)
            sampled[seq.request_id] = SampledToken(tok, -0.5)
        return ModelRunnerOutput(sampled)


def next_token(context: list[int], seed: int, step: int) -> int:
    return (sum((i + 1) * t for i, t in enumerate(context)) * 31 + seed * 7 + step) % VOCAB


class CharDetok:
    """Token t decodes to chr(ord('a') + t % 26); pushes are immediate."""

    def push(self, token_id: int) -> str:
        return chr(ord("a") + token_id % 26)

    def flush(self) -> str:
        return ""


class ScriptRunner(NoModel):
    """Samples request ``rid``'s script[step] (its output position); with CharDetok, token t reads
    chr(ord('a') + t)."""

    def __init__(self, scripts: dict[str, list[int]]) -> None:
        self.scripts = scripts

    def execute(self, so: SchedulerOutput) -> ModelRunnerOutput:
        return ModelRunnerOutput({s.request_id: SampledToken(self.scripts[s.request_id][s.step],
                                                             -1.0)
                                  for s in so.seqs if s.sample})
