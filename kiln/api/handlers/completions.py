"""POST /v1/completions: vLLM's completions request. With `prompt_logprobs` and `max_tokens`
missing, null, 0 or 1 it is Kiln's prompt scoring (docs/behavior.md §8), exactly as before: no
generation happens. Anything else generates (completions_gen, completions_stream)."""

from __future__ import annotations

import base64
import hashlib
import time
from typing import Any

from msgspec import UNSET
from starlette.requests import Request
from starlette.responses import Response

from kiln.api._generated import wire
from kiln.api.contract import read_json_body
from kiln.api.errors import ApiError
from kiln.api.replies import completions_stream
from kiln.api.requests import completions_gen
from kiln.api.requests.params import BASE, Selection, resolve_model, select
from kiln.api.requests.refused import COMPLETION_UNSUPPORTED, refuse_unsupported, unsupported
from kiln.api.sse import EventStream
from kiln.api.state import AppState, app_state, claim_request_id, json_response, usage
from kiln.api.structured.constraints import constraint
from kiln.api.submission import engine_error, observe_request, until_disconnect
from kiln.api.wire_values import opt
from kiln.engine.errors import EngineError
from kiln.engine.request import GrammarSpec
from kiln.provenance import adapter_identity, compact_json

ERROR_CODE = "completion_invalid_request"
MAX_K = 256
MAX_PROMPT_TOKENS = 4096
MAX_CANDIDATES = 65_536
# Generation fields that prompt scoring refuses (unsupported_parameter) unless they hold one of
# these values (missing is null), and the ones it refuses when non-empty.
SCORING_NEUTRAL: dict[str, tuple[Any, ...]] = {
    "echo": (None, False), "logprobs": (None, 0), "return_token_ids": (None, False),
    "return_tokens_as_token_ids": (None, False), "truncate_prompt_tokens": (None, 0),
    "best_of": (None, 1), "logprob_token_ids": (None,)}
SCORING_EMPTY = ("bad_words", "repetition_detection")


def _bad(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, ERROR_CODE, message, param=param)


def is_scoring(req: wire.TextCompletionRequest, given: dict[str, Any]) -> bool:
    """prompt_logprobs with max_tokens missing, null, 0 or 1 (``given``: the decoded body, since
    the struct fills max_tokens' default of 16 in)."""
    return opt(req.prompt_logprobs) is not None and given.get("max_tokens") in (None, 0, 1)


async def create(request: Request) -> Response:
    started, arrived = time.perf_counter(), time.monotonic()
    state = app_state(request)
    backend = state.backend
    body = await read_json_body(request, state.config.max_body_bytes)
    req = state.contract.parse("TextCompletionRequest", body, wire.TextCompletionRequest, ERROR_CODE)
    # runs under the base model, or under the adapter `model` names (docs/decisions.md)
    _, model_adapter = resolve_model(backend, opt(req.model))
    refuse_unsupported(req, COMPLETION_UNSUPPORTED)
    given = state.contract.decode(body)  # an object: parse accepted it
    scoring = is_scoring(req, given)
    # generation follows chat's rule (no adapter field: the server default, else the one
    # `model` names); scoring runs the base model unless `model` names one
    selection = (
        await select(backend, UNSET, UNSET, model_adapter, tri_state=not scoring)
        if model_adapter or not scoring else BASE
    )
    grammar = await output_constraint(state, req, scoring)
    if scoring:
        return await _score(request, state, req, selection, model_adapter)
    prep = completions_gen.prepare(state, req, selection, model_adapter or backend.model_id,
                                   max_tokens_given="max_tokens" in given, grammar=grammar)
    fingerprint = teacher_fingerprint(backend, selection)
    rid = claim_request_id(request, opt(req.request_id))  # the header's and the body's id
    prep.completion_id = f"cmpl-{rid}"
    if opt(req.stream):
        await until_disconnect(request, completions_gen.score_echoes(state, prep))
        streams = completions_gen.start(state, prep, rid, arrived)

        async def close() -> None:
            for s in streams:
                await s.aclose()

        return EventStream(completions_stream.frames(state, prep, streams, started),
                           on_close=close)
    return await completions_gen.respond(request, state, prep, rid, arrived, fingerprint)


async def output_constraint(state: AppState, req: wire.TextCompletionRequest, scoring: bool) -> GrammarSpec | None:
    """The request's structured-output constraint (None: none), compiled under the server's
    deadline; beside prompt scoring a 400."""
    grammar = await constraint(
        state.backend.tokenizer, code=ERROR_CODE, response_format=opt(req.response_format),
        structured_outputs=opt(req.structured_outputs), ignore_eos=bool(opt(req.ignore_eos)),
        deadline_s=state.config.grammar_compile_timeout_s)
    if grammar is not None and scoring:
        raise unsupported(grammar.param, "prompt scoring generates no text to "
                                                     "constrain")
    return grammar


async def _score(request: Request, state: AppState, req: wire.TextCompletionRequest, selection: Selection,
                 model_adapter: str | None) -> Response:
    backend = state.backend
    n = opt(req.n)
    if n is not None and n != 1:
        raise _bad("n must be 1 (or null) for prompt scoring", "n")
    if opt(req.stream):
        raise _bad("prompt scoring is non-streaming only (stream must be false)", "stream")
    for name, neutral in SCORING_NEUTRAL.items():
        if opt(getattr(req, name)) not in neutral:
            raise unsupported(
                name, "it does not apply to prompt scoring (prompt_logprobs with max_tokens 0); "
                      "vLLM's way, echo with logprobs and max_tokens 0, needs no prompt_logprobs")
    for name in SCORING_EMPTY:
        if opt(getattr(req, name)):
            raise unsupported(name, "prompt scoring generates no tokens")
    if not isinstance(req.prompt, str) and not all(map(completions_gen.is_token_id, req.prompt)):
        raise _bad("prompt scoring takes one prompt (a text or a token-ID list)", "prompt")
    if (opt(req.thinking_token_budget) or -1) >= 0:
        raise unsupported("thinking_token_budget", "prompt scoring generates nothing")
    k = int(opt(req.prompt_logprobs) or 0)  # set: is_scoring
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
        observe_request(len(ids), 0, "error", None, [], None, None)
        raise engine_error(exc, prompt_param="prompt") from None
    # scored prompt tokens count as prompt tokens; the request as finished by "length", as its
    # choice says (no generated token, so no TTFT or inter-token gaps)
    observe_request(len(ids), 0, "length", None, [], time.perf_counter() - started, None)
    logprobs = completions_gen.prompt_logprob_list(backend.tokenizer, ids, list(scores))
    fingerprint = teacher_fingerprint(backend, selection)
    return json_response(wire.TextCompletionResponse(
        id=f"cmpl-{claim_request_id(request, opt(req.request_id))}",
        object="text_completion",
        created=int(time.time()),
        model=model_adapter or backend.model_id,
        system_fingerprint=fingerprint,
        choices=[wire.TextCompletionChoice(index=0, text="", finish_reason="length",
                                           prompt_logprobs=logprobs)],
        usage=usage(len(ids), 0),
        weight_version=backend.weight_version,  # the scores' weights: scoring runs alone
    ))


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
