"""Running engine requests from a handler: submit, collect, and abort on client disconnect."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field
from typing import TypeVar

from starlette.requests import Request as HttpRequest

from kiln.api.backend import Backend
from kiln.api.errors import ApiError
from kiln.engine.errors import EngineError
from kiln.engine.metrics import RequestMetrics
from kiln.engine.outputs import RequestOutput
from kiln.engine.request import Request, SamplingParams

T = TypeVar("T")


@dataclass
class Completion:
    """Everything one engine request produced."""

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str = "stop"
    stop_reason: str | int | None = None
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    num_cached_tokens: int = 0
    seed: int = 0
    metrics: RequestMetrics | None = None
    error: str | None = None

    def add(self, out: RequestOutput) -> None:
        self.text += out.text_delta
        self.token_ids.extend(out.new_token_ids)
        self.logprobs.extend(out.new_logprobs)
        self.num_prompt_tokens = out.num_prompt_tokens
        self.num_output_tokens = out.num_output_tokens
        self.num_cached_tokens = out.num_cached_tokens
        self.seed = out.seed
        if out.finished:
            self.finish_reason = out.finish_reason or "stop"
            self.stop_reason = out.stop_reason
            self.metrics = out.metrics
            self.error = out.error


def engine_error(exc: EngineError) -> ApiError:
    param = "messages" if exc.code == "context_length_exceeded" else None
    headers = {"retry-after": "1"} if exc.status == 503 else None
    return ApiError(exc.status, exc.code, exc.message, param=param, headers=headers)


def submit(
    backend: Backend, request_id: str, prompt_ids: list[int], params: SamplingParams
) -> AsyncIterator[RequestOutput]:
    try:
        return backend.submit(Request(request_id, list(prompt_ids), params))
    except EngineError as exc:
        raise engine_error(exc) from None


async def collect(outputs: AsyncIterator[RequestOutput]) -> Completion:
    done = Completion()
    try:
        async for out in outputs:
            done.add(out)
            if out.finished:
                break
    finally:
        aclose = getattr(outputs, "aclose", None)
        if aclose is not None:
            await aclose()
    return done


async def until_disconnect(request: HttpRequest, work: Awaitable[T]) -> T:
    """Await `work`, cancelling it (which aborts its engine requests) if the client goes away.

    Starlette cancels streaming responses on disconnect by itself; non-streaming handlers need
    this watch.
    """
    task = asyncio.ensure_future(work)

    async def watch() -> None:
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                return

    watcher = asyncio.ensure_future(watch())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        watcher.cancel()
        raise
    if not task.done():
        task.cancel()
        watcher.cancel()
        raise ApiError(499, "client_disconnected", "client closed the connection")
    watcher.cancel()
    return task.result()
