"""POST /v1/messages (Anthropic's Messages API, JSON and SSE) and POST /v1/messages/count_tokens.

The request is read against the contract (messages-v1.schema.json), turned into the chat request
it means (`messages_input`), and run as chat runs it (`chat_turn`); this module writes the turn
as a Messages response (`messages_output`), `messages_stream` as Anthropic's events. Errors leave in Anthropic's
shape (kiln.api.errors renders every error; it picks the shape by route)."""

from __future__ import annotations

import time
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from kiln.api._generated import wire
from kiln.api.replies import chat_turn, messages_stream
from kiln.api.replies.messages_output import message_body
from kiln.api.requests import messages_input
from kiln.api.sse import EventStream
from kiln.api.state import app_state, claim_request_id, json_response

CODE = messages_input.CODE


async def _read(request: Request, definition: str, target: type[Any]) -> dict[str, Any]:
    state = app_state(request)
    req = await state.contract.read(request, state.config.max_body_bytes, definition, target,
                                    CODE)
    raw: dict[str, Any] = msgspec.to_builtins(req)
    return raw


async def create(request: Request) -> Response:
    started, arrived = time.perf_counter(), time.monotonic()
    state = app_state(request)
    raw = await _read(request, "MessagesCreateRequest", wire.MessagesCreateRequest)
    body = messages_input.chat_body(raw)
    chat_turn.rollout(body, CODE)
    rid = claim_request_id(request, None)
    message_id = f"msg_{rid}"
    if raw.get("stream"):
        prepared = await chat_turn.prepare(state, chat_turn.stream_body(body), CODE)
        events, close = await chat_turn.stream(state, prepared, rid, arrived, started)
        frames = messages_stream.frames(message_id, prepared.shape.model,
                                        len(prepared.prompt.ids), events,
                                        messages_input.thinking_omitted(raw))
        return EventStream(frames, on_close=close)
    prepared = await chat_turn.prepare(state, body, CODE)
    turn = await chat_turn.run(request, state, prepared, rid, arrived, started, CODE)
    return json_response(message_body(message_id, prepared.shape.model, turn,
                                      messages_input.thinking_omitted(raw)))


async def count_tokens(request: Request) -> Response:
    """The prompt's tokens, as /v1/messages would run it (the same chat body, template and
    tokenizer; nothing is generated)."""
    state = app_state(request)
    raw = await _read(request, "MessagesCountTokensRequest", wire.MessagesCountTokensRequest)
    body = messages_input.chat_body(raw, counting=True)
    body["max_tokens"] = 1  # the prompt must leave room for one token, as /v1/messages checks
    prepared = await chat_turn.prepare(state, body, CODE)
    return json_response({"input_tokens": len(prepared.prompt.ids)})
