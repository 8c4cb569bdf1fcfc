"""POST /v1/completions generation, as vLLM does it: prompts (a text, texts, token IDs or lists
of them) x n choices, prompt-major; echo; logprobs; stop strings and token IDs; seeds.

``prepare`` turns the wire request into engine requests (plus each prompt's echo); ``respond``
runs them and builds the JSON body; ``completions_stream`` streams them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from msgspec import UNSET
from starlette.requests import Request
from starlette.responses import Response

from kiln.api.backend import PositionScore
from kiln.api.encode import json_response
from kiln.api.errors import ApiError
from kiln.api.handlers.adapters import Selection
from kiln.api.handlers.extras import check_logprobs, logits_extras
from kiln.api.handlers.generation import Admitted, Completion, collect, submit_all, until_disconnect
from kiln.api.handlers.logprobs import CompletionLogprobs
from kiln.api.handlers.params import (
    choice_seed,
    normalize_stop,
    opt,
    sampling_params,
    state_default,
)
from kiln.api.state import AppState
from kiln.engine.request import SamplingParams

ERROR_CODE = "completion_invalid_request"
DEFAULT_MAX_TOKENS = 16  # vLLM's completions default
MAX_CHOICES = 64
MAX_ECHO_CANDIDATES = 65_536  # as scoring: echoed positions * (logprobs + 1)


def bad(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, ERROR_CODE, message, param=param)


@dataclass
class Prepared:
    completion_id: str
    model: str
    prompts: list[list[int]]
    echo_texts: list[str]  # per prompt: what echo prepends
    n: int
    params: list[SamplingParams]  # per choice, prompt-major
    lora: tuple[tuple[Any, float], ...]
    echo: bool
    logprobs: int | None
    as_ids: bool
    return_token_ids: bool
    include_usage: bool
    stream_interval: int
    include_stop: bool = False  # include_stop_str_in_output: a matched stop string ends the text
    echo_scores: list[list[PositionScore]] = field(default_factory=list)

    def prompt_of(self, index: int) -> int:
        return index // self.n


def split_prompts(prompt: Any) -> list[str | list[int]]:
    """One text, token IDs, texts, or lists of token IDs -> one entry per prompt."""
    if isinstance(prompt, str):
        return [prompt]
    if all(type(x) is int for x in prompt):
        return [list(prompt)]
    return [p if isinstance(p, str) else list(p) for p in prompt]


def _tokenize(state: AppState, req: Any) -> tuple[list[list[int]], list[str]]:
    backend = state.backend
    tok, limit, vocab = backend.tokenizer, backend.max_model_len, backend.tokenizer.vocab_size
    prompts: list[list[int]] = []
    texts: list[str] = []
    for i, p in enumerate(split_prompts(req.prompt)):
        where = "prompt" if i == 0 and not isinstance(req.prompt, list) else f"prompt[{i}]"
        if isinstance(p, str):
            if tok.surely_over(p, limit):
                raise ApiError(400, "context_length_exceeded",
                               f"{where} ({len(p)} characters) is longer than the context window "
                               f"of {limit} tokens", param="prompt")
            ids = tok.encode(p, add_special_tokens=bool(req.add_special_tokens))
            texts.append(p)
        else:
            ids = p
            bad_ids = [t for t in ids if t >= vocab]
            if bad_ids:
                raise bad(f"{where}: token id {bad_ids[0]} is outside the vocabulary "
                          f"(size {vocab})", "prompt")
            texts.append(tok.decode(ids))
        if not ids:
            raise bad(f"prompt tokenizes to 0 tokens ({where})", "prompt")
        if len(ids) >= limit:
            raise ApiError(400, "context_length_exceeded",
                           f"{where} has {len(ids)} tokens; the maximum context length is {limit}",
                           param="prompt")
        prompts.append(ids)
    return prompts, texts


def _max_tokens(req: Any, given: bool, prompt_len: int, limit: int) -> int:
    """vLLM: 16 when missing, the rest of the context window when null; clamped to it."""
    wanted = req.max_tokens
    room = limit - prompt_len
    if not given or wanted is UNSET:
        return min(DEFAULT_MAX_TOKENS, room)
    return room if wanted is None else max(0, min(int(wanted), room))


def prepare(state: AppState, req: Any, selection: Selection, model: str, *,
            max_tokens_given: bool) -> Prepared:
    prompts, texts = _tokenize(state, req)
    n = int(opt(req.n) or 1)
    if len(prompts) * n > MAX_CHOICES:
        raise bad(f"{len(prompts)} prompts x n={n} is more than {MAX_CHOICES} choices", "n")
    logprobs = opt(req.logprobs)
    check_logprobs(logprobs, state.config.max_logprobs, "logprobs", ERROR_CODE)
    echo = bool(opt(req.echo))
    if echo and logprobs is not None:
        worst = max(len(p) - 1 for p in prompts) * (int(logprobs) + 1)
        if worst > MAX_ECHO_CANDIDATES:
            raise bad(f"echoed prompt positions * (logprobs + 1) exceeds {MAX_ECHO_CANDIDATES}",
                      "logprobs")
    stop = normalize_stop(opt(req.stop))
    stop_ids = tuple(int(t) for t in (opt(req.stop_token_ids) or ()))
    wanted = opt(req.max_tokens) if max_tokens_given else DEFAULT_MAX_TOKENS
    extras = logits_extras(req, state.backend.tokenizer, code=ERROR_CODE, stop=stop,
                           stop_token_ids=stop_ids, max_tokens=wanted)
    default = state_default(state)
    params: list[SamplingParams] = []
    for p, ids in enumerate(prompts):
        for c in range(n):
            base = sampling_params(
                req, max_tokens=_max_tokens(req, max_tokens_given, len(ids),
                                       state.backend.max_model_len),
                stop=stop, seed=choice_seed(req.seed, p * n + c), base=default)
            params.append(dataclasses.replace(
                base, logprobs=None if logprobs is None else int(logprobs),
                stop_token_ids=stop_ids, **extras))
    options = opt(req.stream_options)
    rid = opt(req.request_id)
    return Prepared(
        completion_id=f"cmpl-{rid if rid else uuid.uuid4()}", model=model, prompts=prompts,
        echo_texts=texts, n=n, params=params, lora=selection.lora, echo=echo,
        logprobs=None if logprobs is None else int(logprobs),
        as_ids=bool(opt(req.return_tokens_as_token_ids)),
        return_token_ids=bool(opt(req.return_token_ids)),
        include_usage=bool(options is not None and opt(options.include_usage)),
        stream_interval=int(opt(req.stream_interval) or 1),
        include_stop=bool(req.include_stop_str_in_output))


async def score_echoes(state: AppState, prep: Prepared) -> None:
    """The echoed prompts' logprobs, from the scoring route (only when echo and logprobs)."""
    if not (prep.echo and prep.logprobs is not None):
        return
    for ids in prep.prompts:
        scores = await state.backend.score(ids, prep.logprobs, prep.lora) if len(ids) > 1 else []
        prep.echo_scores.append(list(scores))


def start(state: AppState, prep: Prepared, rid: str, arrived: float) -> list[Admitted]:
    """Admit every choice that generates (max_tokens 0 choices need no engine request)."""
    items = [(f"{rid}-{i}", prep.prompts[prep.prompt_of(i)], p, prep.lora)
             for i, p in enumerate(prep.params) if p.max_tokens > 0]
    return submit_all(state, items, arrived, code=ERROR_CODE, prompt_param="prompt")


def finish_reason(c: Completion) -> str:
    if c.finish_reason == "error":
        raise ApiError(500, "generation_error", f"generation failed: {c.error or 'unknown error'}")
    if c.finish_reason == "abort":
        raise ApiError(503, "engine_not_running", c.error or "the engine stopped this request",
                       headers={"retry-after": "1"})
    return c.finish_reason if c.finish_reason in ("stop", "length") else "stop"


def echo_logprobs(state: AppState, prep: Prepared, p: int) -> CompletionLogprobs:
    lps = CompletionLogprobs(as_ids=prep.as_ids)
    if prep.echo:
        lps.add_echo(state.backend.tokenizer, prep.prompts[p], prep.echo_scores[p])
    return lps


def stop_text(prep: Prepared, finish: str | None, stop_reason: str | int | None) -> str:
    """The matched stop string when include_stop_str_in_output asks for it."""
    ok = prep.include_stop and finish == "stop" and isinstance(stop_reason, str)
    return str(stop_reason) if ok else ""


def choice_body(state: AppState, prep: Prepared, index: int, c: Completion) -> dict[str, Any]:
    p = prep.prompt_of(index)
    text = ((prep.echo_texts[p] if prep.echo else "") + c.text
            + stop_text(prep, c.finish_reason, c.stop_reason))
    choice: dict[str, Any] = {"index": index, "text": text, "logprobs": None,
                              "finish_reason": finish_reason(c), "stop_reason": c.stop_reason}
    if prep.logprobs is not None:
        lps = echo_logprobs(state, prep, p)
        lps.add_generated(state.backend.tokenizer, prep.prompts[p], c.token_ids, c.tops)
        choice["logprobs"] = lps.wire()
    if prep.return_token_ids:
        choice["prompt_token_ids"] = prep.prompts[p]
        choice["token_ids"] = c.token_ids
    return choice


def usage(prep: Prepared, completion_tokens: int) -> dict[str, int]:
    prompt_tokens = sum(len(p) for p in prep.prompts)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


async def _collect(streams: list[Admitted]) -> list[Completion]:
    try:
        return list(await asyncio.gather(*(collect(s) for s in streams)))
    finally:
        for s in streams:
            await s.aclose()


async def respond(request: Request, state: AppState, prep: Prepared, rid: str, arrived: float,
                  fingerprint: str | None) -> Response:
    await until_disconnect(request, score_echoes(state, prep))
    streams = start(state, prep, rid, arrived)
    done = iter(await until_disconnect(request, _collect(streams)))
    completions = [next(done) if p.max_tokens > 0 else Completion(finish_reason="length")
                   for p in prep.params]
    choices = [choice_body(state, prep, i, c) for i, c in enumerate(completions)]
    return json_response({
        "id": prep.completion_id, "object": "text_completion", "created": int(time.time()),
        "model": prep.model, "system_fingerprint": fingerprint, "choices": choices,
        "usage": usage(prep, sum(c.num_output_tokens for c in completions)),
    })
