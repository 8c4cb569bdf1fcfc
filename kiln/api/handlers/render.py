"""vLLM's render routes: POST /v1/completions/render and POST /v1/chat/completions/render take
the same request as their generating route, run its whole preparation (validation, template,
tokenization, truncation, sampling resolution) and return what the engine would run, without
generating: the prompt's token ids and text, and the resolved sampling."""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

from msgspec import UNSET
from starlette.requests import Request
from starlette.responses import Response

from kiln.api._generated import wire
from kiln.api.contract import read_json_body
from kiln.api.errors import ApiError
from kiln.api.handlers.completions import ERROR_CODE, is_scoring, output_constraint
from kiln.api.requests import completions_gen
from kiln.api.requests.params import BASE, resolve_model, select
from kiln.api.requests.prepare import prepare_chat
from kiln.api.requests.refused import COMPLETION_UNSUPPORTED, refuse_unsupported
from kiln.api.state import app_state, json_response, request_id
from kiln.api.wire_values import opt
from kiln.engine.request import SamplingParams


def sampling(p: SamplingParams, priority: int = 0, cache_salt: str | None = None
             ) -> dict[str, Any]:
    """Every field of the SamplingParams the engine would get, by one mapping (a field added to
    SamplingParams shows here; the contract's ``additionalProperties: false`` makes the render
    tests notice it), and the request's scheduling priority and cache salt, which the engine
    takes beside them (kiln.engine.request.Request)."""
    return {**dataclasses.asdict(p), "priority": priority, "cache_salt": cache_salt}


def rendered(rid: str, model: str, ids: list[int], text: str, p: SamplingParams,
             priority: int = 0, cache_salt: str | None = None) -> dict[str, Any]:
    return {"request_id": rid, "model": model, "token_ids": list(ids), "prompt": text,
            "sampling_params": sampling(p, priority, cache_salt)}


async def chat(request: Request) -> Response:
    state = app_state(request)
    req = await state.contract.read(request, state.config.max_body_bytes,
                                    "ChatCompletionRequest", wire.ChatCompletionRequest,
                                    "chat_invalid_request")
    prepared = await prepare_chat(state, req)
    rid = request_id(request) or f"chatcmpl-{uuid.uuid4()}"
    run = prepared.run
    return json_response(rendered(rid, prepared.shape.model, prepared.prompt.ids,
                                  prepared.prompt.text, run.params[0], run.priority,
                                  run.cache_salt))


async def completion(request: Request) -> Response:
    state = app_state(request)
    backend = state.backend
    body = await read_json_body(request, state.config.max_body_bytes)
    req = state.contract.parse("TextCompletionRequest", body, wire.TextCompletionRequest,
                               ERROR_CODE)
    _, model_adapter = resolve_model(backend, opt(req.model))
    refuse_unsupported(req, COMPLETION_UNSUPPORTED)
    selection = (await select(backend, UNSET, UNSET, model_adapter, tri_state=False)
                 if model_adapter else BASE)
    model = model_adapter or backend.model_id
    rid = request_id(request) or f"cmpl-{uuid.uuid4()}"
    given = state.contract.decode(body)
    scoring = is_scoring(req, given)
    grammar = await output_constraint(state, req, scoring)
    if scoring:  # scoring runs the prompt as given: no generation
        prompt = req.prompt
        if isinstance(prompt, str):
            ids = backend.tokenizer.encode(prompt, add_special_tokens=bool(req.add_special_tokens))
        else:
            if not all(map(completions_gen.is_token_id, prompt)):
                raise ApiError(400, ERROR_CODE, "prompt scoring takes one prompt (a text or a "
                                                "token-ID list)", param="prompt")
            ids = [int(t) for t in prompt]
        p = SamplingParams(max_tokens=0)
        return json_response([rendered(rid, model, ids, backend.tokenizer.decode(ids), p)])
    prep = completions_gen.prepare(state, req, selection, model,
                                   max_tokens_given="max_tokens" in given, grammar=grammar)
    return json_response([
        rendered(rid, model, prompt.ids, prompt.text, prep.run.params[i * prep.n],
                 prep.run.priority, prep.run.cache_salt)
        for i, prompt in enumerate(prep.prompts)])
