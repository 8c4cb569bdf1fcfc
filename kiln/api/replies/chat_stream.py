"""The chat SSE stream: role chunk (with `prompt_token_ids` under return_token_ids), the echoed
content (echo), content/reasoning deltas, optional token timings, the finish chunk with
metadata, the optional usage chunk, then `[DONE]`. Each choice chunk carries the logprobs and
(return_token_ids) the ids of the tokens generated since the previous one.

Stop strings never reach this layer (the engine holds them back); the reasoning splitter holds
back partial `</think>` tags. Closing this generator (client disconnect) aborts the engine request.

`chunks` is the stream as typed records, a list per engine output; `frames` writes them as SSE.
The Responses and Messages streams (`responses_stream`, `messages_stream`) read `chunks` too and
tell the same generation in their own events: one streaming path for every API.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass

from kiln.api._generated import wire
from kiln.api.errors import ApiError
from kiln.api.replies.logprobs import chat_content
from kiln.api.replies.perf import performance
from kiln.api.requests.extras import included_stop
from kiln.api.requests.prepare import PreparedChat
from kiln.api.sse import DONE, event, generation_error
from kiln.api.state import AppState, Finish, as_wire, finish_reason
from kiln.api.state import usage as token_usage
from kiln.api.submission import Completion, request_fault
from kiln.api.weight_versions import spans_wire, version_of
from kiln.engine.outputs import RequestOutput
from kiln.text.thinking import Delta, ReasoningSplitter, record
from kiln.text.tool_stream import StreamEvents, ToolCallStreamer
from kiln.text.tools import ToolCall, closing_stop

ARGUMENT_FRAGMENT = 16  # characters of arguments JSON per streamed tool-call delta


@dataclass(frozen=True)
class StreamFault:
    """The generation failed mid-stream (the status line is out): the stream's last record.
    ``fault``: the request's own error, sent as it is; else a server-side generation error."""

    message: str
    fault: ApiError | None = None


Item = wire.ChatCompletionChunk | wire.StreamingTokenTiming | StreamFault


def _ms(t: float, start: float) -> float:
    return round(max(0.0, t - start) * 1000.0, 3)


class _Chunks:
    def __init__(self, completion_id: str, model: str, token_ids: bool,
                 reasoning: bool = True) -> None:
        self.id, self.created, self.model = completion_id, int(time.time()), model
        self.reasoning = reasoning  # include_reasoning: false sends no reasoning deltas
        # logprobs content and (with return_token_ids) ids of tokens not sent yet: the next
        # chunk of the choice carries them
        self.pending: list[wire.ChatTokenLogprob] = []
        self.pending_ids: list[int] | None = [] if token_ids else None
        # continuous_usage_stats: the prompt's tokens, and the request's tally so far
        self.running: tuple[int, Completion] | None = None

    def chunk(self, choices: list[wire.ChunkChoice]) -> wire.ChatCompletionChunk:
        out = wire.ChatCompletionChunk(id=self.id, object="chat.completion.chunk",
                                       created=self.created, model=self.model, choices=choices)
        if self.running is not None:
            prompt, tally = self.running
            out.usage = token_usage(prompt, tally.num_output_tokens, tally.num_cached_tokens)
        return out

    def choice(self, delta: wire.Delta, finish: Finish | None = None,
               stop_reason: str | int | None = None,
               metadata: wire.StreamingTerminalMetadata | None = None,
               prompt_ids: list[int] | None = None) -> wire.ChatCompletionChunk:
        choice = wire.ChunkChoice(index=0, delta=delta)
        if self.pending:
            choice.logprobs = wire.ChatLogprobs(content=self.pending)
            self.pending = []
        if self.pending_ids is not None:
            choice.token_ids, self.pending_ids = self.pending_ids, []
        if finish is not None:
            choice.finish_reason = finish
        if stop_reason is not None:  # vLLM's, on the finishing chunk
            choice.stop_reason = stop_reason
        chunk = self.chunk([choice])
        if metadata is not None:
            chunk.kiln_metadata = metadata
        if prompt_ids is not None:
            chunk.prompt_token_ids = prompt_ids
        return chunk

    def deltas(self, d: Delta) -> list[Item]:
        out: list[Item] = []
        if d.reasoning and self.reasoning:
            out.append(self.choice(wire.Delta(reasoning_content=d.reasoning)))
        if d.content:
            out.append(self.choice(wire.Delta(content=d.content)))
        return out

    def tool_call(self, index: int, call: ToolCall) -> list[Item]:
        """Index, id and name first; then argument fragments that concatenate to the JSON."""
        head = {"index": index, "id": call.id, "type": "function",
                "function": {"name": call.name, "arguments": ""}}
        out: list[Item] = [self.choice(wire.Delta(tool_calls=[head]))]
        args = call.arguments
        for start in range(0, len(args), ARGUMENT_FRAGMENT):
            piece = {"index": index, "function": {"arguments": args[start:start + ARGUMENT_FRAGMENT]}}
            out.append(self.choice(wire.Delta(tool_calls=[piece])))
        return out

    def usage(self, prompt: int, completion: int, cached: int) -> wire.ChatCompletionChunk:
        chunk = self.chunk([])
        chunk.usage = token_usage(prompt, completion, cached)
        return chunk


class _ToolFilter:
    """Routes answer text through the tool-call streamer when tool parsing is on."""

    def closes_with(self, stop: str) -> bool:
        return self.streamer is not None and self.streamer.closes_with(stop)

    def __init__(self, prepared: PreparedChat, chunks: _Chunks) -> None:
        self.streamer = ToolCallStreamer(prepared.shape.tools) if prepared.shape.tools else None
        self.parallel = prepared.shape.parallel_tool_calls
        self.chunks = chunks
        self.calls = 0

    def frames(self, delta: Delta, final: bool = False) -> list[Item]:
        if self.streamer is None:
            return self.chunks.deltas(delta)
        events = StreamEvents()
        if delta.content:
            events = self.streamer.push(delta.content)
        if final:
            tail = self.streamer.finish()
            events.content += tail.content
            events.tool_calls.extend(tail.tool_calls)
        out = self.chunks.deltas(Delta(reasoning=delta.reasoning, content=events.content))
        for _, call in events.tool_calls:
            if self.calls and not self.parallel:
                continue
            out.extend(self.chunks.tool_call(self.calls, call))
            self.calls += 1
        return out


def _timing(index: int, token_id: int, ready: float, received: float,
            start: float) -> wire.StreamingTokenTiming:
    now = time.monotonic()
    handler_queue = max(0.0, received - ready)
    return wire.StreamingTokenTiming(
        object="kiln.token_timing",
        source="batching_engine",
        token_index=index,
        token_id=token_id,
        ready_ms=_ms(ready, start),
        producer_delivered_ms=_ms(ready, start),
        handler_received_ms=_ms(received, start),
        body_enqueued_ms=_ms(now, start),
        response_delivery_ms=0.0,
        handler_queue_ms=round(handler_queue * 1000.0, 3),
        queue_delay_ms=round(handler_queue * 1000.0, 3),
        client_delivery_ms=_ms(now, received),
        blocking_phase=None,
        blocking_phase_ms=None,
    )


def _frame(item: Item) -> bytes:
    if isinstance(item, StreamFault):
        return generation_error(item.message, item.fault)
    return event(item)


async def frames(
    state: AppState,
    prepared: PreparedChat,
    completion_id: str,
    outputs: AsyncIterator[RequestOutput],
    started: float,
) -> AsyncIterator[bytes]:
    """The chat SSE stream: one write per engine output, then `[DONE]`."""
    source = chunks(state, prepared, completion_id, outputs, started)
    try:
        async for batch in source:
            yield b"".join(_frame(item) for item in batch)
    finally:
        await source.aclose()
    yield DONE


async def chunks(
    state: AppState,
    prepared: PreparedChat,
    completion_id: str,
    outputs: AsyncIterator[RequestOutput],
    started: float,
) -> AsyncGenerator[list[Item], None]:
    """The stream as records, a list per engine output (one write each); a failure ends it
    with a `StreamFault`."""
    shape = prepared.shape
    chunks = _Chunks(completion_id, shape.model, shape.return_token_ids, shape.reasoning)
    splitter = ReasoningSplitter(prepared.prompt.in_reasoning)
    tools = _ToolFilter(prepared, chunks)
    start_mono = time.monotonic() - (time.perf_counter() - started)
    tally = Completion()  # records the request's metrics when it finishes
    if shape.continuous_usage:
        chunks.running = (len(prepared.prompt.ids), tally)
    yield [chunks.choice(wire.Delta(role="assistant"), prompt_ids=(
        prepared.prompt.ids if shape.return_token_ids else None))]
    if shape.echo_text:  # echo: the final assistant message's content, before what follows it
        yield [chunks.choice(wire.Delta(content=shape.echo_text))]
    final: RequestOutput | None = None
    emitted = 0
    timeout = state.config.request_timeout_s
    # the deadline covers only the waits for the engine, never a yield (a cancellation there
    # would land in the server's send); the clock starts when the request arrived
    deadline = asyncio.get_running_loop().time() + timeout - (time.perf_counter() - started)
    timed_out = False
    it = aiter(outputs)
    context = list(prepared.prompt.ids[-8:])  # the tokens before the next one (logprob texts)
    try:
        while True:
            try:
                async with asyncio.timeout_at(deadline):
                    out = await anext(it)
            except StopAsyncIteration:
                break
            except TimeoutError:
                timed_out = True
                break
            received = time.monotonic()
            tally.add(out)
            if chunks.pending_ids is not None:
                chunks.pending_ids.extend(out.new_token_ids)
            if prepared.shape.logprobs is not None:
                chunks.pending.extend(chat_content(state.backend.tokenizer, context,
                                                   out.new_token_ids, out.new_top_logprobs,
                                                   as_ids=prepared.shape.as_ids))
                context.extend(out.new_token_ids)
            # one write per engine output: its deltas and token timings as one body chunk
            batch = tools.frames(splitter.push(out.text_delta))
            if prepared.shape.explicit_performance:
                ready = out.ready_time if out.ready_time is not None else received
                for token_id in out.new_token_ids:
                    batch.append(_timing(emitted, token_id, ready, received, start_mono))
                    emitted += 1
            if batch:
                yield batch
            if out.finished:
                final = out
                break
    finally:
        aclose = getattr(outputs, "aclose", None)
        if aclose is not None:
            await aclose()
    if final is None or final.finish_reason in ("error", "abort"):
        message = (final.error if final else None) or "generation ended without a result"
        if timed_out:  # docs/behavior.md §10: an error event, no finish chunk
            message = f"streaming generation timed out after {round(timeout * 1000)} ms"
        fault = None if timed_out else request_fault(message, "chat_invalid_request",
                                                      prepared.run.mix_param)
        yield [StreamFault(message, fault)]
        return
    kept = included_stop(prepared.shape.include_stop, final.finish_reason, final.stop_reason,
                         prepared.run.params[0].stop)
    tail_items: list[Item] = []
    if kept:  # include_stop_str_in_output: the stop string is text like the rest
        tail_items.extend(tools.frames(splitter.push(kept)))
    stop = "" if kept else closing_stop(final.finish_reason, final.stop_reason)
    tail = splitter.flush()
    if stop and not tail.reasoning and tools.closes_with(tail.content + stop):
        tail = Delta(reasoning=tail.reasoning, content=tail.content + stop)
    tail_items.extend(tools.frames(tail, final=True))
    prompt_tokens = len(prepared.prompt.ids)
    outcome = final.thinking_outcome if prepared.run.budget_applied else None
    metadata = wire.StreamingTerminalMetadata(thinking_budget=as_wire(
        record(prepared.run.budget, prepared.run.budget_applied, outcome)))
    if prepared.shape.include_performance:
        metadata.performance = performance(
            final.metrics,
            prompt_tokens=prompt_tokens,
            completion_tokens=final.num_output_tokens,
            total_latency_s=time.perf_counter() - started,
            adapter=prepared.run.adapter,
            thinking_mode=prepared.thinking_mode,
            finish_reason=finish_reason(final.finish_reason),
            tokenization_s=prepared.prompt.tokenization_s,
        )
    finish = finish_reason(final.finish_reason)
    if tools.calls and finish != "length":  # max_tokens may have cut a further call short
        finish = "tool_calls"
    closing = chunks.choice(wire.Delta(), finish, final.stop_reason, metadata=metadata)
    closing.weight_version = version_of(final.weight_spans, final.weight_version,
                                        state.backend)
    if (spans := spans_wire(final.weight_spans)) is not None:
        closing.choices[0].weight_versions = spans
    tail_items.append(closing)
    if prepared.shape.include_usage:
        tail_items.append(chunks.usage(prompt_tokens, final.num_output_tokens,
                                       final.num_cached_tokens))
    yield tail_items
