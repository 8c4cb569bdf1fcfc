"""POST /v1/completions generation, as vLLM does it: prompts (a text, texts, token IDs or lists
of them) x n choices, prompt-major; best_of; echo; logprobs and prompt_logprobs; prompt
truncation; stop strings and token IDs; a thinking budget; seeds.

``prepare`` turns the wire request into engine requests (plus each prompt's echo); ``respond``
runs them and builds the JSON body; ``completions_stream`` streams them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any

from msgspec import UNSET
from starlette.requests import Request
from starlette.responses import Response

from kiln.api._generated import wire
from kiln.api.backend import PositionScore
from kiln.api.errors import ApiError
from kiln.api.replies.logprobs import CompletionLogprobs
from kiln.api.requests.extras import (
    check_logprobs,
    generation_extras,
    included_stop,
    logits_extras,
    response_id,
    text_extras,
    thinking_tokens,
    truncate,
    truncation,
)
from kiln.api.requests.params import Selection, choice_seed, normalize_stop, state_max_tokens
from kiln.api.requests.prepare import (
    Prompt,
    Run,
    Shape,
    apply_budget,
    choice_params,
    over_context,
)
from kiln.api.state import AppState, Finish, json_response
from kiln.api.state import finish_reason as wire_finish
from kiln.api.state import usage as token_usage
from kiln.api.submission import (
    Completion,
    collect_all,
    generation_failed,
    submit_all,
    until_disconnect,
)
from kiln.api.weight_versions import spans_wire, version_of
from kiln.api.wire_values import opt
from kiln.engine.outputs import RequestOutput, RequestStream
from kiln.engine.request import GrammarSpec, SamplingParams
from kiln.text.thinking import prompt_starts_in_reasoning, resolve
from kiln.text.tokenizer import decode_in_context

ERROR_CODE = "completion_invalid_request"
DEFAULT_MAX_TOKENS = 16  # vLLM's completions default
MAX_CHOICES = 64
MAX_ECHO_CANDIDATES = 65_536  # as scoring: echoed positions * (logprobs + 1)


def bad(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, ERROR_CODE, message, param=param)


@dataclass
class Prepared:
    """A completions request: per prompt its `Prompt` (the token ids, and the text echo puts
    back), what the engine runs (`Run`: every choice's SamplingParams, prompt-major) and how the
    response is shaped (`Shape`); then what only completions has: best_of, the streaming
    interval, tokens as ids, prompt_logprobs, and the prompt scores ``score_echoes`` fills in."""

    completion_id: str
    prompts: tuple[Prompt, ...]
    run: Run
    shape: Shape
    n: int  # engine requests per prompt (best_of, else n)
    keep: int  # choices returned per prompt: n (the best n of best_of by cumulative logprob)
    as_ids: bool = False
    stream_interval: int = 1
    prompt_logprobs: int | None = None  # prompt_logprobs beside generation
    echo_scores: list[list[PositionScore]] = field(default_factory=list)
    prompt_lists: list[list[Any]] = field(default_factory=list)  # per prompt, scoring's shape

    def prompt_of(self, index: int) -> int:
        return index // self.n


def split_prompts(prompt: Any) -> list[str | list[int]]:
    """One text, token IDs, texts, or lists of token IDs -> one entry per prompt."""
    if isinstance(prompt, str):
        return [prompt]
    if all(is_token_id(x) for x in prompt):
        return [[int(x) for x in prompt]]
    return [p if isinstance(p, str) else [int(x) for x in p] for p in prompt]


def is_token_id(x: Any) -> bool:
    """A token ID: the contract's integers accept integral floats (2.0) too."""
    return isinstance(x, int | float) and not isinstance(x, bool)


def _tokenize(state: AppState, req: wire.TextCompletionRequest, keep: int | None = None
              ) -> tuple[list[list[int]], list[str]]:
    backend = state.backend
    tok, limit, vocab = backend.tokenizer, backend.max_model_len, backend.tokenizer.vocab_size
    prompts: list[list[int]] = []
    texts: list[str] = []
    for i, p in enumerate(split_prompts(req.prompt)):
        where = "prompt" if i == 0 and not isinstance(req.prompt, list) else f"prompt[{i}]"
        if isinstance(p, str):
            if keep is None and tok.surely_over(p, limit):
                raise ApiError(400, "context_length_exceeded",
                               f"{where} ({len(p)} characters) is longer than the context window "
                               f"of {limit} tokens", param="prompt")
            ids = tok.encode(p, add_special_tokens=bool(req.add_special_tokens))
            cut = truncate(ids, keep, opt(req.truncation_side))
            texts.append(p if cut is ids else tok.decode(cut))
            ids = cut
        else:
            ids = p
            bad_ids = [t for t in ids if t >= vocab]
            if bad_ids:
                raise bad(f"{where}: token id {bad_ids[0]} is outside the vocabulary "
                          f"(size {vocab})", "prompt")
            ids = truncate(ids, keep, opt(req.truncation_side))
            texts.append(tok.decode(ids))
        if not ids:
            raise bad(f"prompt tokenizes to 0 tokens ({where})", "prompt")
        if len(ids) >= limit:
            raise over_context(where, len(ids), limit, "prompt")
        prompts.append(ids)
    return prompts, texts


def wanted_max_tokens(req: wire.TextCompletionRequest, given: bool, model_default: int | None) -> int | None:
    """The max_tokens asked for (None: the rest of the context window). vLLM: 16 when missing,
    the rest of the window when null, and the model's generation_config max_new_tokens
    (``model_default``) bounds both defaults."""
    if not given or req.max_tokens is UNSET:
        return DEFAULT_MAX_TOKENS if model_default is None else min(DEFAULT_MAX_TOKENS,
                                                                    model_default)
    return model_default if req.max_tokens is None else int(req.max_tokens)


def _max_tokens(wanted: int | None, prompt_len: int, limit: int) -> int:
    room = limit - prompt_len
    return room if wanted is None else max(0, min(wanted, room))


def prepare(state: AppState, req: wire.TextCompletionRequest, selection: Selection, model: str, *,
            max_tokens_given: bool, grammar: GrammarSpec | None = None) -> Prepared:
    """``grammar``: the structured-output constraint every choice runs under."""
    limit = state.backend.max_model_len
    wanted = wanted_max_tokens(req, max_tokens_given, state_max_tokens(state))
    prompts, texts = _tokenize(state, req, truncation(req, limit, wanted, ERROR_CODE))
    keep = int(opt(req.n) or 1)
    n = int(opt(req.best_of) or keep)
    if n < keep:
        raise bad(f"best_of ({n}) must be at least n ({keep})", "best_of")
    if n > keep and opt(req.stream):
        raise bad("best_of above n cannot stream (the best are known only at the end)", "best_of")
    if len(prompts) * n > MAX_CHOICES:
        param = "best_of" if n > keep else "n"
        raise bad(f"{len(prompts)} prompts x {param}={n} is more than {MAX_CHOICES} choices", param)
    logprobs = opt(req.logprobs)
    check_logprobs(logprobs, state.config.max_logprobs, "logprobs", ERROR_CODE)
    prompt_logprobs = opt(req.prompt_logprobs)
    check_logprobs(prompt_logprobs, state.config.max_logprobs, "prompt_logprobs", ERROR_CODE)
    echo = bool(opt(req.echo))
    if echo and logprobs is not None:
        worst = max(len(p) - 1 for p in prompts) * (int(logprobs) + 1)
        if worst > MAX_ECHO_CANDIDATES:
            raise bad(f"echoed prompt positions * (logprobs + 1) exceeds {MAX_ECHO_CANDIDATES}",
                      "logprobs")
    stop = normalize_stop(opt(req.stop))
    stop_ids = tuple(int(t) for t in (opt(req.stop_token_ids) or ()))
    extras = logits_extras(req, state.backend.tokenizer, code=ERROR_CODE, stop=stop,
                           stop_token_ids=stop_ids, max_tokens=wanted) | text_extras(req)
    extras |= generation_extras(req, None if logprobs is None else int(logprobs),
                                state.backend.tokenizer.vocab_size, ERROR_CODE)
    budget = resolve(thinking_tokens(req, ERROR_CODE), UNSET, None, None)  # vLLM's alias only
    params: list[SamplingParams] = []
    records: list[Prompt] = []
    for p, ids in enumerate(prompts):
        max_tokens = _max_tokens(wanted, len(ids), limit)
        in_reasoning = prompt_starts_in_reasoning(texts[p])
        spec = apply_budget(state, budget, in_reasoning, max_tokens,
                            stop, ERROR_CODE) if budget.configured else None
        params.extend(choice_params(
            req, state, max_tokens=max_tokens, stop=stop,
            seeds=[choice_seed(req.seed, p * n + c) for c in range(n)],
            logprobs=None if logprobs is None else int(logprobs), stop_token_ids=stop_ids,
            thinking=spec, grammar=grammar, **extras))
        records.append(Prompt(texts[p], ids, in_reasoning))
    options = opt(req.stream_options)
    return Prepared(
        completion_id=response_id(req, "cmpl"), prompts=tuple(records),
        run=Run(tuple(params), selection.lora, selection.label, budget,
                any(p.thinking is not None for p in params),
                cache_salt=opt(req.cache_salt), priority=int(opt(req.priority) or 0),
                mix_param=selection.param),
        shape=Shape(
            model=model, stream=bool(opt(req.stream)), echo=echo,
            include_usage=bool(options is not None and opt(options.include_usage)),
            continuous_usage=bool(options is not None and opt(options.include_usage)
                                  and opt(options.continuous_usage_stats)),
            logprobs=None if logprobs is None else int(logprobs),
            return_token_ids=bool(opt(req.return_token_ids)),
            include_stop=bool(req.include_stop_str_in_output)),
        n=n, keep=keep, as_ids=bool(opt(req.return_tokens_as_token_ids)),
        stream_interval=int(opt(req.stream_interval) or 1),
        prompt_logprobs=None if prompt_logprobs is None else int(prompt_logprobs))


async def score_echoes(state: AppState, prep: Prepared) -> None:
    """The prompts' logprobs from the scoring route: the echoed prompts' (echo with logprobs)
    and prompt_logprobs beside generation, one scoring pass per prompt for both."""
    echo = prep.shape.echo and prep.shape.logprobs is not None
    if not echo and prep.prompt_logprobs is None:
        return
    k = max(prep.shape.logprobs or 0 if echo else 0, prep.prompt_logprobs or 0)
    for prompt in prep.prompts:
        ids = prompt.ids
        scores = list(await state.backend.score(ids, k, prep.run.lora)) if len(ids) > 1 else []
        if echo:
            prep.echo_scores.append([_top(s, prep.shape.logprobs or 0) for s in scores])
        if prep.prompt_logprobs is not None:
            tok = state.backend.tokenizer
            prep.prompt_lists.append(prompt_logprob_list(
                tok, ids, [_top(s, prep.prompt_logprobs) for s in scores]))


def _top(s: PositionScore, k: int) -> PositionScore:
    return dataclasses.replace(s, top_ids=s.top_ids[:k], top_logprobs=s.top_logprobs[:k])


async def scored_prompt(state: AppState, ids: list[int], k: int,
                        lora: tuple[tuple[Any, float], ...]) -> list[Any]:
    """vLLM's prompt_logprobs beside generation for one prompt (chat's; completions shares its
    scoring pass with echo, ``score_echoes``): the scoring route's top ``k`` per position."""
    scores = list(await state.backend.score(ids, k, lora)) if len(ids) > 1 else []
    return prompt_logprob_list(state.backend.tokenizer, ids, [_top(s, k) for s in scores])


def prompt_logprob_list(tokenizer: Any, ids: list[int], scores: list[PositionScore]
                        ) -> list[Any]:
    """Scoring's prompt_logprobs: null for the first token, then per position the top ids by
    logit and the observed token, each {logprob, rank, decoded_token}."""
    out: list[Any] = [None]
    for pos, s in enumerate(scores, start=1):
        entries: dict[str, Any] = {}
        decode = decode_in_context(tokenizer, ids[max(0, pos - 4):pos])
        for rank, (tid, lp) in enumerate(zip(s.top_ids, s.top_logprobs, strict=True), start=1):
            entries[str(tid)] = {"logprob": lp, "rank": rank, "decoded_token": decode(tid)}
        if str(s.token_id) not in entries:
            entries[str(s.token_id)] = {"logprob": s.logprob, "rank": s.rank,
                                        "decoded_token": decode(s.token_id)}
        out.append(entries)
    return out


ChoiceQueue = asyncio.Queue[tuple[int, RequestOutput | None]]


def merged(live: list[int], streams: list[RequestStream]
           ) -> tuple[ChoiceQueue, list[asyncio.Future[None]]]:
    """The choices' streams as one queue of (choice index, output), in arrival order; a choice's
    stream ending puts (index, None). The tasks pump until cancelled or done."""
    queue: ChoiceQueue = asyncio.Queue()

    async def pump(i: int, outputs: RequestStream) -> None:
        try:
            async for out in outputs:
                queue.put_nowait((i, out))
                if out.finished:
                    break
        finally:
            queue.put_nowait((i, None))

    return queue, [asyncio.ensure_future(pump(i, s)) for i, s in zip(live, streams, strict=True)]


def start(state: AppState, prep: Prepared, rid: str, arrived: float) -> list[RequestStream]:
    """Admit every choice that generates (max_tokens 0 choices need no engine request)."""
    items = [(f"{rid}-{i}", prep.prompts[prep.prompt_of(i)].ids, p, prep.run.lora)
             for i, p in enumerate(prep.run.params) if p.max_tokens > 0]
    return submit_all(state, items, arrived, code=ERROR_CODE, prompt_param="prompt",
                      cache_salt=prep.run.cache_salt, priority=prep.run.priority)


def finish_reason(c: Completion, mix_param: str | None = None) -> Finish:
    if c.finish_reason == "error":
        raise generation_failed(c, ERROR_CODE, mix_param)
    if c.finish_reason == "abort":
        raise ApiError(503, "engine_not_running", c.error or "the engine stopped this request",
                       headers={"retry-after": "1"})
    return wire_finish(c.finish_reason)


def echo_logprobs(state: AppState, prep: Prepared, p: int) -> CompletionLogprobs:
    lps = CompletionLogprobs(as_ids=prep.as_ids)
    if prep.shape.echo:
        lps.add_echo(state.backend.tokenizer, prep.prompts[p].ids, prep.echo_scores[p])
    return lps


def stop_text(prep: Prepared, finish: str | None, stop_reason: str | int | None) -> str:
    """The matched stop string when include_stop_str_in_output asks for it."""
    return included_stop(prep.shape.include_stop, finish, stop_reason, prep.run.params[0].stop)


def choice_body(state: AppState, prep: Prepared, index: int, p: int, c: Completion
                ) -> wire.TextCompletionChoice:
    text = ((prep.prompts[p].text if prep.shape.echo else "") + c.text
            + stop_text(prep, c.finish_reason, c.stop_reason))
    choice = wire.TextCompletionChoice(index=index, text=text, finish_reason=finish_reason(c, prep.run.mix_param),
                                       logprobs=None, stop_reason=c.stop_reason)
    if prep.shape.logprobs is not None:
        lps = echo_logprobs(state, prep, p)
        lps.add_generated(state.backend.tokenizer, prep.prompts[p].ids, c.token_ids, c.tops)
        choice.logprobs = lps.wire()
    if prep.shape.return_token_ids:
        choice.prompt_token_ids = prep.prompts[p].ids
        choice.token_ids = c.token_ids
    if prep.prompt_logprobs is not None:
        choice.prompt_logprobs = prep.prompt_lists[p]
    if (spans := spans_wire(c.weight_spans)) is not None:
        choice.weight_versions = spans
    return choice


def best(prep: Prepared, completions: list[Completion]) -> list[tuple[int, Completion]]:
    """Per prompt, the ``keep`` best of its ``n`` runs by cumulative logprob (the engine's
    behaviour logprob of each sampled token; best first, as vLLM orders them); all of them in
    order when keep == n."""
    out: list[tuple[int, Completion]] = []
    for p in range(len(prep.prompts)):
        runs = completions[p * prep.n:(p + 1) * prep.n]
        if prep.keep < prep.n:
            runs = sorted(runs, key=lambda c: -sum(c.logprobs))[:prep.keep]
        out.extend((p, c) for c in runs)
    return out


def usage(prep: Prepared, completion_tokens: int, cached: list[int]) -> wire.Usage:
    """The request's usage; ``cached``: each choice's prompt tokens the prefix cache held, of
    which each prompt counts once (its choices share it), as its tokens do."""
    per_prompt = [0] * len(prep.prompts)
    for i, n in enumerate(cached):
        per_prompt[prep.prompt_of(i)] = max(per_prompt[prep.prompt_of(i)], n)
    return token_usage(sum(len(p.ids) for p in prep.prompts), completion_tokens,
                       sum(per_prompt))


async def respond(request: Request, state: AppState, prep: Prepared, rid: str, arrived: float,
                  fingerprint: str | None) -> Response:
    await until_disconnect(request, score_echoes(state, prep))
    streams = start(state, prep, rid, arrived)
    done = iter(await until_disconnect(request, collect_all(streams)))
    completions = [next(done) if p.max_tokens > 0 else Completion(finish_reason="length")
                   for p in prep.run.params]
    choices = [choice_body(state, prep, i, p, c) for i, (p, c) in enumerate(best(prep, completions))]
    return json_response(wire.TextCompletionResponse(
        id=prep.completion_id, object="text_completion", created=int(time.time()),
        model=prep.shape.model, system_fingerprint=fingerprint, choices=choices,
        usage=usage(prep, sum(c.num_output_tokens for c in completions),
                    [c.num_cached_tokens for c in completions]),
        weight_version=version_of(completions[-1].weight_spans, completions[-1].weight_version,
                                  state.backend),
    ))
