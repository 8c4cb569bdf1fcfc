"""Speculative decoding's parts (kiln.engine.speculative) and the scheduler's verify steps, with a
fake runner that verifies drafts as the C runner does: every request's tokens with drafts equal
its tokens without, whatever is accepted or rejected, wherever it ends (EOS, a stop token,
max_tokens mid-draft). Stepped by hand, no thread. The real C step's equality is
tests/e2e/test_speculative_http.py's."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from kiln.engine.config import EngineConfig
from kiln.engine.outputs import ModelRunnerOutput, RequestOutput, SampledToken, SchedulerOutput
from kiln.engine.request import GrammarSpec, Request, SamplingParams
from kiln.engine.scheduler import Scheduler
from kiln.engine.speculative import (
    DraftLength,
    SpeculativeConfig,
    accepted_prefix,
    drafts_allowed,
    ngram_draft,
)
from tests.engine.fakes import FakeRunner

SPEC = SpeculativeConfig(num_speculative_tokens=4, prompt_lookup_max=3, prompt_lookup_min=1)


def test_ngram_draft_follows_the_latest_longest_match() -> None:
    assert ngram_draft([1, 2, 3, 9, 1, 2, 3, 7, 1, 2, 3], 3, 1, 3) == [7, 1, 2]
    assert ngram_draft([5, 6, 7, 8, 5, 6], 2, 2, 3) == [7, 8]
    assert ngram_draft([1, 2, 3, 4], 3, 1, 3) == []  # the tail never occurred before
    assert ngram_draft([4, 4], 3, 1, 3) == [4]  # what follows, up to the end
    assert ngram_draft([1, 2], 0, 1, 3) == []


def test_accepted_prefix_keeps_the_matches_and_the_first_miss() -> None:
    assert accepted_prefix([5, 6, 7], [5, 6]) == 3  # all drafts, then the bonus token
    assert accepted_prefix([5, 9, 7], [5, 6]) == 2  # the miss is plain decoding's token there
    assert accepted_prefix([9, 6, 7], [5, 6]) == 1
    assert accepted_prefix([5, 6], [5, 6, 8]) == 2  # the third row's logits were not finite
    assert accepted_prefix([], [5]) == 0


def test_draft_length_follows_acceptance_and_rests() -> None:
    d = DraftLength(4, misses=2, rest=3)
    assert d.wanted() == 4
    d.record(4, 1)
    assert d.wanted() == 2
    d.record(2, 2)
    assert d.wanted() == 3
    d.record(3, 0)
    d.record(1, 0)  # two misses in a row: three plain steps
    assert [d.wanted() for _ in range(4)] == [0, 0, 0, 1]


@pytest.mark.parametrize(("text", "words"), [
    ('{"method": "mtp"}', "not built"),
    ('{"method": "draft_model"}', "needs \"model\""),
    ('{"method": "draft_model", "model": ""}', "needs \"model\""),
    ('{"method": "draft_model", "model": "x", "prompt_lookup_max": 3}', "not supported"),
    ('{"method": "nope"}', "unknown"),
    ('{"method": "ngram", "num_speculative_tokens": 0}', "positive integer"),
    ('{"method": "ngram", "num_speculative_tokens": 99}', "at most"),
    ('{"method": "ngram", "prompt_lookup_min": 5, "prompt_lookup_max": 2}', "must not exceed"),
    ('{"method": "ngram", "draft_tensor_parallel_size": 1}', "not supported"),
    ("ngram", "not JSON"),
])
def test_config_refuses_what_it_cannot_honour(text: str, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        SpeculativeConfig.parse(text)


def test_config_reads_vllms_json() -> None:
    spec = SpeculativeConfig.parse('{"method": "ngram", "num_speculative_tokens": 5, '
                                   '"prompt_lookup_max": 4, "prompt_lookup_min": 2}')
    assert (spec.num_speculative_tokens, spec.prompt_lookup_max, spec.prompt_lookup_min) == \
        (5, 4, 2)
    draft = SpeculativeConfig.parse('{"method": "draft_model", "model": "small.gguf", '
                                    '"num_speculative_tokens": 3}')
    assert (draft.method, draft.model, draft.num_speculative_tokens) == \
        ("draft_model", "small.gguf", 3)
    assert draft.describe() == "draft_model (k=3, model=small.gguf)"


def test_only_plain_requests_draft() -> None:
    plain = Request("a", [1], SamplingParams(stop=("x",), logprobs=2))  # stop strings, logprobs
    assert drafts_allowed(plain)
    for change in ({"logit_bias": ((1, 1.0),)},
                   {"grammar": GrammarSpec('start: "x"')}):
        assert not drafts_allowed(Request("a", [1], dataclasses.replace(SamplingParams(),
                                                                        **change)))


class CopyRunner(FakeRunner):
    """A fake model that mostly repeats its context with period 5 (so n-gram drafts are often
    right), unless the sampler's counter hash says otherwise, and that verifies drafts: each row
    of a drafted decode is sampled from its own position's context, its counter the row's output
    index, as plain decoding samples that position."""

    verifies_drafts = True

    def __init__(self, num_blocks: int, block_size: int, vocab: int = 50) -> None:
        super().__init__(num_blocks, block_size)
        self.vocab = vocab

    def _next(self, context: list[int], seed: int, step: int) -> int:
        if (seed * 31 + step * 7) % 6 == 0:  # now and then a token no draft guessed
            return (context[-1] * 13 + step) % self.vocab
        return context[-5] if len(context) >= 5 else context[-1]

    def execute(self, so: SchedulerOutput) -> ModelRunnerOutput:
        bs = self.block_size
        sampled: dict[str, SampledToken] = {}
        verified: dict[str, tuple[SampledToken, ...]] = {}
        for seq in so.seqs:
            for i, tok in enumerate(seq.token_ids):
                pos = seq.start_pos + i
                self.kv[seq.block_table[pos // bs] * bs + pos % bs] = tok
            if not seq.sample:
                continue
            first = seq.start_pos + len(seq.token_ids) - 1 - len(seq.draft)
            rows = []
            for j in range(1 + len(seq.draft)):
                end = first + j + 1
                context = [self.kv[seq.block_table[p // bs] * bs + p % bs] for p in range(end)]
                assert None not in context, "read an unwritten KV slot"
                rows.append(SampledToken(self._next([int(t) for t in context if t is not None],
                                                    seq.seed, seq.step + j), -0.25))
            sampled[seq.request_id] = rows[0]
            if seq.draft:
                verified[seq.request_id] = tuple(rows)
        return ModelRunnerOutput(sampled, {}, verified)


def run(spec: SpeculativeConfig | None, requests: list[Request], eos: int | None = None
        ) -> tuple[dict[str, list[int]], dict[str, RequestOutput], Scheduler]:
    cfg = EngineConfig(block_size=4, num_blocks=128, max_num_batched_tokens=64, speculative=spec)
    s = Scheduler(cfg, 128, 400, frozenset() if eos is None else {eos})
    r = CopyRunner(128, 4)
    s.speculation.runner_verifies = True
    for req in requests:
        s.add_request(req)
    tokens: dict[str, list[int]] = {}
    finals: dict[str, RequestOutput] = {}
    for _ in range(1000):
        if not s.has_work:
            break
        so = s.schedule()
        for o in s.update_from_output(so, r.execute(so)):
            tokens.setdefault(o.request_id, []).extend(o.new_token_ids)
            if o.finished:
                finals[o.request_id] = o
    assert not s.has_work
    return tokens, finals, s


def reqs(**sampling: object) -> list[Request]:
    prompt = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9]
    return [Request(f"r{i}", prompt[i:], SamplingParams(seed=i, **sampling))  # type: ignore[arg-type]
            for i in range(4)]


@pytest.mark.parametrize("sampling", [
    {"max_tokens": 60}, {"max_tokens": 23}, {"max_tokens": 40, "stop_token_ids": (7,)},
    {"max_tokens": 40, "presence_penalty": 0.5}])
def test_tokens_with_drafts_equal_tokens_without(sampling: dict[str, object]) -> None:
    plain, plain_final, _ = run(None, reqs(**sampling))
    spec, spec_final, s = run(SPEC, reqs(**sampling))
    assert spec == plain
    for rid, out in plain_final.items():
        got = spec_final[rid]
        assert (got.finish_reason, got.stop_reason, got.num_output_tokens) == \
            (out.finish_reason, out.stop_reason, out.num_output_tokens)
    assert s.speculation.accepted_tokens > 0 and s.speculation.draft_tokens > s.speculation.accepted_tokens
    assert s.pool.num_used_blocks == 0  # every block given back


def test_eos_inside_a_draft_ends_the_request_there() -> None:
    plain, _, _ = run(None, reqs(max_tokens=60), eos=9)
    spec, final, _ = run(SPEC, reqs(max_tokens=60), eos=9)
    assert spec == plain
    assert any(out.finish_reason == "stop" for out in final.values())


def test_a_runner_that_does_not_verify_gets_no_drafts() -> None:
    cfg = EngineConfig(block_size=4, num_blocks=64, max_num_batched_tokens=64, speculative=SPEC)
    s = Scheduler(cfg, 64, 400)
    s.add_request(reqs(max_tokens=20)[0])
    s.speculation.runner_verifies = False
    r = CopyRunner(64, 4)
    for _ in range(40):
        if not s.has_work:
            break
        so = s.schedule()
        assert not any(seq.draft for seq in so.seqs)
        s.update_from_output(so, r.execute(so))
    assert s.speculation.drafts == 0


def _with_text(spec: SpeculativeConfig | None, stop: tuple[str, ...]
               ) -> dict[str, list[RequestOutput]]:
    from kiln.engine.output_processor import OutputProcessor
    from tests.engine.drive import drive
    from tests.engine.fakes import CharDetok

    dropped: list[int] = []

    class Watched(OutputProcessor):
        def _stopped(self, out: RequestOutput, stop: str, finish: Any, extra: int = 0) -> None:
            dropped.append(extra)
            super()._stopped(out, stop, finish, extra)

    cfg = EngineConfig(block_size=4, num_blocks=128, max_num_batched_tokens=64, speculative=spec)
    s = Scheduler(cfg, 128, 400)
    s.speculation.runner_verifies = True
    out = drive(s, CopyRunner(128, 4), reqs(max_tokens=60, stop=stop),
                output=Watched(lambda sp: CharDetok()))
    assert s.pool.num_used_blocks == 0
    if spec is not None:
        assert s.speculation.accepted_tokens > 0
        assert any(dropped), "no string ended inside a verify step's tokens"
    return out


@pytest.mark.parametrize("stop", [("nlfrb",), ("wijhj", "xx"), ("bjhtt", "tmbc")])
def test_a_stop_string_inside_a_verified_step_ends_where_plain_decoding_ends(
        stop: tuple[str, ...]) -> None:
    """The text completes the string at a token in the middle of a verify step's tokens (these
    strings do, with this fake: ``_with_text`` checks): the tokens after it are dropped, as
    plain decoding never made them."""
    plain, spec = _with_text(None, stop), _with_text(SPEC, stop)
    assert spec.keys() == plain.keys()
    stopped = 0
    for rid, outs in plain.items():
        got = spec[rid]
        assert [t for o in got for t in o.new_token_ids] == [t for o in outs for t in o.new_token_ids]
        assert "".join(o.text_delta for o in got) == "".join(o.text_delta for o in outs)
        a, b = outs[-1], got[-1]
        assert (b.finish_reason, b.stop_reason, b.num_output_tokens, b.weight_spans) == \
            (a.finish_reason, a.stop_reason, a.num_output_tokens, a.weight_spans)
        assert len(b.metrics.token_times) == len(a.metrics.token_times)  # type: ignore[union-attr]
        stopped += a.stop_reason in stop
    assert stopped  # a string did stop some request


def test_the_cost_gate_closes_where_drafts_cost_more_than_they_give() -> None:
    """Measured seconds per token: drafted and plain steps alternate until both are known;
    then drafting goes on only where it pays, with a probe of the other kind every PROBE
    steps."""
    from kiln.engine.speculative import CostGate

    gate = CostGate()
    warm = [gate.allow() for _ in range(2 * CostGate.WARM)]
    assert warm == [True, False] * CostGate.WARM
    for drafted in (True, False):
        for _ in range(CostGate.WARM):
            gate.observe(drafted, 0.02 if drafted else 0.01)  # drafts: twice the plain cost
    steps = [gate.allow() for _ in range(2 * CostGate.PROBE)]
    assert steps.count(True) == 2 and gate.closed_steps == 2 * CostGate.PROBE - 2
    cheap = CostGate()
    for drafted in (True, False):
        for _ in range(CostGate.WARM):
            cheap.observe(drafted, 0.005 if drafted else 0.01)
    steps = [cheap.allow() for _ in range(2 * CostGate.PROBE)]
    assert steps.count(False) == 2  # open, with a plain probe every PROBE steps
