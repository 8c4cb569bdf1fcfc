from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from kiln.engine.config import EngineConfig
from kiln.engine.errors import EngineError
from kiln.engine.loop import AsyncEngine
from kiln.engine.outputs import ModelRunnerOutput, RequestOutput, SchedulerOutput
from kiln.engine.request import Request, SamplingParams
from kiln.engine.scheduler import Scheduler
from tests.engine.fakes import FakeRunner


class SlowRunner(FakeRunner):
    """Waits on an event before every step (after ``hold_after`` free steps), so tests control
    the engine's pace."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        super().__init__(num_blocks, block_size)
        self.gate = threading.Event()
        self.gate.set()
        self.hold_after = 0

    def execute(self, so: SchedulerOutput) -> ModelRunnerOutput:
        if len(self.steps) >= self.hold_after:
            assert self.gate.wait(10)
        return super().execute(so)


@pytest.fixture
def engine() -> Iterator[tuple[AsyncEngine, SlowRunner]]:
    cfg = EngineConfig(block_size=4, num_blocks=64, max_num_batched_tokens=32)
    runner = SlowRunner(64, 4)
    eng = AsyncEngine.from_components(Scheduler(cfg, 64, 200), runner)
    eng.start()
    yield eng, runner
    runner.gate.set()
    eng.shutdown()


def req(rid: str, max_tokens: int = 6, n: int = 9) -> Request:
    return Request(rid, list(range(1, n + 1)), SamplingParams(max_tokens=max_tokens, seed=3))


async def collect(eng: AsyncEngine, r: Request) -> list[RequestOutput]:
    return [o async for o in eng.generate(r)]


def test_generate_streams_until_finished(engine: tuple[AsyncEngine, SlowRunner]) -> None:
    eng, _ = engine

    async def main() -> list[list[RequestOutput]]:
        return list(await asyncio.gather(*(collect(eng, req(f"r{i}")) for i in range(5))))

    results = asyncio.run(main())
    for outs in results:
        assert sum(len(o.new_token_ids) for o in outs) == 6
        assert outs[-1].finished and outs[-1].finish_reason == "length"
        assert not any(o.finished for o in outs[:-1])
    assert [o.new_token_ids for o in results[0]] == [o.new_token_ids for o in results[4]]
    stats = eng.stats()
    assert stats["running"] == 0 and stats["kv_blocks_used"] == 0 and stats["steps"] > 0


def test_admission_error_raised_synchronously(engine: tuple[AsyncEngine, SlowRunner]) -> None:
    eng, _ = engine

    async def main() -> None:
        with pytest.raises(EngineError) as e:
            eng.add_request(req("big", n=200))
        assert e.value.code == "context_length_exceeded" and e.value.status == 400
        outs = await collect(eng, req("zero", max_tokens=0))
        assert len(outs) == 1 and outs[0].finish_reason == "length"
        assert outs[0].num_prompt_tokens == 9

    asyncio.run(main())


def test_cancel_aborts_and_frees_blocks(engine: tuple[AsyncEngine, SlowRunner]) -> None:
    eng, runner = engine

    async def main() -> None:
        got_first = asyncio.Event()
        runner.hold_after = len(runner.steps) + 2  # then hold: the request is still running
        runner.gate.clear()

        async def consume() -> None:
            async for _ in eng.generate(req("long", max_tokens=150)):
                got_first.set()

        task = asyncio.create_task(consume())
        await asyncio.wait_for(got_first.wait(), 120)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        runner.gate.set()
        for _ in range(500):
            if eng.stats()["kv_blocks_used"] == 0 and eng.stats()["running"] == 0:
                break
            await asyncio.sleep(0.01)
        assert eng.stats()["kv_blocks_used"] == 0 and eng.stats()["running"] == 0

    asyncio.run(main())


def test_abort_delivers_final_abort_output(engine: tuple[AsyncEngine, SlowRunner]) -> None:
    eng, runner = engine

    async def main() -> None:
        runner.gate.clear()
        queue = eng.add_request(req("a", max_tokens=100))
        eng.abort("a")
        runner.gate.set()
        while True:
            out = await asyncio.wait_for(queue.get(), 120)
            if out.finished:
                break
        assert out.finish_reason == "abort" and out.metrics is not None

    asyncio.run(main())


def test_model_failure_errors_the_step_and_engine_keeps_serving(
        engine: tuple[AsyncEngine, SlowRunner]) -> None:
    eng, runner = engine

    async def main() -> None:
        runner.fail_next = True
        outs = await collect(eng, req("bad"))
        assert outs[-1].finish_reason == "error" and "boom" in (outs[-1].error or "")
        ok = await collect(eng, req("good"))
        assert ok[-1].finish_reason == "length"
        assert eng.stats()["failed_steps"] == 1

    asyncio.run(main())


def test_idle_engine_thread_sleeps(engine: tuple[AsyncEngine, SlowRunner]) -> None:
    eng, runner = engine
    asyncio.run(collect(eng, req("x")))
    steps = len(runner.steps)
    threading.Event().wait(0.2)
    assert len(runner.steps) == steps  # no empty steps while idle


def test_not_started_engine_refuses() -> None:
    cfg = EngineConfig(block_size=4, num_blocks=8)
    eng = AsyncEngine.from_components(Scheduler(cfg, 8, 100), FakeRunner(8, 4))

    async def main() -> None:
        with pytest.raises(EngineError):
            eng.add_request(req("a"))

    asyncio.run(main())


def test_scheduler_and_loop_import_without_torch() -> None:
    code = ("import sys; import kiln.engine, kiln.engine.scheduler, kiln.engine.block_pool, "
            "kiln.engine.loop, kiln.engine.outputs; assert 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_abort_all_ends_every_request_with_its_message() -> None:
    """The drain's last resort: every running and waiting request ends with "abort" and the
    message, and the pool gets its blocks back."""
    import asyncio

    from kiln.engine.config import EngineConfig
    from kiln.engine.loop import AsyncEngine
    from kiln.engine.request import Request, SamplingParams
    from kiln.engine.scheduler import Scheduler
    from tests.engine.fakes import FakeRunner

    class SlowRunner(FakeRunner):  # 10 ms a step: nothing finishes on its own meanwhile
        def execute(self, so):
            import time

            time.sleep(0.01)
            return super().execute(so)

    eng = AsyncEngine.from_components(
        Scheduler(EngineConfig(block_size=4, num_blocks=64, max_num_batched_tokens=32), 64, 200),
        SlowRunner(64, 4))
    eng.start()

    async def main() -> list[tuple[str | None, str | None]]:
        streams = [eng.generate(Request(f"r{i}", [1, 2, 3], SamplingParams(max_tokens=10_000,
                                                                           ignore_eos=True)))
                   for i in range(3)]
        firsts = [await anext(s) for s in streams]
        assert all(not o.finished for o in firsts)
        eng.abort_all("drained")
        finals = []
        for s in streams:
            async for out in s:
                last = out
            finals.append((last.finish_reason, last.error))
        return finals

    try:
        assert asyncio.run(main()) == [("abort", "drained")] * 3
        assert eng.scheduler.pool.num_used_blocks == 0
    finally:
        eng.shutdown()
