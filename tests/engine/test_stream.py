"""RequestStream, the one wrapper between an engine request and its caller: it ends at the
finished output, aborts the request when closed or cancelled early, and runs its close callbacks
exactly once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

import pytest

from kiln.engine.outputs import RequestOutput, RequestStream


def output(finished: bool, token: int = 1) -> RequestOutput:
    return RequestOutput(
        request_id="r", new_token_ids=[token], new_logprobs=[0.0], text_delta="",
        finished=finished, finish_reason="length" if finished else None, stop_reason=None,
        num_prompt_tokens=1, num_output_tokens=token, num_cached_tokens=0, seed=0, metrics=None)


class Recorder:
    def __init__(self) -> None:
        self.aborted: list[str] = []
        self.closed = 0

    def stream(self, queue: asyncio.Queue[RequestOutput]) -> RequestStream:
        s = RequestStream.over_queue("r", queue, self.aborted.append)
        s.on_close(self.close)
        return s

    def close(self) -> None:
        self.closed += 1


def test_ends_at_the_finished_output_without_an_abort() -> None:
    rec = Recorder()

    async def main() -> list[int]:
        queue: asyncio.Queue[RequestOutput] = asyncio.Queue()
        for out in (output(False, 1), output(False, 2), output(True, 3), output(False, 4)):
            queue.put_nowait(out)
        stream = rec.stream(queue)
        got = [o.num_output_tokens async for o in stream]
        await stream.aclose()
        return got

    assert asyncio.run(main()) == [1, 2, 3]  # nothing is read past the finished output
    assert rec.aborted == [] and rec.closed == 1


def test_closing_early_aborts_once_even_before_iterating() -> None:
    rec = Recorder()

    async def main() -> None:
        queue: asyncio.Queue[RequestOutput] = asyncio.Queue()
        stream = rec.stream(queue)
        stream.close_now()
        await stream.aclose()
        with pytest.raises(StopAsyncIteration):
            await anext(stream)

    asyncio.run(main())
    assert rec.aborted == ["r"] and rec.closed == 1


def test_cancelling_a_wait_aborts_the_request() -> None:
    rec = Recorder()

    async def main() -> None:
        queue: asyncio.Queue[RequestOutput] = asyncio.Queue()
        queue.put_nowait(output(False))
        stream = rec.stream(queue)

        async def consume() -> None:
            async for _ in stream:
                pass

        task = asyncio.create_task(consume())
        while queue.qsize():  # the first output is taken; then it waits for the next
            await asyncio.sleep(0)
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert rec.aborted == ["r"] and rec.closed == 1


def test_on_close_after_the_end_runs_at_once() -> None:
    rec = Recorder()
    stream = RequestStream.over_queue("r", asyncio.Queue(), rec.aborted.append)
    stream.close_now()
    stream.on_close(rec.close)
    assert rec.closed == 1 and rec.aborted == ["r"]


def test_a_source_generator_is_closed_by_aclose() -> None:
    closed: list[bool] = []

    async def source() -> AsyncGenerator[RequestOutput, None]:
        try:
            yield output(False)
            yield output(True)
        finally:
            closed.append(True)

    async def main() -> None:
        gen = source()
        stream = RequestStream("r", gen.__anext__, close_source=gen.aclose)
        assert (await anext(stream)).finished is False
        await stream.aclose()

    asyncio.run(main())
    assert closed == [True]
