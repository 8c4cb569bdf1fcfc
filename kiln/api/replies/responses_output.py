"""The Responses API's output shapes, from a turn (kiln.api.replies.chat_turn.Turn): the output
items (reasoning, the assistant message, function calls), usage, and the response object that
echoes the request's settings; shared by the JSON answer, the stream and the store."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from kiln.api._generated import wire
from kiln.api.replies.chat_turn import Turn
from kiln.api.requests.prepare import PreparedChat
from kiln.api.requests.responses_input import seal


@dataclass(frozen=True)
class Ids:
    """A response's id and its output items' ids (the stream and the object use the same)."""

    response: str

    @property
    def key(self) -> str:
        return self.response.removeprefix("resp_")

    @property
    def reasoning(self) -> str:
        return f"rs_{self.key}"

    @property
    def message(self) -> str:
        return f"msg_{self.key}"

    def call(self, index: int) -> str:
        return f"fc_{self.key}_{index}"


def logprob(entry: wire.ChatTokenLogprob) -> dict[str, Any]:
    tops = [{"token": t.token, "logprob": t.logprob, "bytes": t.bytes or []}
            for t in (entry.top_logprobs or [])]
    return {"token": entry.token, "logprob": entry.logprob, "bytes": entry.bytes or [],
            "top_logprobs": tops}


def reasoning_item(ids: Ids, text: str, sealed: bool, status: str = "completed"
                   ) -> dict[str, Any]:
    item: dict[str, Any] = {"type": "reasoning", "id": ids.reasoning, "summary": [],
                            "content": [{"type": "reasoning_text", "text": text}],
                            "status": status}
    if sealed:
        item["encrypted_content"] = seal(text)
    return item


def text_part(text: str, logprobs: list[dict[str, Any]]) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs}


def message_item(ids: Ids, text: str, logprobs: list[dict[str, Any]],
                 status: str = "completed") -> dict[str, Any]:
    return {"type": "message", "id": ids.message, "status": status, "role": "assistant",
            "content": [text_part(text, logprobs)]}


def call_item(ids: Ids, index: int, call_id: str, name: str, arguments: str,
              status: str = "completed") -> dict[str, Any]:
    return {"type": "function_call", "id": ids.call(index), "call_id": call_id, "name": name,
            "arguments": arguments, "status": status}


def output_items(ids: Ids, turn: Turn, sealed: bool, max_tool_calls: int | None
                 ) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if turn.reasoning:
        out.append(reasoning_item(ids, turn.reasoning, sealed))
    if turn.text or not (turn.calls or turn.reasoning):  # an empty answer: one empty message
        out.append(message_item(ids, turn.text, [logprob(e) for e in turn.logprobs or ()]))
    calls = turn.calls if max_tool_calls is None else turn.calls[:max_tool_calls]
    for i, call in enumerate(calls):
        out.append(call_item(ids, i, call.id, call.name, call.arguments))
    return out


def usage(turn: Turn) -> dict[str, Any]:
    return {"input_tokens": turn.prompt_tokens,
            "input_tokens_details": {"cached_tokens": turn.cached_tokens},
            "output_tokens": turn.output_tokens,
            "output_tokens_details": {"reasoning_tokens": turn.reasoning_tokens},
            "total_tokens": turn.prompt_tokens + turn.output_tokens}


def response_object(ids: Ids, req: dict[str, Any], prepared: PreparedChat, created_at: int,
                    status: str = "in_progress") -> dict[str, Any]:
    """The response object before its output: the request's settings, as they ran."""
    params = prepared.run.params[0]
    reasoning = req.get("reasoning") or {}
    text = req.get("text") or {}
    return {
        "id": ids.response, "object": "response", "created_at": created_at, "status": status,
        "error": None, "incomplete_details": None,
        "instructions": req.get("instructions"),
        "max_output_tokens": req.get("max_output_tokens"),
        "max_tool_calls": req.get("max_tool_calls"),
        "model": prepared.shape.model, "output": [],
        "parallel_tool_calls": req.get("parallel_tool_calls") is not False,
        "previous_response_id": req.get("previous_response_id"),
        "reasoning": {"effort": reasoning.get("effort"), "summary": reasoning.get("summary")},
        "store": req.get("store") is not False,
        "temperature": params.temperature, "top_p": params.top_p,
        "text": {"format": text.get("format") or {"type": "text"}},
        "tool_choice": req.get("tool_choice") or "auto",
        "tools": req.get("tools") or [],
        "top_logprobs": req.get("top_logprobs"),
        "truncation": req.get("truncation") or "disabled",
        "usage": None,
        "metadata": req.get("metadata") or {},
        "user": req.get("user"),
        "safety_identifier": req.get("safety_identifier"),
        "prompt_cache_key": req.get("prompt_cache_key"),
        "service_tier": "default",
        "background": False,
    }


def finished(obj: dict[str, Any], ids: Ids, turn: Turn, req: dict[str, Any]
             ) -> dict[str, Any]:
    """The response object with the turn's output, status and usage."""
    sealed = "reasoning.encrypted_content" in (req.get("include") or [])
    out = dict(obj)
    out["output"] = output_items(ids, turn, sealed, req.get("max_tool_calls"))
    out["usage"] = usage(turn)
    if turn.provenance is not None:
        out["rollout_provenance"] = turn.provenance
    if turn.weight_version is not None:
        out["weight_version"] = turn.weight_version
    if turn.finish == "length":
        out["status"] = "incomplete"
        out["incomplete_details"] = {"reason": "max_output_tokens"}
    else:
        out["status"] = "completed"
    return out


def failed(obj: dict[str, Any], code: str, message: str) -> dict[str, Any]:
    return {**obj, "status": "failed", "error": {"code": code, "message": message}}


def now() -> int:
    return int(time.time())
