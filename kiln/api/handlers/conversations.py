"""/v1/conversations: the conversations the web page (/ui) keeps on the server — list, create,
get, rename or rewrite (PATCH), delete, export. The store is kiln.conversations (SQLite under
--data-dir, else memory); bodies are read against the contract (conversations-v1.schema.json)."""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote

import msgspec
from msgspec import UNSET
from starlette.requests import Request
from starlette.responses import Response

from kiln.api._generated import wire
from kiln.api.errors import ApiError
from kiln.api.state import AppState, app_state, json_response
from kiln.conversations import Conversation, ConversationLimit, is_id

CODE = "invalid_conversation_request"
NOT_FOUND = "conversation_not_found"


def _id(request: Request) -> str:
    raw = unquote(str(request.path_params.get("conversation_id", "")))
    head, _, tail = raw.partition("/")
    if tail == "export" and is_id(head):  # the export route's path, by a method it lacks
        raise ApiError(405, "method_not_allowed",
                       f"method {request.method} not allowed on {request.url.path}",
                       headers={"allow": "GET, HEAD"})
    if not is_id(raw):
        raise ApiError(400, "invalid_conversation_id",
                       f"{raw[:80]!r} is not a conversation id (conv_ and 32 hex digits)",
                       param="conversation_id")
    return raw


def _found(state: AppState, cid: str) -> Conversation:
    conv = state.conversations.get(cid)
    if conv is None:
        raise _missing(cid)
    return conv


def _missing(cid: str) -> ApiError:
    return ApiError(404, NOT_FOUND, f"conversation {cid!r} is not stored (unknown or deleted)",
                    param="conversation_id")


def _messages(value: list[wire.ConversationMessage] | Any) -> list[dict[str, Any]] | None:
    if value is UNSET:
        return None
    return [msgspec.to_builtins(m) for m in value]


def _given(value: Any) -> Any:
    return None if value is UNSET else value


async def list_conversations(request: Request) -> Response:
    store = app_state(request).conversations
    return json_response({"object": "list", "data": store.summaries(), "storage": store.storage})


async def create(request: Request) -> Response:
    state = app_state(request)
    req = await state.contract.read(request, state.config.max_body_bytes,
                                    "ConversationCreateRequest", wire.ConversationCreateRequest,
                                    CODE)
    try:
        conv = state.conversations.create(_given(req.title), _messages(req.messages),
                                          _given(req.settings))
    except ConversationLimit as exc:
        raise ApiError(409, "conversation_limit_reached", str(exc)) from None
    return json_response(conv.to_wire())


async def retrieve(request: Request) -> Response:
    state = app_state(request)
    return json_response(_found(state, _id(request)).to_wire())


async def update(request: Request) -> Response:
    state = app_state(request)
    cid = _id(request)
    req = await state.contract.read(request, state.config.max_body_bytes,
                                    "ConversationUpdateRequest", wire.ConversationUpdateRequest,
                                    CODE)
    conv = state.conversations.update(cid, title=_given(req.title),
                                      messages=_messages(req.messages),
                                      settings=_given(req.settings))
    if conv is None:
        raise _missing(cid)
    return json_response(conv.to_wire())


async def delete(request: Request) -> Response:
    state = app_state(request)
    cid = _id(request)
    if not state.conversations.delete(cid):
        raise _missing(cid)
    return json_response({"id": cid, "object": "conversation.deleted", "deleted": True})


async def export(request: Request) -> Response:
    state = app_state(request)
    conv = _found(state, _id(request))
    return json_response(conv.export(), headers={
        "content-disposition": f'attachment; filename="{conv.id}.json"'})
