"""The Messages API's output shapes, from a turn (kiln.api.replies.chat_turn.Turn): the
response's content blocks, `stop_reason` and usage, shared by the JSON answer and the stream."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from kiln.api.replies.chat_turn import Turn


def signature(thinking: str) -> str:
    """A thinking block's `signature`: Kiln signs nothing; this names the text's digest, so a
    client that sends the block back sends something that identifies it."""
    return "kiln-sha256:" + hashlib.sha256(thinking.encode()).hexdigest()


def tool_input(arguments: str) -> dict[str, Any]:
    """A call's arguments as the `input` object (a model's text that is not a JSON object is
    kept whole under "arguments", never dropped)."""
    try:
        value = json.loads(arguments) if arguments else {}
    except ValueError:
        return {"arguments": arguments}
    return value if isinstance(value, dict) else {"arguments": value}


def stop_reason(turn: Turn) -> str:
    if turn.finish == "tool_calls":
        return "tool_use"
    if turn.finish == "length":
        return "max_tokens"
    return "stop_sequence" if turn.stop_string is not None else "end_turn"


def usage(turn: Turn) -> dict[str, int]:
    """Anthropic counts cache reads apart from `input_tokens` (their sum is the prompt)."""
    return {"input_tokens": turn.prompt_tokens - turn.cached_tokens,
            "output_tokens": turn.output_tokens,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": turn.cached_tokens}


def message_body(message_id: str, model: str, turn: Turn, omit_thinking: bool = False
                 ) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    if turn.reasoning:
        content.append({"type": "thinking", "thinking": "" if omit_thinking else turn.reasoning,
                        "signature": signature(turn.reasoning)})
    if turn.text or not (turn.calls or turn.reasoning):  # an empty answer is one empty text
        content.append({"type": "text", "text": turn.text})
    for call in turn.calls:
        content.append({"type": "tool_use", "id": call.id, "name": call.name,
                        "input": tool_input(call.arguments)})
    out = {"id": message_id, "type": "message", "role": "assistant", "model": model,
           "content": content, "stop_reason": stop_reason(turn),
           "stop_sequence": turn.stop_string if turn.finish == "stop" else None,
           "usage": usage(turn)}
    if turn.provenance is not None:
        out["rollout_provenance"] = turn.provenance
    if turn.weight_version is not None:
        out["weight_version"] = turn.weight_version
    return out
