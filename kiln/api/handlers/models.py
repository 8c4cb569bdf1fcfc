"""GET /v1/models and the `model` field rule shared by the inference handlers."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from kiln.api.backend import Backend
from kiln.api.encode import json_response
from kiln.api.errors import ApiError
from kiln.api.state import app_state


def model_cards(backend: Backend) -> list[dict[str, Any]]:
    cards: list[dict[str, Any]] = [
        {
            "id": backend.model_id,
            "object": "model",
            "created": backend.created,
            "owned_by": "kiln",
            "parent": None,
            "root": backend.model_id,
            "max_model_len": backend.max_model_len,
        }
    ]
    for name in adapter_names(backend):
        cards.append(
            {
                "id": name,
                "object": "model",
                "created": backend.created,
                "owned_by": "kiln",
                "parent": backend.model_id,
                "root": backend.model_id,
                "max_model_len": backend.max_model_len,
            }
        )
    return cards


def adapter_names(backend: Backend) -> list[str]:
    """Adapters that `model` can name: one named like the served model or an alias is shadowed
    by it (`model` selects the base), so it is not listed as a second card with the same id."""
    store = backend.adapter_store
    served = {backend.model_id, *backend.aliases}
    return [i.name for i in (store.list() if store is not None else []) if i.name not in served]


async def list_models(request: Request) -> Response:
    backend = app_state(request).backend
    return json_response({"object": "list", "data": model_cards(backend)})


async def retrieve_model(request: Request) -> Response:
    """One card of the list by id (an alias answers with the served model's card), or 404."""
    backend = app_state(request).backend
    requested = str(request.path_params.get("model", ""))
    model, _ = resolve_model(backend, requested)  # 404 model_not_found for anything else
    return json_response(next(c for c in model_cards(backend) if c["id"] == model))


def resolve_model(backend: Backend, requested: str | None) -> tuple[str, str | None]:
    """docs/decisions.md: missing/null -> the served model; served id or alias -> fine; name of an
    available adapter -> that adapter; else 404. Returns (model id to report, adapter or None)."""
    if requested is None or requested == backend.model_id or requested in backend.aliases:
        return backend.model_id, None
    from kiln.api.handlers.adapters import adapter_named_by_model

    adapter = adapter_named_by_model(backend, requested)
    if adapter is not None:
        return adapter, adapter
    names = [backend.model_id, *adapter_names(backend)]
    shown = ", ".join(names[:9]) + (f" and {len(names) - 9} more" if len(names) > 9 else "")
    raise ApiError(
        404, "model_not_found", f"model {requested!r} is not served here; available: {shown}",
        param="model",
    )
