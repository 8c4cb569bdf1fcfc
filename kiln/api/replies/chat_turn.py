"""One assistant turn for the agent APIs (OpenAI's Responses, Anthropic's Messages), run as the
chat request it means: each API's input stage (`responses_input`, `messages_input`) writes a chat
request body; it is prepared by `prepare.prepare_chat`, run, and read back exactly as
/v1/chat/completions runs and reads it (chat template, reasoning split, tool-call parsing,
grammar, thinking budget, adapters, prefix cache). There is no second generation path: this
module only turns chat's result (`chat_body.response_body`) and chat's stream (`chat_stream.chunks`)
into API-neutral records that the two APIs' output stages write in their own shapes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import msgspec
from starlette.requests import Request

from kiln.api._generated import wire
from kiln.api.errors import ApiError
from kiln.api.replies import chat_body, chat_stream
from kiln.api.requests import rollout as chat_rollout
from kiln.api.requests.prepare import PreparedChat, prepare_chat
from kiln.api.state import AppState
from kiln.api.submission import collect_all, submit, submit_all, until_disconnect
from kiln.api.wire_values import opt
from kiln.text.thinking import CLOSE_TAG


@dataclass(frozen=True)
class ToolCallOut:
    id: str
    name: str
    arguments: str  # JSON text


@dataclass(frozen=True)
class Turn:
    """What the turn produced, in no API's shape."""

    reasoning: str | None
    text: str
    calls: tuple[ToolCallOut, ...]
    finish: str  # "stop", "length" or "tool_calls"
    stop_string: str | None  # the client's stop sequence that ended it
    prompt_tokens: int
    output_tokens: int
    cached_tokens: int
    reasoning_tokens: int
    logprobs: tuple[wire.ChatTokenLogprob, ...] | None  # the answer's tokens (not reasoning)
    provenance: dict[str, Any] | None = None  # rollout_provenance: chat's record of the turn
    weight_version: str | None = None  # the weights that made it (chat's weight_version)


@dataclass(frozen=True)
class TextDelta:
    text: str
    logprobs: tuple[wire.ChatTokenLogprob, ...] = ()


@dataclass(frozen=True)
class ReasoningDelta:
    text: str


@dataclass(frozen=True)
class CallStart:
    index: int
    id: str
    name: str


@dataclass(frozen=True)
class CallArguments:
    index: int
    fragment: str


@dataclass(frozen=True)
class TurnEnd:
    turn: Turn


@dataclass(frozen=True)
class TurnFault:
    message: str
    fault: ApiError | None = None


Event = TextDelta | ReasoningDelta | CallStart | CallArguments | TurnEnd | TurnFault


def chat_request(body: dict[str, Any], code: str) -> wire.ChatCompletionRequest:
    """The chat request an input stage wrote."""
    try:
        return msgspec.convert(body, wire.ChatCompletionRequest, strict=False)
    except msgspec.ValidationError as exc:  # an input stage's value the chat struct refuses
        raise ApiError(400, code, str(exc)) from None


def reasoning_tokens(state: AppState, ids: list[int], reasoning: str | None) -> int:
    """Generated tokens up to and including the reasoning's close tag (all of them when the
    reasoning never closed): counted on the token ids, not re-tokenized text."""
    if not reasoning:
        return 0
    close = state.backend.tokenizer.encode(CLOSE_TAG, add_special_tokens=False)
    n = len(close)
    for i in range(len(ids) - n + 1):
        if ids[i:i + n] == close:
            return i + n
    return len(ids)


def _stop_string(stop_reason: Any) -> str | None:
    return stop_reason if isinstance(stop_reason, str) and stop_reason != "repetition_detected" \
        else None


async def prepare(state: AppState, body: dict[str, Any], code: str) -> PreparedChat:
    return await prepare_chat(state, chat_request(body, code))


def rollout(body: dict[str, Any], code: str) -> None:
    """`rollout_provenance: true` on an agent API: chat's record, under chat's conditions
    (the contract states them for chat; here they are checked on the chat body written)."""
    if not body.get("rollout_provenance"):
        return
    if body.get("stream"):
        raise ApiError(400, code, "rollout_provenance needs a non-streaming request",
                       param="rollout_provenance")
    if body.get("tools") or body.get("tool_choice") is not None:
        raise ApiError(400, code, "rollout_provenance cannot be combined with tools",
                       param="rollout_provenance")


async def run(request: Request, state: AppState, prepared: PreparedChat, rid: str,
              arrived: float, started: float, code: str) -> Turn:
    """Run the prepared turn to its end, as chat's non-streaming path does."""
    run_, prompt = prepared.run, prepared.prompt
    if prepared.shape.rollout:
        chat_rollout.check(state, prepared)
    streams = submit_all(state, [(f"{rid}-0", prompt.ids, run_.params[0], run_.lora)], arrived,
                         code=code, cache_salt=run_.cache_salt, priority=run_.priority)
    completions = await until_disconnect(request, collect_all(streams))
    body = chat_body.response_body(state, prepared, f"turn-{rid}", completions, started)
    choice, c = body.choices[0], completions[0]
    message = choice.message
    reasoning = opt(message.reasoning_content)
    calls = tuple(ToolCallOut(t["id"], t["function"]["name"], t["function"]["arguments"])
                  for t in (opt(message.tool_calls) or []))
    n_reasoning = reasoning_tokens(state, c.token_ids, reasoning)
    logprobs = None
    chosen = opt(choice.logprobs)
    if chosen is not None:
        logprobs = tuple((chosen.content or [])[n_reasoning:])
    record = opt(choice.rollout_provenance)
    return Turn(reasoning=reasoning, text=message.content or "", calls=calls,
                finish=str(choice.finish_reason), stop_string=_stop_string(c.stop_reason),
                prompt_tokens=len(prompt.ids), output_tokens=c.num_output_tokens,
                cached_tokens=c.num_cached_tokens, reasoning_tokens=n_reasoning,
                logprobs=logprobs,
                provenance=msgspec.to_builtins(record) if record is not None else None,
                weight_version=opt(body.weight_version))


@dataclass
class _Tally:
    reasoning: list[str] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    calls: dict[int, list[str]] = field(default_factory=dict)  # index -> [id, name, args...]
    ids: list[int] = field(default_factory=list)
    logprobs: list[wire.ChatTokenLogprob] = field(default_factory=list)
    finish: str = "stop"
    stop_reason: Any = None
    weight_version: str | None = None  # from chat's finishing chunk
    usage: wire.Usage | None = None


def stream_body(body: dict[str, Any]) -> dict[str, Any]:
    """The chat body of a streamed turn: chat's stream with the ids and usage the end needs."""
    return {**body, "stream": True, "stream_options": {"include_usage": True},
            "return_token_ids": True}


def _events(item: chat_stream.Item, tally: _Tally) -> list[Event]:
    if isinstance(item, chat_stream.StreamFault):
        return [TurnFault(item.message, item.fault)]
    if not isinstance(item, wire.ChatCompletionChunk):
        return []  # token timings are chat's own
    given = opt(item.usage)
    if given is not None:
        tally.usage = given
    out: list[Event] = []
    for choice in item.choices:
        ids = opt(choice.token_ids)
        if ids:
            tally.ids.extend(ids)
        lps = tuple(opt(choice.logprobs).content or []) if opt(choice.logprobs) else ()
        delta = choice.delta
        reasoning, content = opt(delta.reasoning_content), opt(delta.content)
        if reasoning:
            tally.reasoning.append(reasoning)
            out.append(ReasoningDelta(reasoning))
        if content:
            tally.text.append(content)
            out.append(TextDelta(content, lps))
        if lps:
            tally.logprobs.extend(lps)
        for call in opt(delta.tool_calls) or []:
            index = int(call["index"])
            fn = call.get("function") or {}
            if "id" in call:
                tally.calls[index] = [call["id"], fn.get("name", "")]
                out.append(CallStart(index, call["id"], fn.get("name", "")))
            fragment = fn.get("arguments") or ""
            if fragment:
                tally.calls[index].append(fragment)
                out.append(CallArguments(index, fragment))
        if opt(choice.finish_reason) is not None:
            tally.finish = str(choice.finish_reason)
            tally.stop_reason = opt(choice.stop_reason)
            tally.weight_version = opt(item.weight_version)
    return out


async def stream(state: AppState, prepared: PreparedChat, rid: str, arrived: float,
                 started: float) -> tuple[AsyncIterator[list[Event]], Any]:
    """The turn's events, a list per engine output; and the close that aborts it."""
    run_, prompt = prepared.run, prepared.prompt
    outputs = submit(state, f"{rid}-0", prompt.ids, run_.params[0], run_.lora, arrived,
                     cache_salt=run_.cache_salt, priority=run_.priority)

    async def events() -> AsyncIterator[list[Event]]:
        tally = _Tally()
        source = chat_stream.chunks(state, prepared, f"turn-{rid}", outputs, started)
        try:
            async for batch in source:
                out: list[Event] = []
                for item in batch:
                    out.extend(_events(item, tally))
                if any(isinstance(e, TurnFault) for e in out):
                    yield out
                    return
                if out:
                    yield out
        finally:
            await source.aclose()
        yield [TurnEnd(_turn_of(state, prepared, tally))]

    return events(), outputs.aclose


def _turn_of(state: AppState, prepared: PreparedChat, tally: _Tally) -> Turn:
    reasoning = "".join(tally.reasoning) or None
    usage = tally.usage
    prompt_tokens = usage.prompt_tokens if usage is not None else len(prepared.prompt.ids)
    output_tokens = usage.completion_tokens if usage is not None else len(tally.ids)
    details = opt(usage.prompt_tokens_details) if usage is not None else None
    calls = tuple(ToolCallOut(v[0], v[1], "".join(v[2:])) for _, v in sorted(tally.calls.items()))
    n_reasoning = reasoning_tokens(state, tally.ids, reasoning)
    return Turn(reasoning=reasoning, text="".join(tally.text), calls=calls, finish=tally.finish,
                stop_string=_stop_string(tally.stop_reason), prompt_tokens=prompt_tokens,
                output_tokens=output_tokens,
                cached_tokens=details.cached_tokens if details is not None else 0,
                reasoning_tokens=n_reasoning,
                logprobs=tuple(tally.logprobs[n_reasoning:])
                if prepared.shape.logprobs is not None else None,
                weight_version=tally.weight_version)


async def close(events: AsyncIterator[list[Event]]) -> None:
    aclose = getattr(events, "aclose", None)
    if aclose is not None:
        await aclose()
