"""The scheduler's mutable per-request state (engine thread only)."""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from kiln.engine.block_pool import ROOT_HASH, block_hashes, salted_root
from kiln.engine.lora_mix import mix_root_hash
from kiln.engine.outputs import RequestMetrics, RequestOutput
from kiln.engine.request import Request
from kiln.text.thinking_budget import ThinkingBudgetController


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class RequestState:
    request: Request
    max_tokens: int  # clamped to the context window
    seed: int
    block_size: int
    status: Status = Status.WAITING
    all_token_ids: list[int] = field(default_factory=list)  # prompt + outputs
    output_token_ids: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    output_forced: list[bool] = field(default_factory=list)  # forced by the thinking budget
    num_computed_tokens: int = 0  # tokens whose KV is in the cache
    num_cached_tokens: int = -1  # prefix-cache hit at first admission (-1: not admitted yet)
    block_ids: list[int] = field(default_factory=list)
    block_hashes: list[int] = field(default_factory=list)  # hash chain of full blocks
    num_registered_blocks: int = 0  # leading blocks already in the prefix cache
    preempted_since_token: bool = False
    metrics: RequestMetrics = field(init=False)
    # The budget's state lives here, so it survives preemption (outputs are kept, KV recomputed).
    thinking: ThinkingBudgetController | None = field(init=False, default=None)
    # Parent of the first block's hash: ROOT_HASH for the base model, a hash of the LoRA mix
    # otherwise, so KV computed under one mix is never reused under another. (The pool's
    # collision key of block 0 keeps ROOT_HASH as its parent, as BlockPool.lookup expects.)
    root_hash: int = field(init=False, default=ROOT_HASH)

    def __post_init__(self) -> None:
        self.all_token_ids = list(self.request.prompt_token_ids)
        self.root_hash = salted_root(mix_root_hash(self.request.lora), self.request.cache_salt)
        self.block_hashes = block_hashes(self.all_token_ids, self.block_size,
                                         parent=self.root_hash)
        self.metrics = RequestMetrics(arrival_time=self.request.arrival_time)
        spec = self.request.sampling.thinking
        if spec is not None:
            self.thinking = ThinkingBudgetController(
                spec.close_ids, spec.max_tokens, spec.max_time_ms, self.max_tokens)

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.request.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_remaining(self) -> int:
        """Known tokens whose KV is not computed yet (1 for a decoding request)."""
        return self.num_tokens - self.num_computed_tokens

    @property
    def is_decoding(self) -> bool:
        return self.num_remaining == 1 and bool(self.output_token_ids)

    def accept(self, candidate: int, logprob: float, now_ms: float) -> tuple[int, float, bool]:
        """Run the thinking budget on a sampled candidate and append what it emits.

        -> (token, logprob, forced); a forced token's logprob is 0.0 (it was not sampled).
        """
        token, forced = candidate, False
        if self.thinking is not None:
            token, forced = self.thinking.decide(self.output_token_ids, candidate, now_ms)
        if forced:
            logprob = 0.0
        self.append_output(token, logprob, forced)
        return token, logprob, forced

    def append_output(self, token_id: int, logprob: float, forced: bool = False) -> None:
        self.all_token_ids.append(token_id)
        self.output_token_ids.append(token_id)
        self.output_logprobs.append(logprob)
        self.output_forced.append(forced)
        bs = self.block_size
        if self.num_tokens % bs == 0:
            parent = self.block_hashes[-1] if self.block_hashes else self.root_hash
            self.block_hashes.extend(
                block_hashes(self.all_token_ids, bs, len(self.block_hashes), parent))

    def parent_hash(self, block_index: int) -> int:
        return self.block_hashes[block_index - 1] if block_index > 0 else ROOT_HASH

    def block_tokens(self, block_index: int) -> list[int]:
        bs = self.block_size
        return self.all_token_ids[block_index * bs:(block_index + 1) * bs]

    def output(self, new: tuple[Sequence[int], Sequence[float], Sequence[bool]],
               reason: str | None, stop_reason: str | int | None,
               clock: Callable[[], float]) -> RequestOutput:
        """This request's output for a step: ``new`` tokens (ids, behaviour logprobs, forced),
        finished when ``reason`` is set; no text (the output stage's)."""
        return RequestOutput(
            request_id=self.request_id,
            new_token_ids=list(new[0]),
            new_logprobs=list(new[1]),
            new_forced=list(new[2]),
            text_delta="",
            finished=reason is not None,
            finish_reason=reason,
            stop_reason=stop_reason,
            num_prompt_tokens=self.num_prompt_tokens,
            num_output_tokens=len(self.output_token_ids),
            num_cached_tokens=max(0, self.num_cached_tokens),
            seed=self.seed,
            metrics=self.metrics if reason is not None else None,
            ready_time=self.metrics.token_times[-1] if self.metrics.token_times else clock(),
        )
