"""GET /health, GET /metrics, GET /openapi.json."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from kiln import metrics
from kiln.api.requests.params import state_max_tokens
from kiln.api.served_openapi import Bounds, served_openapi
from kiln.api.state import app_state, json_response
from kiln.engine.grammar import can_drive


async def health(request: Request) -> Response:
    state = app_state(request)
    backend = state.backend
    status = backend.health()
    body: dict[str, object] = {"status": status, "model": backend.model_id}
    plan = backend.compute_plan() if status == "ok" else None
    if plan is not None:
        body["compute_plan"] = plan
    if status == "ok":  # a training loop's pause (handlers/training.py)
        paused = bool(backend.stats().get("paused", 0.0))
        body["scheduler"] = "sleeping" if state.sleeping else "paused" if paused else (
            "pausing" if state.pause_mode is not None else "serving")
        body["weight_version"] = backend.weight_version
    if status != "ok":
        body["detail"] = (
            "the model is loading" if status == "loading" else "the engine is not running"
        )
    ready = status == "ok"
    return json_response(body, status=200 if ready else 503)


async def prometheus(request: Request) -> Response:
    state = app_state(request)
    store = state.backend.adapter_store
    default = store.default if store is not None else None
    stats = state.backend.stats()
    metrics.observe_engine(
        stats,
        model=state.backend.model_id,
        adapters=(default,) if default else (),
        max_lora=state.config.max_lora_slots,
    )
    metrics.observe_cache_config(state.config.block_size, int(stats.get("kv_blocks_total", 0)),
                                 state.config.kv_cache_dtype, state.config.enable_prefix_caching)
    payload, content_type = metrics.render()
    return Response(payload, media_type=content_type)


async def openapi(request: Request) -> Response:
    """The contract's OpenAPI document with the loaded model's and this server's bounds."""
    state = app_state(request)
    backend = state.backend
    cfg = state.config
    body = served_openapi(Bounds(
        vocab_size=backend.tokenizer.vocab_size, max_logprobs=cfg.max_logprobs,
        max_model_len=backend.max_model_len, capacity=state.gate.capacity,
        model_names=(backend.model_id, *backend.aliases),
        default_budget=(cfg.default_thinking_budget_tokens is not None
                        or cfg.default_thinking_budget_ms is not None),
        grammars=can_drive(backend.tokenizer), max_new_tokens=state_max_tokens(state)))
    return Response(body, media_type="application/json")
