"""A weight update between two steps (the scheduler's side of AsyncEngine.update_weights): a
request kept across it reports two spans whose tokens are those of the two weights, the prefix
cache keeps no block of the old weights, and a request that ran across the update offers none of
its later blocks. Stepped by hand, no thread: the fake runner's "weights" are an offset added to
every token it samples."""

from __future__ import annotations

from typing import Any

from kiln.engine.config import EngineConfig
from kiln.engine.outputs import (
    ModelRunnerOutput,
    RequestOutput,
    SampledToken,
    SchedulerOutput,
    WeightSpan,
)
from kiln.engine.request import Request, SamplingParams
from kiln.engine.scheduler import Scheduler
from tests.engine.fakes import VOCAB, FakeRunner, next_token


class WeightedRunner(FakeRunner):
    """FakeRunner whose sampled tokens are shifted by its weights' offset."""

    offset = 0

    def execute(self, so: SchedulerOutput) -> ModelRunnerOutput:
        out = super().execute(so)
        return ModelRunnerOutput({rid: SampledToken((t.token_id + self.offset) % VOCAB, t.logprob)
                                  for rid, t in out.sampled.items()})

    def swap_weights(self, model: Any) -> None:  # the "weights": an offset
        self.offset = int(model)


def make(version: str = "v0") -> tuple[Scheduler, WeightedRunner]:
    cfg = EngineConfig(block_size=4, num_blocks=64, max_num_batched_tokens=32,
                       weight_version=version)
    return Scheduler(cfg, 64, 200), WeightedRunner(64, 4)


def req(rid: str, max_tokens: int = 10) -> Request:
    return Request(rid, list(range(1, 10)), SamplingParams(max_tokens=max_tokens, seed=3))


def run(s: Scheduler, r: WeightedRunner, steps: int = 100) -> dict[str, list[RequestOutput]]:
    outs: dict[str, list[RequestOutput]] = {}
    for _ in range(steps):
        if not s.has_work:
            break
        so = s.schedule()
        for o in s.update_from_output(so, r.execute(so)):
            outs.setdefault(o.request_id, []).append(o)
    return outs


def tokens(outs: list[RequestOutput]) -> list[int]:
    return [t for o in outs for t in o.new_token_ids]


def test_one_weight_version_is_one_span() -> None:
    s, r = make("start")
    s.add_request(req("a"))
    final = run(s, r)["a"][-1]
    assert final.finished and final.weight_version == "start"
    assert final.weight_spans == (WeightSpan("start", 0, 10),)


def test_kept_request_spans_the_update_with_each_weights_tokens() -> None:
    s_old, r_old = make()
    s_old.add_request(req("a"))
    old = tokens(run(s_old, r_old)["a"])  # the old weights alone
    s, r = make()
    s.add_request(req("a"))
    first = run(s, r, steps=4)["a"]  # the prompt's prefill, then three more tokens
    k = len(tokens(first))
    assert 0 < k < 10 and tokens(first) == old[:k]
    r.swap_weights(5)
    assert s.weights_changed("v1") > 0  # the prompt's cached blocks forgotten
    rest = run(s, r)["a"]
    got = tokens(first) + tokens(rest)
    final = rest[-1]
    assert final.weight_spans == (WeightSpan("v0", 0, k), WeightSpan("v1", k, 10))
    assert final.weight_version == "v1"
    # the old weights' tokens up to the update; after it, each token the new weights sampled
    # over the same context (the fake's KV is the tokens themselves)
    prompt = list(range(1, 10))
    for i in range(k, 10):
        assert got[i] == (next_token(prompt + got[:i], final.seed, i) + 5) % VOCAB


def test_update_flushes_the_cache_and_a_spanning_request_offers_no_block() -> None:
    s, r = make()
    s.add_request(req("a", max_tokens=20))
    run(s, r, steps=2)
    assert s.pool.num_cached_blocks > 0
    s.weights_changed("v1")
    assert s.pool.num_cached_blocks == 0
    run(s, r)  # "a" finishes under v1, across the update: its blocks hold both weights' KV
    assert s.pool.num_cached_blocks == 0
    s.add_request(req("b"))  # the same prompt after the update: nothing to reuse
    final = run(s, r)["b"][-1]
    assert final.num_cached_tokens == 0 and final.weight_spans == (WeightSpan("v1", 0, 10),)
    s.add_request(req("c"))  # computed under v1 alone: its prompt's blocks are shared
    assert run(s, r)["c"][-1].num_cached_tokens > 0
