from __future__ import annotations

import pytest

from kiln.engine.config import EngineConfig
from kiln.engine.errors import EngineError
from kiln.engine.outputs import RequestOutput
from kiln.engine.request import Request, SamplingParams
from kiln.engine.scheduler import Scheduler
from tests.engine.fakes import FakeRunner


def make(num_blocks: int = 64, bs: int = 4, budget: int = 32, max_seqs: int = 16,
         max_len: int = 1000, eos: frozenset[int] = frozenset(), caching: bool = True,
         ) -> tuple[Scheduler, FakeRunner]:
    cfg = EngineConfig(block_size=bs, num_blocks=num_blocks, max_num_batched_tokens=budget,
                       max_num_seqs=max_seqs, enable_prefix_caching=caching)
    sched = Scheduler(cfg, num_blocks, max_len, eos_token_ids=eos)
    return sched, FakeRunner(num_blocks, bs)


def req(rid: str, n: int = 10, max_tokens: int = 8, seed: int = 1, base: int = 0,
        **kw: object) -> Request:
    sp = SamplingParams(max_tokens=max_tokens, seed=seed, **kw)  # type: ignore[arg-type]
    return Request(rid, [(base + i) % 50 for i in range(n)], sp)


def run(sched: Scheduler, runner: FakeRunner, max_steps: int = 1000,
        ) -> dict[str, list[RequestOutput]]:
    outs: dict[str, list[RequestOutput]] = {}
    for _ in range(max_steps):
        if not sched.has_work:
            return outs
        so = sched.schedule()
        assert so.num_batched_tokens <= sched.config.max_num_batched_tokens
        assert len(so.seqs) <= sched.config.max_num_seqs
        for o in sched.update_from_output(so, runner.execute(so)):
            outs.setdefault(o.request_id, []).append(o)
    raise AssertionError("did not finish")


def tokens(outs: list[RequestOutput]) -> list[int]:
    return [t for o in outs for t in o.new_token_ids]


def test_single_request_generates_max_tokens_and_frees_blocks() -> None:
    sched, runner = make()
    assert sched.add_request(req("a", max_tokens=5)) is None
    outs = run(sched, runner)["a"]
    assert len(tokens(outs)) == 5 and outs[-1].finished and outs[-1].finish_reason == "length"
    assert [o.finished for o in outs] == [False] * 4 + [True]
    assert outs[-1].num_output_tokens == 5 and outs[-1].num_prompt_tokens == 10
    assert outs[-1].metrics is not None and len(outs[-1].metrics.token_times) == 5
    assert sched.pool.num_used_blocks == 0


def test_token_budget_chunks_long_prefill_without_stalling_decodes() -> None:
    sched, runner = make(budget=8, num_blocks=128)
    sched.add_request(req("short", n=3, max_tokens=20))
    so = sched.schedule()
    sched.update_from_output(so, runner.execute(so))  # short is now decoding
    sched.add_request(req("long", n=50, max_tokens=2))
    steps_with_long_prefill = 0
    while sched.has_work:
        so = sched.schedule()
        ids = {s.request_id: s for s in so.seqs}
        assert so.num_batched_tokens <= 8
        if "long" in ids and not ids["long"].sample:
            steps_with_long_prefill += 1
            assert "short" in ids and ids["short"].num_tokens == 1  # decode not starved
        sched.update_from_output(so, runner.execute(so))
    assert steps_with_long_prefill >= 6  # 50 tokens in chunks of <= 7


def test_chunked_prefill_gives_same_tokens_as_unchunked() -> None:
    a, ra = make(budget=5)
    b, rb = make(budget=512)
    for s in (a, b):
        s.add_request(req("x", n=23, max_tokens=6))
    assert tokens(run(a, ra)["x"]) == tokens(run(b, rb)["x"])
    assert max(len(s.token_ids) for so in ra.steps for s in so.seqs) == 5


def test_batch_and_order_invariance() -> None:
    alone, r1 = make()
    alone.add_request(req("t", n=9, max_tokens=10, seed=7, base=3))
    ref = tokens(run(alone, r1)["t"])
    busy, r2 = make(budget=16)
    for i in range(4):
        busy.add_request(req(f"o{i}", n=5 + i, max_tokens=7, seed=i, base=i))
    busy.add_request(req("t", n=9, max_tokens=10, seed=7, base=3))
    assert tokens(run(busy, r2)["t"]) == ref


def test_preemption_recompute_gives_same_tokens() -> None:
    roomy, r1 = make(num_blocks=200)
    tight, r2 = make(num_blocks=12)  # 48 token slots for 4 x (10 + 14) tokens
    for s in (roomy, tight):
        for i in range(4):
            s.add_request(req(f"r{i}", n=10, max_tokens=14, seed=i, base=5 * i))
    want = {k: tokens(v) for k, v in run(roomy, r1).items()}
    got_outs = run(tight, r2)
    assert {k: tokens(v) for k, v in got_outs.items()} == want
    assert tight.num_preemptions > 0
    counts = [o[-1].metrics.num_preemptions for o in got_outs.values() if o[-1].metrics]
    assert len(counts) == 4 and sum(counts) == tight.num_preemptions
    assert tight.pool.num_used_blocks == 0


def test_prefix_cache_hits_skip_computed_tokens() -> None:
    sched, runner = make()
    sched.add_request(req("a", n=17, max_tokens=3))
    first = tokens(run(sched, runner)["a"])
    sched.add_request(req("b", n=17, max_tokens=3))
    so = sched.schedule()
    (seq,) = so.seqs
    assert seq.start_pos == 16 and seq.num_tokens == 1  # 4 full blocks hit
    outs = sched.update_from_output(so, runner.execute(so)) + run(sched, runner)["b"]
    assert tokens(outs) == first  # the cached KV is the right KV
    assert outs[-1].num_cached_tokens == 16
    assert sched.prefix_cache_hit_tokens == 16


def test_full_prompt_hit_still_computes_last_token() -> None:
    sched, runner = make()
    sched.add_request(req("a", n=16, max_tokens=2))
    want = tokens(run(sched, runner)["a"])
    sched.add_request(req("b", n=16, max_tokens=2))
    so = sched.schedule()
    assert so.seqs[0].start_pos == 12 and so.seqs[0].num_tokens == 4 and so.seqs[0].sample
    outs = sched.update_from_output(so, runner.execute(so)) + run(sched, runner)["b"]
    assert tokens(outs) == want
    assert sched.prefix_cache_hit_tokens == 12


def test_no_prefix_hits_when_caching_disabled() -> None:
    sched, runner = make(caching=False)
    sched.add_request(req("a", n=17, max_tokens=2))
    run(sched, runner)
    sched.add_request(req("b", n=17, max_tokens=2))
    assert sched.schedule().seqs[0].start_pos == 0


def test_siblings_share_prompt_blocks() -> None:
    sched, runner = make()
    for i in range(3):
        sched.add_request(req(f"s{i}", n=20, max_tokens=4, seed=i))
    first = sched.schedule()
    assert [s.request_id for s in first.seqs] == ["s0"]  # siblings wait for the shared prefix
    sched.update_from_output(first, runner.execute(first))
    second = sched.schedule()
    starts = {s.request_id: s.start_pos for s in second.seqs}
    assert starts["s1"] == 16 and starts["s2"] == 16
    s0_blocks = first.seqs[0].block_table[:4]
    for s in second.seqs:
        if s.request_id != "s0":
            assert s.block_table[:4] == s0_blocks
            assert all(sched.pool.ref_count(b) == 3 for b in s0_blocks)
    sched.update_from_output(second, runner.execute(second))
    run(sched, runner)
    assert sched.prefix_cache_hit_tokens == 32


def test_abort_frees_blocks() -> None:
    sched, runner = make()
    sched.add_request(req("a", max_tokens=50))
    sched.add_request(req("w", max_tokens=50, base=9))
    for _ in range(3):
        so = sched.schedule()
        sched.update_from_output(so, runner.execute(so))
    out = sched.abort("a")
    assert out is not None and out.finished and out.finish_reason == "abort"
    assert sched.abort("a") is None and sched.abort("nope") is None
    assert sched.abort("w") is not None
    assert sched.pool.num_used_blocks == 0 and not sched.has_work


def test_max_tokens_zero_finishes_immediately() -> None:
    sched, _ = make()
    out = sched.add_request(req("z", n=7, max_tokens=0))
    assert out is not None and out.finished and out.finish_reason == "length"
    assert out.new_token_ids == [] and out.num_prompt_tokens == 7 and out.num_output_tokens == 0
    assert not sched.has_work


def test_admission_errors_and_clamping() -> None:
    sched, runner = make(num_blocks=8, max_len=20)
    with pytest.raises(EngineError) as e:
        sched.add_request(req("long", n=20))
    assert e.value.code == "context_length_exceeded" and e.value.status == 400
    sched.add_request(req("ok", n=15, max_tokens=100))
    assert tokens(run(sched, runner)["ok"]).__len__() == 5  # clamped to max_model_len - prompt
    small, _ = make(num_blocks=2, bs=4, max_len=1000)
    with pytest.raises(EngineError) as e2:
        small.add_request(req("big", n=8))
    # never fits in the cache: a 400 like the context window (a 503 had invited retries)
    assert (e2.value.code, e2.value.status) == ("context_length_exceeded", 400)
    with pytest.raises(EngineError):
        small.add_request(Request("empty", [], SamplingParams()))
    small.add_request(req("dup", n=2))
    with pytest.raises(EngineError) as e3:
        small.add_request(req("dup", n=2))
    assert e3.value.code == "duplicate_request_id"


def test_eos_and_stop_token_ids_stop_on_the_token() -> None:
    sched, runner = make()
    sched.add_request(req("probe", max_tokens=6))
    toks = tokens(run(sched, runner)["probe"])
    sched2, runner2 = make(eos=frozenset({toks[2]}))
    sched2.add_request(req("a", max_tokens=6))
    sched2.add_request(req("b", max_tokens=6, ignore_eos=True))
    sched2.add_request(req("c", max_tokens=6, stop_token_ids=(toks[1],)))
    outs = run(sched2, runner2)
    assert tokens(outs["a"]) == toks[:3] and outs["a"][-1].finish_reason == "stop"
    assert outs["a"][-1].num_output_tokens == 3 and outs["a"][-1].stop_reason is None
    assert tokens(outs["b"]) == toks and outs["b"][-1].finish_reason == "length"
    assert tokens(outs["c"]) == toks[:2] and outs["c"][-1].stop_reason == toks[1]
    assert all(o.text_delta == "" for o in outs["a"])  # text is the output stage's
    assert sched2.pool.num_used_blocks == 0


def test_preempted_waiting_request_can_be_aborted() -> None:
    sched, runner = make(num_blocks=6, budget=64)
    sched.add_request(req("a", n=8, max_tokens=12))
    sched.add_request(req("b", n=8, max_tokens=12, base=20))
    while sched.num_preemptions == 0:
        so = sched.schedule()
        sched.update_from_output(so, runner.execute(so))
    assert so.preempted_ids == ["b"] and sched.num_waiting == 1  # the newest one
    out = sched.abort("b")
    assert out is not None and out.finish_reason == "abort" and sched.num_waiting == 0
    assert tokens(run(sched, runner)["a"]).__len__() >= 1
    assert sched.pool.num_used_blocks == 0


def test_fail_step_finishes_every_request_in_the_step_with_error() -> None:
    sched, _ = make()
    sched.add_request(req("a"))
    sched.add_request(req("b", base=4))
    so = sched.schedule()
    outs = sched.fail_step(so, "boom")
    assert {o.request_id for o in outs} == {"a", "b"}
    assert all(o.finish_reason == "error" and o.error == "boom" for o in outs)
    assert sched.pool.num_used_blocks == 0 and not sched.has_work


def test_cache_salt_keeps_requests_from_sharing_prefix_blocks() -> None:
    sched, runner = make()
    salted = req("a", n=17, max_tokens=3)
    salted.cache_salt = "tenant-1"
    sched.add_request(salted)
    first = tokens(run(sched, runner)["a"])
    for rid, salt, start in (("b", "tenant-2", 0), ("c", None, 0), ("d", "tenant-1", 16)):
        r = req(rid, n=17, max_tokens=3)
        r.cache_salt = salt
        sched.add_request(r)
        so = sched.schedule()
        assert so.seqs[0].start_pos == start, rid  # only the same salt hits the cached blocks
        outs = sched.update_from_output(so, runner.execute(so)) + run(sched, runner)[rid]
        assert tokens(outs) == first  # a salt changes what is shared, never the tokens


def test_priority_orders_the_waiting_queue_fifo_within_a_level() -> None:
    sched, runner = make(max_seqs=1)
    for rid, priority in (("a", 0), ("b", 5), ("c", 1), ("d", 1), ("e", -2)):
        r = req(rid, n=5, max_tokens=2, base=ord(rid))
        r.priority = priority
        sched.add_request(r)
    outs = run(sched, runner)
    assert list(outs) == ["e", "a", "c", "d", "b"]  # all queued before the first step


def test_preemption_takes_the_lowest_priority_first() -> None:
    def preempted_first(priorities: dict[str, int]) -> str:
        sched, runner = make(num_blocks=6, bs=4, max_seqs=4)
        for rid in ("old", "new"):  # "new" arrives last: the victim when priorities are equal
            r = req(rid, n=8, max_tokens=20, base=10 if rid == "old" else 30)
            r.priority = priorities[rid]
            sched.add_request(r)
        for _ in range(200):
            so = sched.schedule()
            if so.preempted_ids:
                return so.preempted_ids[0]
            sched.update_from_output(so, runner.execute(so))
        raise AssertionError("no preemption")

    assert preempted_first({"old": 0, "new": 0}) == "new"
    assert preempted_first({"old": 3, "new": 0}) == "old"
    assert preempted_first({"old": 0, "new": 3}) == "new"
