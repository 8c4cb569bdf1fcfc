"""The output stage: text deltas and stop strings after each step; the scheduler stops on token
ids and lengths only and frees a request the stage stopped by a string."""

from __future__ import annotations

import asyncio

from kiln.engine.config import EngineConfig
from kiln.engine.loop import AsyncEngine
from kiln.engine.output_processor import OutputProcessor
from kiln.engine.outputs import RequestOutput
from kiln.engine.request import Request, SamplingParams
from kiln.engine.scheduler import Scheduler
from tests.engine.drive import drive, text, token_ids
from tests.engine.fakes import CharDetok, FakeRunner, ScriptRunner


def make(eos: frozenset[int] = frozenset()) -> tuple[Scheduler, OutputProcessor]:
    cfg = EngineConfig(block_size=4, num_blocks=64, max_num_batched_tokens=32, max_num_seqs=16)
    return Scheduler(cfg, 64, 1000, eos_token_ids=eos), OutputProcessor(lambda sp: CharDetok())


def req(rid: str, max_tokens: int = 8, n: int = 10, **kw: object) -> Request:
    sp = SamplingParams(max_tokens=max_tokens, seed=1, **kw)  # type: ignore[arg-type]
    return Request(rid, [i % 50 for i in range(n)], sp)


def test_eos_counts_but_has_no_text() -> None:
    sched, _ = make()
    toks = token_ids(drive(sched, FakeRunner(64, 4), [req("probe", max_tokens=6)])["probe"])
    eos = toks[2]
    sched2, stage2 = make(eos=frozenset({eos}))
    outs = drive(sched2, FakeRunner(64, 4), [req("a", max_tokens=6)], output=stage2)["a"]
    assert token_ids(outs) == toks[:3] and outs[-1].finish_reason == "stop"
    assert outs[-1].num_output_tokens == 3 and outs[-1].stop_reason is None
    assert text(outs) == "".join(chr(97 + t % 26) for t in toks[:2])
    sched3, stage3 = make(eos=frozenset({eos}))
    b = drive(sched3, FakeRunner(64, 4), [req("b", max_tokens=6, ignore_eos=True)], output=stage3)
    assert token_ids(b["b"]) == toks


def test_stop_string_truncates_and_never_leaks() -> None:
    sched, stage = make()
    full = text(drive(sched, FakeRunner(64, 4), [req("probe")], output=stage)["probe"])
    stop = full[3:5]
    sched2, stage2 = make()
    outs = drive(sched2, FakeRunner(64, 4), [req("a", stop=(stop, "zzzzzz"))], output=stage2)["a"]
    assert text(outs) == full[: full.index(stop)]
    assert outs[-1].finish_reason == "stop" and outs[-1].stop_reason == stop
    assert sched2.pool.num_used_blocks == 0 and not sched2.has_work
    assert stage.num_requests == stage2.num_requests == 0


def test_stop_string_ends_the_request_as_its_final_output() -> None:
    """The output that completes a stop string is the request's last: it is finished, carries
    the final metrics and counts, and the scheduler frees the request's blocks."""
    sched, stage = make()
    runner = ScriptRunner({"a": [0, 1, 2, 3, 4, 5, 6, 7]})  # "abcdefgh"
    outs = drive(sched, runner, [req("a", stop=("cd",))], output=stage)["a"]
    assert token_ids(outs) == [0, 1, 2, 3] and text(outs) == "ab"
    assert [o.finished for o in outs] == [False, False, False, True]
    last = outs[-1]
    assert (last.finish_reason, last.stop_reason, last.num_output_tokens) == ("stop", "cd", 4)
    assert last.metrics is not None and len(last.metrics.token_times) == 4
    assert last.metrics.finished_time is not None
    assert sched.pool.num_used_blocks == 0 and not sched.has_work and stage.num_requests == 0


def test_stop_string_on_the_last_allowed_token_wins_over_length() -> None:
    sched, stage = make()
    outs = drive(sched, ScriptRunner({"a": [0, 1, 2, 3]}), [req("a", max_tokens=3, stop=("bc",))],
                 output=stage)["a"]
    assert text(outs) == "a" and outs[-1].finish_reason == "stop"
    assert outs[-1].stop_reason == "bc" and outs[-1].num_output_tokens == 3


def test_held_back_text_is_released_at_the_end() -> None:
    """Text that could still begin a stop string is held back, and released when the request
    ends by length or on a stop token; the stop token itself makes no text."""
    sched, stage = make(eos=frozenset({3}))
    outs = drive(sched, ScriptRunner({"len": [0, 1, 2, 9], "eos": [0, 1, 2, 3, 9]}),
                 [req("len", max_tokens=3, stop=("cz",)), req("eos", stop=("cz",))],
                 output=stage)
    # "c" waits for a "z": at length it comes with the last token; the EOS step releases it
    assert [o.text_delta for o in outs["len"]] == ["a", "b", "c"]
    assert [o.text_delta for o in outs["eos"]] == ["a", "b", "", "c"]
    for rid, reason in (("len", "length"), ("eos", "stop")):
        assert outs[rid][-1].finish_reason == reason and outs[rid][-1].stop_reason is None
    assert stage.num_requests == 0


def test_abort_and_error_make_no_text_and_drop_the_state() -> None:
    sched, stage = make()
    sched.add_request(r := req("a", stop=("zz",)))
    stage.add_request(r)
    so = sched.schedule()
    first = stage.process(sched.update_from_output(so, FakeRunner(64, 4).execute(so)),
                          sched.finish_stopped)
    assert len(first) == 1 and len(first[0].text_delta) == 1
    out = sched.abort("a")
    assert out is not None
    (final,) = stage.process([out], sched.finish_stopped)
    assert final.text_delta == "" and final.finish_reason == "abort"
    assert stage.num_requests == 0 and sched.pool.num_used_blocks == 0


def test_engine_step_runs_the_output_stage() -> None:
    """Through the engine thread: text deltas and a stop string reach the caller's stream."""
    cfg = EngineConfig(block_size=4, num_blocks=64, max_num_batched_tokens=32)
    stage = OutputProcessor(lambda sp: CharDetok())
    eng = AsyncEngine.from_components(Scheduler(cfg, 64, 200),
                                      ScriptRunner({"a": [0, 1, 2, 3, 4, 5]}), stage)
    eng.start()

    async def main() -> list[RequestOutput]:
        return [o async for o in eng.generate(req("a", stop=("de",)))]

    try:
        outs = asyncio.run(main())
    finally:
        eng.shutdown()
    assert text(outs) == "abc" and outs[-1].stop_reason == "de" and outs[-1].finished
    assert eng.stats()["kv_blocks_used"] == 0 and stage.num_requests == 0
