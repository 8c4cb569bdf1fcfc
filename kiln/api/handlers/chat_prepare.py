"""A validated ChatCompletionRequest -> a PreparedChat: rendered prompt, token ids, per-choice
engine requests, thinking metadata and the resolved thinking budget."""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from msgspec import UNSET

from kiln.api._generated import wire
from kiln.api.errors import ApiError
from kiln.api.handlers.adapters import select
from kiln.api.handlers.constraints import constraint, plain
from kiln.api.handlers.extras import (
    chat_extras,
    prompt_logprobs_wanted,
    thinking_tokens,
    truncate,
    truncation,
)
from kiln.api.handlers.models import resolve_model
from kiln.api.handlers.params import (
    choice_seed,
    effective_max_tokens,
    normalize_stop,
    opt,
    requested_max_tokens,
    sampling_params,
    state_default,
    state_max_tokens,
)
from kiln.api.handlers.unsupported import unsupported
from kiln.api.state import AppState
from kiln.engine.request import SamplingParams, ThinkingBudgetSpec
from kiln.text.budget import BudgetConfig, resolve
from kiln.text.reasoning import CLOSE_TAG, prompt_starts_in_reasoning
from kiln.text.thinking_budget import budget_problem
from kiln.text.tools import tool_format

TEXT_PARTS = ("text", "input_text", "output_text")


@dataclass
class PreparedChat:
    model: str
    prompt_text: str
    prompt_ids: list[int]
    in_reasoning: bool
    thinking_source: str
    default_thinking_enabled: bool | None
    n: int
    params: list[SamplingParams]
    budget: BudgetConfig
    fold: bool
    include_performance: bool
    explicit_performance: bool
    include_config_hashes: bool
    include_usage: bool
    stream: bool
    tokenization_s: float
    adapter: str
    lora: tuple[tuple[Any, float], ...] = ()
    messages: list[dict[str, Any]] = field(default_factory=list)
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    rollout: bool = False
    logprobs: int | None = None  # alternatives per token when the request set logprobs: true
    tools: list[Any] | None = None  # set only when tool-call parsing is on
    parallel_tool_calls: bool = True
    budget_applied: bool = False
    echo_text: str = ""  # echo: the final assistant message, put before each choice's content
    return_token_ids: bool = False
    include_stop: bool = False  # include_stop_str_in_output: the matched stop string ends the text
    priority: int = 0  # vLLM's scheduling priority (lower first)
    cache_salt: str | None = None  # vLLM's: different salts never share prefix-cache blocks
    as_ids: bool = False  # return_tokens_as_token_ids: logprobs tokens written token_id:<id>
    prompt_logprobs: int | None = None  # vLLM's prompt_logprobs beside generation

    @property
    def thinking_mode(self) -> str:
        return "reasoning" if self.in_reasoning else "non_reasoning"

    def effective_config_hash(self) -> str:
        canon = json.dumps(
            {
                "model": self.model,
                "adapter": self.adapter,
                "params": [asdict(p) for p in self.params],
                "n": self.n,
            },
            sort_keys=True,
            default=list,
        )
        return "sha256:" + hashlib.sha256(canon.encode()).hexdigest()


def message_content(content: Any) -> str:
    """String as is; content-part arrays concatenated (text parts only); null/missing -> ""."""
    if content is None or content is UNSET:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for part in content:
        if isinstance(part, dict) and part.get("type") in TEXT_PARTS:
            text = part.get("text")
            if isinstance(text, str):
                parts.append(text)
    return "".join(parts)


def _decode_arguments(call: Any) -> Any:
    """Prior-turn tool calls: string `arguments` (top level or under `function`) are JSON-parsed
    for the template, as transformers-style templates expect a mapping."""
    if not isinstance(call, dict):
        return call
    out = dict(call)
    if isinstance(out.get("function"), dict):
        out["function"] = dict(out["function"])  # copied first: the request's own stays as sent
    for holder in (out, out.get("function")):
        if isinstance(holder, dict) and isinstance(holder.get("arguments"), str):
            try:
                holder["arguments"] = json.loads(holder["arguments"])
            except ValueError:
                pass
    return out


def template_messages(messages: list[wire.ChatMessageInput], *, decode_arguments: bool = True,
                      null_content: bool = True) -> list[dict[str, Any]]:
    """The template's view of messages (docs/behavior.md §12): prior tool calls' string arguments
    JSON-decoded, and an assistant message with tool calls and content "" given content null.
    ``render_prompt`` falls back to raw arguments and to "" for templates that cannot take them."""
    out = []
    for m in messages:
        msg: dict[str, Any] = {"role": m.role, "content": message_content(m.content)}
        for key in ("tool_calls", "name", "tool_call_id"):
            value = opt(getattr(m, key))
            if value is not None:
                msg[key] = value
        if msg.get("tool_calls"):
            if decode_arguments:
                msg["tool_calls"] = [_decode_arguments(c) for c in msg["tool_calls"]]
            if msg["content"] == "" and null_content:
                msg["content"] = None
        if msg["content"] is None and not null_content:
            msg["content"] = ""
        out.append(msg)
    return out


def tools_enabled(tools: Any, tool_choice: Any) -> bool:
    """Tool-call parsing is on iff tools is a non-empty array and tool_choice is not "none"."""
    return bool(tools) and tool_choice != "none"


def apply_budget(
    state: AppState,
    budget: BudgetConfig,
    in_reasoning: bool,
    max_tokens: int,
    stop: tuple[str, ...],
    error_code: str,
) -> ThinkingBudgetSpec | None:
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


RESERVED_TEMPLATE_VARS = frozenset({"messages", "tools"})


def template_kwargs(state: AppState, requested: Any, error_code: str) -> dict[str, Any]:
    """`chat_template_kwargs` as top-level template variables, plus the server's default
    `enable_thinking` when the request does not set it. `messages` and `tools` are the request's
    own: a kwarg of either name is a 400 (it had been a TypeError shown as invalid_messages)."""
    kwargs: dict[str, Any] = dict(opt(requested) or {})
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


def _thinking_source(requested: Any, server_default: bool | None) -> str:
    """Who chose the thinking mode (docs/behavior.md §4), from the request's own
    ``chat_template_kwargs`` (before ``template_kwargs`` merges the server default in)."""
    kwargs = opt(requested) or {}
    if "enable_thinking" in kwargs:
        return "request" if isinstance(kwargs["enable_thinking"], bool) else "custom"
    return "server_default" if server_default is not None else "template_default"


def too_long(limit: int, chars: int, param: str) -> ApiError:
    """context_length_exceeded for a prompt too long to be worth encoding."""
    return ApiError(
        400, "context_length_exceeded",
        f"maximum context length is {limit} tokens; the prompt ({chars} characters) has more",
        param=param,
    )


def render_prompt(
    state: AppState, messages: list[wire.ChatMessageInput], tools: Any, kwargs: dict[str, Any],
    add_generation_prompt: bool = True,
) -> str:
    """Render with the reference's message view; if the template fails on it, again with raw
    tool-call arguments (templates that print the string, DeepSeek style) and/or "" for null
    content (templates that concatenate content, such as SmolLM2's, on which a client's own
    assistant tool-call turn had failed). The first error is the one reported."""
    first: Exception | None = None
    tried: list[list[dict[str, Any]]] = []
    for decode, null in ((True, True), (True, False), (False, True), (False, False)):
        view = template_messages(messages, decode_arguments=decode, null_content=null)
        if view in tried:
            continue
        tried.append(view)
        try:
            return state.backend.chat_template.render(
                view, tools=tools, add_generation_prompt=add_generation_prompt, **kwargs)
        except Exception as exc:  # template errors are the client's messages/tools
            first = first or exc
    raise ApiError(
        400, "invalid_messages", f"Failed to apply chat template: {first}", param="messages"
    ) from None


def _bad(message: str, param: str) -> ApiError:
    return ApiError(400, "chat_invalid_request", message, param=param)


def continue_final(prompt_text: str, final: str) -> str:
    """vLLM's continue_final_message: the rendered conversation cut right after the final
    assistant message's content, so generation continues it (no end-of-turn after it)."""
    at = prompt_text.rfind(final) if final else -1
    if at < 0:
        raise _bad("continue_final_message needs a final assistant message with content that the "
                   "chat template renders verbatim", "continue_final_message")
    return prompt_text[:at + len(final)]


def _vllm_chat_fields(req: wire.ChatCompletionRequest) -> tuple[bool, bool, str]:
    """add_generation_prompt, continue_final_message, and what echo puts before the content."""
    gen = opt(req.add_generation_prompt) is not False
    cont = opt(req.continue_final_message) is True
    last = req.messages[-1]
    final = message_content(last.content) if last.role == "assistant" else None
    if cont and gen:
        raise _bad("continue_final_message: true needs add_generation_prompt: false",
                   "continue_final_message")
    if cont and final is None:
        raise _bad("continue_final_message needs the last message to be the assistant's",
                   "continue_final_message")
    echo = final if opt(req.echo) is True and final is not None else ""
    stream = opt(req.stream) is True
    # echo with stream is refused whatever the final message is: a rule that does not depend
    # on the conversation (the served x-kiln-rules state it)
    for name in ("echo", "return_token_ids"):
        if stream and opt(getattr(req, name)) is True:
            raise unsupported(name, "it is implemented for non-streaming chat only")
    return gen, cont, echo


async def prepare_chat(state: AppState, req: wire.ChatCompletionRequest) -> PreparedChat:
    cfg = state.config
    backend = state.backend
    model, model_adapter = resolve_model(backend, opt(req.model))
    selection = await select(backend, req.adapter, req.adapters, model_adapter, tri_state=True)
    started = time.perf_counter()
    kwargs = template_kwargs(state, req.chat_template_kwargs, "chat_invalid_request")
    tools = opt(req.tools) or None
    tool_choice = plain(opt(req.tool_choice))
    if tool_choice is not None:
        kwargs.setdefault("tool_choice", tool_choice)
    messages = template_messages(req.messages)
    gen_prompt, cont, echo_text = _vllm_chat_fields(req)
    prompt_text = render_prompt(state, req.messages, tools, kwargs, gen_prompt)
    if cont:
        prompt_text = continue_final(prompt_text, message_content(req.messages[-1].content))
    limit = backend.max_model_len
    requested = requested_max_tokens(req.max_tokens, req.max_completion_tokens)
    keep = truncation(req, limit, requested if requested is not None else state_max_tokens(state),
                      "chat_invalid_request")
    if keep is None and backend.tokenizer.surely_over(prompt_text, limit):
        raise too_long(limit, len(prompt_text), "messages")
    prompt_ids = backend.tokenizer.encode(prompt_text,
                                          add_special_tokens=opt(req.add_special_tokens) is True)
    if keep is not None and len(prompt_ids) > keep:  # truncate_prompt_tokens, as completions
        prompt_ids = truncate(prompt_ids, keep, opt(req.truncation_side))
        prompt_text = backend.tokenizer.decode(prompt_ids)
    tokenization_s = time.perf_counter() - started
    if len(prompt_ids) >= limit:
        raise ApiError(
            400,
            "context_length_exceeded",
            f"maximum context length is {limit} tokens; the prompt has {len(prompt_ids)} tokens",
            param="messages",
        )
    max_tokens = effective_max_tokens(requested, len(prompt_ids), limit, state_max_tokens(state))
    stop = normalize_stop(opt(req.stop))
    n = int(opt(req.n) or 1)
    budget = resolve(
        thinking_tokens(req, "chat_invalid_request"),  # or vLLM's thinking_token_budget
        req.thinking_budget_ms,
        cfg.default_thinking_budget_tokens,
        cfg.default_thinking_budget_ms,
    )
    in_reasoning = prompt_starts_in_reasoning(prompt_text)
    spec = apply_budget(state, budget, in_reasoning, max_tokens, stop, "chat_invalid_request")
    rollout = req.rollout_provenance is True
    seed = opt(req.seed)
    if rollout and seed is None:
        seed = secrets.randbits(64)  # drawn here so that the record can state it
    extras = chat_extras(req, backend.tokenizer, stop, requested, cfg.max_logprobs)
    base = state_default(state)
    parallel = opt(req.parallel_tool_calls) is not False
    extras["grammar"] = await constraint(
        backend.tokenizer, code="chat_invalid_request", response_format=opt(req.response_format),
        structured_outputs=opt(req.structured_outputs), tools=tools, tool_choice=tool_choice,
        parallel_tool_calls=parallel, ignore_eos=bool(opt(req.ignore_eos)),
        tool_format=tool_format(getattr(backend.chat_template, "source", None)),
        after=tuple(backend.tokenizer.encode(CLOSE_TAG)) if in_reasoning else (),
        deadline_s=cfg.grammar_compile_timeout_s)
    params = [
        replace(
            sampling_params(
                req,
                max_tokens=max_tokens,
                stop=stop,
                seed=choice_seed(seed, i),
                base=base,
            ),
            thinking=spec,
            **extras,
        )
        for i in range(n)
    ]
    include_perf = opt(req.include_performance)
    include_hashes = opt(req.include_config_hashes)
    fold = opt(req.fold_reasoning_into_content)
    stream_options = opt(req.stream_options)
    return PreparedChat(
        model=model,
        prompt_text=prompt_text,
        prompt_ids=prompt_ids,
        in_reasoning=in_reasoning,
        thinking_source=_thinking_source(req.chat_template_kwargs, cfg.default_thinking_enabled),
        default_thinking_enabled=cfg.default_thinking_enabled,
        n=n,
        params=params,
        budget=budget,
        fold=cfg.fold_reasoning_into_content if fold is None else bool(fold),
        include_performance=bool(include_perf),
        explicit_performance=include_perf is True,
        include_config_hashes=bool(include_hashes),
        include_usage=bool(stream_options and opt(stream_options.include_usage)),
        stream=bool(opt(req.stream)),
        tokenization_s=tokenization_s,
        adapter=selection.label,
        lora=selection.lora,
        tools=tools if tools_enabled(tools, tool_choice) else None,
        parallel_tool_calls=parallel,
        budget_applied=spec is not None,
        messages=messages,
        template_kwargs=kwargs,
        rollout=rollout,
        logprobs=extras["logprobs"],
        echo_text=echo_text,
        return_token_ids=opt(req.return_token_ids) is True,
        include_stop=opt(req.include_stop_str_in_output) is True,
        priority=int(opt(req.priority) or 0),
        cache_salt=opt(req.cache_salt),
        as_ids=opt(req.return_tokens_as_token_ids) is True,
        prompt_logprobs=prompt_logprobs_wanted(req, cfg.max_logprobs, "chat_invalid_request"),
    )

