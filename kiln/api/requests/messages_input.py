"""Anthropic's Messages request, read into the chat request it means (kiln.api.replies.chat_turn
runs it): `system` becomes the system message, each message's blocks become chat messages
(`tool_use` an assistant tool call, `tool_result` a tool message, `thinking` the assistant's
reasoning), `tools`/`tool_choice` chat's function tools, `thinking` the chat template's
`enable_thinking` and Kiln's thinking budget (a forced close at `budget_tokens`, as on chat).

What Kiln cannot honour is a 400 naming the field (`REFUSED`, the server tools, image and
document blocks); the request's own validation is the contract's (messages-v1.schema.json)."""

from __future__ import annotations

import json
from typing import Any

from kiln.api.errors import ApiError

CODE = "messages_invalid_request"

# field -> why Kiln refuses it when set (to anything but null / its default)
REFUSED = {
    "mcp_servers": "Kiln connects to no MCP server; run the tools in the client",
    "container": "Kiln has no code-execution container",
}
# context_management edits Kiln honours: which past thinking the prompt keeps is the chat
# template's to say (Qwen-style templates render none of it), so clearing thinking changes no
# prompt Kiln renders; clearing tool results would, and is refused.
CONTEXT_EDITS = ("clear_thinking_",)
SERVICE_TIERS = ("auto", "standard_only")  # one tier here: both mean it
# output_config.effort -> Kiln's thinking budget in tokens (None: bounded by max_tokens only),
# where thinking is on and the request gives no budget of its own (docs/agents.md)
EFFORT_BUDGET: dict[str, int | None] = {"low": 1024, "medium": 4096, "high": 16384,
                                        "xhigh": None, "max": None}
SAMPLING = ("temperature", "top_p", "top_k", "seed", "min_p", "repetition_penalty",
            "presence_penalty", "frequency_penalty")


def refuse(field: str, why: str) -> ApiError:
    return ApiError(400, CODE, f"{field} is not supported: {why}", param=field)


def _text_of(blocks: Any, where: str) -> str:
    """A string, or text blocks joined (images and documents refused)."""
    if isinstance(blocks, str):
        return blocks
    parts = []
    for i, b in enumerate(blocks):
        if b.get("type") != "text":
            raise refuse(f"{where}[{i}]", f"{b.get('type')} blocks are not supported here; "
                         "Kiln serves text models")
        parts.append(b["text"])
    return "".join(parts)


def _user(m: dict[str, Any], i: int) -> list[dict[str, Any]]:
    """A user message: its tool results as tool messages (first, as the API orders them), then
    its text."""
    content = m["content"]
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    out: list[dict[str, Any]] = []
    text: list[str] = []
    for j, b in enumerate(content):
        kind, where = b.get("type"), f"messages[{i}].content[{j}]"
        if kind == "text":
            text.append(b["text"])
        elif kind == "tool_result":
            body = b.get("content", "")
            result = _text_of(body, f"{where}.content") if body else ""
            if b.get("is_error"):
                result = f"Error: {result}" if result else "Error"
            out.append({"role": "tool", "tool_call_id": b["tool_use_id"], "content": result})
        else:
            raise refuse(where, f"{kind} blocks are not supported in a user message; Kiln "
                         "serves text models (text and tool_result blocks)")
    if text:
        out.append({"role": "user", "content": "".join(text)})
    return out


def _assistant(m: dict[str, Any], i: int) -> dict[str, Any]:
    content = m["content"]
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    text: list[str] = []
    thinking: list[str] = []
    calls: list[dict[str, Any]] = []
    for j, b in enumerate(content):
        kind, where = b.get("type"), f"messages[{i}].content[{j}]"
        if kind == "text":
            text.append(b["text"])
        elif kind == "thinking":
            thinking.append(b["thinking"])
        elif kind == "tool_use":
            calls.append({"id": b["id"], "type": "function", "function": {
                "name": b["name"], "arguments": json.dumps(b.get("input", {}))}})
        else:
            raise refuse(where, f"{kind} blocks are not supported in an assistant message "
                         "(text, thinking and tool_use are)")
    out: dict[str, Any] = {"role": "assistant", "content": "".join(text)}
    if thinking:
        out["reasoning_content"] = "".join(thinking)
    if calls:
        out["tool_calls"] = calls
    return out


def chat_messages(req: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    system = req.get("system")
    if system:
        out.append({"role": "system", "content": _text_of(system, "system")})
    for i, m in enumerate(req["messages"]):
        if m["role"] == "system":  # an instruction at its place in the conversation
            out.append({"role": "system",
                        "content": _text_of(m["content"], f"messages[{i}].content")})
        else:
            out.extend(_user(m, i) if m["role"] == "user" else [_assistant(m, i)])
    return out


def chat_tools(req: dict[str, Any]) -> list[dict[str, Any]] | None:
    tools = req.get("tools")
    if not tools:
        return None
    out = []
    for i, t in enumerate(tools):
        kind = t.get("type", "custom")
        if kind != "custom":
            raise refuse(f"tools[{i}].type", f"the server tool {kind!r} runs on Anthropic's "
                         "servers; Kiln runs custom (function) tools only")
        where = f"tools[{i}]"
        if t.get("defer_loading"):
            raise refuse(f"{where}.defer_loading", "Kiln has no tool search; send the tools "
                         "the model may call")
        if t.get("allowed_callers"):
            raise refuse(f"{where}.allowed_callers", "Kiln runs no code that calls tools")
        fn: dict[str, Any] = {"name": t["name"], "parameters": t.get("input_schema") or {}}
        description = t.get("description") or ""
        if t.get("input_examples"):  # the model sees them where the template shows tools
            examples = "\n".join(json.dumps(e) for e in t["input_examples"])
            description = f"{description}\n\nExample inputs:\n{examples}".strip()
        if description:
            fn["description"] = description
        if t.get("strict") is not None:
            fn["strict"] = t["strict"]
        out.append({"type": "function", "function": fn})
    return out


def chat_tool_choice(choice: dict[str, Any] | None) -> tuple[Any, bool | None]:
    """Chat's tool_choice and parallel_tool_calls."""
    if choice is None:
        return None, None
    kind = choice["type"]
    parallel = None if choice.get("disable_parallel_tool_use") is None \
        else not choice["disable_parallel_tool_use"]
    if kind == "auto":
        return "auto", parallel
    if kind == "any":
        return "required", parallel
    if kind == "none":
        return "none", parallel
    return {"type": "function", "function": {"name": choice["name"]}}, parallel


def thinking_fields(thinking: dict[str, Any] | None, effort: str | None) -> dict[str, Any]:
    """`enabled` with its budget: thinking on and Kiln's budget; `adaptive`: thinking on, the
    budget ``effort`` names (`EFFORT_BUDGET`); `disabled`: thinking off; absent: the
    template's (and server's) default, with ``effort``'s budget where it thinks."""
    kind = thinking["type"] if thinking is not None else None
    if kind == "between_tools":
        raise refuse("thinking.type", "Kiln's thinking budget is per turn; use enabled or "
                     "adaptive")
    if kind == "disabled":
        return {"chat_template_kwargs": {"enable_thinking": False}}
    out: dict[str, Any] = {}
    if kind is not None:
        out["chat_template_kwargs"] = {"enable_thinking": True}
    if kind == "enabled":
        out["thinking_budget_tokens"] = int(thinking["budget_tokens"])  # type: ignore[index]
    elif effort is not None and EFFORT_BUDGET[effort] is not None:
        out["thinking_budget_tokens"] = EFFORT_BUDGET[effort]
    return out


def thinking_omitted(req: dict[str, Any]) -> bool:
    """`display: omitted`: thinking blocks are sent empty (with their signature)."""
    return (req.get("thinking") or {}).get("display") == "omitted"


def refuse_unsupported(req: dict[str, Any]) -> None:
    for name, why in REFUSED.items():
        if req.get(name):
            raise refuse(name, why)
    edits = (req.get("context_management") or {}).get("edits") or []
    for i, edit in enumerate(edits):
        kind = str(edit.get("type", "")) if isinstance(edit, dict) else ""
        if not kind.startswith(CONTEXT_EDITS):
            raise refuse(f"context_management.edits[{i}]", f"Kiln does not apply the edit "
                         f"{kind or edit!r} to the conversation; send the messages to run")
    tier = req.get("service_tier")
    if tier is not None and tier not in SERVICE_TIERS:
        raise refuse("service_tier", "one service tier here")
    if req.get("speed") == "fast":
        raise refuse("speed", "Kiln runs at one speed")
    if req.get("inference_geo"):
        raise refuse("inference_geo", "Kiln runs where it is started")
    if (req.get("diagnostics") or {}).get("previous_message_id"):
        raise refuse("diagnostics.previous_message_id", "Kiln reports no cache diagnostics; "
                     "usage.cache_read_input_tokens tells what the prefix cache held")


def chat_body(req: dict[str, Any], *, counting: bool = False) -> dict[str, Any]:
    """The chat request body of a Messages (or count_tokens) request."""
    refuse_unsupported(req)
    thinking = req.get("thinking")
    max_tokens = req.get("max_tokens")
    if thinking and thinking.get("type") == "enabled" and max_tokens is not None \
            and thinking["budget_tokens"] >= max_tokens:
        raise ApiError(400, CODE, "thinking.budget_tokens must be less than max_tokens",
                       param="thinking.budget_tokens")
    messages = chat_messages(req)
    body: dict[str, Any] = {"model": req["model"], "messages": messages}
    last = messages[-1] if messages else None
    if last is not None and last["role"] == "assistant" and not last.get("tool_calls"):
        # a final assistant message is Anthropic's prefill: the answer continues it
        body["continue_final_message"] = True
        body["add_generation_prompt"] = False
    tools = chat_tools(req)
    choice, parallel = chat_tool_choice(req.get("tool_choice"))
    if tools is not None:
        body["tools"] = tools
        if choice is not None:
            body["tool_choice"] = choice
        if parallel is not None:
            body["parallel_tool_calls"] = parallel
    elif choice not in (None, "none", "auto"):
        raise ApiError(400, CODE, "tool_choice names tools, but the request has none",
                       param="tool_choice")
    output = req.get("output_config") or {}
    body.update(thinking_fields(thinking, output.get("effort")))
    fmt = output.get("format")
    if fmt is not None:
        body["response_format"] = {"type": "json_schema", "json_schema": {
            "name": "output", "schema": fmt["schema"], "strict": True}}
    if counting:
        return body
    body["max_tokens"] = max_tokens
    if req.get("stop_sequences"):
        body["stop"] = list(req["stop_sequences"])
    for name in SAMPLING:
        if req.get(name) is not None:
            body[name] = req[name]
    if req.get("rollout_provenance"):
        body["rollout_provenance"] = True
        if req.get("stream"):
            body["stream"] = True  # refused by chat_turn.rollout, naming the field
    return body
