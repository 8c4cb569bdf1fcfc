"""GET /v1/models and GET /v1/models/{model} (`params.resolve_model` reads `model`)."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from kiln.api.backend import Backend
from kiln.api.requests.params import adapter_names, resolve_model
from kiln.api.state import app_state, json_response


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
            "weight_version": backend.weight_version,
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


async def list_models(request: Request) -> Response:
    backend = app_state(request).backend
    return json_response({"object": "list", "data": model_cards(backend)})


async def retrieve_model(request: Request) -> Response:
    """One card of the list by id (an alias answers with the served model's card), or 404."""
    backend = app_state(request).backend
    requested = str(request.path_params.get("model", ""))
    model, _ = resolve_model(backend, requested)  # 404 model_not_found for anything else
    return json_response(next(c for c in model_cards(backend) if c["id"] == model))
