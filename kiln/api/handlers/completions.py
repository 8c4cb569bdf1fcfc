"""POST /v1/completions: prompt-logprob scoring (reference §8). No generation happens."""

from __future__ import annotations

import base64
import hashlib
import time
import uuid
from typing import Any

from msgspec import UNSET
from starlette.requests import Request
from starlette.responses import Response

from kiln import metrics
from kiln.api._generated import wire
from kiln.api.body import read_json_body
from kiln.api.encode import json_response
from kiln.api.errors import ApiError
from kiln.api.handlers.adapters import BASE, Selection, select
from kiln.api.handlers.generation import engine_error, until_disconnect
from kiln.api.handlers.models import resolve_model
from kiln.api.handlers.params import opt
from kiln.api.state import app_state
from kiln.engine.errors import EngineError
from kiln.provenance import adapter_identity, compact_json
from kiln.text.detokenizer import decode_in_context

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
    # DESIGN §6: scores under the base model, or under the adapter `model` names
    _, model_adapter = resolve_model(backend, opt(req.model))
    selection = (
        await select(backend, UNSET, UNSET, model_adapter, tri_state=False)
        if model_adapter else BASE
    )
    n = opt(req.n)
    if n is not None and n != 1:
        raise _bad("n must be 1 (or null) for prompt scoring", "n")
    k = int(req.prompt_logprobs)
    vocab = backend.tokenizer.vocab_size
    if k > vocab:
        raise _bad(f"prompt_logprobs {k} exceeds the vocabulary size {vocab}", "prompt_logprobs")
    if isinstance(req.prompt, str):
        if backend.tokenizer.surely_over(req.prompt, MAX_PROMPT_TOKENS):
            raise _bad(f"prompt ({len(req.prompt)} characters) has more than the cap of "
                       f"{MAX_PROMPT_TOKENS} tokens", "prompt")
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
    started = time.perf_counter()
    try:
        scores = await until_disconnect(request, backend.score(ids, k, selection.lora))
    except EngineError as exc:  # e.g. kv_cache_exhausted (503), non-finite logits (500)
        metrics.observe_request(len(ids), 0, "error", None, [], None, None)
        raise engine_error(exc, prompt_param="prompt") from None
    # scored prompt tokens count as prompt tokens; the request as finished by "length", as its
    # choice says (no generated token, so no TTFT or inter-token gaps)
    metrics.observe_request(len(ids), 0, "length", None, [], time.perf_counter() - started, None)
    logprobs: list[Any] = [None]
    for pos, s in enumerate(scores, start=1):
        entries: dict[str, Any] = {}
        decode = decode_in_context(backend.tokenizer, ids[max(0, pos - 4):pos])
        for rank, (tid, lp) in enumerate(zip(s.top_ids, s.top_logprobs, strict=True), start=1):
            entries[str(tid)] = {"logprob": lp, "rank": rank, "decoded_token": decode(tid)}
        if str(s.token_id) not in entries:
            entries[str(s.token_id)] = {
                "logprob": s.logprob, "rank": s.rank, "decoded_token": decode(s.token_id),
            }
        logprobs.append(entries)
    fingerprint = teacher_fingerprint(backend, selection)
    return json_response(
        {
            "id": f"cmpl-{uuid.uuid4()}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": model_adapter or backend.model_id,
            "system_fingerprint": fingerprint,
            "choices": [
                {"index": 0, "text": "", "finish_reason": "length", "prompt_logprobs": logprobs}
            ],
            "usage": {"prompt_tokens": len(ids), "completion_tokens": 0, "total_tokens": len(ids)},
        }
    )


def teacher_fingerprint(backend: Any, selection: Selection) -> str | None:
    """`kiln-teacher-v1.<base64url JSON>.<sha256 of that JSON>`: the exact base model content,
    adapter content, tokenizer and template that produced the scores (None without an identity)."""
    identity = backend.policy_identity()
    if identity is None:
        return None
    doc: dict[str, Any] = {
        "served_model_id": identity.served_model_id,
        "base_model_sha256": identity.base_model_sha256,
        "tokenizer_vocab_sha256": identity.vocab_sha256,
        "tokenizer_config_sha256": identity.tokenizer_config_sha256,
        "chat_template_sha256": identity.chat_template_sha256,
        "inference_config_sha256": identity.inference_config_sha256,
    }
    adapter = adapter_identity(selection.lora)
    if adapter is not None:
        doc["adapter"] = adapter
    raw = compact_json(doc, sort_keys=True)
    encoded = base64.urlsafe_b64encode(raw).decode().rstrip("=")
    return f"kiln-teacher-v1.{encoded}.{hashlib.sha256(raw).hexdigest()}"
