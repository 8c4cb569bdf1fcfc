"""The records at the engine's seams: scheduler -> runner -> scheduler -> handlers, the
timing record each request carries out (``RequestMetrics``), and ``RequestStream``, the one
async iterator between an engine request and its caller.

Timing: filled by the scheduler on the engine thread; all times are ``time.monotonic()``
seconds. Enough to derive queue time, TTFT, prefill and decode durations, inter-token latency
percentiles and stalls (the contract's latency diagnostics).

The stream: the engine fills a request's queue from its thread; the caller (a handler, a test, a
bench) iterates the stream until the output that is ``finished``. Closing the stream early, even
before iterating, or cancelling a wait for its next output, aborts the request; callbacks added
with ``on_close`` (a handler's admission slot) run once, when the stream ends or is closed.
"""

from __future__ import annotations

import asyncio
import itertools
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kiln.engine.lora_mix import LoraMix
from kiln.text.thinking import Outcome

if TYPE_CHECKING:  # kiln.engine.request imports this module's records
    from kiln.engine.request import SamplingParams

# A gap >= max(STALL_FLOOR_S, STALL_FACTOR x median ITL) is a stall (docs/behavior.md §13).
STALL_FACTOR = 5.0
STALL_FLOOR_S = 0.25

# Phase tags recorded with every token (what the engine did in the step that produced it).
PHASE_DECODE = "decode"  # a pure decode step
PHASE_PREFILL = "prefill_interference"  # the step also ran prefill chunks
PHASE_PREEMPTED = "preemption_recompute"  # this request was preempted since its last token


@dataclass(frozen=True)
class Stall:
    token_index: int  # index of the token that arrived late
    gap_s: float
    phase: str


@dataclass
class RequestMetrics:
    arrival_time: float
    admitted_time: float | None = None  # accepted by the engine thread
    first_scheduled_time: float | None = None
    prefill_start_time: float | None = None
    prefill_end_time: float | None = None
    first_token_time: float | None = None
    finished_time: float | None = None
    token_times: list[float] = field(default_factory=list)
    token_phases: list[str] = field(default_factory=list)
    num_preemptions: int = 0
    stalls: list[Stall] = field(default_factory=list)

    @property
    def queue_time(self) -> float | None:
        if self.first_scheduled_time is None:
            return None
        return self.first_scheduled_time - self.arrival_time

    @property
    def ttft(self) -> float | None:
        if self.first_token_time is None:
            return None
        return self.first_token_time - self.arrival_time

    @property
    def prefill_time(self) -> float | None:
        if self.prefill_start_time is None or self.prefill_end_time is None:
            return None
        return self.prefill_end_time - self.prefill_start_time

    @property
    def decode_time(self) -> float | None:
        if self.first_token_time is None or not self.token_times:
            return None
        return self.token_times[-1] - self.first_token_time

    @property
    def inter_token_latencies(self) -> list[float]:
        t = self.token_times
        return [b - a for a, b in itertools.pairwise(t)]

    def itl_percentile(self, q: float) -> float | None:
        """R-7 (linear interpolation) percentile of the inter-token gaps, q in [0, 1]."""
        return percentile(self.inter_token_latencies, q)

    def record_step_token(self, now: float, step_had_prefill: bool, preempted: bool) -> None:
        """A token from a step that did (or did not) also run prefill chunks, its request
        preempted (or not) since its last token: recorded with the phase that says so."""
        phase = PHASE_PREFILL if step_had_prefill else PHASE_DECODE
        self.record_token(now, PHASE_PREEMPTED if preempted else phase)

    def record_token(self, now: float, phase: str) -> None:
        if self.first_token_time is None:
            self.first_token_time = now
        self.token_times.append(now)
        self.token_phases.append(phase)

    @property
    def stall_threshold(self) -> float | None:
        """max(250 ms, 5 x the median gap); None without gaps."""
        median = percentile(self.inter_token_latencies, 0.5)
        return None if median is None else max(STALL_FLOOR_S, STALL_FACTOR * median)

    def finalize(self, now: float) -> None:
        """Close the record: finish time and stalls (gaps at or above ``stall_threshold``)."""
        self.finished_time = now
        threshold = self.stall_threshold
        self.stalls = []
        if threshold is None:
            return
        for i, gap in enumerate(self.inter_token_latencies):
            if gap >= threshold:
                self.stalls.append(Stall(i + 1, gap, self.token_phases[i + 1]))


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    xs = sorted(values)
    h = (len(xs) - 1) * q
    lo = math.floor(h)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (h - lo) * (xs[hi] - xs[lo])


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
    # speculative decoding (kiln.engine.speculative): drafted tokens after the sequence's last
    # one, the tail of ``token_ids``; every row of the step is sampled to verify them
    draft: tuple[int, ...] = ()

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
    # a drafted sequence's samples, one per row (its last token's, then each draft token's),
    # up to the first row whose logits were not finite; the scheduler keeps the verified prefix.
    # A drafted sequence without an entry was run plainly (its drafts dropped).
    verified: dict[str, tuple[SampledToken, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class WeightSpan:
    """Output tokens ``[start, end)`` of a request were generated by the weights named
    ``version`` (vLLM's ``weight_versions`` spans): one span, unless the request ran across a
    weight update in keep mode (``AsyncEngine.update_weights``)."""

    version: str
    start: int
    end: int


def trimmed(spans: tuple[WeightSpan, ...], n: int) -> tuple[WeightSpan, ...]:
    """``spans`` over the first ``n`` output tokens only."""
    return tuple(WeightSpan(s.version, s.start, min(s.end, n)) for s in spans if s.start < n)


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
    # on the final output: which weights generated which output tokens, and the version that
    # served the request (the last span's, or the engine's at the end when no token was made)
    weight_spans: tuple[WeightSpan, ...] = ()
    weight_version: str | None = None


class RequestStream:
    """``next_output`` awaits the request's next output (the engine: its queue's ``get``);
    ``abort`` ends the request early (sync, any thread); ``close_source`` (optional) is awaited
    by ``aclose`` for a source that must be closed itself (an async generator)."""

    def __init__(self, request_id: str, next_output: Callable[[], Awaitable[RequestOutput]],
                 abort: Callable[[str], None] | None = None,
                 close_source: Callable[[], Awaitable[None]] | None = None) -> None:
        self.request_id = request_id
        self._next = next_output
        self._abort = abort
        self._close_source = close_source
        self._finished = False  # the finished output was handed out
        self._closed = False
        self._on_close: list[Callable[[], None]] = []

    @classmethod
    def over_queue(cls, request_id: str, queue: asyncio.Queue[RequestOutput],
                   abort: Callable[[str], None]) -> RequestStream:
        return cls(request_id, queue.get, abort)

    def on_close(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once, when the stream ends or is closed (at once if it is)."""
        if self._closed:
            callback()
        else:
            self._on_close.append(callback)

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> RequestOutput:
        if self._finished or self._closed:
            self.close_now()
            raise StopAsyncIteration
        try:
            out = await self._next()
        except StopAsyncIteration:  # a source that ended without a finished output
            self._finished = True
            self.close_now()
            raise
        except asyncio.CancelledError:  # the caller gave up waiting: nobody reads on
            self.close_now()
            raise
        self._finished = out.finished
        return out

    def close_now(self) -> None:
        """Abort the request unless it finished, and run the close callbacks (idempotent)."""
        if self._closed:
            return
        self._closed = True
        if not self._finished and self._abort is not None:
            self._abort(self.request_id)
        callbacks, self._on_close = self._on_close, []
        for callback in callbacks:
            callback()

    async def aclose(self) -> None:
        self.close_now()
        close, self._close_source = self._close_source, None
        if close is not None:
            await close()
