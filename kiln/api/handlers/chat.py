"""POST /v1/chat/completions: JSON and SSE."""

from __future__ import annotations

import time

from starlette.requests import Request
from starlette.responses import Response

from kiln.api._generated import wire
from kiln.api.replies import chat_stream
from kiln.api.replies.chat_body import response_body
from kiln.api.requests import rollout
from kiln.api.requests.completions_gen import scored_prompt
from kiln.api.requests.prepare import CHAT_CODE, prepare_chat
from kiln.api.sse import EventStream
from kiln.api.state import app_state, claim_request_id, json_response
from kiln.api.submission import collect_all, submit, submit_all, until_disconnect
from kiln.api.wire_values import opt


async def create(request: Request) -> Response:
    started, arrived = time.perf_counter(), time.monotonic()
    state = app_state(request)
    req = await state.contract.read(request, state.config.max_body_bytes,
                                    "ChatCompletionRequest", wire.ChatCompletionRequest, CHAT_CODE)
    prepared = await prepare_chat(state, req)
    prompt, run = prepared.prompt, prepared.run
    if prepared.shape.rollout:
        rollout.check(state, prepared)
    rid = claim_request_id(request, opt(req.request_id))  # the header's and the body's id
    completion_id = f"chatcmpl-{rid}"
    if prepared.shape.stream:
        outputs = submit(state, f"{rid}-0", prompt.ids, run.params[0], run.lora, arrived,
                         cache_salt=run.cache_salt, priority=run.priority)
        frames = chat_stream.frames(state, prepared, completion_id, outputs, started)
        return EventStream(frames, on_close=outputs.aclose)
    streams = submit_all(
        state, [(f"{rid}-{i}", prompt.ids, p, run.lora) for i, p in enumerate(run.params)],
        arrived, code=CHAT_CODE, cache_salt=run.cache_salt, priority=run.priority,
    )
    completions = await until_disconnect(request, collect_all(streams))
    body_out = response_body(state, prepared, completion_id, completions, started)
    if prepared.shape.prompt_logprobs is not None:  # vLLM's, beside the choices
        body_out.prompt_logprobs = await scored_prompt(
            state, prompt.ids, prepared.shape.prompt_logprobs, run.lora)
    return json_response(body_out)
