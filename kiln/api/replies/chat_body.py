"""Chat's answer as the wire's ``ChatCompletionResponse``: reasoning split from content, tool
calls parsed, finish reasons, logprobs, usage, the config hashes and rollout provenance; the
handler (``kiln.api.handlers.chat``) and the agent APIs' turn (``chat_turn``) build it here."""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict
from typing import Any

from kiln.api._generated import wire
from kiln.api.errors import ApiError
from kiln.api.replies.logprobs import chat_content
from kiln.api.replies.perf import performance
from kiln.api.requests import rollout
from kiln.api.requests.extras import included_stop
from kiln.api.requests.prepare import CHAT_CODE, PreparedChat
from kiln.api.state import AppState, Finish, as_wire, finish_reason, usage
from kiln.api.submission import Completion, generation_failed
from kiln.api.weight_versions import spans_wire, version_of
from kiln.text.thinking import fold, record, split_reasoning
from kiln.text.tools import ParsedOutput, ToolCall, closing_stop, parse_closed, parse_tool_calls


def extract_tool_calls(
    prepared: PreparedChat, reasoning: str | None, content: str, c: Completion, kept: str
) -> tuple[str | None, str, list[ToolCall]]:
    """Tool calls from the answer (or, if it has none, from the reasoning); a client's stop
    string that closed the last call (``closing_stop``) is put back for parsing unless the
    text already keeps it (``kept``)."""
    if prepared.shape.tools is None:
        return reasoning, content, []
    stop = "" if kept else closing_stop(c.finish_reason, c.stop_reason)
    parsed: ParsedOutput = parse_closed(content, prepared.shape.tools, stop)
    calls = parsed.tool_calls
    if calls:
        content = parsed.content
    elif reasoning:
        # complete calls only: reasoning cut short while it mentions a call is still reasoning
        from_reasoning = parse_tool_calls(reasoning, prepared.shape.tools, partial=False)
        if from_reasoning.tool_calls:
            calls = from_reasoning.tool_calls
            reasoning = from_reasoning.content or None
    if not prepared.shape.parallel_tool_calls:
        calls = calls[:1]
    return reasoning, content, calls


def _finish_reason(c: Completion, mix_param: str | None) -> Finish:
    if c.finish_reason == "error":
        raise generation_failed(c, CHAT_CODE, mix_param)
    if c.finish_reason == "abort":  # the engine stopped it (shutdown): not a finished answer
        raise ApiError(503, "engine_not_running", c.error or "the engine stopped this request",
                       headers={"retry-after": "1"})
    return finish_reason(c.finish_reason)


def content_metadata(prepared: PreparedChat, reasoning: str | None, content: str,
                     has_tools: bool, budget: dict[str, Any]) -> wire.ChatCompletionMetadata:
    """The response's metadata, from its first choice; ``budget``: the thinking-budget record."""
    meta = wire.ChatCompletionMetadata(
        thinking_enabled=prepared.prompt.in_reasoning,
        thinking_mode=prepared.thinking_mode,
        thinking_source=prepared.prompt.thinking_source,
        final_content_empty=content == "",
        reasoning_folded_into_content=bool(prepared.shape.fold and reasoning),
        thinking_budget=as_wire(budget),
    )
    if prepared.shape.default_thinking_enabled is not None:
        meta.default_thinking_enabled = prepared.shape.default_thinking_enabled
    if content == "":
        meta.content_empty_reason = ("reasoning_without_final_content" if reasoning
                                     else "tool_call" if has_tools else "no_content")
    return meta


def effective_config_hash(prepared: PreparedChat) -> str:
    """What the engine runs (model, adapter, every choice's SamplingParams), hashed."""
    run = prepared.run
    canon = json.dumps(
        {"model": prepared.shape.model, "adapter": run.adapter,
         "params": [asdict(p) for p in run.params], "n": run.n},
        sort_keys=True, default=list,
    )
    return "sha256:" + hashlib.sha256(canon.encode()).hexdigest()


def config_hashes(state: AppState, prepared: PreparedChat) -> wire.ConfigHashes:
    ident = state.backend.identity()
    out = wire.ConfigHashes(effective_config_hash=effective_config_hash(prepared))
    for key in ("tokenizer_config_hash", "chat_template_hash", "model_config_hash"):
        if key in ident:
            setattr(out, key, ident[key])
    return out


def response_body(
    state: AppState,
    prepared: PreparedChat,
    completion_id: str,
    completions: list[Completion],
    started: float,
) -> wire.ChatCompletionResponse:
    prompt, run, shape = prepared.prompt, prepared.run, prepared.shape
    choices: list[wire.Choice] = []
    first_meta: wire.ChatCompletionMetadata | None = None
    completion_tokens = 0
    budget = record(run.budget, run.budget_applied,
                    completions[0].thinking_outcome if run.budget_applied else None)
    for index, c in enumerate(completions):
        finish = _finish_reason(c, run.mix_param)
        kept = included_stop(shape.include_stop, c.finish_reason, c.stop_reason,
                             run.params[0].stop)
        reasoning, content = split_reasoning(c.text + kept, prompt.in_reasoning)
        reasoning, content, calls = extract_tool_calls(prepared, reasoning, content, c, kept)
        first_meta = first_meta or content_metadata(
            prepared, reasoning, content, bool(calls), budget)
        text = fold(reasoning, content) if shape.fold and reasoning else content
        message = wire.ChatMessageOutput(role="assistant", content=shape.echo_text + text)
        if reasoning is not None and shape.reasoning:
            message.reasoning_content = reasoning
        if calls:
            message.tool_calls = [call.wire() for call in calls]
            finish = "length" if finish == "length" else "tool_calls"  # a cut call is told
        choice = wire.Choice(index=index, message=message, finish_reason=finish)
        if c.stop_reason is not None:  # vLLM's: a stop string or token id, repetition_detected
            choice.stop_reason = c.stop_reason
        if shape.return_token_ids:
            choice.token_ids = c.token_ids
        if shape.logprobs is not None:
            choice.logprobs = wire.ChatLogprobs(content=chat_content(
                state.backend.tokenizer, prompt.ids, c.token_ids, c.tops, as_ids=shape.as_ids))
        if run.budget_applied and c.thinking_outcome is not None:
            choice.thinking_budget = as_wire(c.thinking_outcome.wire())
        if (spans := spans_wire(c.weight_spans)) is not None:
            choice.weight_versions = spans
        if shape.rollout:
            choice.rollout_provenance = as_wire(rollout.record(
                state, prepared, prompt.messages, c, shape.echo_text + text,
                prompt.template_kwargs))
        choices.append(choice)
        completion_tokens += c.num_output_tokens
    prompt_tokens = len(prompt.ids)
    assert first_meta is not None
    metadata = first_meta
    if shape.include_config_hashes:
        metadata.config_hashes = config_hashes(state, prepared)
    if shape.include_performance:
        first = completions[0]
        metadata.performance = performance(
            first.metrics,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            choice_tokens=first.num_output_tokens,
            total_latency_s=time.perf_counter() - started,
            adapter=run.adapter,
            thinking_mode=prepared.thinking_mode,
            finish_reason=choices[0].finish_reason,
            tokenization_s=prompt.tokenization_s,
        )
    out = wire.ChatCompletionResponse(
        id=completion_id,
        object="chat.completion",
        created=int(time.time()),
        model=shape.model,
        choices=choices,
        usage=usage(prompt_tokens, completion_tokens, completions[0].num_cached_tokens),
        kiln_metadata=metadata,
        weight_version=version_of(completions[-1].weight_spans, completions[-1].weight_version,
                                  state.backend),
    )
    if shape.return_token_ids:
        out.prompt_token_ids = prompt.ids
    return out
