"""Speculative decoding that changes nothing but the speed: drafts, and the rule that verifies
them.

The C step computes each row of a step from its own position and context alone, so the logits
of a position verified in a multi-row step are the plain decode step's bit for bit, and the
sampler draws a position's token from a counter hash of (seed, output index, ...) with the
request's own penalty history. Verifying a draft therefore means: run the decoding request's
last token and its k drafted tokens as one step, sample every row exactly as plain decoding would
sample that position (its output index as the counter, the output so far plus the drafts before
it as history), and keep the sampled tokens while each equals the draft it checks. The tokens
kept are the tokens plain decoding would have made, one after another; the first sample that
differs from its draft is kept too (plain decoding makes it there), and the rest is dropped.

Drafts come from n-gram (prompt) lookup over the request's own tokens (``ngram``): the longest
recent n-gram (``prompt_lookup_max`` down to ``prompt_lookup_min`` tokens) that ends the
sequence and occurred before proposes the tokens that followed it; or from a draft model with
the same tokenizer (``draft_model``: ``kiln.engine.draft_model``), greedily, for every drafting
request of a step at once. ``DraftLength`` follows each request's
acceptance, and ``Speculation`` (the scheduler's side, at the end) decides which requests draft
at all (only plain decoding rows the runner verifies; any other request decodes as before) and
counts what verify steps kept.

The configuration is vLLM's ``--speculative-config`` JSON (``{"method": "ngram",
"num_speculative_tokens": K, "prompt_lookup_max": N, "prompt_lookup_min": M}``, or
``{"method": "draft_model", "model": PATH, "num_speculative_tokens": K}``); the MTP kind is
refused until it is built.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kiln.engine.outputs import ModelRunnerOutput, SampledToken, ScheduledSeq, SchedulerOutput

if TYPE_CHECKING:
    from kiln.engine.draft_model import ModelDrafter
    from kiln.engine.request import RequestState

METHODS = ("ngram", "draft_model")
# the keys each method takes besides "method"
KEYS = {"ngram": ("num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min"),
        "draft_model": ("model", "num_speculative_tokens")}
NOT_BUILT = ("mtp", "eagle", "eagle3", "medusa", "suffix")
MAX_SPECULATIVE_TOKENS = 16
LOOKBACK = 4096  # tokens searched for an earlier occurrence of the tail n-gram
# A step's rows beyond which no draft is added: on the CPU a row is not free (a step of 4
# decodes and 8 prefill rows takes ~1.9x a decode-only step, kiln.engine.config), so drafts pay
# where a step has few rows and cost where it is full. Measured on the default model, 2 cores
# (python -m bench.bench_speculative): with drafts on every one of 8 streams, retrieval ran at
# 0.89x and free chat at 0.92x of plain decoding; a single stream's editing at 2.33x.
DRAFT_ROWS = 8


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str = "ngram"
    num_speculative_tokens: int = 4
    prompt_lookup_max: int = 4
    prompt_lookup_min: int = 2
    model: str | None = None  # draft_model: the draft model's location (load_model's)

    @classmethod
    def parse(cls, text: str | Mapping[str, Any]) -> SpeculativeConfig:
        """vLLM's ``--speculative-config`` (a JSON object, or its dict). ValueError, naming the
        key, for anything this server cannot honour."""
        try:
            spec = json.loads(text) if isinstance(text, str) else dict(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"--speculative-config is not JSON: {exc}") from None
        if not isinstance(spec, dict):
            raise ValueError("--speculative-config must be a JSON object")
        method = spec.pop("method", "ngram")
        if method in NOT_BUILT:
            raise ValueError(f"--speculative-config method {method!r} is not built; "
                             f"only {', '.join(METHODS)}")
        if method not in METHODS:
            raise ValueError(f"--speculative-config method {method!r} is unknown; "
                             f"use {', '.join(METHODS)}")
        known = set(KEYS[method])
        unknown = sorted(set(spec) - known)
        if unknown:
            raise ValueError(f"--speculative-config {unknown[0]!r} is not supported "
                             f"({method} takes {', '.join(sorted(known))})")
        model = spec.pop("model", None)
        if method == "draft_model" and (not isinstance(model, str) or not model.strip()):
            raise ValueError("--speculative-config draft_model needs \"model\": the draft "
                             "model's path or name (a GGUF with the served model's tokenizer)")
        ints = {}
        for key in sorted(known - {"model"}):
            if key in spec:
                value = spec[key]
                if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                    raise ValueError(f"--speculative-config {key} must be a positive integer, "
                                     f"got {value!r}")
                ints[key] = value
        out = cls(method=method, model=model, **ints)
        if out.num_speculative_tokens > MAX_SPECULATIVE_TOKENS:
            raise ValueError(f"--speculative-config num_speculative_tokens is at most "
                             f"{MAX_SPECULATIVE_TOKENS}, got {out.num_speculative_tokens}")
        if out.prompt_lookup_min > out.prompt_lookup_max:
            raise ValueError("--speculative-config prompt_lookup_min must not exceed "
                             "prompt_lookup_max")
        return out

    def describe(self) -> str:
        if self.method == "draft_model":
            return f"draft_model (k={self.num_speculative_tokens}, model={self.model})"
        return (f"ngram (k={self.num_speculative_tokens}, n={self.prompt_lookup_min}.."
                f"{self.prompt_lookup_max})")


def ngram_draft(tokens: Sequence[int], k: int, n_min: int, n_max: int) -> list[int]:
    """Up to ``k`` tokens that followed the latest earlier occurrence of the longest n-gram
    (``n_max`` down to ``n_min`` tokens) that ends ``tokens``; empty when none occurred."""
    size = len(tokens)
    if k <= 0 or size < n_min + 1:
        return []
    low = max(0, size - LOOKBACK)
    for n in range(min(n_max, size - 1), n_min - 1, -1):
        tail = list(tokens[size - n:])
        first = tail[0]
        # the latest start i < size - n with tokens[i:i+n] == tail
        for i in range(size - n - 1, low - 1, -1):
            if tokens[i] == first and list(tokens[i:i + n]) == tail:
                follow = list(tokens[i + n:i + n + k])
                if follow:
                    return follow
    return []


class DraftLength:
    """A request's draft length: it grows by one after a draft accepted whole and shrinks to the
    accepted length plus one after a miss, between 1 and ``k``; after ``misses`` drafts in a row
    accept nothing, the request stops drafting for ``rest`` decode steps (a step with drafts
    costs more rows than a plain one, so speculation that does not pay turns itself off)."""

    def __init__(self, k: int, misses: int = 3, rest: int = 16) -> None:
        self.k, self.length, self.misses, self.rest = k, k, misses, rest
        self._missed = 0
        self._resting = 0

    def wanted(self) -> int:
        """Tokens to draft this step (0: decode plainly)."""
        if self._resting:
            self._resting -= 1
            return 0
        return self.length

    def record(self, drafted: int, accepted: int) -> None:
        if drafted == 0:
            return
        if accepted == drafted:
            self.length = min(self.k, self.length + 1)
        else:
            self.length = max(1, accepted + 1)
        self._missed = self._missed + 1 if accepted == 0 else 0
        if self._missed >= self.misses:
            self._missed, self._resting = 0, self.rest


def drafts_allowed(request: Any) -> bool:
    """Whether a request's tokens may be drafted and verified: plain sampling, with logprobs
    (such a row's logits go through torch, kiln.engine.runner; the C step computed them) and stop
    strings (the output stage drops a verify step's tokens past the one that completed a
    string: kiln.engine.output_processor). Logits processors and adapters, a grammar's mask and
    a thinking budget's forced tokens follow each token one by one: such a request decodes as
    before."""
    sp = request.sampling
    return not (request.lora or sp.processes_logits or sp.grammar is not None
                or sp.thinking is not None)


def accepted_prefix(sampled: Sequence[int], draft: Sequence[int]) -> int:
    """How many sampled tokens a verify step keeps: samples while each equals the draft token it
    checks, then the first that differs (or the one after the whole draft). ``sampled`` may
    stop short of a sample per row (a row whose logits were not finite): at most its length."""
    n = 0
    while n < len(draft) and n < len(sampled) - 1 and sampled[n] == draft[n]:
        n += 1
    return min(n + 1, len(sampled))


def at_position(seq: ScheduledSeq, j: int) -> ScheduledSeq:
    """Row ``j`` of a drafted decode as plain decoding samples that position: its output index
    as the sampler's counter, the output so far plus the drafts before it as the history."""
    if j == 0:
        return seq
    return dataclasses.replace(seq, step=seq.step + j,
                               output_token_ids=[*seq.output_token_ids, *seq.draft[:j]])


def verified_output(rows: Sequence[ScheduledSeq], samples: Sequence[SampledToken],
                    errors: dict[str, str]) -> ModelRunnerOutput:
    """A drafted step's samples, one per row in step order (the rows ``at_position`` gave):
    each sequence's first as its sample, a drafted one's all (its verify rows) for the
    scheduler to keep the verified prefix of."""
    sampled: dict[str, SampledToken] = {}
    verified: dict[str, list[SampledToken]] = {}
    for row, tok in zip(rows, samples, strict=True):
        sampled.setdefault(row.request_id, tok)
        if row.draft:
            verified.setdefault(row.request_id, []).append(tok)
    return ModelRunnerOutput(sampled, errors, {k: tuple(v) for k, v in verified.items()})


class CostGate:
    """Whether drafting pays, measured: the seconds per generated token of decode-only steps
    with drafts (the draft model's proposals included) against those without, each a moving
    average. A draft model costs a forward pass per drafted token, so where it is not much
    cheaper than the served model (or its drafts are often rejected) a drafted step makes fewer
    tokens per second than a plain one, and the gate closes: decoding goes on plainly, with a
    drafted step every ``PROBE`` steps to see whether that changed (and, while open, a plain one
    every ``PROBE`` steps to keep the other side current). Until each side has ``WARM``
    measurements, drafted and plain steps alternate. Outputs are the same either way (the
    verification keeps plain decoding's tokens); only the speed depends on it."""

    WARM = 4
    PROBE = 32
    ALPHA = 0.25  # the moving averages' weight of the newest step

    def __init__(self) -> None:
        self.cost: dict[bool, float] = {}  # drafted? -> seconds per token
        self.seen = {True: 0, False: 0}
        self._step = 0
        self.closed_steps = 0  # steps the gate kept from drafting (diagnostics)

    def observe(self, drafted: bool, seconds_per_token: float) -> None:
        old = self.cost.get(drafted)
        self.cost[drafted] = seconds_per_token if old is None else (
            old + self.ALPHA * (seconds_per_token - old))
        self.seen[drafted] += 1

    def allow(self) -> bool:
        """Whether this step may draft (called once per scheduled step that could)."""
        self._step += 1
        if min(self.seen.values()) < self.WARM:
            return self._step % 2 == 1
        pays = self.cost[True] <= self.cost[False]
        probe = self._step % self.PROBE == 0
        allowed = pays != probe
        if not allowed:
            self.closed_steps += 1
        return allowed


class Speculation:
    """The scheduler's side of speculative decoding: which running decode drafts and how many
    tokens, and what a verify step kept, with vLLM's counters. Drafts are proposed only while
    the runner verifies them (``runner_verifies``: the engine loop sets it each step from its
    executor's ``verifies_drafts``)."""

    def __init__(self, config: SpeculativeConfig | None) -> None:
        self.config = config
        # draft_model: the draft model (kiln.engine.core.build_core loads it); ngram: None
        self.drafter: ModelDrafter | None = None
        self._prepared: dict[str, list[int]] = {}  # the draft model's drafts for this step
        self.gate = CostGate()  # whether the draft model's drafting pays (measured)
        self._scheduled_at = 0.0
        self.runner_verifies = False
        self.drafts = 0  # verify steps a request drafted in
        self.draft_tokens = 0
        self.accepted_tokens = 0

    def room(self, decodes: int) -> int:
        """The rows drafts may add to a step with ``decodes`` decoding rows (``DRAFT_ROWS``)."""
        return DRAFT_ROWS - decodes if self.config is not None else 0

    def _wanted(self, st: RequestState, budget: int, max_model_len: int) -> int:
        """How many tokens ``st`` drafts this step (0: none): only a request whose every token
        is plain sampling (no logits processors, grammar, thinking budget or adapter: those
        decode as before), within its max_tokens, the context window and ``budget``."""
        spec = self.config
        if spec is None or not self.runner_verifies or not drafts_allowed(st.request):
            return 0
        if st.draft_length is None:
            st.draft_length = DraftLength(spec.num_speculative_tokens)
        return max(0, min(st.draft_length.wanted(), budget - 1,
                          st.max_tokens - len(st.output_token_ids) - 1,
                          max_model_len - st.num_tokens - 1))

    def prepare(self, decodes: Sequence[RequestState], budget: int, max_model_len: int) -> None:
        """Before a step is scheduled: the draft model drafts for every decode that drafts this
        step, in one call (``ModelDrafter.propose``), within the step's room for draft rows;
        ``draft`` hands each its tokens: only where one request decodes (``CostGate`` decides
        whether that pays). Nothing to do for n-gram drafts (made one by one)."""
        self._prepared = {}
        # one decoding request at a time: a step of several already keeps the cores busy, and
        # each request's first drafts feed its whole context through the draft model first
        if self.drafter is None or len(decodes) != 1 or not self.gate.allow():
            return
        room = self.room(len(decodes))
        wants: list[tuple[str, list[int], int]] = []
        for st in decodes:
            if room <= 0:
                break
            k = self._wanted(st, min(budget, room + 1), max_model_len)
            if k > 0:
                wants.append((st.request_id, st.all_token_ids, k))
                room -= k
        self._prepared = self.drafter.propose(wants)

    def draft(self, st: RequestState, budget: int, max_model_len: int) -> list[int]:
        """Tokens to verify after decoding ``st``'s last one (see ``_wanted``): the draft
        model's, prepared for this step, or the n-gram lookup's."""
        if self.drafter is not None:
            return self._prepared.pop(st.request_id, [])[:max(0, budget - 1)]
        spec = self.config
        k = self._wanted(st, budget, max_model_len)
        if spec is None or k <= 0:
            return []
        return ngram_draft(st.all_token_ids, k, spec.prompt_lookup_min, spec.prompt_lookup_max)

    def scheduled(self, now: float) -> None:
        """A step is being scheduled at ``now`` (the scheduler's clock): its cost starts."""
        self._scheduled_at = now

    def observe(self, so: SchedulerOutput, tokens: int, now: float) -> None:
        """A step's outputs are in at ``now``: a decode-only step's seconds per token, drafted
        or not, for the draft model's gate."""
        if self.drafter is None or tokens <= 0 or so.num_prefill_tokens > 0:
            return
        self.gate.observe(any(s.draft for s in so.seqs), (now - self._scheduled_at) / tokens)

    def forget(self, request_id: str) -> None:
        """A finished request: the draft model's cache lets its blocks go."""
        if self.drafter is not None:
            self.drafter.forget(request_id)

    def kept(self, st: RequestState, seq: ScheduledSeq, samples: Sequence[SampledToken]) -> int:
        """How many of a verify step's ``samples`` plain decoding makes (the accepted drafts and
        the sample after them); counted, and fed to the request's ``DraftLength``."""
        keep = min(len(samples), accepted_prefix([t.token_id for t in samples], seq.draft))
        self.drafts += 1
        self.draft_tokens += len(seq.draft)
        self.accepted_tokens += keep - 1
        if st.draft_length is not None:
            st.draft_length.record(len(seq.draft), keep - 1)
        return keep

    def stats(self) -> dict[str, float]:
        """vLLM's counters (``/metrics``)."""
        return {"spec_decode_num_drafts": float(self.drafts),
                "spec_decode_num_draft_tokens": float(self.draft_tokens),
                "spec_decode_num_accepted_tokens": float(self.accepted_tokens)}

