"""POST /v1/completions/batch: prompts x n completions, all running concurrently in the engine.

Items are ordered by prompt then completion; completion (p, c) uses seed + p*n + c. A per-item
generation failure gives that item finish_reason "error" (docs/decisions.md); bad input rejects the
whole request.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from kiln.api._generated import wire
from kiln.api.body import read_json_body
from kiln.api.encode import json_response
from kiln.api.errors import ApiError
from kiln.api.handlers.adapters import select
from kiln.api.handlers.chat_prepare import (
    apply_budget,
    render_prompt,
    template_kwargs,
    too_long,
    tools_enabled,
)
from kiln.api.handlers.completions_gen import scored_prompt
from kiln.api.handlers.constraints import constraint, plain
from kiln.api.handlers.extras import (
    chat_extras,
    included_stop,
    prompt_logprobs_wanted,
    response_id,
    thinking_tokens,
    truncate,
    truncation,
)
from kiln.api.handlers.generation import Admitted, Completion, collect, submit_all, until_disconnect
from kiln.api.handlers.logprobs import chat_content
from kiln.api.handlers.models import resolve_model
from kiln.api.handlers.params import (
    U64,
    effective_max_tokens,
    normalize_stop,
    opt,
    requested_max_tokens,
    sampling_params,
    state_default,
    state_max_tokens,
)
from kiln.api.rules import check_batch
from kiln.api.state import AppState, app_state, request_id
from kiln.engine.request import SamplingParams
from kiln.text.budget import resolve
from kiln.text.reasoning import CLOSE_TAG, fold, prompt_starts_in_reasoning, split_reasoning
from kiln.text.tools import closing_stop, parse_closed, tool_format

ERROR_CODE = "batch_invalid_request"


async def create(request: Request) -> Response:
    state = app_state(request)
    body = await read_json_body(request, state.config.max_body_bytes)
    req = state.contract.parse(
        "BatchCompletionRequest", body, wire.BatchCompletionRequest, ERROR_CODE
    )
    check_batch(req)
    model, model_adapter = resolve_model(state.backend, opt(req.model))
    selection = await select(state.backend, req.adapter, req.adapters, model_adapter, tri_state=True)
    n = int(opt(req.n) or 1)
    tools = opt(req.tools) or None
    kwargs = template_kwargs(state, req.chat_template_kwargs, ERROR_CODE)
    tool_choice = plain(opt(req.tool_choice))
    if tool_choice is not None:  # as chat renders it: templates may read tool_choice
        kwargs.setdefault("tool_choice", tool_choice)
    limit = state.backend.max_model_len
    requested = requested_max_tokens(req.max_tokens, req.max_completion_tokens)
    model_default = state_max_tokens(state)
    keep = truncation(req, limit, requested if requested is not None else model_default,
                      ERROR_CODE)
    special = opt(req.add_special_tokens) is True  # vLLM's chat field: BOS on top of the template
    prompts: list[tuple[list[int], bool]] = []
    for p, messages in enumerate(req.prompts):
        text = render_prompt(state, messages, tools, kwargs)
        if keep is None and state.backend.tokenizer.surely_over(text, limit):
            raise too_long(limit, len(text), f"prompts[{p}]")
        ids = state.backend.tokenizer.encode(text, add_special_tokens=special)
        if keep is not None and len(ids) > keep:  # truncate_prompt_tokens, as chat
            ids = truncate(ids, keep, opt(req.truncation_side))
            text = state.backend.tokenizer.decode(ids)
        if len(ids) >= limit:
            raise ApiError(
                400, "context_length_exceeded",
                f"prompt {p} has {len(ids)} tokens; the maximum context length is {limit}",
                param=f"prompts[{p}]",
            )
        prompts.append((ids, prompt_starts_in_reasoning(text)))
    stop = normalize_stop(opt(req.stop))
    seed = opt(req.seed)
    rid = request_id(request)
    budget = resolve(
        thinking_tokens(req, ERROR_CODE), req.thinking_budget_ms,
        state.config.default_thinking_budget_tokens, state.config.default_thinking_budget_ms,
    )
    close_ids = tuple(state.backend.tokenizer.encode(CLOSE_TAG))
    grammars = {  # one constraint for every item; it starts after the reasoning when there is one
        in_reasoning: await constraint(
            state.backend.tokenizer, code=ERROR_CODE, response_format=opt(req.response_format),
            structured_outputs=opt(req.structured_outputs), tools=tools, tool_choice=tool_choice,
            parallel_tool_calls=opt(req.parallel_tool_calls) is not False,
            ignore_eos=bool(opt(req.ignore_eos)), after=close_ids if in_reasoning else (),
            tool_format=tool_format(getattr(state.backend.chat_template, "source", None)),
            deadline_s=state.config.grammar_compile_timeout_s)
        for in_reasoning in sorted({r for _, r in prompts})}
    base = state_default(state)
    extras = chat_extras(req, state.backend.tokenizer, stop, requested,
                         state.config.max_logprobs, code=ERROR_CODE)  # as chat: every item
    logprobs = extras["logprobs"]
    token_ids = opt(req.return_token_ids) is True
    as_ids = opt(req.return_tokens_as_token_ids) is True
    k_prompt = prompt_logprobs_wanted(req, state.config.max_logprobs, ERROR_CODE)
    include_stop = opt(req.include_stop_str_in_output) is True
    work: list[tuple[str, list[int], SamplingParams, tuple[tuple[Any, float], ...]]] = []
    for p, (ids, in_reasoning) in enumerate(prompts):
        max_tokens = effective_max_tokens(requested, len(ids), limit, model_default)
        spec = apply_budget(state, budget, in_reasoning, max_tokens, stop, "chat_invalid_request")
        for c in range(n):
            item_seed = None if seed is None else (int(seed) + p * n + c) % U64
            params = sampling_params(
                req, max_tokens=max_tokens, stop=stop, seed=item_seed, base=base
            )
            params = replace(params, thinking=spec, grammar=grammars[in_reasoning], **extras)
            work.append((f"{rid}-{p}-{c}", ids, params, selection.lora))
    jobs = submit_all(state, work, code="batch_too_large", cache_salt=opt(req.cache_salt),
                      priority=int(opt(req.priority) or 0))
    results = await until_disconnect(request, _gather(jobs))
    prompt_lists = [] if k_prompt is None else [  # vLLM's prompt_logprobs, per prompt
        await scored_prompt(state, ids, k_prompt, selection.lora) for ids, _ in prompts]
    parse_tools = tools if tools_enabled(tools, tool_choice) else None
    items = []
    usage = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
    for k, done in enumerate(results):
        p, c = divmod(k, n)
        kept = included_stop(include_stop, done.finish_reason, done.stop_reason, stop)
        item = _item(state, p, c, done, len(prompts[p][0]), prompts[p][1], kept)
        _add_tool_calls(item, parse_tools, first_only=opt(req.parallel_tool_calls) is False,
                        stop="" if kept else closing_stop(done.finish_reason, done.stop_reason))
        if work[k][2].thinking is not None and done.thinking_outcome is not None:
            item["thinking_budget"] = done.thinking_outcome.wire()
        if item["finish_reason"] != "error":
            ids = prompts[p][0]
            if logprobs is not None:
                item["logprobs"] = {"content": chat_content(
                    state.backend.tokenizer, ids, done.token_ids, done.tops, as_ids=as_ids)}
            if prompt_lists:
                item["prompt_logprobs"] = prompt_lists[p]
            if token_ids:
                item["prompt_token_ids"] = ids
                item["token_ids"] = done.token_ids
        items.append(item)
        for key in usage:
            usage[key] += items[-1]["usage"][key]
    return json_response(
        {
            "id": response_id(req, "batchcmpl"),  # vLLM's request_id, else a fresh uuid
            "object": "batch.completion",
            "created": int(time.time()),
            "model": model,
            "completions": items,
            "usage": usage,
            "metadata": {"thinking_budget": budget.effective()},
        }
    )


async def _gather(jobs: list[Admitted]) -> list[Completion]:
    try:
        return list(await asyncio.gather(*(collect(j) for j in jobs)))
    finally:
        for j in jobs:
            await j.aclose()


def _add_tool_calls(item: dict[str, Any], tools: list[Any] | None, first_only: bool,
                    stop: str = "") -> None:
    if tools is None or item["finish_reason"] == "error":
        return
    parsed = parse_closed(item["text"], tools, stop)
    calls = parsed.tool_calls[:1] if first_only else parsed.tool_calls
    if calls:
        item["text"] = parsed.content
        item["tool_calls"] = [call.wire() for call in calls]
        if item["finish_reason"] != "length":  # max_tokens may have cut a further call short
            item["finish_reason"] = "tool_calls"


def _item(
    state: AppState, p: int, c: int, done: Completion, prompt_len: int, in_reasoning: bool,
    kept: str = "",
) -> dict[str, Any]:
    """One item's body; ``kept`` is the stop string include_stop_str_in_output puts back."""
    item: dict[str, Any] = {"prompt_index": p, "completion_index": c}
    if done.finish_reason in ("error", "abort"):
        item.update(text="", finish_reason="error")
    else:
        reasoning, content = split_reasoning(done.text + kept, in_reasoning)
        if state.config.fold_reasoning_into_content and reasoning:
            content = fold(reasoning, content)
        item["text"] = content
        if reasoning is not None:
            item["reasoning_content"] = reasoning
        item["finish_reason"] = done.finish_reason
        if done.stop_reason is not None:
            item["stop_reason"] = done.stop_reason
    item["usage"] = {
        "prompt_tokens": prompt_len,
        "completion_tokens": done.num_output_tokens,
        "total_tokens": prompt_len + done.num_output_tokens,
    }
    return item
