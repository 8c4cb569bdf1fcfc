"""A training loop's routes, under vLLM's and SGLang's names, served with
--enable-weight-updates (a 404 that says so otherwise): POST /pause (?mode=abort|wait|keep),
POST /resume, GET /is_paused, POST /reset_prefix_cache, POST /sleep (?level=1),
POST /wake_up, GET /is_sleeping, POST /update_weights_from_disk (kiln.serving:
`EngineBackend.update_weights`). The engine
applies each between two steps (kiln.engine.loop: `AsyncEngine.pause`, `resume`,
`reset_prefix_cache`, `sleep`); the scheduler holds the pause (kiln.engine.scheduler:
`Scheduler.pause`); sleeping gives the KV cache's pages back (kiln.model.native.c_model:
`release_pages`)."""

from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.responses import Response

from kiln.api._generated import wire
from kiln.api.errors import ApiError
from kiln.api.requests.refused import UNSUPPORTED_CODE
from kiln.api.state import AppState, app_state, json_response
from kiln.api.wire_values import opt
from kiln.weight_update import WeightUpdateBusy, WeightUpdateError, WeightUpdateTimeout

CODE = "training_invalid_request"
MODES = ("abort", "wait", "keep")
DEFAULT_MODE = "abort"  # vLLM's
WAIT_POLL_S = 0.02


def enabled(request: Request) -> AppState:
    """The app's state, or a 404 when the training routes are off."""
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
    state = enabled(request)
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
    state = enabled(request)
    _awake(state, "POST /resume")
    await state.backend.resume()
    state.pause_mode = None
    return _state(state, None)


async def is_paused(request: Request) -> Response:
    state = enabled(request)
    return json_response({"is_paused": state.pause_mode is not None})


async def reset_prefix_cache(request: Request) -> Response:
    state = enabled(request)
    forgotten = await state.backend.reset_prefix_cache()
    return json_response({"reset": True, "forgotten_blocks": forgotten})


def _sleep_state(state: AppState, aborted: int = 0, released: int = 0) -> Response:
    return json_response({"sleeping": state.sleeping,
                          "level": state.sleep_level if state.sleeping else None,
                          "aborted": aborted, "released_bytes": released})


async def sleep(request: Request) -> Response:
    """Level 1: every request aborted, new ones held, the prefix cache forgotten, the KV
    cache's memory given back. Level 2: the weights' memory as well, when they were loaded from
    a file (POST /wake_up reads them again)."""
    state = enabled(request)
    level = request.query_params.get("level", "1")
    if level not in ("1", "2"):
        raise ApiError(400, CODE, f"level must be 1 (the KV cache's memory) or 2 (the weights' "
                       f"as well), got {level!r}", param="level")
    if state.sleeping:
        raise ApiError(409, "sleeping", "the server sleeps already")
    try:
        aborted, released = await state.backend.sleep(int(level))
    except WeightUpdateError as exc:
        raise ApiError(400, CODE, exc.message, param="level") from None
    state.sleeping, state.pause_mode, state.sleep_level = True, "abort", int(level)
    return _sleep_state(state, aborted, released)


async def wake_up(request: Request) -> Response:
    state = enabled(request)
    if not state.sleeping:
        raise ApiError(409, "not_sleeping", "the server is awake")
    try:
        await state.backend.wake_up()
    except WeightUpdateError as exc:  # the file changed shape or went away meanwhile
        raise ApiError(409, "wake_up_failed", f"the weights could not be read again: "
                       f"{exc.message}; the server still sleeps") from None
    state.sleeping, state.pause_mode = False, None
    return _sleep_state(state)


async def is_sleeping(request: Request) -> Response:
    state = enabled(request)
    return json_response({"is_sleeping": state.sleeping})


UPDATE_MODES = ("abort", "wait", "keep")
# SGLang's fields Kiln has no use for, accepted at their no-op value only: (field, that value)
NO_OP_FIELDS = (("is_async", False), ("torch_empty_cache", False),
                ("recapture_cuda_graph", False), ("token_step", 0), ("flush_cache", True))


def _update_mode(req: wire.TrainingUpdateWeightsRequest) -> str:
    """The running-request mode: ``mode``, or SGLang's abort_all_requests (true: abort), or
    SGLang's default (the running requests finish first: wait)."""
    mode: str | None = opt(req.mode)
    abort_all = opt(req.abort_all_requests)
    if mode is None:
        return "abort" if abort_all else "wait"
    if abort_all and mode != "abort":
        raise ApiError(400, CODE, f"abort_all_requests=true is mode abort, not {mode!r}",
                       param="abort_all_requests")
    return mode


async def update_weights_from_disk(request: Request) -> Response:
    """SGLang's route: load ``model_path`` beside the serving weights, then swap it in between
    two steps (``EngineBackend.update_weights``: abort | wait | keep); the prefix cache is
    flushed, adapters stay loaded. Refused with nothing changed: a bad or mismatched
    checkpoint (400), another update in flight or a sleeping server (409), a wait that outlasts
    the request timeout (408)."""
    state = enabled(request)
    req = await state.contract.read(request, state.config.max_body_bytes,
                                    "TrainingUpdateWeightsRequest",
                                    wire.TrainingUpdateWeightsRequest, CODE)
    for name, value in NO_OP_FIELDS:
        given = opt(getattr(req, name))
        if given is not None and given != value:
            raise ApiError(400, UNSUPPORTED_CODE, f"{name}={given!r} is not supported (only "
                           f"{value!r}): "
                           + ("the prefix cache is always flushed" if name == "flush_cache"
                              else "the update loads, swaps and returns in this call"
                              if name == "is_async" else "this server has no such step"),
                           param=name)
    load_format = opt(req.load_format)
    if load_format not in (None, "auto"):
        raise ApiError(400, CODE, f"load_format {load_format!r} is not supported: the format "
                       "is read from the file (null or \"auto\")", param="load_format")
    mode = _update_mode(req)
    _awake(state, "POST /update_weights_from_disk")
    backend = state.backend
    try:
        done = await backend.update_weights(req.model_path, opt(req.weight_version), mode,
                                            state.config.request_timeout_s)
    except WeightUpdateBusy as exc:
        raise ApiError(409, "update_in_flight", str(exc)) from None
    except WeightUpdateTimeout as exc:
        raise ApiError(408, "request_timeout", str(exc)) from None
    except WeightUpdateError as exc:
        raise ApiError(400, CODE, f"the serving weights are unchanged: {exc.message}",
                       param=exc.param) from None
    kept = 0
    if mode == "keep":
        kept = int(backend.stats().get("running", 0.0))
    if opt(req.keep_pause):
        await backend.pause("keep")
        state.pause_mode = "keep"
    message = (f"serving {done.version} from {req.model_path} (mode {mode}; loaded in "
               f"{done.load_s:.2f} s, serving after {done.total_s:.2f} s)")
    return json_response({"success": True, "message": message, "num_paused_requests": kept,
                          "weight_version": done.version, "mode": mode,
                          "aborted": done.aborted, "load_s": round(done.load_s, 4),
                          "total_s": round(done.total_s, 4)})
