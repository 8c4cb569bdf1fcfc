"""OpenAI's Responses request, read into the chat request it means (kiln.api.replies.chat_turn
runs it): `instructions` and the conversation (the stored turns `previous_response_id` names,
then `input`) become chat messages, function `tools`/`tool_choice` chat's tools, `text.format`
chat's `response_format` (the same grammar stage), `reasoning.effort` the template's thinking
switch and Kiln's thinking budget (`EFFORT_BUDGET`), `max_output_tokens` `max_tokens`,
`top_logprobs` chat's logprobs.

What Kiln cannot honour is a 400 naming the field (`REFUSED`, hosted tools, images, files and
audio); the request's own validation is the contract's (responses-v1.schema.json)."""

from __future__ import annotations

import base64
import json
from typing import Any

from kiln.api.errors import ApiError

CODE = "responses_invalid_request"

# reasoning.effort -> (thinking on, Kiln's thinking budget in tokens; None: unbounded but for
# max_output_tokens). The template also gets `reasoning_effort` (gpt-oss-style templates read it).
EFFORT_BUDGET: dict[str, tuple[bool, int | None]] = {
    "none": (False, None),
    "minimal": (True, 256),
    "low": (True, 1024),
    "medium": (True, 4096),
    "high": (True, None),
    "xhigh": (True, None),
}

# field -> why Kiln refuses it when set (to anything truthy)
REFUSED = {
    "background": "Kiln runs every response in the foreground; send it without background",
    "conversation": "Kiln keeps conversations by previous_response_id only",
    "prompt": "Kiln has no stored prompt templates; send instructions and input",
}
INCLUDE_HONOURED = ("message.output_text.logprobs", "reasoning.encrypted_content")
SAMPLING = ("temperature", "top_p", "top_k", "seed", "min_p", "repetition_penalty",
            "presence_penalty", "frequency_penalty")
ENCRYPTED_PREFIX = "kiln1:"  # Kiln's reasoning round trip: the text, base64; not a secret


def refuse(field: str, why: str) -> ApiError:
    return ApiError(400, CODE, f"{field} is not supported: {why}", param=field)


def seal(reasoning: str) -> str:
    """`encrypted_content` of a reasoning item: what a stateless client (`store: false`) sends
    back so that the next turn has the reasoning. Kiln holds no key: it is the text, encoded."""
    return ENCRYPTED_PREFIX + base64.b64encode(reasoning.encode()).decode()


def unseal(sealed: str, where: str) -> str:
    if not sealed.startswith(ENCRYPTED_PREFIX):
        raise refuse(where, "this encrypted_content was not written by Kiln")
    try:
        return base64.b64decode(sealed[len(ENCRYPTED_PREFIX):], validate=True).decode()
    except (ValueError, UnicodeDecodeError):
        raise refuse(where, "this encrypted_content is damaged") from None


def content_text(content: Any, where: str) -> str:
    """A message's text: a string, or its text parts joined (images, files, audio refused)."""
    if isinstance(content, str):
        return content
    parts = []
    for i, part in enumerate(content):
        kind = part.get("type")
        if kind in ("input_text", "output_text"):
            parts.append(part["text"])
        elif kind == "refusal":
            parts.append(part["refusal"])
        else:
            raise refuse(f"{where}[{i}]", f"{kind} parts are not supported; Kiln serves text "
                         "models (input_text, output_text and refusal parts are)")
    return "".join(parts)


def _reasoning_of(item: dict[str, Any], where: str) -> str:
    sealed = item.get("encrypted_content")
    if sealed:
        return unseal(sealed, f"{where}.encrypted_content")
    texts = [c["text"] for c in item.get("content") or []]
    return "".join(texts) or "".join(s["text"] for s in item.get("summary") or [])


def chat_messages(items: list[dict[str, Any]], where: str = "input") -> list[dict[str, Any]]:
    """A conversation's items as chat messages: a function_call joins the assistant turn before
    it, a reasoning item the assistant turn after it."""
    out: list[dict[str, Any]] = []
    reasoning: str | None = None

    def assistant() -> dict[str, Any]:
        nonlocal reasoning
        last = out[-1] if out else None
        if last is None or last["role"] != "assistant" or reasoning is not None:
            last = {"role": "assistant", "content": ""}
            out.append(last)
        if reasoning is not None:
            last["reasoning_content"] = reasoning
            reasoning = None
        return last

    for i, item in enumerate(items):
        kind, at = item.get("type", "message"), f"{where}[{i}]"
        if kind == "message":
            role = item["role"]
            text = content_text(item["content"], f"{at}.content")
            if role == "assistant":
                msg = assistant()
                if msg.get("tool_calls") or msg["content"]:  # a new turn after tool calls
                    msg = {"role": "assistant", "content": ""}
                    out.append(msg)
                msg["content"] = text
            else:  # OpenAI's developer role is the system's for a chat template
                out.append({"role": "system" if role == "developer" else role, "content": text})
        elif kind == "function_call":
            assistant().setdefault("tool_calls", []).append({
                "id": item["call_id"], "type": "function",
                "function": {"name": item["name"], "arguments": item["arguments"]}})
        elif kind == "function_call_output":
            output = item["output"]
            text = output if isinstance(output, str) else content_text(output, f"{at}.output")
            out.append({"role": "tool", "tool_call_id": item["call_id"], "content": text})
        elif kind == "reasoning":
            reasoning = _reasoning_of(item, at)
        else:
            raise refuse(at, "item_reference is not supported; send the item itself, or "
                         "continue with previous_response_id")
    return out


def chat_tools(req: dict[str, Any]) -> list[dict[str, Any]] | None:
    tools = req.get("tools")
    if not tools:
        return None
    out = []
    for i, t in enumerate(tools):
        if t["type"] != "function":
            raise refuse(f"tools[{i}].type", f"the hosted tool {t['type']!r} runs on OpenAI's "
                         "servers; Kiln runs function tools only")
        fn: dict[str, Any] = {"name": t["name"]}
        if t.get("description") is not None:
            fn["description"] = t["description"]
        fn["parameters"] = t.get("parameters") or {"type": "object", "properties": {}}
        if t.get("strict") is not None:
            fn["strict"] = t["strict"]
        out.append({"type": "function", "function": fn})
    return out


def chat_tool_choice(req: dict[str, Any], tools: list[dict[str, Any]] | None
                     ) -> tuple[Any, list[dict[str, Any]] | None]:
    """Chat's tool_choice, and the tools it leaves (allowed_tools narrows them)."""
    choice = req.get("tool_choice")
    if choice is None or isinstance(choice, str):
        return choice, tools
    kind = choice["type"]
    if kind == "function":
        return {"type": "function", "function": {"name": choice["name"]}}, tools
    if kind == "allowed_tools":
        names = {t.get("name") for t in choice["tools"] if t.get("type") == "function"}
        if len(names) != len(choice["tools"]):
            raise refuse("tool_choice.tools", "allowed_tools may list function tools only")
        kept = [t for t in tools or [] if t["function"]["name"] in names]
        return choice["mode"], kept or None
    raise refuse("tool_choice", f"{kind} is a hosted tool; Kiln runs function tools only")


def response_format(text: dict[str, Any] | None) -> dict[str, Any] | None:
    if not text:
        return None
    verbosity = text.get("verbosity")
    if verbosity not in (None, "medium"):
        raise refuse("text.verbosity", "Kiln does not steer answer length; leave it medium")
    fmt = text.get("format")
    if fmt is None or fmt["type"] == "text":
        return None
    if fmt["type"] == "json_object":
        return {"type": "json_object"}
    schema: dict[str, Any] = {"name": fmt["name"], "schema": fmt["schema"]}
    for key in ("description", "strict"):
        if fmt.get(key) is not None:
            schema[key] = fmt[key]
    return {"type": "json_schema", "json_schema": schema}


def reasoning_fields(reasoning: dict[str, Any] | None) -> dict[str, Any]:
    if not reasoning:
        return {}
    for key in ("summary", "generate_summary"):
        if reasoning.get(key) not in (None, "auto"):
            raise refuse(f"reasoning.{key}", "Kiln writes no summaries; the reasoning itself is "
                         "returned as the reasoning item's content (\"auto\" is accepted)")
    effort = reasoning.get("effort")
    if effort is None:
        return {}
    on, budget = EFFORT_BUDGET[effort]
    out: dict[str, Any] = {"chat_template_kwargs": {"enable_thinking": on,
                                                    "reasoning_effort": effort}}
    if budget is not None:
        out["thinking_budget_tokens"] = budget
    return out


def refuse_unsupported(req: dict[str, Any]) -> None:
    for name, why in REFUSED.items():
        if req.get(name):
            raise refuse(name, why)
    for i, name in enumerate(req.get("include") or []):
        if name not in INCLUDE_HONOURED:
            raise refuse(f"include[{i}]", f"{name} belongs to a hosted tool or an image input")
    if (req.get("stream_options") or {}).get("include_obfuscation"):
        raise refuse("stream_options.include_obfuscation", "Kiln pads no stream events")
    if req.get("service_tier") not in (None, "auto", "default"):
        raise refuse("service_tier", "one service tier here (auto or default)")
    if req.get("prompt_cache_retention") not in (None, "in-memory"):
        raise refuse("prompt_cache_retention", "Kiln's prefix cache lives in memory")


def logprob_fields(req: dict[str, Any]) -> dict[str, Any]:
    k = req.get("top_logprobs")
    wanted = "message.output_text.logprobs" in (req.get("include") or [])
    if k is None and not wanted:
        return {}
    return {"logprobs": True, "top_logprobs": int(k or 0)}


def chat_body(req: dict[str, Any], history: list[dict[str, Any]],
              items: list[dict[str, Any]]) -> dict[str, Any]:
    """The chat request body: ``history`` (the stored conversation's items) then ``items``."""
    refuse_unsupported(req)
    messages: list[dict[str, Any]] = []
    if req.get("instructions"):
        messages.append({"role": "system", "content": req["instructions"]})
    messages += chat_messages(history, "previous_response_id")
    messages += chat_messages(items)
    if not messages:
        raise ApiError(400, CODE, "input is empty: give input (or instructions)", param="input")
    body: dict[str, Any] = {"model": req.get("model"), "messages": messages}
    tools = chat_tools(req)
    choice, tools = chat_tool_choice(req, tools)
    if tools is not None:
        body["tools"] = tools
        if choice is not None:
            body["tool_choice"] = choice
        if req.get("parallel_tool_calls") is not None:
            body["parallel_tool_calls"] = req["parallel_tool_calls"]
    elif choice not in (None, "none", "auto"):
        raise ApiError(400, CODE, "tool_choice names tools, but the request has none",
                       param="tool_choice")
    fmt = response_format(req.get("text"))
    if fmt is not None:
        body["response_format"] = fmt
    body.update(reasoning_fields(req.get("reasoning")))
    if req.get("max_output_tokens") is not None:
        body["max_tokens"] = req["max_output_tokens"]
    for name in SAMPLING:
        if req.get(name) is not None:
            body[name] = req[name]
    if req.get("rollout_provenance"):
        body["rollout_provenance"] = True
        if req.get("stream"):
            body["stream"] = True  # refused by chat_turn.rollout, naming the field
    body.update(logprob_fields(req))
    return body


def input_items(req: dict[str, Any], response_id: str) -> list[dict[str, Any]]:
    """The request's input as items, each with an id (what `input_items` lists)."""
    given = req.get("input")
    if given is None:
        return []
    if isinstance(given, str):
        given = [{"type": "message", "role": "user",
                  "content": [{"type": "input_text", "text": given}]}]
    out = []
    for i, item in enumerate(given):
        item = {"type": "message", **item} if "type" not in item else dict(item)
        item.setdefault("id", f"in_{response_id.removeprefix('resp_')}_{i}")
        if item["type"] == "message" and isinstance(item.get("content"), str):
            kind = "output_text" if item.get("role") == "assistant" else "input_text"
            item["content"] = [{"type": kind, "text": item["content"]}]
        out.append(item)
    return out


def arguments_json(arguments: str) -> str:
    """Arguments as sent (kept as text: a model's call is what it wrote)."""
    return arguments if isinstance(arguments, str) else json.dumps(arguments)
