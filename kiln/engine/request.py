"""A request through the engine (as vLLM v1's ``request.py``): what the HTTP handlers hand to
the engine (``Request`` and its ``SamplingParams``; not wire types) and its mutable state in the
scheduler (``RequestState``, engine thread only). The priority policy over them is
``kiln.engine.priority``'s. Pure Python, like the scheduler.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kiln.engine.block_pool import ROOT_HASH, block_hashes, salted_root
from kiln.engine.lora_mix import LoraMix, mix_root_hash
from kiln.engine.outputs import RequestMetrics, RequestOutput, ScheduledSeq
from kiln.engine.repetition import RepetitionDetection
from kiln.engine.speculative import DraftLength
from kiln.text.thinking_budget import ThinkingBudgetController

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


# -- the values the float32 samplers are given (the torch and C engines alike) -------------------
LOGPROB_FLOOR = -9999.0  # OpenAI's: a named token that cannot be sampled (JSON has no -inf)


def parameters(seqs: Sequence[ScheduledSeq]
               ) -> tuple[list[tuple[float, ...]], list[tuple[int, int, int]]]:
    """Per row, the FLOAT_COLUMNS and the INT_COLUMNS values (seeds as they are: any int, of
    which the samplers take the low 64 bits)."""
    return [_float_values(s.sampling) for s in seqs], [(s.sampling.top_k, s.seed, s.step)
                                                        for s in seqs]


# The samplers work in float32, a request's values are float64 (JSON's numbers reach ~1.8e308).
# Past float32's range a value became inf there: a temperature made NaN of a masked token's
# -inf logit (-inf / inf, NaN logprobs), a min_p or a repetition penalty read as "off" (not
# finite). float32's largest carries each with its meaning. A positive repetition penalty below
# 2^-80 is 2^-80: a seen token's positive logit is divided by it and then by the temperature
# (at least 1e-5 > 2^-17 unless greedy), and for logits below 2^30 (no model's come near)
# 2^30 * 2^80 * 2^17 = 2^127 stays under float32's largest, where a smaller penalty made +inf
# (NaN logprobs again). Either way the largest such logit takes the whole row, as the limit does.
F32_MAX = float.fromhex("0x1.fffffep+127")  # float32's largest
MIN_REPETITION = 2.0 ** -80


def _float_values(p: SamplingParams) -> tuple[float, ...]:
    """A row's FLOAT_COLUMNS values, as the float32 samplers are given them."""
    r = p.repetition_penalty
    r = min(max(r, MIN_REPETITION), F32_MAX) if r > 0 else r  # <= 0: off (Kiln's rule)
    return (min(p.temperature, F32_MAX), _top_p(p.top_p), min(p.min_p, F32_MAX),
            p.presence_penalty, p.frequency_penalty, r)


# The smallest top_p the float32 kernels are given: a positive top_p below it (1e-300 rounds to
# 0.0 in float32, which means "off") keeps the top token, as any top_p under p_max >= 1/V does.
MIN_TOP_P = 1e-30


def _top_p(top_p: float) -> float:
    return MIN_TOP_P if 0.0 < top_p < MIN_TOP_P else top_p


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


# -- a request's state in the scheduler ------------------------------------------------------------
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
    # [version, start, end) per run of output tokens made by one set of weights (WeightSpan)
    weight_spans: list[list[Any]] = field(default_factory=list)
    # False once the weights changed under this request's computed KV (a keep-mode update):
    # its later full blocks hold KV of two weights and are never offered to the prefix cache
    cacheable: bool = True
    # speculative decoding: this request's draft length, made on its first drafted step
    draft_length: DraftLength | None = None

    def __post_init__(self) -> None:
        self.all_token_ids = list(self.request.prompt_token_ids)
        mix = self.request.lora
        self.root_hash = salted_root(mix_root_hash(mix) if mix else ROOT_HASH,
                                     self.request.cache_salt)
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

    def scheduled(self, n: int, is_new: bool, now: float, draft: Sequence[int] = ()
                  ) -> ScheduledSeq:
        """This request's part of a step: its next ``n`` tokens to compute, and after them
        ``draft``, tokens to verify (kiln.engine.speculative)."""
        start = self.num_computed_tokens
        if self.metrics.prefill_start_time is None:
            self.metrics.prefill_start_time = now
        return ScheduledSeq(
            request_id=self.request_id,
            token_ids=self.all_token_ids[start:start + n] + list(draft),
            start_pos=start,
            block_table=list(self.block_ids),
            sample=start + n == self.num_tokens,
            is_new=is_new,
            sampling=self.request.sampling,
            seed=self.seed,
            step=len(self.output_token_ids),
            prompt_token_ids=self.request.prompt_token_ids,
            output_token_ids=self.output_token_ids,  # read-only until update_from_output
            lora=self.request.lora,
            draft=tuple(draft),
        )

    def drop_tail(self, n: int) -> None:
        """Forget the last ``n`` output tokens (a verify step made them past a stop string)."""
        keep = len(self.output_token_ids) - n
        del self.output_token_ids[keep:], self.output_logprobs[keep:], self.output_forced[keep:]
        del self.all_token_ids[len(self.all_token_ids) - n:]
        del self.metrics.token_times[len(self.metrics.token_times) - n:]
        del self.metrics.token_phases[len(self.metrics.token_phases) - n:]
        spans = [s for s in self.weight_spans if s[1] < keep]
        for s in spans:
            s[2] = min(s[2], keep)
        self.weight_spans = spans

    def note_weights(self, version: str) -> None:
        """The weights named ``version`` made this request's latest output token."""
        n = len(self.output_token_ids)
        spans = self.weight_spans
        if spans and spans[-1][0] == version:
            spans[-1][2] = n
        else:
            spans.append([version, spans[-1][2] if spans else 0, n])

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
