"""Anthropic's Messages stream, written from the turn's events (kiln.api.replies.chat_turn):
`message_start`, `ping`, per content block `content_block_start` / `content_block_delta`
(`thinking_delta` then `signature_delta`, `text_delta`, `input_json_delta`) /
`content_block_stop`, then `message_delta` (stop reason, usage) and `message_stop`; a failure
mid-stream is an `error` event."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import msgspec

from kiln.api.replies import chat_turn
from kiln.api.replies.chat_turn import (
    CallArguments,
    CallStart,
    Event,
    ReasoningDelta,
    TextDelta,
    TurnEnd,
    TurnFault,
)
from kiln.api.replies.messages_output import signature, stop_reason, usage

_encoder = msgspec.json.Encoder()


def sse(name: str, data: dict[str, Any]) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + _encoder.encode(data) + b"\n\n"


class _Blocks:
    """The open content block and the index of the next."""

    def __init__(self, omit_thinking: bool) -> None:
        self.omit_thinking = omit_thinking  # display: omitted
        self.index = -1
        self.kind: str | None = None
        self.thinking: list[str] = []

    def open(self, kind: str, block: dict[str, Any]) -> list[bytes]:
        out = self.close()
        self.index += 1
        self.kind = kind
        return [*out, sse("content_block_start", {"type": "content_block_start",
                                                  "index": self.index, "content_block": block})]

    def close(self) -> list[bytes]:
        if self.kind is None:
            return []
        out = []
        if self.kind == "thinking":
            out.append(self.delta({"type": "signature_delta",
                                   "signature": signature("".join(self.thinking))}))
            self.thinking = []
        out.append(sse("content_block_stop", {"type": "content_block_stop", "index": self.index}))
        self.kind = None
        return out

    def delta(self, delta: dict[str, Any]) -> bytes:
        return sse("content_block_delta", {"type": "content_block_delta", "index": self.index,
                                           "delta": delta})


def _frames_of(event: Event, blocks: _Blocks) -> list[bytes]:
    out: list[bytes] = []
    if isinstance(event, ReasoningDelta):
        if blocks.kind != "thinking":
            out += blocks.open("thinking", {"type": "thinking", "thinking": "", "signature": ""})
        blocks.thinking.append(event.text)
        if not blocks.omit_thinking:
            out.append(blocks.delta({"type": "thinking_delta", "thinking": event.text}))
    elif isinstance(event, TextDelta):
        if blocks.kind != "text":
            out += blocks.open("text", {"type": "text", "text": ""})
        out.append(blocks.delta({"type": "text_delta", "text": event.text}))
    elif isinstance(event, CallStart):
        out += blocks.open("tool_use", {"type": "tool_use", "id": event.id, "name": event.name,
                                        "input": {}})
    elif isinstance(event, CallArguments):
        out.append(blocks.delta({"type": "input_json_delta", "partial_json": event.fragment}))
    return out


async def frames(message_id: str, model: str, prompt_tokens: int,
                 events: AsyncIterator[list[Event]], omit_thinking: bool = False
                 ) -> AsyncIterator[bytes]:
    start: dict[str, Any] = {"id": message_id, "type": "message", "role": "assistant", "model": model,
             "content": [], "stop_reason": None, "stop_sequence": None,
             "usage": {"input_tokens": prompt_tokens, "output_tokens": 0}}
    yield sse("message_start", {"type": "message_start", "message": start})
    yield sse("ping", {"type": "ping"})
    blocks = _Blocks(omit_thinking)
    try:
        async for batch in events:
            out: list[bytes] = []
            for event in batch:
                if isinstance(event, TurnFault):
                    status = event.fault.status if event.fault is not None else 500
                    kind = "invalid_request_error" if 400 <= status < 500 else "api_error"
                    out.append(sse("error", {"type": "error", "error": {
                        "type": kind, "message": event.message}}))
                    yield b"".join(out)
                    return
                if isinstance(event, TurnEnd):
                    turn = event.turn
                    if blocks.index < 0:  # an empty answer is one empty text block
                        out += blocks.open("text", {"type": "text", "text": ""})
                    out += blocks.close()
                    delta: dict[str, Any] = {
                        "type": "message_delta",
                        "delta": {"stop_reason": stop_reason(turn),
                                  "stop_sequence": turn.stop_string
                                  if turn.finish == "stop" else None},
                        "usage": usage(turn)}
                    if turn.weight_version is not None:
                        delta["weight_version"] = turn.weight_version
                    out.append(sse("message_delta", delta))
                    out.append(sse("message_stop", {"type": "message_stop"}))
                else:
                    out += _frames_of(event, blocks)
            if out:
                yield b"".join(out)
    finally:
        await chat_turn.close(events)
