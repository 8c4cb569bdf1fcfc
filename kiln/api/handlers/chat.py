"""POST /v1/chat/completions: JSON and SSE."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from kiln.api._generated import wire
from kiln.api.body import read_json_body
from kiln.api.encode import json_response
from kiln.api.errors import ApiError
from kiln.api.handlers import chat_stream, rollout
from kiln.api.handlers.chat_prepare import PreparedChat, prepare_chat
from kiln.api.handlers.completions_gen import scored_prompt
from kiln.api.handlers.extras import included_stop, response_id
from kiln.api.handlers.generation import (
    Admitted,
    Completion,
    collect,
    generation_failed,
    submit,
    submit_all,
    until_disconnect,
)
from kiln.api.handlers.logprobs import chat_content
from kiln.api.handlers.perf import performance
from kiln.api.rules import check_chat
from kiln.api.sse import EventStream
from kiln.api.state import AppState, app_state, request_id
from kiln.text.budget import record
from kiln.text.reasoning import fold, split_reasoning
from kiln.text.tools import ParsedOutput, ToolCall, closing_stop, parse_closed, parse_tool_calls

ERROR_CODE = "chat_invalid_request"


async def create(request: Request) -> Response:
    started, arrived = time.perf_counter(), time.monotonic()
    state = app_state(request)
    body = await read_json_body(request, state.config.max_body_bytes)
    req = state.contract.parse("ChatCompletionRequest", body, wire.ChatCompletionRequest, ERROR_CODE)
    check_chat(req)
    prepared = await prepare_chat(state, req)
    if prepared.rollout:
        rollout.check(state, prepared)
    completion_id = response_id(req, "chatcmpl")  # vLLM's request_id, else a fresh uuid
    rid = request_id(request)
    if prepared.stream:
        outputs = submit(
            state, f"{rid}-0", prepared.prompt_ids, prepared.params[0], prepared.lora, arrived,
            cache_salt=prepared.cache_salt, priority=prepared.priority,
        )
        frames = chat_stream.frames(state, prepared, completion_id, outputs, started)
        return EventStream(frames, on_close=outputs.aclose)
    streams = submit_all(
        state,
        [(f"{rid}-{i}", prepared.prompt_ids, p, prepared.lora) for i, p in enumerate(prepared.params)],
        arrived, code=ERROR_CODE, cache_salt=prepared.cache_salt, priority=prepared.priority,
    )
    completions = await until_disconnect(request, _collect_all(streams))
    body_out = response_body(state, prepared, completion_id, completions, started)
    if prepared.prompt_logprobs is not None:  # vLLM's, beside the choices
        body_out["prompt_logprobs"] = await scored_prompt(
            state, prepared.prompt_ids, prepared.prompt_logprobs, prepared.lora)
    return json_response(body_out)


async def _collect_all(streams: list[Admitted]) -> list[Completion]:
    try:
        return list(await asyncio.gather(*(collect(s) for s in streams)))
    finally:
        for s in streams:
            await s.aclose()


def extract_tool_calls(
    prepared: PreparedChat, reasoning: str | None, content: str, stop: str = ""
) -> tuple[str | None, str, list[ToolCall]]:
    """Tool calls from the answer (or, if it has none, from the reasoning); ``stop`` is a
    client's stop string that closed the last call (``closing_stop``)."""
    if prepared.tools is None:
        return reasoning, content, []
    parsed: ParsedOutput = parse_closed(content, prepared.tools, stop)
    calls = parsed.tool_calls
    if calls:
        content = parsed.content
    elif reasoning:
        from_reasoning = parse_tool_calls(reasoning, prepared.tools)
        if from_reasoning.tool_calls:
            calls = from_reasoning.tool_calls
            reasoning = from_reasoning.content or None
    if not prepared.parallel_tool_calls:
        calls = calls[:1]
    return reasoning, content, calls


def _finish_reason(c: Completion) -> str:
    if c.finish_reason == "error":
        raise generation_failed(c, ERROR_CODE)
    if c.finish_reason == "abort":  # the engine stopped it (shutdown): not a finished answer
        raise ApiError(503, "engine_not_running", c.error or "the engine stopped this request",
                       headers={"retry-after": "1"})
    return c.finish_reason if c.finish_reason in ("stop", "length", "tool_calls") else "stop"


def content_metadata(
    prepared: PreparedChat, reasoning: str | None, content: str, has_tools: bool
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "thinking_enabled": prepared.in_reasoning,
        "thinking_mode": prepared.thinking_mode,
        "thinking_source": prepared.thinking_source,
    }
    if prepared.default_thinking_enabled is not None:
        meta["default_thinking_enabled"] = prepared.default_thinking_enabled
    meta["final_content_empty"] = content == ""
    if content == "":
        if reasoning:
            meta["content_empty_reason"] = "reasoning_without_final_content"
        elif has_tools:
            meta["content_empty_reason"] = "tool_call"
        else:
            meta["content_empty_reason"] = "no_content"
    meta["reasoning_folded_into_content"] = bool(prepared.fold and reasoning)
    return meta


def config_hashes(state: AppState, prepared: PreparedChat) -> dict[str, str]:
    ident = state.backend.identity()
    out: dict[str, str] = {
        key: ident[key]
        for key in ("tokenizer_config_hash", "chat_template_hash", "model_config_hash")
        if key in ident
    }
    out["effective_config_hash"] = prepared.effective_config_hash()
    return out


def response_body(
    state: AppState,
    prepared: PreparedChat,
    completion_id: str,
    completions: list[Completion],
    started: float,
) -> dict[str, Any]:
    choices = []
    first_meta: dict[str, Any] | None = None
    completion_tokens = 0
    for index, c in enumerate(completions):
        finish = _finish_reason(c)
        kept = included_stop(prepared.include_stop, c.finish_reason, c.stop_reason,
                             prepared.params[0].stop)
        reasoning, content = split_reasoning(c.text + kept, prepared.in_reasoning)
        stop = "" if kept else closing_stop(c.finish_reason, c.stop_reason)
        reasoning, content, calls = extract_tool_calls(prepared, reasoning, content, stop)
        meta = content_metadata(prepared, reasoning, content, bool(calls))
        first_meta = first_meta or meta
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if prepared.fold and reasoning:
            message["content"] = fold(reasoning, content)
        message["content"] = prepared.echo_text + message["content"]
        if reasoning is not None:
            message["reasoning_content"] = reasoning
        if calls:
            message["tool_calls"] = [call.wire() for call in calls]
            finish = "length" if finish == "length" else "tool_calls"  # a cut call is told
        choice: dict[str, Any] = {"index": index, "message": message, "finish_reason": finish}
        if c.stop_reason is not None:  # vLLM's: a stop string or token id, repetition_detected
            choice["stop_reason"] = c.stop_reason
        if prepared.return_token_ids:
            choice["token_ids"] = c.token_ids
        if prepared.logprobs is not None:
            choice["logprobs"] = {"content": chat_content(
                state.backend.tokenizer, prepared.prompt_ids, c.token_ids, c.tops,
                as_ids=prepared.as_ids)}
        if prepared.budget_applied and c.thinking_outcome is not None:
            choice["thinking_budget"] = c.thinking_outcome.wire()
        if prepared.rollout:
            choice["rollout_provenance"] = rollout.record(
                state, prepared, prepared.messages, c, message["content"],
                prepared.template_kwargs,
            )
        choices.append(choice)
        completion_tokens += c.num_output_tokens
    prompt_tokens = len(prepared.prompt_ids)
    assert first_meta is not None
    metadata = dict(first_meta)
    metadata["thinking_budget"] = record(
        prepared.budget,
        prepared.budget_applied,
        completions[0].thinking_outcome if prepared.budget_applied else None,
    )
    if prepared.include_config_hashes:
        metadata["config_hashes"] = config_hashes(state, prepared)
    if prepared.include_performance:
        first = completions[0]
        metadata["performance"] = performance(
            first.metrics,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            choice_tokens=first.num_output_tokens,
            total_latency_s=time.perf_counter() - started,
            adapter=prepared.adapter,
            thinking_mode=prepared.thinking_mode,
            finish_reason=str(choices[0]["finish_reason"]),
            tokenization_s=prepared.tokenization_s,
        )
    out: dict[str, Any] = {
        "id": completion_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": prepared.model,
        "choices": choices,
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
        "metadata": metadata,
    }
    if prepared.return_token_ids:
        out["prompt_token_ids"] = prepared.prompt_ids
    return out
