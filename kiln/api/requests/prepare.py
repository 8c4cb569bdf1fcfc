"""Prompt preparation, shared by chat, batch and completions: the model and adapter a request
runs under (`params.resolve_model_adapter`), the rendered and tokenized prompt checked against
the context window, and one engine SamplingParams per choice. A request becomes three small
frozen records: what the prompt is (`Prompt`), what the engine runs (`Run`) and how the response
is shaped (`Shape`); completions builds them in `completions_gen.prepare`."""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from kiln.api._generated import wire
from kiln.api.backend import Backend
from kiln.api.errors import ApiError
from kiln.api.requests.extras import (
    chat_extras,
    chat_turn_fields,
    continue_final,
    prompt_logprobs_wanted,
    reasoning_shown,
    thinking_tokens,
    truncate,
    truncation,
)
from kiln.api.requests.params import (
    U64,
    choice_seed,
    effective_max_tokens,
    normalize_stop,
    requested_max_tokens,
    resolve_model_adapter,
    sampling_params,
    state_default,
    state_max_tokens,
)
from kiln.api.requests.prompt_ids import given_prompt, refuse_template_fields
from kiln.api.state import AppState
from kiln.api.structured.constraints import constraint
from kiln.api.wire_values import ChatRequest, GenRequest, opt, plain
from kiln.engine.request import SamplingParams, ThinkingBudgetSpec
from kiln.text.chat_template import message_content, render_messages, template_messages
from kiln.text.thinking import CLOSE_TAG, BudgetConfig, prompt_starts_in_reasoning, resolve
from kiln.text.thinking_budget import budget_problem
from kiln.text.tools import tool_format

CHAT_CODE = "chat_invalid_request"
Lora = tuple[tuple[Any, float], ...]
ThinkingSource = Literal["custom", "request", "server_default", "template_default"]


@dataclass(frozen=True)
class Prompt:
    """What the prompt is: the rendered text, its token ids, the template's view of the messages
    and variables, and whether it starts inside a reasoning block."""

    text: str
    ids: list[int]
    in_reasoning: bool = False
    thinking_source: ThinkingSource = "template_default"
    tokenization_s: float = 0.0
    messages: list[dict[str, Any]] = field(default_factory=list)
    template_kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Run:
    """What the engine runs: one SamplingParams per choice, under ``lora`` (``adapter`` names
    it), with the resolved thinking budget."""

    params: tuple[SamplingParams, ...]
    lora: Lora
    adapter: str
    budget: BudgetConfig
    budget_applied: bool
    cache_salt: str | None = None  # vLLM's: different salts never share prefix-cache blocks
    priority: int = 0  # vLLM's scheduling priority (lower first)
    mix_param: str | None = None  # the field that chose ``lora`` (``Selection.param``)

    @property
    def n(self) -> int:
        return len(self.params)


@dataclass(frozen=True)
class Shape:
    """How the response is shaped: which optional parts it carries and how text is told."""

    model: str
    stream: bool = False
    echo: bool = False  # completions: each prompt's text goes before its choices' text
    include_usage: bool = False
    continuous_usage: bool = False  # vLLM's continuous_usage_stats: usage on every chunk
    include_performance: bool = False
    explicit_performance: bool = False
    include_config_hashes: bool = False
    default_thinking_enabled: bool | None = None
    reasoning: bool = True  # include_reasoning: the reasoning is in the response
    fold: bool = False
    logprobs: int | None = None  # alternatives per token when the request set logprobs: true
    tools: list[Any] | None = None  # set only when tool-call parsing is on
    parallel_tool_calls: bool = True
    echo_text: str = ""  # echo: the final assistant message, put before each choice's content
    return_token_ids: bool = False
    include_stop: bool = False  # include_stop_str_in_output: the matched stop string ends the text
    rollout: bool = False
    as_ids: bool = False  # return_tokens_as_token_ids: logprobs tokens written token_id:<id>
    prompt_logprobs: int | None = None  # vLLM's prompt_logprobs beside generation


@dataclass(frozen=True)
class PreparedChat:
    prompt: Prompt
    run: Run
    shape: Shape

    @property
    def thinking_mode(self) -> Literal["reasoning", "non_reasoning"]:
        return "reasoning" if self.prompt.in_reasoning else "non_reasoning"


@dataclass(frozen=True)
class PreparedBatch:
    """A batch: per prompt its `Prompt` and `Run` (n choices each), one `Shape` for all."""

    items: tuple[tuple[Prompt, Run], ...]
    shape: Shape


RESERVED_TEMPLATE_VARS = frozenset({"messages", "tools"})


TEMPLATE_FIELDS = ("reasoning_effort", "documents")  # vLLM's fields the template reads


def template_kwargs(state: AppState, req: ChatRequest | wire.TokenizeRequest, error_code: str) -> dict[str, Any]:
    """`chat_template_kwargs` as top-level template variables, plus the server's default
    `enable_thinking` when the request does not set it and the TEMPLATE_FIELDS it sets.
    `messages` and `tools` are the request's own: a kwarg of either name is a 400 (it had been a
    TypeError shown as invalid_messages)."""
    kwargs: dict[str, Any] = dict(opt(req.chat_template_kwargs) or {})
    for name in TEMPLATE_FIELDS:
        value = opt(getattr(req, name, None))
        if value is None:
            continue
        if name in kwargs:
            raise ApiError(400, error_code, f"{name} is set twice, as a field and in "
                                            "chat_template_kwargs: set it once", param=name)
        kwargs[name] = value
    reserved = sorted(RESERVED_TEMPLATE_VARS & kwargs.keys())
    if reserved:
        raise ApiError(
            400, error_code,
            f"chat_template_kwargs may not set {', '.join(reserved)}: the template gets them from "
            "the request's own fields", param="chat_template_kwargs",
        )
    default = state.config.default_thinking_enabled
    if "enable_thinking" not in kwargs and default is not None:
        kwargs["enable_thinking"] = default
    return kwargs


def _thinking_source(requested: Any, server_default: bool | None) -> ThinkingSource:
    """Who chose the thinking mode (docs/behavior.md §4), from the request's own
    ``chat_template_kwargs`` (before ``template_kwargs`` merges the server default in)."""
    kwargs = opt(requested) or {}
    if "enable_thinking" in kwargs:
        return "request" if isinstance(kwargs["enable_thinking"], bool) else "custom"
    return "server_default" if server_default is not None else "template_default"


# OpenAI's message roles (and its former "function"), which vLLM takes too
ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})


def render_prompt(state: AppState, messages: list[wire.ChatMessageInput], tools: Any,
                  kwargs: dict[str, Any], add_generation_prompt: bool = True,
                  param: str = "messages") -> str:
    """The chat template over the messages (``render_messages``' fallbacks); a role outside
    ``ROLES`` is a 400 naming it (``param``: where the messages are), as OpenAI and vLLM answer;
    a template error is the client's messages or tools: 400 invalid_messages with the first
    error."""
    for i, m in enumerate(messages):
        if m.role not in ROLES:
            raise ApiError(400, "invalid_messages", f"{param}[{i}].role: unknown role "
                           f"{m.role!r}; one of {', '.join(sorted(ROLES))}",
                           param=f"{param}[{i}].role")
    try:
        return render_messages(state.backend.chat_template, messages, tools, kwargs,
                               add_generation_prompt)
    except Exception as exc:
        raise ApiError(400, "invalid_messages", f"Failed to apply chat template: {exc}",
                       param="messages") from None


def over_context(where: str, tokens: int, limit: int, param: str) -> ApiError:
    """context_length_exceeded for a prompt of ``tokens`` tokens (``where``: which prompt)."""
    return ApiError(400, "context_length_exceeded",
                    f"{where} has {tokens} tokens; the maximum context length is {limit}",
                    param=param)


def encode_prompt(backend: Backend, text: str, param: str, where: str | None = None, *,
                  special: bool = False, keep: int | None = None, side: str | None = None
                  ) -> tuple[str, list[int]]:
    """A rendered prompt's text and token ids (``special``: vLLM's add_special_tokens, BOS on
    top of the template; ``keep``: truncate_prompt_tokens, from ``side``), which must leave
    room in the context window for a token."""
    limit = backend.max_model_len
    if keep is None and backend.tokenizer.surely_over(text, limit):  # not worth encoding
        raise ApiError(400, "context_length_exceeded", f"maximum context length is {limit} "
                       f"tokens; the prompt ({len(text)} characters) has more", param=param)
    ids: list[int] = backend.tokenizer.encode(text, add_special_tokens=special)
    if keep is not None and len(ids) > keep:  # truncate_prompt_tokens, as completions
        ids = truncate(ids, keep, side)
        text = backend.tokenizer.decode(ids)
    if len(ids) >= limit:
        if where is not None:
            raise over_context(where, len(ids), limit, param)
        raise ApiError(400, "context_length_exceeded",
                       f"maximum context length is {limit} tokens; the prompt has {len(ids)} "
                       "tokens", param=param)
    return text, ids


def tools_enabled(tools: Any, tool_choice: Any) -> bool:
    """Tool-call parsing is on iff tools is a non-empty array and tool_choice is not "none"."""
    return bool(tools) and tool_choice != "none"


def apply_budget(state: AppState, budget: BudgetConfig, in_reasoning: bool, max_tokens: int,
                 stop: tuple[str, ...], error_code: str) -> ThinkingBudgetSpec | None:
    """The engine's budget spec when it applies (docs/behavior.md §3.2), after the §3.3 checks:
    the close sequence must round-trip, fit the effective max_tokens, and not clash with a stop."""
    if not (budget.configured and in_reasoning and max_tokens > 0):
        return None
    tokenizer = state.backend.tokenizer
    close_ids = tuple(tokenizer.encode(CLOSE_TAG, add_special_tokens=False))
    roundtrip = bool(close_ids) and tokenizer.decode(list(close_ids)) == CLOSE_TAG
    problem = budget_problem(roundtrip, len(close_ids), max_tokens, stop)
    if problem is not None:
        raise ApiError(400, error_code, problem[0], param=problem[1])
    return ThinkingBudgetSpec(close_ids, budget.tokens.limit, budget.time_ms.limit)


def choice_params(req: GenRequest, state: AppState, *, max_tokens: int, stop: tuple[str, ...],
                  seeds: list[int | None], **fields: Any) -> tuple[SamplingParams, ...]:
    """One SamplingParams per choice (one seed each), with ``fields`` set on every one."""
    base = state_default(state)
    return tuple(replace(sampling_params(req, max_tokens=max_tokens, stop=stop, seed=seed,
                                         base=base), **fields) for seed in seeds)


async def _unconstrained() -> None:
    return None


def _grammar(state: AppState, req: ChatRequest, code: str, tools: Any, tool_choice: Any,
             in_reasoning: bool) -> Any:
    """The structured-output constraint of a chat or batch request (a coroutine); it starts
    after the reasoning when the prompt starts in one. A request that sets none of the fields
    that can ask for one is unconstrained without entering structured/constraints.py."""
    # llama-server's grammar and json_schema come on chat only
    llama = (opt(req.grammar), opt(req.json_schema)) \
        if isinstance(req, wire.ChatCompletionRequest) else (None, None)
    if opt(req.response_format) is None and opt(req.structured_outputs) is None \
            and tool_choice is None and llama == (None, None):
        return _unconstrained()
    tokenizer = state.backend.tokenizer
    return constraint(
        tokenizer, code=code, response_format=opt(req.response_format),
        structured_outputs=opt(req.structured_outputs), tools=tools, tool_choice=tool_choice,
        parallel_tool_calls=opt(req.parallel_tool_calls) is not False,
        ignore_eos=bool(opt(req.ignore_eos)),
        tool_format=tool_format(getattr(state.backend.chat_template, "source", None))
        if tools else "json",  # the format of tool calls, where the request has tools
        after=tuple(tokenizer.encode(CLOSE_TAG)) if in_reasoning else (),
        deadline_s=state.config.grammar_compile_timeout_s, llama=llama)


async def prepare_chat(state: AppState, req: wire.ChatCompletionRequest) -> PreparedChat:
    cfg, backend = state.config, state.backend
    model, selection = await resolve_model_adapter(backend, opt(req.model), req.adapter,
                                                   req.adapters)
    started = time.perf_counter()
    kwargs = template_kwargs(state, req, CHAT_CODE)
    tools = opt(req.tools) or None
    tool_choice = plain(opt(req.tool_choice))
    if tool_choice is not None:
        kwargs.setdefault("tool_choice", tool_choice)
    messages = template_messages(req.messages)
    given = opt(req.prompt_token_ids)
    if given is not None:  # token-in: no template (kiln.api.requests.prompt_ids)
        refuse_template_fields(req, CHAT_CODE)
    gen_prompt, cont, echo_text = chat_turn_fields(req, CHAT_CODE)
    requested = requested_max_tokens(req.max_tokens, req.max_completion_tokens)
    if given is not None:
        text, ids = given_prompt(backend, given, "prompt_token_ids", CHAT_CODE)
    else:
        text = render_prompt(state, req.messages, tools, kwargs, gen_prompt)
        if cont:
            text = continue_final(text, message_content(req.messages[-1].content), CHAT_CODE)
        keep = truncation(req, backend.max_model_len, requested if requested is not None
                          else state_max_tokens(state), CHAT_CODE)
        text, ids = encode_prompt(backend, text, "messages", special=opt(req.add_special_tokens)
                                  is True, keep=keep, side=opt(req.truncation_side))
    tokenization_s = time.perf_counter() - started
    max_tokens = effective_max_tokens(requested, len(ids), backend.max_model_len,
                                      state_max_tokens(state))
    stop = normalize_stop(opt(req.stop))
    n = int(opt(req.n) or 1)
    budget = resolve(thinking_tokens(req, CHAT_CODE),  # or vLLM's thinking_token_budget
                     req.thinking_budget_ms, cfg.default_thinking_budget_tokens,
                     cfg.default_thinking_budget_ms)
    in_reasoning = prompt_starts_in_reasoning(text)
    spec = apply_budget(state, budget, in_reasoning, max_tokens, stop, CHAT_CODE)
    rollout = req.rollout_provenance is True
    seed = opt(req.seed)
    if rollout and seed is None:
        seed = secrets.randbits(64)  # drawn here so that the record can state it
    extras = chat_extras(req, backend.tokenizer, stop, requested, cfg.max_logprobs)
    extras["grammar"] = await _grammar(state, req, CHAT_CODE, tools, tool_choice, in_reasoning)
    params = choice_params(req, state, max_tokens=max_tokens, stop=stop,
                           seeds=[choice_seed(seed, i) for i in range(n)], thinking=spec, **extras)
    include_perf = opt(req.include_performance)
    reasoning, fold = reasoning_shown(req, cfg.fold_reasoning_into_content, CHAT_CODE)
    stream_options = opt(req.stream_options)
    return PreparedChat(
        Prompt(text, ids, in_reasoning,
               _thinking_source(req.chat_template_kwargs, cfg.default_thinking_enabled),
               tokenization_s, messages, kwargs),
        Run(params, selection.lora, selection.label, budget, spec is not None,
            cache_salt=opt(req.cache_salt), priority=int(opt(req.priority) or 0),
            mix_param=selection.param),
        Shape(
            model=model,
            stream=bool(opt(req.stream)),
            include_usage=bool(stream_options and opt(stream_options.include_usage)),
            continuous_usage=bool(stream_options and opt(stream_options.include_usage)
                                  and opt(stream_options.continuous_usage_stats)),
            include_performance=bool(include_perf),
            explicit_performance=include_perf is True,
            include_config_hashes=bool(opt(req.include_config_hashes)),
            default_thinking_enabled=cfg.default_thinking_enabled,
            reasoning=reasoning,
            fold=fold,
            logprobs=extras["logprobs"],
            tools=tools if tools_enabled(tools, tool_choice) else None,
            parallel_tool_calls=opt(req.parallel_tool_calls) is not False,
            echo_text=echo_text,
            return_token_ids=opt(req.return_token_ids) is True,
            include_stop=opt(req.include_stop_str_in_output) is True,
            rollout=rollout,
            as_ids=opt(req.return_tokens_as_token_ids) is True,
            prompt_logprobs=prompt_logprobs_wanted(req, cfg.max_logprobs, CHAT_CODE),
        ),
    )


async def prepare_batch(state: AppState, req: wire.BatchCompletionRequest, code: str
                        ) -> PreparedBatch:
    """Every prompt rendered as chat renders it; choice (p, c) is seeded seed + p*n + c."""
    cfg, backend = state.config, state.backend
    model, selection = await resolve_model_adapter(backend, opt(req.model), req.adapter,
                                                   req.adapters)
    n = int(opt(req.n) or 1)
    tools = opt(req.tools) or None
    kwargs = template_kwargs(state, req, code)
    tool_choice = plain(opt(req.tool_choice))
    if tool_choice is not None:  # as chat renders it: templates may read tool_choice
        kwargs.setdefault("tool_choice", tool_choice)
    source = _thinking_source(req.chat_template_kwargs, cfg.default_thinking_enabled)
    requested = requested_max_tokens(req.max_tokens, req.max_completion_tokens)
    model_default = state_max_tokens(state)
    keep = truncation(req, backend.max_model_len,
                      requested if requested is not None else model_default, code)
    given = opt(req.prompt_token_ids)
    if given is not None:  # token-in: one id list per prompt, no template (prompt_ids)
        refuse_template_fields(req, code)
        if len(given) != len(req.prompts):
            raise ApiError(400, code, f"prompt_token_ids has {len(given)} entries, prompts "
                           f"{len(req.prompts)}: one id list per prompt",
                           param="prompt_token_ids")
    prompts: list[Prompt] = []
    for p, messages in enumerate(req.prompts):
        started = time.perf_counter()
        if given is not None:
            text, ids = given_prompt(backend, given[p], f"prompt_token_ids[{p}]", code)
        else:
            text = render_prompt(state, messages, tools, kwargs, param=f"prompts[{p}]")
            text, ids = encode_prompt(backend, text, f"prompts[{p}]", f"prompt {p}",
                                      special=opt(req.add_special_tokens) is True, keep=keep,
                                      side=opt(req.truncation_side))
        prompts.append(Prompt(text, ids, prompt_starts_in_reasoning(text), source,
                              time.perf_counter() - started, template_kwargs=kwargs))
    stop = normalize_stop(opt(req.stop))
    seed = opt(req.seed)
    budget = resolve(thinking_tokens(req, code), req.thinking_budget_ms,
                     cfg.default_thinking_budget_tokens, cfg.default_thinking_budget_ms)
    grammars = {r: await _grammar(state, req, code, tools, tool_choice, r)
                for r in sorted({p.in_reasoning for p in prompts})}
    fields = chat_extras(req, backend.tokenizer, stop, requested, cfg.max_logprobs,
                         code=code)  # as chat: the same for every item
    logprobs = fields["logprobs"]
    k_prompt = prompt_logprobs_wanted(req, cfg.max_logprobs, code)
    items = []
    for p, prompt in enumerate(prompts):
        max_tokens = effective_max_tokens(requested, len(prompt.ids), backend.max_model_len,
                                          model_default)
        spec = apply_budget(state, budget, prompt.in_reasoning, max_tokens, stop, CHAT_CODE)
        seeds = [None if seed is None else (int(seed) + p * n + c) % U64 for c in range(n)]
        params = choice_params(req, state, max_tokens=max_tokens, stop=stop, seeds=seeds,
                               thinking=spec, grammar=grammars[prompt.in_reasoning], **fields)
        items.append((prompt, Run(params, selection.lora, selection.label, budget,
                                  spec is not None, cache_salt=opt(req.cache_salt),
                                  priority=int(opt(req.priority) or 0),
                                  mix_param=selection.param)))
    reasoning, fold = reasoning_shown(req, cfg.fold_reasoning_into_content, code)
    shape = Shape(
        model=model, reasoning=reasoning, fold=fold, logprobs=logprobs,
        tools=tools if tools_enabled(tools, tool_choice) else None,
        parallel_tool_calls=opt(req.parallel_tool_calls) is not False,
        return_token_ids=opt(req.return_token_ids) is True,
        include_stop=opt(req.include_stop_str_in_output) is True,
        as_ids=opt(req.return_tokens_as_token_ids) is True, prompt_logprobs=k_prompt,
    )
    return PreparedBatch(tuple(items), shape)
