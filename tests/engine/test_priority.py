"""vLLM's priority policy through the scheduler's public methods: a waiting request that cannot
be admitted (the running set is full, or KV blocks ran out) preempts the lowest-priority running
request (the latest-arrived among equals) of strictly lower priority; equal priorities never
preempt each other. A preempted request resumes by recompute, token for token, and none is lost.
(The fake runner reads its context back through the block tables, so a lost or stale KV slot
changes the tokens; the tiny-model test checks the same on the real runner, greedy.)"""

from __future__ import annotations

import random

from kiln.engine.config import EngineConfig
from kiln.engine.loop import build_core
from kiln.engine.outputs import RequestOutput
from kiln.engine.request import Request, SamplingParams
from kiln.engine.scheduler import Scheduler
from kiln.model import LoadedModel
from tests.engine.drive import token_ids
from tests.engine.fakes import FakeRunner
from tests.engine.test_scheduler import make, req, run, tokens

Outputs = dict[str, list[RequestOutput]]


def ranked(rid: str, priority: int, arrival: float, **kw: object) -> Request:
    r = req(rid, **kw)  # type: ignore[arg-type]
    r.priority, r.arrival_time = priority, arrival
    return r


def step(sched: Scheduler, runner: FakeRunner, outs: Outputs) -> list[str]:
    """One engine step; -> the ids it preempted."""
    so = sched.schedule()
    for o in sched.update_from_output(so, runner.execute(so)):
        outs.setdefault(o.request_id, []).append(o)
    return so.preempted_ids


def alone(r: Request) -> list[int]:
    sched, runner = make()
    clone = Request(r.request_id, list(r.prompt_token_ids), r.sampling)
    sched.add_request(clone)
    return tokens(run(sched, runner)[r.request_id])


def test_a_full_running_set_makes_room_for_a_higher_priority() -> None:
    sched, runner = make(max_seqs=1)
    low = ranked("low", 5, 0.0, n=6, max_tokens=10, base=3)
    sched.add_request(low)
    outs: Outputs = {}
    for _ in range(3):
        assert step(sched, runner, outs) == []
    high = ranked("high", 0, 1.0, n=6, max_tokens=4, base=20)
    sched.add_request(high)
    so = sched.schedule()
    assert so.preempted_ids == ["low"] and [s.request_id for s in so.seqs] == ["high"]
    for o in sched.update_from_output(so, runner.execute(so)):
        outs.setdefault(o.request_id, []).append(o)
    for rid, more in run(sched, runner).items():
        outs.setdefault(rid, []).extend(more)
    assert tokens(outs["low"]) == alone(low) and tokens(outs["high"]) == alone(high)
    assert outs["low"][-1].metrics is not None and outs["low"][-1].metrics.num_preemptions == 1
    assert outs["low"][-1].num_output_tokens == 10 and sched.pool.num_used_blocks == 0


def test_equal_or_lower_priorities_wait_their_turn() -> None:
    for later in (0, 1):  # the running request's own level, and a lower one (higher value)
        sched, runner = make(max_seqs=1)
        sched.add_request(ranked("first", 0, 0.0, max_tokens=6))
        outs: Outputs = {}
        assert step(sched, runner, outs) == []
        sched.add_request(ranked("second", later, 1.0, max_tokens=6, base=9))
        while sched.has_work:
            assert step(sched, runner, outs) == []
        assert outs["first"][-1].finished and "second" in outs
        assert sched.num_preemptions == 0


def test_blocks_running_out_make_room_for_a_higher_priority() -> None:
    sched, runner = make(num_blocks=8, bs=4, max_seqs=4)  # 32 KV slots
    low = ranked("low", 3, 0.0, n=24, max_tokens=8, base=1)
    sched.add_request(low)
    outs: Outputs = {}
    for _ in range(2):  # the prompt's 24 tokens, then one decode: 7 of the 8 blocks held
        assert step(sched, runner, outs) == []
    assert sched.pool.num_free_blocks == 1
    # its first chunk (8 tokens while a decode runs) needs 2 blocks
    high = ranked("high", 1, 1.0, n=12, max_tokens=4, base=30)
    sched.add_request(high)
    assert step(sched, runner, outs) == ["low"]
    for rid, more in run(sched, runner).items():
        outs.setdefault(rid, []).extend(more)
    assert tokens(outs["low"]) == alone(low) and tokens(outs["high"]) == alone(high)
    assert sched.pool.num_used_blocks == 0


def test_the_victim_is_the_lowest_priority_latest_arrived() -> None:
    sched, runner = make(max_seqs=4, num_blocks=128)
    for i, (rid, p) in enumerate((("a", 1), ("b", 3), ("c", 3), ("d", 0))):
        sched.add_request(ranked(rid, p, float(i), n=5, max_tokens=30, base=7 * i))
    outs: Outputs = {}
    assert step(sched, runner, outs) == []  # all four admitted
    sched.add_request(ranked("e", 2, 10.0, n=5, max_tokens=30, base=40))
    assert step(sched, runner, outs) == ["c"]  # b and c rank lowest; c arrived later
    sched.add_request(ranked("f", 2, 11.0, n=5, max_tokens=30, base=41))
    assert step(sched, runner, outs) == ["b"]
    sched.add_request(ranked("g", 2, 12.0, n=5, max_tokens=30, base=42))
    assert step(sched, runner, outs) == []  # a, d, e, f: none ranks below 2
    assert sched.num_running == 4 and sched.num_waiting == 3


def test_no_request_is_lost_under_mixed_priorities() -> None:
    """Requests of random priorities arrive at random steps into a tight engine: each finishes
    once with exactly its solo tokens, and every block is free at the end."""
    rng = random.Random(25)
    sched, runner = make(num_blocks=14, bs=4, max_seqs=3, budget=16)
    pending = [ranked(f"r{i}", rng.randint(0, 3), float(i), n=rng.randint(3, 14),
                      max_tokens=rng.randint(2, 12), seed=i, base=rng.randint(0, 49))
               for i in range(24)]
    solo = {r.request_id: alone(r) for r in pending}
    outs: Outputs = {}
    preempted: list[str] = []
    for _ in range(5000):
        while pending and rng.random() < 0.4:
            sched.add_request(pending.pop(0))
        if not pending and not sched.has_work:
            break
        preempted += step(sched, runner, outs)
    assert not pending and not sched.has_work
    assert preempted  # the policy was exercised
    assert {rid: tokens(o) for rid, o in outs.items()} == solo
    assert all(sum(o.finished for o in got) == 1 for got in outs.values())
    assert sched.pool.num_used_blocks == 0


def test_a_preempted_greedy_request_resumes_token_for_token(tiny_llama: LoadedModel) -> None:
    """On the real runner: a low-priority greedy request preempted mid-decode by a higher one
    recomputes its KV and continues with the same tokens as when it runs alone."""
    greedy = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)

    def request(rid: str, text: str, priority: int) -> Request:
        r = Request(rid, tiny_llama.tokenizer.encode(text), greedy)
        r.priority = priority
        return r

    def solo(r: Request) -> list[int]:
        sched, runner = build_core(tiny_llama, EngineConfig(block_size=4, num_blocks=64))
        sched.add_request(Request(r.request_id, r.prompt_token_ids, r.sampling))
        out: list[RequestOutput] = []
        while sched.has_work:
            so = sched.schedule()
            out += sched.update_from_output(so, runner.execute(so))
        return token_ids(out)

    low, high = request("low", "The quick brown fox", 4), request("high", "Hello, world!", 0)
    sched, runner = build_core(tiny_llama, EngineConfig(block_size=4, num_blocks=64,
                                                        max_num_seqs=1))
    sched.add_request(low)
    outs: list[RequestOutput] = []
    for _ in range(4):
        so = sched.schedule()
        outs += sched.update_from_output(so, runner.execute(so))
    sched.add_request(high)
    while sched.has_work:
        so = sched.schedule()
        outs += sched.update_from_output(so, runner.execute(so))
    assert sched.num_preemptions == 1
    by_id: Outputs = {}
    for o in outs:
        by_id.setdefault(o.request_id, []).append(o)
    assert token_ids(by_id["low"]) == solo(low) and token_ids(by_id["high"]) == solo(high)
    assert [o.request_id for o in outs if o.finished] == ["high", "low"]
