"""Hypothesis stateful test of the scheduler over the fake paged runner (no torch).

Invariants after every step: free + used = total blocks; no block is owned by two running requests
unless it is a shared prefix-cache block whose ref count equals its owners; ref counts are never
negative; every request is in exactly one of waiting/running/finished. At the end every request
finishes (or was aborted), and every block is free again; preempted requests (out of blocks, or
for a waiting request of higher priority) resume and finish with the same tokens a solo run
produces.
"""

from __future__ import annotations

from collections import Counter

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kiln.engine.config import EngineConfig
from kiln.engine.outputs import RequestOutput
from kiln.engine.request import Request, SamplingParams
from kiln.engine.scheduler import Scheduler
from tests.engine.drive import drive, token_ids
from tests.engine.fakes import FakeRunner

BLOCK = 4
BLOCKS = 24


def make_scheduler() -> tuple[Scheduler, FakeRunner]:
    config = EngineConfig(block_size=BLOCK, num_blocks=BLOCKS, max_num_seqs=6,
                          max_num_batched_tokens=16)
    return Scheduler(config, BLOCKS, max_model_len=64), FakeRunner(BLOCKS, BLOCK)


class SchedulerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.sched, self.runner = make_scheduler()
        self.requests: dict[str, Request] = {}
        self.outputs: dict[str, list[RequestOutput]] = {}
        self.finished: set[str] = set()
        self.aborted: set[str] = set()
        self.count = 0

    def _record(self, outs: list[RequestOutput]) -> None:
        for o in outs:
            self.outputs.setdefault(o.request_id, []).append(o)
            if o.finished:
                assert o.request_id not in self.finished, "finished twice"
                self.finished.add(o.request_id)

    @rule(prompt=st.lists(st.integers(0, 4), min_size=1, max_size=20),
          shared=st.booleans(), max_tokens=st.integers(0, 12), seed=st.integers(0, 5),
          priority=st.integers(0, 2))
    def add(self, prompt: list[int], shared: bool, max_tokens: int, seed: int,
            priority: int) -> None:
        if shared:  # a common prefix, so the prefix cache and sharing get exercised
            prompt = [1, 2, 3, 4, 1, 2, 3, 4, *prompt]
        rid = f"r{self.count}"
        self.count += 1
        req = Request(rid, prompt, SamplingParams(max_tokens=max_tokens, seed=seed,
                                                  ignore_eos=True))
        req.priority = priority  # higher ones preempt lower running ones (kiln.engine.request)
        self.requests[rid] = req
        first = self.sched.add_request(req)
        if first is not None:
            self._record([first])

    @precondition(lambda self: self.sched.has_work)
    @rule()
    def step(self) -> None:
        so = self.sched.schedule()
        self._record(self.sched.update_from_output(so, self.runner.execute(so)))

    @precondition(lambda self: len(self.requests) > len(self.finished))
    @rule(data=st.data())
    def abort(self, data: st.DataObject) -> None:
        live = sorted(set(self.requests) - self.finished)
        rid = data.draw(st.sampled_from(live))
        out = self.sched.abort(rid)
        if out is not None:
            self.aborted.add(rid)
            self._record([out])

    @invariant()
    def blocks_are_accounted(self) -> None:
        pool = self.sched.pool
        assert pool.num_free_blocks + pool.num_used_blocks == BLOCKS
        owners: Counter[int] = Counter()
        for state in self.sched._running:
            owners.update(state.block_ids)
        for block, n in owners.items():
            assert pool.ref_count(block) == n, (block, n, pool.ref_count(block))
        for block in range(BLOCKS):
            assert pool.ref_count(block) >= 0

    @invariant()
    def each_request_in_one_place(self) -> None:
        waiting = {s.request.request_id for s in self.sched._waiting}
        running = {s.request.request_id for s in self.sched._running}
        assert not waiting & running
        assert not (waiting | running) & self.finished
        assert waiting | running | self.finished == set(self.requests)

    def teardown(self) -> None:
        for _ in range(2000):
            if not self.sched.has_work:
                break
            self.step()
        assert set(self.requests) == self.finished, "a request was lost"
        assert self.sched.pool.num_used_blocks == 0
        for rid, req in self.requests.items():
            if rid in self.aborted:
                continue
            outs = self.outputs[rid]
            assert outs[-1].finish_reason == "length"
            solo_sched, solo_runner = make_scheduler()
            solo = drive(solo_sched, solo_runner, [Request(rid, req.prompt_token_ids,
                                                           req.sampling)])
            assert token_ids(outs) == token_ids(solo[rid])  # preemption/recompute is invisible


SchedulerMachine.TestCase.settings = settings(
    max_examples=40, stateful_step_count=30, deadline=None, derandomize=True,
    suppress_health_check=list(HealthCheck),
)
TestScheduler = SchedulerMachine.TestCase
