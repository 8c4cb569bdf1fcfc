"""POST /inference/v1/generate: vLLM's token-in/token-out route (served with
--enable-weight-updates). Token ids and vLLM's sampling parameters in; token ids, logprobs and
the weights' spans out, as JSON or a stream of events.

No engine path of its own: the request becomes the /v1/completions request it stands for (the
ids as the prompt, every sampling parameter under its completions name), parsed and checked by
the contract as that one is, and runs through completions' preparation and submission
(kiln.api.requests.completions_gen). So its tokens equal those of the same prompt sent as text
or ids to /v1/completions, and every field means what it means there. Only the answer's shape is
this module's."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import msgspec
from msgspec import UNSET
from starlette.requests import Request
from starlette.responses import Response

from kiln.api._generated import wire
from kiln.api.handlers.completions import output_constraint
from kiln.api.handlers.training import enabled
from kiln.api.replies.logprobs import chat_content
from kiln.api.requests import completions_gen
from kiln.api.requests.params import resolve_model, select
from kiln.api.requests.refused import COMPLETION_UNSUPPORTED, refuse_unsupported
from kiln.api.sse import DONE, EventStream, event, generation_error
from kiln.api.state import AppState, as_wire, claim_request_id
from kiln.api.submission import Completion, collect_all, request_fault, until_disconnect
from kiln.api.weight_versions import spans_json, version_of
from kiln.api.wire_values import opt
from kiln.engine.outputs import RequestOutput, RequestStream

CODE = "generate_invalid_request"
# GenerateRequest's own fields that /v1/completions has under the same name
PASSED = ("model", "stream", "stream_options", "cache_salt", "priority", "request_id")


def completions_body(req: wire.GenerateRequest) -> dict[str, Any]:
    """The /v1/completions body ``req`` stands for."""
    params = dict(req.sampling_params)
    params.pop("detokenize", None)  # no text is returned either way
    body: dict[str, Any] = {**params, "prompt": list(req.token_ids), "return_token_ids": True}
    for name in PASSED:
        value = getattr(req, name)
        if value is not UNSET and value is not None:
            body[name] = value
    return body


async def create(request: Request) -> Response:
    started, arrived = time.perf_counter(), time.monotonic()
    state = enabled(request)
    req = await state.contract.read(request, state.config.max_body_bytes, "GenerateRequest",
                                    wire.GenerateRequest, CODE)
    body = completions_body(req)
    creq = state.contract.parse("TextCompletionRequest", msgspec.json.encode(body),
                                wire.TextCompletionRequest, CODE)
    refuse_unsupported(creq, COMPLETION_UNSUPPORTED)
    backend = state.backend
    _, adapter = resolve_model(backend, opt(creq.model))
    selection = await select(backend, UNSET, UNSET, adapter, tri_state=True)
    grammar = await output_constraint(state, creq, False)
    prep = completions_gen.prepare(state, creq, selection, adapter or backend.model_id,
                                   max_tokens_given="max_tokens" in req.sampling_params,
                                   grammar=grammar)
    rid = claim_request_id(request, opt(req.request_id))
    prep.completion_id = rid
    await until_disconnect(request, completions_gen.score_echoes(state, prep))
    streams = completions_gen.start(state, prep, rid, arrived)
    if opt(creq.stream):
        async def close() -> None:
            for s in streams:
                await s.aclose()

        return EventStream(_events(state, prep, rid, streams, started), on_close=close)
    done = iter(await until_disconnect(request, collect_all(streams)))
    runs = [next(done) if p.max_tokens > 0 else Completion(finish_reason="length")
            for p in prep.run.params]
    choices = [_choice(state, prep, i, c, c.token_ids, c.tops, final=True)
               for i, c in enumerate(runs)]
    return _json(_response(state, prep, rid, choices, runs[-1], runs))


def _json(body: dict[str, Any]) -> Response:
    return Response(msgspec.json.encode(body), media_type="application/json")


def _choice(state: AppState, prep: completions_gen.Prepared, index: int, c: Completion | None,
            ids: list[int], tops: list[Any], *, final: bool,
            out: RequestOutput | None = None, context: list[int] | None = None
            ) -> dict[str, Any]:
    """A choice's JSON: ``ids`` (and their ``tops``) are the tokens this answer or event
    carries; ``final``: the choice ended here (finish_reason, stop_reason and spans)."""
    choice: dict[str, Any] = {"index": index, "token_ids": ids, "finish_reason": None,
                              "weight_versions": []}
    if prep.shape.logprobs is not None:
        before = context if context is not None else prep.prompts[prep.prompt_of(index)].ids
        choice["logprobs"] = {"content": as_wire(chat_content(
            state.backend.tokenizer, before, ids, tops, as_ids=True))}
    if final:
        reason = c.finish_reason if c is not None else (out.finish_reason if out else None)
        stop = c.stop_reason if c is not None else (out.stop_reason if out else None)
        spans = c.weight_spans if c is not None else (out.weight_spans if out else ())
        if c is not None:
            completions_gen.finish_reason(c, prep.run.mix_param)  # an error or abort: raises
        choice["finish_reason"] = "length" if reason == "length" else "stop"
        if stop is not None:
            choice["stop_reason"] = stop
        choice["weight_versions"] = spans_json(spans)
    return choice


def _response(state: AppState, prep: completions_gen.Prepared, rid: str,
              choices: list[dict[str, Any]], last: Completion | RequestOutput | None,
              runs: list[Completion] | None = None) -> dict[str, Any]:
    spans = last.weight_spans if last is not None else ()
    ended = last.weight_version if last is not None else None
    body: dict[str, Any] = {"request_id": rid, "choices": choices,
                            "weight_version": version_of(spans, ended,
                                                         state.backend)}
    if prep.prompt_logprobs is not None and prep.prompt_lists:
        body["prompt_logprobs"] = as_wire(prep.prompt_lists[0])
    if runs is not None:
        body["usage"] = as_wire(completions_gen.usage(
            prep, sum(c.num_output_tokens for c in runs), [c.num_cached_tokens for c in runs]))
    return body


async def _events(state: AppState, prep: completions_gen.Prepared, rid: str,
                  streams: list[RequestStream], started: float) -> AsyncIterator[bytes]:
    """One event per engine output of any choice (its new ids and logprobs); a choice's last
    event has its finish_reason and spans; a failure ends the stream with an error event."""
    live = [i for i, p in enumerate(prep.run.params) if p.max_tokens > 0]
    for i, p in enumerate(prep.run.params):
        if p.max_tokens == 0:
            yield event(_response(state, prep, rid, [_choice(
                state, prep, i, Completion(finish_reason="length"), [], [], final=True)], None))
    queue, tasks = completions_gen.merged(live, streams)
    timeout = state.config.request_timeout_s
    deadline = asyncio.get_running_loop().time() + timeout - (time.perf_counter() - started)
    pending = set(live)
    # per choice, the tokens before its next ones (the logprobs' token texts)
    contexts = {i: list(prep.prompts[prep.prompt_of(i)].ids) for i in live}
    try:
        while pending:
            try:
                async with asyncio.timeout_at(deadline):
                    i, out = await queue.get()
            except TimeoutError:
                yield generation_error(f"generation timed out after {round(timeout * 1000)} ms")
                yield DONE
                return
            if out is None:
                if i in pending:
                    yield generation_error("generation ended without a result")
                    yield DONE
                    return
                continue
            if out.finished and out.finish_reason in ("error", "abort"):
                yield generation_error(out.error or "generation failed",
                                       request_fault(out.error, CODE, prep.run.mix_param))
                yield DONE
                return
            ids = list(out.new_token_ids)
            choice = _choice(state, prep, i, None, ids, list(out.new_top_logprobs),
                             final=out.finished, out=out, context=contexts[i])
            contexts[i].extend(ids)
            if out.finished:
                pending.discard(i)
            yield event(_response(state, prep, rid, [choice], out if out.finished else None))
        yield DONE
    finally:
        for t in tasks:
            t.cancel()

