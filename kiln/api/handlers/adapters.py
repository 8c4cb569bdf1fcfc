"""Adapter management: `/v1/adapters` lists them, `POST /v1/adapters/load` sets the server's
default, `/unload` clears it and `DELETE /v1/adapters/{name}` removes one (docs/behavior.md §6).
What a request's `model`, `adapter` and `adapters` select is resolved in
kiln/api/requests/params.py (``resolve_model``, ``select``)."""

from __future__ import annotations

from urllib.parse import unquote

from starlette.requests import Request
from starlette.responses import Response

from kiln.adapters import AdapterActive, AdapterNotFound, AdapterStore
from kiln.api._generated import wire
from kiln.api.backend import Backend
from kiln.api.errors import ApiError
from kiln.api.requests.params import adapter_not_found, check_adapter_name, load_mix
from kiln.api.state import app_state, json_response


def _require_store(backend: Backend) -> AdapterStore:
    store = backend.adapter_store
    if store is None:
        raise ApiError(
            404, "adapter_not_found", "this server has no adapter directory (--adapter-dir)"
        )
    return store


async def list_adapters(request: Request) -> Response:
    store = app_state(request).backend.adapter_store
    if store is None:
        return json_response({"active": None, "available": []})
    return json_response(
        {"active": store.default, "available": [info.to_dict() for info in store.list()]}
    )


async def load(request: Request) -> Response:
    state = app_state(request)
    req = await state.contract.read(
        request, state.config.max_body_bytes, "AdapterLoadRequest", wire.AdapterLoadRequest,
        "invalid_adapter_request",
    )
    store = _require_store(state.backend)
    selection = await load_mix(state.backend, [(req.name, 1.0)], "name")
    store.set_default(selection.mix[0][0])
    return json_response({"status": "loaded", "name": selection.mix[0][0]})


async def unload(request: Request) -> Response:
    store = app_state(request).backend.adapter_store
    if store is not None:
        store.clear_default()
    return json_response({"status": "unloaded", "name": None})


async def delete(request: Request) -> Response:
    store = _require_store(app_state(request).backend)
    raw = unquote(str(request.path_params.get("name", "")))
    name = check_adapter_name(raw, "name")
    if not store.exists(name):
        raise adapter_not_found(name, "name")
    try:
        deleted = store.delete(name)
    except AdapterActive as exc:
        raise ApiError(409, "adapter_active", str(exc), param="name") from None
    except AdapterNotFound as exc:
        raise ApiError(404, "adapter_not_found", str(exc), param="name") from None
    return json_response({"status": "deleted", "name": name, "deleted": deleted})
