"""OpenAI's Responses API: POST /v1/responses (JSON and SSE), GET and DELETE
/v1/responses/{id}, GET /v1/responses/{id}/input_items.

A request is read against the contract (responses-v1.schema.json); the conversation it continues
(`previous_response_id`) is read from the store (kiln.api.response_store); `responses_input`
turns both into the chat request they mean, which runs as chat runs it (`chat_turn`);
`responses_output` writes the response object and `responses_stream` its events. With `store`
(OpenAI's default, true) the finished response and its input items are kept, bounded."""

from __future__ import annotations

import time
import uuid
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from kiln.api._generated import wire
from kiln.api.errors import ApiError
from kiln.api.replies import chat_turn, responses_stream
from kiln.api.replies.chat_turn import TurnEnd
from kiln.api.replies.responses_output import Ids, finished, now, response_object
from kiln.api.requests.prepare import PreparedChat
from kiln.api.requests.responses_input import CODE, chat_body, input_items
from kiln.api.response_store import Stored
from kiln.api.sse import EventStream
from kiln.api.state import AppState, app_state, claim_request_id, json_response

NOT_FOUND = "response_not_found"
MAX_ITEMS_PAGE = 100


def _missing(state: AppState, rid: str, param: str | None = None) -> ApiError:
    store = state.responses
    why = ("it was evicted" if store.was_evicted(rid)
           else "it is unknown, was deleted or was evicted")
    where = "previous_response_id" if param else "response"
    return ApiError(404, NOT_FOUND, f"{where} {rid!r} is not stored: {why} ({store.bounds()})",
                    param=param)


def conversation(state: AppState, previous: str | None) -> list[dict[str, Any]]:
    """The items of the stored conversation ``previous`` ends: each turn's input, then its
    output."""
    if previous is None:
        return []
    try:
        chain = state.responses.chain(previous)
    except KeyError as exc:
        raise _missing(state, str(exc.args[0]), "previous_response_id") from None
    items: list[dict[str, Any]] = []
    for rec in chain:
        items += rec.input_items
        items += rec.response["output"]
    return items


def _drop_oldest(body: dict[str, Any]) -> dict[str, Any] | None:
    """`truncation: auto`: the conversation less its oldest turn (system messages and the last
    message stay; tool results left without their call go too); None when nothing can go."""
    messages = body["messages"]
    kept_head = [m for m in messages if m["role"] == "system"]
    rest = [m for m in messages if m["role"] != "system"]
    if len(rest) <= 1:
        return None
    rest = rest[1:]
    while len(rest) > 1 and rest[0]["role"] == "tool":
        rest = rest[1:]
    return {**body, "messages": kept_head + rest}


async def _prepare(state: AppState, body: dict[str, Any], raw: dict[str, Any]) -> PreparedChat:
    while True:
        try:
            return await chat_turn.prepare(state, body, CODE)
        except ApiError as exc:
            if exc.code != "context_length_exceeded" or raw.get("truncation") != "auto":
                raise
            shorter = _drop_oldest(body)
            if shorter is None:
                raise
            body = shorter


def _store(state: AppState, ids: Ids, raw: dict[str, Any], obj: dict[str, Any],
           items: list[dict[str, Any]]) -> None:
    if raw.get("store") is False:
        return
    state.responses.put(Stored(ids.response, time.time(), raw.get("previous_response_id"),
                               obj, items))


async def create(request: Request) -> Response:
    started, arrived = time.perf_counter(), time.monotonic()
    state = app_state(request)
    req = await state.contract.read(request, state.config.max_body_bytes,
                                    "ResponsesCreateRequest", wire.ResponsesCreateRequest, CODE)
    raw: dict[str, Any] = msgspec.to_builtins(req)
    ids = Ids(f"resp_{uuid.uuid4().hex}")
    history = conversation(state, raw.get("previous_response_id"))
    items = input_items(raw, ids.response)
    body = chat_body(raw, history, items)
    chat_turn.rollout(body, CODE)
    rid = claim_request_id(request, None)
    sealed = "reasoning.encrypted_content" in (raw.get("include") or [])
    if raw.get("stream"):
        prepared = await _prepare(state, chat_turn.stream_body(body), raw)
        obj = response_object(ids, raw, prepared, now())
        events, close = await chat_turn.stream(state, prepared, rid, arrived, started)

        def finish(end: TurnEnd) -> dict[str, Any]:
            done = finished(obj, ids, end.turn, raw)
            _store(state, ids, raw, done, items)
            return done

        frames = responses_stream.frames(obj, ids, events, finish, sealed)
        return EventStream(frames, on_close=close)
    prepared = await _prepare(state, body, raw)
    turn = await chat_turn.run(request, state, prepared, rid, arrived, started, CODE)
    obj = finished(response_object(ids, raw, prepared, now()), ids, turn, raw)
    _store(state, ids, raw, obj, items)
    return json_response(obj)


def _stored(request: Request) -> Stored:
    state = app_state(request)
    rid = request.path_params["response_id"]
    rec = state.responses.get(rid)
    if rec is None:
        raise _missing(state, rid)
    return rec


def _flag(request: Request, name: str) -> bool:
    value = request.query_params.get(name, "false").lower()
    if value not in ("true", "false"):
        raise ApiError(400, CODE, f"{name} must be true or false, got {value!r}", param=name)
    return value == "true"


def _integer(request: Request, name: str, default: int, low: int, high: int) -> int:
    text = request.query_params.get(name)
    if text is None:
        return default
    if not text.isdigit() or not low <= int(text) <= high:
        raise ApiError(400, CODE, f"{name} must be an integer in {low}..{high}, got {text!r}",
                       param=name)
    return int(text)


async def retrieve(request: Request) -> Response:
    rec = _stored(request)
    if _flag(request, "stream"):
        after = _integer(request, "starting_after", -1, 0, 2**31)
        return Response(responses_stream.replay(rec.response, after),
                        media_type="text/event-stream", headers={"cache-control": "no-cache"})
    if "starting_after" in request.query_params:
        raise ApiError(400, CODE, "starting_after needs stream=true", param="starting_after")
    return json_response(rec.response)


async def delete(request: Request) -> Response:
    state = app_state(request)
    rid = request.path_params["response_id"]
    if not state.responses.delete(rid):
        raise _missing(state, rid)
    return json_response({"id": rid, "object": "response", "deleted": True})


async def list_input_items(request: Request) -> Response:
    rec = _stored(request)
    limit = _integer(request, "limit", 20, 1, MAX_ITEMS_PAGE)
    order = request.query_params.get("order", "desc")
    if order not in ("asc", "desc"):
        raise ApiError(400, CODE, f"order must be asc or desc, got {order!r}", param="order")
    items = rec.input_items if order == "asc" else list(reversed(rec.input_items))
    after = request.query_params.get("after")
    if after is not None:
        ids = [i.get("id") for i in items]
        if after not in ids:
            raise ApiError(404, NOT_FOUND, f"no input item {after!r} in this response",
                           param="after")
        items = items[ids.index(after) + 1:]
    page = items[:limit]
    return json_response({"object": "list", "data": page,
                          "first_id": page[0]["id"] if page else None,
                          "last_id": page[-1]["id"] if page else None,
                          "has_more": len(items) > limit})
