"""The completions SSE stream: `text_completion` chunks of every choice as they advance (each
choice's first chunk carries its echo), the finish on each choice's last chunk, an optional
usage chunk with no choices, then `[DONE]`. Closing the stream aborts every engine request."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

from kiln.api._generated import wire
from kiln.api.replies.logprobs import CompletionLogprobs
from kiln.api.requests.completions_gen import Prepared, echo_logprobs, merged, stop_text, usage
from kiln.api.sse import DONE, event, generation_error
from kiln.api.state import AppState, Finish, finish_reason
from kiln.api.submission import Completion, request_fault
from kiln.api.weight_versions import spans_wire, version_of
from kiln.engine.outputs import RequestOutput, RequestStream


def _usage(prep: Prepared, tallies: list[Completion]) -> wire.Usage:
    return usage(prep, sum(t.num_output_tokens for t in tallies),
                 [t.num_cached_tokens for t in tallies])


class _Choice:
    """One choice's running state: pending text/tokens until its next chunk."""

    def __init__(self, state: AppState, prep: Prepared, index: int) -> None:
        self.index = index
        self.prompt = prep.prompts[prep.prompt_of(index)].ids
        self.context = list(self.prompt)
        self.logprobs: CompletionLogprobs | None = None
        self.text = ""
        self.ids: list[int] = []
        self.sent_first = False
        self.tally = Completion()  # records the request's metrics when it finishes
        p = prep.prompt_of(index)
        if prep.shape.echo:
            self.text = prep.prompts[p].text
        if prep.shape.logprobs is not None:
            self.logprobs = echo_logprobs(state, prep, p)


class _Stream:
    def __init__(self, state: AppState, prep: Prepared) -> None:
        self.state, self.prep = state, prep
        self.created = int(time.time())
        self.choices: list[_Choice] = []  # continuous_usage_stats: their tallies so far

    def frame(self, choices: list[wire.TextCompletionChunkChoice],
              usage: wire.Usage | None = None, weight_version: str | None = None) -> bytes:
        chunk = wire.TextCompletionChunk(id=self.prep.completion_id, object="text_completion",
                                         created=self.created, model=self.prep.shape.model,
                                         choices=choices)
        if weight_version is not None:  # on a choice's finishing chunk
            chunk.weight_version = weight_version
        if usage is None and self.prep.shape.continuous_usage:
            usage = _usage(self.prep, [c.tally for c in self.choices])
        if usage is not None:
            chunk.usage = usage
        return event(chunk)

    def chunk(self, ch: _Choice, finish: Finish | None = None,
              stop_reason: str | int | None = None, ended: RequestOutput | None = None
              ) -> bytes:
        choice = wire.TextCompletionChunkChoice(index=ch.index, text=ch.text, logprobs=None,
                                                finish_reason=finish, stop_reason=stop_reason)
        if ch.logprobs is not None:
            choice.logprobs = ch.logprobs.wire()
            ch.logprobs = CompletionLogprobs(as_ids=self.prep.as_ids, offset=ch.logprobs.offset)
        if self.prep.prompt_logprobs is not None and not ch.sent_first:
            choice.prompt_logprobs = self.prep.prompt_lists[self.prep.prompt_of(ch.index)]
        if self.prep.shape.return_token_ids:
            if not ch.sent_first:
                choice.prompt_token_ids = ch.prompt
            choice.token_ids = ch.ids
        ch.text, ch.ids, ch.sent_first = "", [], True
        version = None
        if finish is not None:
            spans = ended.weight_spans if ended is not None else ()
            version = version_of(spans, ended.weight_version if ended is not None else None,
                                 self.state.backend)
            if (wire_spans := spans_wire(spans)) is not None:
                choice.weight_versions = wire_spans
        return self.frame([choice], weight_version=version)

    def add(self, ch: _Choice, out: RequestOutput) -> None:
        ch.tally.add(out)
        ch.text += out.text_delta
        ch.ids.extend(out.new_token_ids)
        if ch.logprobs is not None:
            ch.logprobs.add_generated(self.state.backend.tokenizer, ch.context,
                                      out.new_token_ids, out.new_top_logprobs)
        ch.context.extend(out.new_token_ids)


async def frames(state: AppState, prep: Prepared, streams: list[RequestStream],
                 started: float) -> AsyncIterator[bytes]:
    sse = _Stream(state, prep)
    choices = [_Choice(state, prep, i) for i in range(len(prep.run.params))]
    sse.choices = choices
    live = [i for i, p in enumerate(prep.run.params) if p.max_tokens > 0]
    queue, tasks = merged(live, streams)
    completion_tokens = 0
    cached = [0] * len(prep.run.params)
    timeout = state.config.request_timeout_s
    deadline = asyncio.get_running_loop().time() + timeout - (time.perf_counter() - started)
    try:
        for i, p in enumerate(prep.run.params):  # echo first; a max_tokens 0 choice is done at once
            ch = choices[i]
            if p.max_tokens == 0:
                yield sse.chunk(ch, "length")
            elif ch.text or (ch.logprobs is not None and ch.logprobs.tokens):
                yield sse.chunk(ch)
        pending, since = set(live), {i: 0 for i in live}
        while pending:
            try:
                async with asyncio.timeout_at(deadline):
                    i, out = await queue.get()
            except TimeoutError:
                yield generation_error(
                    f"streaming generation timed out after {round(timeout * 1000)} ms")
                yield DONE
                return
            ch = choices[i]
            if out is None:
                if i in pending:  # ended without a finished output
                    yield generation_error("generation ended without a result")
                    yield DONE
                    return
                continue
            sse.add(ch, out)
            if out.finished:
                pending.discard(i)
                if out.finish_reason in ("error", "abort"):
                    yield generation_error(out.error or "generation failed", request_fault(
                        out.error, "completion_invalid_request", prep.run.mix_param))
                    yield DONE
                    return
                completion_tokens += out.num_output_tokens
                cached[i] = out.num_cached_tokens
                ch.text += stop_text(prep, out.finish_reason, out.stop_reason)
                yield sse.chunk(ch, finish_reason(out.finish_reason), out.stop_reason, out)
                continue
            since[i] += len(out.new_token_ids)
            first = not ch.sent_first
            if (first or since[i] >= prep.stream_interval) and (
                    ch.text or (ch.logprobs is not None and ch.logprobs.tokens)):
                since[i] = 0
                yield sse.chunk(ch)
        if prep.shape.include_usage:
            yield sse.frame([], usage(prep, completion_tokens, cached))
        yield DONE
    finally:
        for t in tasks:
            t.cancel()
        for s in streams:
            await s.aclose()
