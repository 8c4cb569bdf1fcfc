"""The thinking budget inside the engine: the scheduler runs the controller on every accepted
token, and forced close tokens enter the output, the KV cache, usage and max_tokens."""

from __future__ import annotations

import pytest

from kiln.engine.config import EngineConfig
from kiln.engine.errors import EngineError
from kiln.engine.loop import build_core
from kiln.engine.outputs import RequestOutput
from kiln.engine.request import Request, SamplingParams, ThinkingBudgetSpec
from kiln.engine.scheduler import Scheduler
from kiln.model import LoadedModel
from kiln.text.thinking import Outcome
from tests.engine.drive import drive
from tests.engine.fakes import FakeRunner, ScriptRunner, next_token
from tests.numerics import sampled_logprob_atol

CLOSE = (60, 61, 62)  # outside the fake runner's vocabulary: never sampled by the model


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def make(num_blocks: int = 64, bs: int = 4, budget: int = 32, eos: frozenset[int] = frozenset(),
         clock: Clock | None = None) -> tuple[Scheduler, FakeRunner]:
    cfg = EngineConfig(block_size=bs, num_blocks=num_blocks, max_num_batched_tokens=budget,
                       max_num_seqs=16)
    sched = Scheduler(cfg, num_blocks, 1000, eos_token_ids=eos, clock=clock or Clock())
    return sched, FakeRunner(num_blocks, bs)


def req(rid: str, think: int | None = None, ms: int | None = None, max_tokens: int = 12,
        seed: int = 1, base: int = 0, n: int = 10, close: tuple[int, ...] = CLOSE) -> Request:
    spec = None if think is None and ms is None else ThinkingBudgetSpec(close, think, ms)
    sp = SamplingParams(max_tokens=max_tokens, seed=seed, thinking=spec)
    return Request(rid, [(base + i) % 50 for i in range(n)], sp)


def run(sched: Scheduler, runner: object, reqs: list[Request], clock: Clock | None = None,
        tick_s: float = 0.0) -> dict[str, list[RequestOutput]]:
    for r in reqs:
        assert sched.add_request(r) is None
    outs: dict[str, list[RequestOutput]] = {}
    for _ in range(1000):
        if not sched.has_work:
            return outs
        so = sched.schedule()
        for o in sched.update_from_output(so, runner.execute(so)):  # type: ignore[attr-defined]
            outs.setdefault(o.request_id, []).append(o)
        if clock is not None:
            clock.t += tick_s
    raise AssertionError("did not finish")


def flat(outs: list[RequestOutput]) -> tuple[list[int], list[float], list[bool]]:
    ids = [t for o in outs for t in o.new_token_ids]
    lps = [x for o in outs for x in o.new_logprobs]
    forced = [f for o in outs for f in o.new_forced]
    assert len(ids) == len(lps) == len(forced)
    return ids, lps, forced


def check_model_saw_forced_tokens(r: Request, ids: list[int], forced: list[bool],
                                  seed: int) -> None:
    """Every sampled token was predicted from a context holding the forced tokens (KV), at the
    counter step = number of output tokens so far."""
    for i, (tok, f) in enumerate(zip(ids, forced, strict=True)):
        if not f:
            assert tok == next_token(r.prompt_token_ids + ids[:i], seed, i)


@pytest.mark.parametrize("n", [0, 1, 4])
def test_budget_of_n_tokens_then_forced_close(n: int) -> None:
    sched, runner = make()
    plain = flat(run(*make(), [req("p")])["p"])[0]
    r = req("a", think=n)
    outs = run(sched, runner, [r])["a"]
    ids, lps, forced = flat(outs)
    assert len(ids) == 12 and ids[:n] == plain[:n]
    assert ids[n:n + 3] == list(CLOSE)
    assert forced == [False] * n + [True] * 3 + [False] * (9 - n)
    assert [lp for lp, f in zip(lps, forced, strict=True) if f] == [0.0] * 3
    assert all(lp == -0.5 for lp, f in zip(lps, forced, strict=True) if not f)
    check_model_saw_forced_tokens(r, ids, forced, seed=1)
    last = outs[-1]
    assert last.finished and last.finish_reason == "length" and last.num_output_tokens == 12
    assert last.thinking_outcome == Outcome(
        triggered=True, closed=True, thinking_tokens=n, thinking_time_ms=0, trigger="tokens")
    assert all(o.thinking_outcome is None for o in outs[:-1])
    assert sched.pool.num_used_blocks == 0


def test_unbudgeted_request_has_no_outcome_and_no_forced_tokens() -> None:
    outs = run(*make(), [req("p")])["p"]
    ids, _, forced = flat(outs)
    assert len(ids) == 12 and not any(forced) and outs[-1].thinking_outcome is None


def test_budgeted_and_unbudgeted_together_match_alone() -> None:
    reqs = [req("b1", think=2, seed=3), req("u1", seed=4, base=7),
            req("b2", think=5, seed=5, base=11, max_tokens=9), req("u2", seed=6, base=2)]
    alone = {r.request_id: run(*make(), [r])[r.request_id] for r in reqs}
    together = run(*make(budget=64), reqs)
    for rid, outs in alone.items():
        assert flat(together[rid]) == flat(outs)
        assert together[rid][-1].thinking_outcome == outs[-1].thinking_outcome
    assert together["b2"][-1].thinking_outcome == Outcome(True, True, 5, 0, "tokens")
    assert together["u1"][-1].thinking_outcome is None


def test_preemption_keeps_tokens_and_outcome() -> None:
    reqs = [req(f"r{i}", think=3 + i, max_tokens=14, seed=i, base=5 * i) for i in range(4)]
    roomy = run(*make(num_blocks=200), reqs)
    tight_sched, tight_runner = make(num_blocks=12)  # 48 slots for 4 x (10 + 14) tokens
    tight = run(tight_sched, tight_runner, reqs)
    assert tight_sched.num_preemptions > 0
    for rid, outs in roomy.items():
        assert flat(tight[rid]) == flat(outs)
        assert tight[rid][-1].thinking_outcome == outs[-1].thinking_outcome
    assert tight["r2"][-1].thinking_outcome == Outcome(True, True, 5, 0, "tokens")


def test_max_tokens_trigger_closes_inside_the_completion() -> None:
    outs = run(*make(), [req("a", think=100, max_tokens=5)])["a"]
    ids, _, forced = flat(outs)
    assert ids[2:] == list(CLOSE) and forced == [False, False, True, True, True]
    assert outs[-1].finish_reason == "length"
    assert outs[-1].thinking_outcome == Outcome(True, True, 2, 0, "max_tokens")


def test_time_trigger_from_first_decode_candidate() -> None:
    clock = Clock()
    sched, runner = make(budget=4, clock=clock)
    # 10 prompt tokens in chunks of 4: the prefill's 500 ms do not count toward the budget
    outs = run(sched, runner, [req("a", ms=600)], clock=clock, tick_s=0.25)["a"]
    ids, _, forced = flat(outs)
    # candidates at +0, +250, +500 ms are accepted; at +750 ms the close is forced
    assert forced == [False] * 3 + [True] * 3 + [False] * 6
    assert ids[3:6] == list(CLOSE)
    assert outs[-1].thinking_outcome == Outcome(True, True, 3, 750, "time")


def test_clamped_max_tokens_that_cannot_fit_the_close_is_rejected() -> None:
    sched, _ = make()
    with pytest.raises(EngineError) as err:
        sched.add_request(req("a", think=4, max_tokens=2))
    assert err.value.code == "chat_invalid_request" and err.value.status == 400
    assert "effective max_tokens 2 cannot fit the 3-token" in err.value.message
    with pytest.raises(EngineError):
        sched.add_request(Request("s", [1, 2], SamplingParams(
            stop=("</",), thinking=ThinkingBudgetSpec(CLOSE, 4))))


def test_natural_close_and_unclosed_eos_outcomes() -> None:
    sched, _ = make(eos=frozenset({99}))
    runner = ScriptRunner({"nat": [1, 60, 61, 62, 5, 6, 7, 8], "eos": [1, 2, 3, 99]})
    outs = run(sched, runner, [req("nat", think=3, max_tokens=8), req("eos", think=10)])
    ids, _, forced = flat(outs["nat"])
    assert ids == [1, 60, 61, 62, 5, 6, 7, 8] and not any(forced)
    assert outs["nat"][-1].thinking_outcome == Outcome(False, True, 1, 0)
    assert outs["eos"][-1].finish_reason == "stop"
    assert outs["eos"][-1].thinking_outcome == Outcome(False, False, 4, 0)


def test_abort_mid_close_reports_triggered_unclosed() -> None:
    sched, runner = make()
    sched.add_request(req("a", think=1))
    out: RequestOutput | None = None
    while out is None:
        so = sched.schedule()
        got = sched.update_from_output(so, runner.execute(so))
        if got and got[0].new_forced == [True]:
            out = sched.abort("a")
    assert out is not None and out.finish_reason == "abort"
    assert out.thinking_outcome == Outcome(True, False, 1, 0, "tokens")


def test_real_runner_budget_is_batch_invariant(tiny_llama: LoadedModel) -> None:
    tok = tiny_llama.tokenizer
    close = tuple(tok.encode("</think>"))
    spec = ThinkingBudgetSpec(close, 3)
    sp = SamplingParams(temperature=0.9, top_k=50, max_tokens=10, seed=7, ignore_eos=True,
                        thinking=spec)
    plain = SamplingParams(temperature=0.9, top_k=50, max_tokens=10, seed=8, ignore_eos=True)

    def reqs() -> list[Request]:
        return [Request("b", tok.encode("Let me think about this."), sp),
                Request("u", tok.encode("Hello there, general."), plain)]

    def gen(rs: list[Request]) -> dict[str, list[RequestOutput]]:
        sched, runner = build_core(tiny_llama, EngineConfig(block_size=4, num_blocks=128))
        return drive(sched, runner, rs)

    together = gen(reqs())
    alone = {r.request_id: gen([r])[r.request_id] for r in reqs()}
    for rid in ("b", "u"):
        (ids_t, lps_t, f_t), (ids_a, lps_a, f_a) = flat(together[rid]), flat(alone[rid])
        assert (ids_t, f_t) == (ids_a, f_a)
        # the batch's shape changes the torch path's summation order, so the logprobs move
        # within the forward bound (tests/numerics.py); the tokens come from the same seeds
        bound = sampled_logprob_atol(tiny_llama.model, tiny_llama.config, 40, 0.9)
        assert max(abs(a - b) for a, b in zip(lps_t, lps_a, strict=True)) <= bound
        ot, oa = together[rid][-1].thinking_outcome, alone[rid][-1].thinking_outcome
        assert (ot is None) == (oa is None) == (rid == "u")
        if ot is not None and oa is not None:  # the real clock: time differs
            assert (ot.triggered, ot.trigger, ot.closed, ot.thinking_tokens) == (
                oa.triggered, oa.trigger, oa.closed, oa.thinking_tokens)
    ids, _, forced = flat(together["b"])
    assert ids[3:3 + len(close)] == list(close)
    assert forced == [False] * 3 + [True] * len(close) + [False] * (7 - len(close))
    o = together["b"][-1].thinking_outcome
    assert o is not None and (o.trigger, o.closed, o.thinking_tokens) == ("tokens", True, 3)
