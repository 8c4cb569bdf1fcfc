"""Adapter management (`/v1/adapters...`) and per-request model and adapter resolution
(docs/behavior.md §6).

Chat's and batch's `adapter` is tri-state: missing = the server default, null or "" = base, a
name = that adapter (scoring on `/v1/completions` runs the base model unless `model` names an
adapter, docs/decisions.md). `adapters: [{name, scale}]` composes. `model` may name one (vLLM);
combining that with `adapter`/`adapters` is a 400. Unknown names are 404 `adapter_not_found`;
names with separators or traversal are 400 `invalid_adapter_name`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from msgspec import UNSET
from starlette.requests import Request
from starlette.responses import Response

from kiln.adapters import (
    AdapterActive,
    AdapterNotFound,
    AdapterStore,
    InvalidAdapterName,
    validate_name,
)
from kiln.api._generated import wire
from kiln.api.backend import Backend
from kiln.api.errors import ApiError
from kiln.api.handlers.generation import engine_error
from kiln.api.state import app_state, json_response
from kiln.engine.errors import EngineError
from kiln.engine.lora_mix import MAX_MIX_ENTRIES

MAX_COMPOSED = MAX_MIX_ENTRIES  # the engine owns the limit


@dataclass(frozen=True)
class Selection:
    mix: tuple[tuple[str, float], ...]  # (adapter name, scale); empty = base
    lora: tuple[tuple[Any, float], ...]  # loaded adapters for the engine

    @property
    def label(self) -> str:
        return "+".join(name for name, _ in self.mix) or "base"


BASE = Selection((), ())


def _store(backend: Backend) -> AdapterStore | None:
    return backend.adapter_store


def _not_found(name: str, param: str) -> ApiError:
    return ApiError(404, "adapter_not_found", f"adapter {name!r} not found", param=param)


def _check_name(name: str, param: str) -> str:
    try:
        return validate_name(name)
    except InvalidAdapterName as exc:
        raise ApiError(400, "invalid_adapter_name", str(exc), param=param) from None


async def load_mix(backend: Backend, mix: list[tuple[str, float]], param: str) -> Selection:
    names = [_check_name(name, param) for name, _ in mix]
    store = _store(backend)
    for name in names:
        if store is None or not store.exists(name):
            raise _not_found(name, param)
    try:
        lora = await backend.prepare_lora([(n, s) for n, (_, s) in zip(names, mix, strict=True)])
    except InvalidAdapterName as exc:
        raise ApiError(400, "invalid_adapter_name", str(exc), param=param) from None
    except AdapterNotFound as exc:
        raise ApiError(404, "adapter_not_found", str(exc), param=param) from None
    except ValueError as exc:
        raise ApiError(
            400, "adapter_load_failed", f"adapter cannot be used: {exc}", param=param
        ) from None
    except EngineError as exc:  # the engine is not running (adapters load on its thread)
        raise engine_error(exc) from None
    return Selection(tuple((n, s) for n, (_, s) in zip(names, mix, strict=True)), lora)


def _composition(adapters: Any) -> list[tuple[str, float]]:
    if len(adapters) == 0:
        raise ApiError(
            400, "invalid_compose_request", "adapters must not be empty", param="adapters"
        )
    if len(adapters) > MAX_COMPOSED:
        raise ApiError(
            400, "invalid_compose_request",
            f"at most {MAX_COMPOSED} adapters can be composed", param="adapters",
        )
    return [(a.name, float(a.scale)) for a in adapters]


async def select(
    backend: Backend, adapter: Any, adapters: Any, model_adapter: str | None, *, tri_state: bool
) -> Selection:
    """The adapter mix of a chat or batch request (tri_state: a missing ``adapter`` is the server
    default), or of a completions request (no default)."""
    given_adapters = adapters is not UNSET and adapters is not None
    if model_adapter is not None:
        if (adapter is not UNSET and adapter not in (None, "")) or given_adapters:
            raise ApiError(
                400, "invalid_compose_request",
                "model names an adapter; do not also send adapter or adapters", param="model",
            )
        return await load_mix(backend, [(model_adapter, 1.0)], "model")
    if given_adapters:
        if isinstance(adapter, str) and adapter:
            raise ApiError(
                400, "invalid_compose_request", "use adapter or adapters, not both",
                param="adapters",
            )
        return await load_mix(backend, _composition(adapters), "adapters")
    if adapter is UNSET:
        store = _store(backend)
        default = store.default if (tri_state and store is not None) else None
        return await load_mix(backend, [(default, 1.0)], "adapter") if default else BASE
    if adapter is None or adapter == "":
        return BASE
    return await load_mix(backend, [(str(adapter), 1.0)], "adapter")


def resolve_model(backend: Backend, requested: str | None) -> tuple[str, str | None]:
    """docs/decisions.md: missing/null -> the served model; served id or alias -> fine; name of an
    available adapter -> that adapter; else 404. Returns (model id to report, adapter or None)."""
    if requested is None or requested == backend.model_id or requested in backend.aliases:
        return backend.model_id, None
    adapter = adapter_named_by_model(backend, requested)
    if adapter is not None:
        return adapter, adapter
    names = [backend.model_id, *adapter_names(backend)]
    shown = ", ".join(names[:9]) + (f" and {len(names) - 9} more" if len(names) > 9 else "")
    raise ApiError(
        404, "model_not_found", f"model {requested!r} is not served here; available: {shown}",
        param="model",
    )


async def resolve_model_adapter(backend: Backend, model: str | None, adapter: Any,
                                adapters: Any) -> tuple[str, Selection]:
    """A chat or batch request's model (the id to report) and adapter mix, in one step."""
    reported, model_adapter = resolve_model(backend, model)
    return reported, await select(backend, adapter, adapters, model_adapter, tri_state=True)


def adapter_names(backend: Backend) -> list[str]:
    """Adapters that `model` can name: one named like the served model or an alias is shadowed
    by it (`model` selects the base), so it is not listed as a second card with the same id."""
    store = _store(backend)
    served = {backend.model_id, *backend.aliases}
    return [i.name for i in (store.list() if store is not None else []) if i.name not in served]


def adapter_named_by_model(backend: Backend, model: str | None) -> str | None:
    store = _store(backend)
    if model is None or store is None or model == backend.model_id:
        return None
    try:
        name = validate_name(model)
    except InvalidAdapterName:
        return None
    return name if store.exists(name) else None


# -- management endpoints ----------------------------------------------------------------------


def _require_store(backend: Backend) -> AdapterStore:
    store = _store(backend)
    if store is None:
        raise ApiError(
            404, "adapter_not_found", "this server has no adapter directory (--adapter-dir)"
        )
    return store


async def list_adapters(request: Request) -> Response:
    store = _store(app_state(request).backend)
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
    store = _store(app_state(request).backend)
    if store is not None:
        store.clear_default()
    return json_response({"status": "unloaded", "name": None})


async def delete(request: Request) -> Response:
    store = _require_store(app_state(request).backend)
    raw = unquote(str(request.path_params.get("name", "")))
    name = _check_name(raw, "name")
    if not store.exists(name):
        raise _not_found(name, "name")
    try:
        deleted = store.delete(name)
    except AdapterActive as exc:
        raise ApiError(409, "adapter_active", str(exc), param="name") from None
    except AdapterNotFound as exc:
        raise ApiError(404, "adapter_not_found", str(exc), param="name") from None
    return json_response({"status": "deleted", "name": name, "deleted": deleted})
