"""Running a handler's engine requests: submit them through the admission gate (429 past it),
collect their outputs into a ``Completion`` each, abort them when the client disconnects, turn
an engine error into the API's, and record each finished request's metrics."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from starlette.requests import Request as HttpRequest

from kiln import metrics
from kiln.api.errors import ApiError
from kiln.api.state import AppState, app_state
from kiln.engine.errors import NON_FINITE_MIX, NOTHING_ALLOWED, EngineError
from kiln.engine.outputs import (
    RequestMetrics,
    RequestOutput,
    RequestStream,
    TokenLogprobs,
    WeightSpan,
)
from kiln.engine.request import Request as EngineRequest
from kiln.engine.request import SamplingParams
from kiln.text.thinking import Outcome

T = TypeVar("T")


def observe_request(
    prompt_tokens: int,
    generation_tokens: int,
    finish_reason: str,
    ttft_s: float | None,
    itls_s: list[float],
    e2e_s: float | None,
    queue_s: float | None,
) -> None:
    """A finished request into the Prometheus metrics (kiln/metrics.py defines them; the
    handler that ran the request records it, as the connection layer records connections)."""
    metrics.TOKENS.labels(kind="prompt").inc(prompt_tokens)
    metrics.TOKENS.labels(kind="generation").inc(generation_tokens)
    metrics.FINISHED.labels(finish_reason=finish_reason).inc()
    if ttft_s is not None:
        metrics.TTFT.observe(ttft_s)
    for gap in itls_s:
        metrics.ITL.observe(gap)
    if e2e_s is not None:
        metrics.E2E.observe(e2e_s)
    if queue_s is not None:
        metrics.QUEUE.observe(queue_s)


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
    forced: list[bool] = field(default_factory=list)
    tops: list[TokenLogprobs | None] = field(default_factory=list)  # when logprobs were asked
    thinking_outcome: Outcome | None = None
    # which weights made which output tokens (kiln.engine.outputs.WeightSpan), and the name of
    # the weights serving when the request ended (None: it never reached the engine)
    weight_spans: tuple[WeightSpan, ...] = ()
    weight_version: str | None = None

    def observe(self) -> None:
        """Record this finished request in the Prometheus metrics."""
        m = self.metrics
        e2e = None
        if m is not None and m.finished_time is not None:
            e2e = m.finished_time - m.arrival_time
        observe_request(
            self.num_prompt_tokens,
            self.num_output_tokens,
            self.finish_reason,
            None if m is None else m.ttft,
            [] if m is None else m.inter_token_latencies,
            e2e,
            None if m is None else m.queue_time,
        )

    def add(self, out: RequestOutput) -> None:
        self.text += out.text_delta
        self.token_ids.extend(out.new_token_ids)
        self.logprobs.extend(out.new_logprobs)
        self.forced.extend(out.new_forced)
        self.tops.extend(out.new_top_logprobs)
        self.num_prompt_tokens = out.num_prompt_tokens
        self.num_output_tokens = out.num_output_tokens
        self.num_cached_tokens = out.num_cached_tokens
        self.seed = out.seed
        if out.finished:
            self.finish_reason = out.finish_reason or "stop"
            self.stop_reason = out.stop_reason
            self.metrics = out.metrics
            self.error = out.error
            self.thinking_outcome = out.thinking_outcome
            self.weight_spans = out.weight_spans
            self.weight_version = out.weight_version
            self.observe()


def engine_error(exc: EngineError, prompt_param: str = "messages") -> ApiError:
    """The API error for an engine refusal; ``prompt_param`` names the request field that held
    the prompt, for context_length_exceeded."""
    param = prompt_param if exc.code == "context_length_exceeded" else None
    headers = {"retry-after": "1"} if exc.status == 503 else None
    return ApiError(exc.status, exc.code, exc.message, param=param, headers=headers)


def submit(
    state: AppState,
    request_id: str,
    prompt_ids: list[int],
    params: SamplingParams,
    lora: tuple[tuple[Any, float], ...] = (),
    arrival: float | None = None,
    prompt_param: str = "messages",
    cache_salt: str | None = None,
    priority: int = 0,
) -> RequestStream:
    """Admit one engine request (429 past the gate's capacity); the returned stream releases
    its gate slot when it is closed or exhausted. ``arrival`` (``time.monotonic()``) is when
    the HTTP request arrived: queue time and TTFT count from it, as token timings do."""
    state.gate.enter(1)
    try:
        request = EngineRequest(request_id, list(prompt_ids), params)
        if arrival is not None:
            request.arrival_time = arrival
        if lora:
            request.lora = lora
        request.cache_salt, request.priority = cache_salt, priority
        outputs = state.backend.submit(request)
    except EngineError as exc:
        state.gate.leave()
        raise engine_error(exc, prompt_param) from None
    except BaseException:
        state.gate.leave()
        raise
    outputs.on_close(state.gate.leave)
    return outputs


def submit_all(
    state: AppState, items: list[tuple[str, list[int], SamplingParams, tuple[tuple[Any, float], ...]]],
    arrival: float | None = None, *, code: str, prompt_param: str = "messages",
    cache_salt: str | None = None, priority: int = 0,
) -> list[RequestStream]:
    """Admit several engine requests, all or none: on a failure the admitted ones are closed.
    More than the gate ever holds is a 400 (``code``), not a 429 that no retry could pass."""
    if len(items) > state.gate.capacity:
        raise ApiError(
            400, code,
            f"the request needs {len(items)} engine requests at once; this server admits at most "
            f"{state.gate.capacity} (--max-num-seqs + --max-waiting-requests)",
            param="n",
        )
    admitted: list[RequestStream] = []
    try:
        for request_id, prompt_ids, params, lora in items:
            admitted.append(submit(state, request_id, prompt_ids, params, lora, arrival,
                                   prompt_param, cache_salt, priority))
    except BaseException:
        for a in admitted:
            a.close_now()
        raise
    return admitted


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


async def collect_all(streams: list[RequestStream]) -> list[Completion]:
    """Every admitted request's ``Completion``, in order; all streams are closed at the end
    (which aborts any still running, when this is cancelled)."""
    try:
        return list(await asyncio.gather(*(collect(s) for s in streams)))
    finally:
        for s in streams:
            await s.aclose()


async def until_disconnect(
    request: HttpRequest, work: Awaitable[T], timeout: float | None = None
) -> T:
    """Await `work`, cancelling it (which aborts its engine requests) if the client goes away or
    `timeout` seconds pass (408).

    Starlette cancels streaming responses on disconnect by itself; non-streaming handlers need
    this watch.
    """
    if timeout is None:
        timeout = app_state(request).config.request_timeout_s
    task = asyncio.ensure_future(work)

    async def watch() -> None:
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                return

    watcher = asyncio.ensure_future(watch())
    try:
        await asyncio.wait(
            {task, watcher}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
        )
    except asyncio.CancelledError:
        task.cancel()
        watcher.cancel()
        raise
    if not task.done():
        task.cancel()
        timed_out = not watcher.done()
        watcher.cancel()
        if timed_out:
            raise ApiError(
                408, "request_timeout", f"the request did not finish within {timeout:g} s"
            )
        raise ApiError(499, "client_disconnected", "client closed the connection")
    watcher.cancel()
    return task.result()


def generation_failed(c: Completion, code: str, mix_param: str | None = None) -> ApiError:
    """A finished-with-error completion as the response's error: a 400 (``code``) when the
    request's own logits processors and constraint left no token to sample, or when its adapter
    mix made the logits non-finite (naming ``mix_param``, the field that chose the mix, e.g.
    ``adapters[0].scale``), else a 500."""
    return request_fault(c.error, code, mix_param) or ApiError(
        500, "generation_error", f"generation failed: {c.error or 'unknown error'}")


def request_fault(error: str | None, code: str, mix_param: str | None) -> ApiError | None:
    """The 400 for an engine error that the request itself caused (``generation_failed``);
    None for any other error. Streams send it as their error event."""
    if error == NOTHING_ALLOWED:
        return ApiError(400, code, f"{NOTHING_ALLOWED}: the request can produce no token")
    if error == NON_FINITE_MIX:
        return ApiError(400, code, f"{mix_param}: {NON_FINITE_MIX}", param=mix_param)
    return None
