"""POST /v1/completions/batch: prompts x n completions, all running concurrently in the engine.

Items are ordered by prompt then completion; completion (p, c) uses seed + p*n + c. A per-item
generation failure gives that item finish_reason "error" (docs/decisions.md); bad input rejects the
whole request.
"""

from __future__ import annotations

import time

from starlette.requests import Request
from starlette.responses import Response

from kiln.api._generated import wire
from kiln.api.replies.logprobs import chat_content
from kiln.api.requests.completions_gen import scored_prompt
from kiln.api.requests.extras import included_stop
from kiln.api.requests.prepare import Prompt, Shape, prepare_batch
from kiln.api.requests.refused import BATCH_UNSUPPORTED, refuse_unsupported
from kiln.api.state import (
    AppState,
    app_state,
    as_wire,
    claim_request_id,
    finish_reason,
    json_response,
    usage,
)
from kiln.api.submission import (
    Completion,
    collect_all,
    generation_failed,
    submit_all,
    until_disconnect,
)
from kiln.api.weight_versions import spans_wire, version_of
from kiln.api.wire_values import opt
from kiln.engine.errors import NON_FINITE_MIX
from kiln.text.thinking import fold, split_reasoning
from kiln.text.tools import closing_stop, parse_closed

ERROR_CODE = "batch_invalid_request"


async def create(request: Request) -> Response:
    state = app_state(request)
    req = await state.contract.read(request, state.config.max_body_bytes,
                                    "BatchCompletionRequest", wire.BatchCompletionRequest,
                                    ERROR_CODE)
    refuse_unsupported(req, BATCH_UNSUPPORTED)
    batch = await prepare_batch(state, req, ERROR_CODE)
    shape, rid = batch.shape, claim_request_id(request, opt(req.request_id))
    work = [(f"{rid}-{p}-{c}", prompt.ids, params, run.lora)
            for p, (prompt, run) in enumerate(batch.items) for c, params in enumerate(run.params)]
    run0 = batch.items[0][1]  # cache_salt and priority are the request's, the same on every item
    jobs = submit_all(state, work, code="batch_too_large", cache_salt=run0.cache_salt,
                      priority=run0.priority)
    results = await until_disconnect(request, collect_all(jobs))
    for done in results:  # the request's adapter mix overflowed: its fault, the whole request's
        if done.finish_reason == "error" and done.error == NON_FINITE_MIX:
            raise generation_failed(done, ERROR_CODE, run0.mix_param)
    k_prompt = shape.prompt_logprobs
    prompt_lists = [] if k_prompt is None else [  # vLLM's prompt_logprobs, per prompt
        await scored_prompt(state, prompt.ids, k_prompt, run.lora) for prompt, run in batch.items]
    n = batch.items[0][1].n
    items = []
    for k, done in enumerate(results):
        p, c = divmod(k, n)
        prompt, run = batch.items[p]
        item = _item(state, shape, p, c, done, prompt, run.params[c].stop, run.budget_applied)
        if prompt_lists and item.finish_reason != "error":
            item.prompt_logprobs = prompt_lists[p]
        items.append(item)
    prompt_tokens = sum(item.usage.prompt_tokens for item in items)
    completion_tokens = sum(item.usage.completion_tokens for item in items)
    cached_tokens = sum(done.num_cached_tokens for done in results)
    return json_response(wire.BatchCompletionResponse(
        id=f"batchcmpl-{rid}",  # the X-Request-Id header's id
        object="batch.completion",
        created=int(time.time()),
        model=shape.model,
        completions=items,
        usage=usage(prompt_tokens, completion_tokens, cached_tokens),
        metadata=wire.BatchCompletionMetadata(
            thinking_budget=as_wire(batch.items[0][1].budget.effective())),
    ))


def _item(state: AppState, shape: Shape, p: int, c: int, done: Completion, prompt: Prompt,
          stop: tuple[str, ...], budget_applied: bool) -> wire.BatchCompletionItem:
    """Choice ``c`` of prompt ``p``; a failed choice is finish_reason "error" with no text."""
    item_usage = usage(len(prompt.ids), done.num_output_tokens, done.num_cached_tokens)
    if done.finish_reason in ("error", "abort"):
        item = wire.BatchCompletionItem(prompt_index=p, completion_index=c, text="",
                                        finish_reason="error", usage=item_usage)
        if budget_applied and done.thinking_outcome is not None:
            item.thinking_budget = as_wire(done.thinking_outcome.wire())
        return item
    kept = included_stop(shape.include_stop, done.finish_reason, done.stop_reason, stop)
    reasoning, content = split_reasoning(done.text + kept, prompt.in_reasoning)
    if shape.fold and reasoning:
        content = fold(reasoning, content)
    item = wire.BatchCompletionItem(prompt_index=p, completion_index=c, text=content,
                                    finish_reason=finish_reason(done.finish_reason), usage=item_usage,
                                    weight_version=version_of(done.weight_spans,
                                                              done.weight_version,
                                                              state.backend))
    if (spans := spans_wire(done.weight_spans)) is not None:
        item.weight_versions = spans
    if reasoning is not None and shape.reasoning:
        item.reasoning_content = reasoning
    if done.stop_reason is not None:  # vLLM's: a stop string or token id, repetition_detected
        item.stop_reason = done.stop_reason
    if shape.tools is not None:
        stop_text = "" if kept else closing_stop(done.finish_reason, done.stop_reason)
        parsed = parse_closed(item.text, shape.tools, stop_text)
        calls = parsed.tool_calls if shape.parallel_tool_calls else parsed.tool_calls[:1]
        if calls:
            item.text = parsed.content
            item.tool_calls = [call.wire() for call in calls]
            if item.finish_reason != "length":  # max_tokens may have cut a further call short
                item.finish_reason = "tool_calls"
    if budget_applied and done.thinking_outcome is not None:
        item.thinking_budget = as_wire(done.thinking_outcome.wire())
    if shape.logprobs is not None:
        item.logprobs = wire.ChatLogprobs(content=chat_content(
            state.backend.tokenizer, prompt.ids, done.token_ids, done.tops, as_ids=shape.as_ids))
    if shape.return_token_ids:
        item.prompt_token_ids = prompt.ids
        item.token_ids = done.token_ids
    return item
