"""Internal engine requests: what the HTTP handlers hand to the engine (not wire types)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from kiln.engine.lora_mix import LoraMix
from kiln.engine.repetition import RepetitionDetection

# Below this temperature a row takes the argmax: the samplers' own threshold
# (kiln_kernels/sampling/reference.py, sample.c; tests/engine/test_greedy.py keeps them equal), so
# 0, a negative temperature and one too small to divide by are greedy alike.
GREEDY_TEMPERATURE = 1e-5


def is_greedy(temperature: float, top_k: int) -> bool:
    """docs/behavior.md §5.2: the one greedy predicate, for the handlers (which take a greedy
    request's penalties from its own fields only) and the sampler (which takes its argmax)."""
    return temperature < GREEDY_TEMPERATURE or top_k == 1


@dataclass(frozen=True)
class ThinkingBudgetSpec:
    """A thinking budget that applies to this request (the handler decides; docs/behavior.md §3.2).

    ``close_ids`` is the tokenizer's encoding of ``</think>``; a limit of None is unlimited.
    """

    close_ids: tuple[int, ...]
    max_tokens: int | None = None
    max_time_ms: int | None = None

    def __post_init__(self) -> None:
        if not self.close_ids:
            raise ValueError("thinking close sequence must not be empty")
        if self.max_tokens is not None and self.max_tokens < 0:
            raise ValueError("thinking max_tokens must be >= 0")
        if self.max_time_ms is not None and self.max_time_ms < 0:
            raise ValueError("thinking max_time_ms must be >= 0")


@dataclass(frozen=True)
class GrammarSpec:
    """A constraint on the generated text: an llguidance grammar (the handler built and
    compiled it once, so it is known to be valid), enforced by a token mask in the sampler.

    ``after``: token ids (the reasoning close ``</think>``) that must appear in the output before
    the constraint starts; empty: it starts with the first token. ``param``: the request field
    that asked for it (named in errors).
    """

    grammar: str
    after: tuple[int, ...] = ()
    param: str = "response_format"

    def __post_init__(self) -> None:
        if not self.grammar:
            raise ValueError("a grammar must not be empty")


@dataclass(frozen=True)
class SamplingParams:
    """Per-request generation settings (already resolved from presets by the handler)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    max_tokens: int = 2048
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    seed: int | None = None
    thinking: ThinkingBudgetSpec | None = None  # only when a budget applies
    # Logprobs of each generated token and of its `logprobs` most likely alternatives, from
    # the distribution the sampler used (after penalties and temperature); None: not wanted.
    logprobs: int | None = None
    # vLLM's logprob_token_ids: these ids' logprobs at each position instead of the top `logprobs`
    logprob_token_ids: tuple[int, ...] | None = None
    stop_token_ids: tuple[int, ...] = ()  # generating one of these stops (stop_reason: the id)
    # vLLM's logits processors, applied to the raw logits before penalties and sampling:
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias added to its logit)
    allowed_token_ids: tuple[int, ...] | None = None  # only these can be sampled
    min_tokens: int = 0  # until this many tokens are out, min_tokens_ids cannot be sampled
    min_tokens_ids: tuple[int, ...] = ()  # EOS (unless ignore_eos) and stop_token_ids
    # vLLM's bad_words as token ids: a word's last id is banned while the output ends with the
    # ids before it (a one-token word always)
    bad_words_ids: tuple[tuple[int, ...], ...] = ()
    grammar: GrammarSpec | None = None  # structured output / forced tool call (a token mask)
    repetition_detection: RepetitionDetection | None = None  # stop a looping output early
    skip_special_tokens: bool = True  # special tokens make no text
    spaces_between_special_tokens: bool = True  # kept special tokens: a space beside each

    def __post_init__(self) -> None:
        if self.max_tokens < 0:
            raise ValueError("max_tokens must be >= 0")
        if self.logprobs is not None and self.logprobs < 0:
            raise ValueError("logprobs must be >= 0")

    @property
    def processes_logits(self) -> bool:
        return bool(self.logit_bias) or self.allowed_token_ids is not None or (
            self.min_tokens > 0 and bool(self.min_tokens_ids)) or bool(self.bad_words_ids)

    @property
    def greedy(self) -> bool:
        return is_greedy(self.temperature, self.top_k)

    @property
    def uses_penalties(self) -> bool:
        return (
            self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
            or self.repetition_penalty != 1.0
        )


@dataclass
class Request:
    request_id: str
    prompt_token_ids: list[int]
    sampling: SamplingParams
    arrival_time: float = field(default_factory=time.monotonic)
    # LoRA adapters and scales (empty: the base model). The adapter objects themselves, so the
    # request keeps the weights it started with even if the adapter is reloaded or deleted.
    lora: LoraMix = ()
    # vLLM's cache_salt: requests with different salts never share prefix-cache blocks.
    cache_salt: str | None = None
    priority: int = 0  # vLLM's: lower is scheduled (and kept running) first
