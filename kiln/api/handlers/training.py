"""A training loop's routes, under vLLM's names, served with --enable-weight-updates (a 404
that says so otherwise): POST /pause (?mode=abort|wait|keep), POST /resume, GET /is_paused,
POST /reset_prefix_cache, POST /sleep (?level=1), POST /wake_up, GET /is_sleeping. The engine
applies each between two steps (kiln.engine.loop: `AsyncEngine.pause`, `resume`,
`reset_prefix_cache`, `sleep`); the scheduler holds the pause (kiln.engine.scheduler:
`Scheduler.pause`); sleeping gives the KV cache's pages back (kiln.model.c_model:
`release_pages`)."""

from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.responses import Response

from kiln.api.errors import ApiError
from kiln.api.state import AppState, app_state, json_response

CODE = "training_invalid_request"
MODES = ("abort", "wait", "keep")
DEFAULT_MODE = "abort"  # vLLM's
WAIT_POLL_S = 0.02


def _enabled(request: Request) -> AppState:
    state = app_state(request)
    if not state.config.enable_weight_updates:
        raise ApiError(404, "not_enabled", f"{request.url.path} is served only with "
                       "--enable-weight-updates (KILN_ENABLE_WEIGHT_UPDATES=1)")
    return state


def _awake(state: AppState, path: str) -> None:
    if state.sleeping:
        raise ApiError(409, "sleeping", f"the server sleeps: POST /wake_up before {path}")


def _state(state: AppState, mode: str | None, aborted: int = 0) -> Response:
    stats = state.backend.stats()
    return json_response({"paused": bool(stats.get("paused", 0.0)), "mode": mode,
                          "aborted": aborted, "running": int(stats.get("running", 0.0)),
                          "waiting": int(stats.get("waiting", 0.0))})


async def pause(request: Request) -> Response:
    state = _enabled(request)
    _awake(state, "POST /pause")
    mode = request.query_params.get("mode", DEFAULT_MODE)
    if mode not in MODES:
        raise ApiError(400, CODE, f"mode must be one of {', '.join(MODES)}, got {mode!r}",
                       param="mode")
    aborted = await state.backend.pause(mode)
    state.pause_mode = mode
    if mode == "wait":  # returns once the running requests finished
        deadline = asyncio.get_running_loop().time() + state.config.request_timeout_s
        while not state.backend.stats().get("paused", 0.0):
            if asyncio.get_running_loop().time() > deadline:
                raise ApiError(408, "request_timeout", "the running requests did not finish "
                               f"within {state.config.request_timeout_s:g} s; the pause (wait) "
                               "stays in force")
            await asyncio.sleep(WAIT_POLL_S)
    return _state(state, mode, aborted)


async def resume(request: Request) -> Response:
    state = _enabled(request)
    _awake(state, "POST /resume")
    await state.backend.resume()
    state.pause_mode = None
    return _state(state, None)


async def is_paused(request: Request) -> Response:
    state = _enabled(request)
    return json_response({"is_paused": state.pause_mode is not None})


async def reset_prefix_cache(request: Request) -> Response:
    state = _enabled(request)
    forgotten = await state.backend.reset_prefix_cache()
    return json_response({"reset": True, "forgotten_blocks": forgotten})


def _sleep_state(state: AppState, aborted: int = 0, released: int = 0) -> Response:
    return json_response({"sleeping": state.sleeping, "level": 1 if state.sleeping else None,
                          "aborted": aborted, "released_bytes": released})


async def sleep(request: Request) -> Response:
    """Level 1: every request aborted, new ones held, the prefix cache forgotten, the KV
    cache's memory given back. Level 2 (the weights' memory too) is not built: a 400."""
    state = _enabled(request)
    level = request.query_params.get("level", "1")
    if level != "1":
        raise ApiError(400, CODE, f"level {level!r}: only level 1 (the KV cache's memory) is "
                       "built; level 2 (the weights' as well) is not", param="level")
    if state.sleeping:
        raise ApiError(409, "sleeping", "the server sleeps already")
    aborted, released = await state.backend.sleep()
    state.sleeping, state.pause_mode = True, "abort"
    return _sleep_state(state, aborted, released)


async def wake_up(request: Request) -> Response:
    state = _enabled(request)
    if not state.sleeping:
        raise ApiError(409, "not_sleeping", "the server is awake")
    await state.backend.resume()
    state.sleeping, state.pause_mode = False, None
    return _sleep_state(state)


async def is_sleeping(request: Request) -> Response:
    state = _enabled(request)
    return json_response({"is_sleeping": state.sleeping})
