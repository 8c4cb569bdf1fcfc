"""POST /v1/completions: prompt-logprob scoring (reference §8). No generation happens."""

from __future__ import annotations

import time
import uuid
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from kiln.api._generated import wire
from kiln.api.body import read_json_body
from kiln.api.encode import json_response
from kiln.api.errors import ApiError
from kiln.api.handlers.generation import engine_error, until_disconnect
from kiln.api.handlers.params import opt
from kiln.api.state import app_state
from kiln.engine.errors import EngineError

ERROR_CODE = "completion_invalid_request"
MAX_K = 256
MAX_PROMPT_TOKENS = 4096
MAX_CANDIDATES = 65_536


def _bad(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, ERROR_CODE, message, param=param)


async def create(request: Request) -> Response:
    state = app_state(request)
    backend = state.backend
    body = await read_json_body(request, state.config.max_body_bytes)
    req = state.contract.parse("TextCompletionRequest", body, wire.TextCompletionRequest, ERROR_CODE)
    model = opt(req.model)
    if model is not None and model != backend.model_id and model not in backend.aliases:
        raise ApiError(
            404, "model_not_found", f"model {model!r} is not served here", param="model"
        )
    n = opt(req.n)
    if n is not None and n != 1:
        raise _bad("n must be 1 (or null) for prompt scoring", "n")
    k = int(req.prompt_logprobs)
    vocab = backend.tokenizer.vocab_size
    if k > vocab:
        raise _bad(f"prompt_logprobs {k} exceeds the vocabulary size {vocab}", "prompt_logprobs")
    if isinstance(req.prompt, str):
        ids = backend.tokenizer.encode(req.prompt, add_special_tokens=bool(req.add_special_tokens))
    else:
        ids = [int(t) for t in req.prompt]
    if not ids:
        raise _bad("prompt tokenizes to 0 tokens", "prompt")
    if len(ids) > MAX_PROMPT_TOKENS:
        raise _bad(f"prompt has {len(ids)} tokens; the cap is {MAX_PROMPT_TOKENS}", "prompt")
    if len(ids) > backend.max_model_len:
        raise ApiError(
            400, "context_length_exceeded",
            f"prompt has {len(ids)} tokens; the maximum context length is {backend.max_model_len}",
            param="prompt",
        )
    bad = [t for t in ids if t >= vocab]
    if bad:
        raise _bad(f"token id {bad[0]} is outside the vocabulary (size {vocab})", "prompt")
    if (len(ids) - 1) * (k + 1) > MAX_CANDIDATES:
        raise _bad(
            f"(prompt tokens - 1) * (prompt_logprobs + 1) exceeds {MAX_CANDIDATES} candidates",
            "prompt_logprobs",
        )
    try:
        scores = await until_disconnect(request, backend.score(ids, k))
    except EngineError as exc:  # e.g. kv_cache_exhausted (503), non-finite logits (500)
        raise engine_error(exc) from None
    logprobs: list[Any] = [None]
    for pos, s in enumerate(scores, start=1):
        entries: dict[str, Any] = {}
        context = ids[:pos]
        for rank, (tid, lp) in enumerate(zip(s.top_ids, s.top_logprobs, strict=True), start=1):
            entries[str(tid)] = {"logprob": lp, "rank": rank, "decoded_token": _decode(backend, context, tid)}
        if str(s.token_id) not in entries:
            entries[str(s.token_id)] = {
                "logprob": s.logprob, "rank": s.rank,
                "decoded_token": _decode(backend, context, s.token_id),
            }
        logprobs.append(entries)
    identity = backend.identity()
    return json_response(
        {
            "id": f"cmpl-{uuid.uuid4()}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": backend.model_id,
            "system_fingerprint": identity.get("fingerprint"),
            "choices": [
                {"index": 0, "text": "", "finish_reason": "length", "prompt_logprobs": logprobs}
            ],
            "usage": {"prompt_tokens": len(ids), "completion_tokens": 0, "total_tokens": len(ids)},
        }
    )


def _decode(backend: Any, context: list[int], token_id: int) -> str:
    """The token's text in context: decode(context + token) minus decode(context)."""
    tail = context[-4:]
    before = backend.tokenizer.decode(tail)
    after = backend.tokenizer.decode([*tail, token_id])
    return str(after[len(before):]) if after.startswith(before) else str(backend.tokenizer.decode([token_id]))
