"""The scheduler's pause (vLLM's /pause): keep schedules nothing and the kept request resumes
where it was, to the same tokens as an unpaused run; abort finishes every request and holds new
ones; wait admits nothing new while the running requests finish; and a prefix-cache reset
leaves no block to reuse. Stepped by hand, no thread."""

from __future__ import annotations

from kiln.engine.config import EngineConfig
from kiln.engine.outputs import RequestOutput
from kiln.engine.request import Request, SamplingParams
from kiln.engine.scheduler import Scheduler
from tests.engine.drive import drive, token_ids
from tests.engine.fakes import FakeRunner


def make() -> tuple[Scheduler, FakeRunner]:
    cfg = EngineConfig(block_size=4, num_blocks=64, max_num_batched_tokens=32)
    return Scheduler(cfg, 64, 200), FakeRunner(64, 4)


def req(rid: str, max_tokens: int = 8) -> Request:
    return Request(rid, list(range(1, 10)), SamplingParams(max_tokens=max_tokens, seed=3))


def step(s: Scheduler, r: FakeRunner) -> list[RequestOutput]:
    so = s.schedule()
    if so.is_empty:
        return []
    return s.update_from_output(so, r.execute(so))


def run_out(s: Scheduler, r: FakeRunner, outs: dict[str, list[int]]) -> None:
    for _ in range(100):
        if not s.has_work:
            return
        for o in step(s, r):
            outs.setdefault(o.request_id, []).extend(o.new_token_ids)
    raise AssertionError("did not finish")


def test_keep_resumes_where_it_was() -> None:
    s0, r0 = make()
    want = token_ids(drive(s0, r0, [req("a")])["a"])
    s, r = make()
    s.add_request(req("a"))
    got: dict[str, list[int]] = {}
    for _ in range(3):
        for o in step(s, r):
            got.setdefault(o.request_id, []).extend(o.new_token_ids)
    assert s.pause("keep") == [] and s.paused and not s.has_work
    s.add_request(req("b"))
    steps = len(r.steps)
    assert s.schedule().is_empty and len(r.steps) == steps
    assert s.stats()["paused"] == 1.0 and s.stats()["running"] == 1.0
    s.resume()
    assert not s.paused and s.has_work
    run_out(s, r, got)
    assert got["a"] == want and got["b"] == want  # the same prompt and seed: the same tokens


def test_abort_finishes_everything_and_holds_new_requests() -> None:
    s, r = make()
    s.add_request(req("a"))
    step(s, r)
    s.add_request(req("w"))
    done = s.pause("abort")
    assert sorted(o.request_id for o in done) == ["a", "w"]
    assert {o.finish_reason for o in done} == {"abort"}
    assert s.pool.num_used_blocks == 0 and s.paused
    s.add_request(req("b"))
    assert s.schedule().is_empty
    s.resume()
    got: dict[str, list[int]] = {}
    run_out(s, r, got)
    assert len(got["b"]) == 8


def test_wait_lets_running_requests_finish_and_admits_nothing() -> None:
    s, r = make()
    s.add_request(req("a"))
    got: dict[str, list[int]] = {"a": [t for o in step(s, r) for t in o.new_token_ids]}
    s.pause("wait")
    assert not s.paused  # "a" still runs
    s.add_request(req("b"))
    for _ in range(50):
        so = s.schedule()
        assert "b" not in {q.request_id for q in so.seqs}
        if so.is_empty:
            break
        for o in s.update_from_output(so, r.execute(so)):
            got.setdefault(o.request_id, []).extend(o.new_token_ids)
    assert len(got["a"]) == 8 and "b" not in got
    assert s.paused and not s.has_work and s.stats()["waiting"] == 1.0
    s.resume()
    run_out(s, r, got)
    assert got["b"] == got["a"]


def test_reset_prefix_cache_leaves_nothing_to_reuse() -> None:
    s, r = make()
    first = drive(s, r, [req("a")])["a"]
    assert first[-1].finished and s.pool.num_cached_blocks > 0
    again = drive(s, r, [req("b")])["b"]
    assert again[-1].num_cached_tokens > 0
    assert s.pool.reset_prefix_cache() > 0 and s.pool.num_cached_blocks == 0
    third = drive(s, r, [req("c")])["c"]
    assert third[-1].num_cached_tokens == 0
    assert token_ids(third) == token_ids(first)
