"""vLLM's tokenizer routes: POST /tokenize (a text, or chat messages rendered as the chat route
renders them), POST /detokenize, GET /tokenizer_info."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from kiln.api._generated import wire
from kiln.api.errors import ApiError
from kiln.api.requests.params import resolve_model
from kiln.api.requests.prepare import render_prompt, template_kwargs
from kiln.api.state import app_state, json_response
from kiln.api.wire_values import opt

CODE = "tokenizer_invalid_request"


async def tokenize(request: Request) -> Response:
    state = app_state(request)
    backend = state.backend
    req = await state.contract.read(
        request, state.config.max_body_bytes, "TokenizeRequest", wire.TokenizeRequest, CODE)
    resolve_model(backend, opt(req.model))
    prompt, messages = opt(req.prompt), opt(req.messages)
    if (prompt is None) == (messages is None):
        raise ApiError(400, CODE, "give exactly one of prompt and messages", param="prompt")
    special = opt(req.add_special_tokens)
    if prompt is None:
        kwargs = template_kwargs(state, req, CODE)
        prompt = render_prompt(state, messages, None, kwargs, bool(req.add_generation_prompt))
        special = False if special is None else special
    limit = backend.max_model_len
    if backend.tokenizer.surely_over(prompt, 4 * limit):  # encoding holds the GIL
        raise ApiError(400, "context_length_exceeded",
                       f"the prompt ({len(prompt)} characters) is far longer than the context "
                       f"window of {limit} tokens", param="prompt")
    ids = backend.tokenizer.encode(prompt, add_special_tokens=True if special is None else special)
    strs = None
    if opt(req.return_token_strs):
        to_str = getattr(backend.tokenizer, "id_to_token", None)
        strs = [str(to_str(t) if to_str else backend.tokenizer.decode([t])) for t in ids]
    return json_response({"count": len(ids), "max_model_len": limit, "tokens": ids,
                          "token_strs": strs})


async def detokenize(request: Request) -> Response:
    state = app_state(request)
    backend = state.backend
    req = await state.contract.read(
        request, state.config.max_body_bytes, "DetokenizeRequest", wire.DetokenizeRequest, CODE)
    resolve_model(backend, opt(req.model))
    vocab = backend.tokenizer.vocab_size
    bad = [t for t in req.tokens if t >= vocab]
    if bad:
        raise ApiError(400, CODE, f"token id {bad[0]} is outside the vocabulary (size {vocab})",
                       param="tokens")
    return json_response({"prompt": backend.tokenizer.decode(list(req.tokens))})


async def info(request: Request) -> Response:
    backend = app_state(request).backend
    tok: Any = backend.tokenizer
    inner = getattr(getattr(tok, "backend", None), "model", None)
    source = getattr(backend.chat_template, "source", None)
    return json_response({
        "tokenizer_class": type(inner).__name__ if inner is not None else type(tok).__name__,
        "vocab_size": tok.vocab_size,
        "model_max_length": backend.max_model_len,
        "eos_token_ids": sorted(tok.eos_token_ids),
        "bos_token": getattr(tok, "bos_token", None),
        "eos_token": getattr(tok, "eos_token", None),
        "chat_template": source if isinstance(source, str) else None,
    })
