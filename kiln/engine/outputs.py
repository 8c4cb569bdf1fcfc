"""The records at the engine's seams: scheduler -> runner -> scheduler -> handlers."""

from __future__ import annotations

from dataclasses import dataclass, field

from kiln.engine.lora_mix import LoraMix
from kiln.engine.metrics import RequestMetrics
from kiln.engine.request import SamplingParams
from kiln.text.budget import Outcome


@dataclass(frozen=True)
class ScheduledSeq:
    """One sequence's work in a step: compute ``token_ids`` at positions start_pos.. onwards.

    ``is_new`` is True when the request was (re)admitted this step. When ``sample`` is True the
    step completes the sequence's known tokens and the runner samples its next token.
    """

    request_id: str
    token_ids: list[int]
    start_pos: int
    block_table: list[int]
    sample: bool
    is_new: bool
    sampling: SamplingParams
    seed: int
    step: int  # number of output tokens so far (the sampler's counter)
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    lora: LoraMix = ()  # the request's adapters and scales (empty: base model)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


@dataclass(frozen=True)
class SchedulerOutput:
    seqs: list[ScheduledSeq]
    block_size: int
    num_batched_tokens: int  # total tokens computed this step (<= max_num_batched_tokens)
    preempted_ids: list[str] = field(default_factory=list)

    @property
    def is_empty(self) -> bool:
        return not self.seqs

    @property
    def num_prefill_tokens(self) -> int:
        return sum(s.num_tokens for s in self.seqs if not (s.sample and s.num_tokens == 1))


@dataclass(frozen=True)
class PositionScore:
    """One scored prompt position (prompt-logprob scoring): the observed token, its float32
    log-softmax value and full-vocabulary rank, and the top-k ids by raw logit with theirs."""

    token_id: int
    logprob: float
    rank: int
    top_ids: list[int]
    top_logprobs: list[float]


@dataclass(frozen=True)
class TokenLogprobs:
    """A generated token's logprob and its most likely alternatives (ids descending by
    logprob, ties to the lower id), under the distribution the sampler used."""

    logprob: float
    top_ids: tuple[int, ...]
    top_logprobs: tuple[float, ...]


@dataclass(frozen=True)
class SampledToken:
    token_id: int
    logprob: float
    top: TokenLogprobs | None = None  # when the request asked for logprobs


@dataclass(frozen=True)
class ModelRunnerOutput:
    """Sampled token + behaviour logprob for every sequence of the step that reached sampling,
    or, for a sequence whose logits were not finite, why it could not sample."""

    sampled: dict[str, SampledToken]
    errors: dict[str, str] = field(default_factory=dict)


@dataclass
class RequestOutput:
    """One per engine step per request that made progress (and always one final output)."""

    request_id: str
    new_token_ids: list[int]
    new_logprobs: list[float]  # behaviour logprob per new token (0.0 for a forced token)
    text_delta: str
    finished: bool
    finish_reason: str | None  # "stop" | "length" | "abort" | "error" | None
    stop_reason: str | int | None
    num_prompt_tokens: int
    num_output_tokens: int
    num_cached_tokens: int
    seed: int
    metrics: RequestMetrics | None  # set on the final output
    error: str | None = None
    # Per new token: forced by the thinking budget (not sampled; its logprob is meaningless).
    new_forced: list[bool] = field(default_factory=list)
    thinking_outcome: Outcome | None = None  # on the final output when a budget applied
    # Per new token when the request asked for logprobs (None for a token the thinking budget
    # forced: it was not sampled from any distribution)
    new_top_logprobs: list[TokenLogprobs | None] = field(default_factory=list)
    # time.monotonic() when the engine produced these tokens: the instant the request's
    # metrics recorded the last of them, so token timings and TTFT/ITL agree
    ready_time: float | None = None
