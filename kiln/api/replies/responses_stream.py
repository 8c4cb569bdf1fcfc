"""The Responses API's event stream, written from the turn's events
(kiln.api.replies.chat_turn): `response.created`, `response.in_progress`, then per output item
`response.output_item.added`, its content part's `added`, the deltas (`output_text`,
`reasoning_text`, `function_call_arguments`), their `done`, the part's and the item's `done`,
and last `response.completed` (or `.incomplete`; a generation that failed ends with
`response.failed`, a request's own fault with an `error` event). Every event carries its
`sequence_number`. `replay` writes a stored response's events again (GET ?stream=true)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
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
from kiln.api.replies.responses_output import (
    Ids,
    call_item,
    failed,
    logprob,
    message_item,
    reasoning_item,
    text_part,
)

_encoder = msgspec.json.Encoder()


class Writer:
    """Numbers the events and writes them as SSE (`event:` names the type)."""

    def __init__(self, starting_after: int = -1) -> None:
        self.sequence = 0
        self.starting_after = starting_after  # replay: events up to this number are left out

    def __call__(self, kind: str, **fields: Any) -> bytes:
        number = self.sequence
        self.sequence += 1
        if number <= self.starting_after:
            return b""
        data = {"type": kind, "sequence_number": number, **fields}
        return b"event: " + kind.encode() + b"\ndata: " + _encoder.encode(data) + b"\n\n"


class _Items:
    """The open output item (reasoning, message or function call) and the items done."""

    def __init__(self, ids: Ids, write: Writer, sealed: bool) -> None:
        self.ids, self.write, self.sealed = ids, write, sealed
        self.kind: str | None = None
        self.index = -1
        self.parts: list[str] = []
        self.logprobs: list[dict[str, Any]] = []
        self.call: tuple[int, str, str] | None = None  # (call index, call id, name)
        self.done: list[dict[str, Any]] = []

    def open_reasoning(self) -> list[bytes]:
        out = self._open("reasoning")
        item = reasoning_item(self.ids, "", False, "in_progress")
        item["content"] = []
        out.append(self.write("response.output_item.added", output_index=self.index, item=item))
        out.append(self.write("response.content_part.added", item_id=self.ids.reasoning,
                              output_index=self.index, content_index=0,
                              part={"type": "reasoning_text", "text": ""}))
        return out

    def open_message(self) -> list[bytes]:
        out = self._open("message")
        item = message_item(self.ids, "", [], "in_progress")
        item["content"] = []
        out.append(self.write("response.output_item.added", output_index=self.index, item=item))
        out.append(self.write("response.content_part.added", item_id=self.ids.message,
                              output_index=self.index, content_index=0, part=text_part("", [])))
        return out

    def open_call(self, index: int, call_id: str, name: str) -> list[bytes]:
        out = self._open("function_call")
        self.call = (index, call_id, name)
        item = call_item(self.ids, index, call_id, name, "", "in_progress")
        out.append(self.write("response.output_item.added", output_index=self.index, item=item))
        return out

    def _open(self, kind: str) -> list[bytes]:
        out = self.close()
        self.kind = kind
        self.index += 1
        self.parts, self.logprobs = [], []
        return out

    def close(self) -> list[bytes]:
        kind, text, w = self.kind, "".join(self.parts), self.write
        if kind is None:
            return []
        out: list[bytes] = []
        if kind == "reasoning":
            item = reasoning_item(self.ids, text, self.sealed)
            part = {"type": "reasoning_text", "text": text}
            out.append(w("response.reasoning_text.done", item_id=self.ids.reasoning,
                         output_index=self.index, content_index=0, text=text))
            out.append(w("response.content_part.done", item_id=self.ids.reasoning,
                         output_index=self.index, content_index=0, part=part))
        elif kind == "message":
            item = message_item(self.ids, text, self.logprobs)
            out.append(w("response.output_text.done", item_id=self.ids.message,
                         output_index=self.index, content_index=0, text=text,
                         logprobs=self.logprobs))
            out.append(w("response.content_part.done", item_id=self.ids.message,
                         output_index=self.index, content_index=0,
                         part=text_part(text, self.logprobs)))
        else:
            assert self.call is not None
            index, call_id, name = self.call
            item = call_item(self.ids, index, call_id, name, text)
            out.append(w("response.function_call_arguments.done", item_id=self.ids.call(index),
                         output_index=self.index, name=name, arguments=text))
        out.append(w("response.output_item.done", output_index=self.index, item=item))
        self.done.append(item)
        self.kind = None
        return out

    def push(self, event: Event) -> list[bytes]:
        out: list[bytes] = []
        w = self.write
        if isinstance(event, ReasoningDelta):
            if self.kind != "reasoning":
                out += self.open_reasoning()
            self.parts.append(event.text)
            out.append(w("response.reasoning_text.delta", item_id=self.ids.reasoning,
                         output_index=self.index, content_index=0, delta=event.text))
        elif isinstance(event, TextDelta):
            if self.kind != "message":
                out += self.open_message()
            self.parts.append(event.text)
            lps = [logprob(e) for e in event.logprobs]
            self.logprobs.extend(lps)
            out.append(w("response.output_text.delta", item_id=self.ids.message,
                         output_index=self.index, content_index=0, delta=event.text,
                         logprobs=lps))
        elif isinstance(event, CallStart):
            out += self.open_call(event.index, event.id, event.name)
        elif isinstance(event, CallArguments) and self.call is not None:
            self.parts.append(event.fragment)
            out.append(w("response.function_call_arguments.delta",
                         item_id=self.ids.call(self.call[0]), output_index=self.index,
                         delta=event.fragment))
        return out


async def frames(obj: dict[str, Any], ids: Ids, events: AsyncIterator[list[Event]],
                 finish: Callable[[TurnEnd], dict[str, Any]], sealed: bool
                 ) -> AsyncIterator[bytes]:
    """The stream of one response: ``obj`` is its object in progress; ``finish`` turns the
    turn's end into the finished object (and stores it)."""
    write = Writer()
    yield write("response.created", response=obj) + write("response.in_progress", response=obj)
    items = _Items(ids, write, sealed)
    try:
        async for batch in events:
            out: list[bytes] = []
            for event in batch:
                if isinstance(event, TurnFault):
                    out += items.close()
                    if event.fault is not None and event.fault.status < 500:
                        out.append(write("error", code=event.fault.code,
                                         message=event.message, param=event.fault.param))
                    out.append(write("response.failed", response=failed(
                        obj, "server_error", event.message)))
                    yield b"".join(out)
                    return
                if isinstance(event, TurnEnd):
                    if items.index < 0:
                        out += items.open_message()  # an empty answer is one empty message
                    out += items.close()
                    done = finish(event)
                    kind = "response.incomplete" if done["status"] == "incomplete" \
                        else "response.completed"
                    out.append(write(kind, response=done))
                else:
                    out += items.push(event)
            if out:
                yield b"".join(out)
    finally:
        await chat_turn.close(events)


def replay(obj: dict[str, Any], starting_after: int) -> bytes:
    """A stored response's events, as a stream of it would have sent them (each item's text in
    one delta), from the event after ``starting_after``."""
    write = Writer(starting_after)
    start = {**obj, "status": "in_progress", "output": [], "usage": None}
    out = [write("response.created", response=start), write("response.in_progress",
                                                            response=start)]
    for index, item in enumerate(obj["output"]):
        kind = item["type"]
        opened = dict(item, status="in_progress")
        if kind in ("message", "reasoning"):
            opened["content"] = []
        if kind == "function_call":
            opened["arguments"] = ""
        out.append(write("response.output_item.added", output_index=index, item=opened))
        if kind == "reasoning":
            text = "".join(c["text"] for c in item.get("content") or [])
            part = {"type": "reasoning_text", "text": text}
            out += [write("response.content_part.added", item_id=item["id"], output_index=index,
                          content_index=0, part={"type": "reasoning_text", "text": ""}),
                    write("response.reasoning_text.delta", item_id=item["id"],
                          output_index=index, content_index=0, delta=text),
                    write("response.reasoning_text.done", item_id=item["id"],
                          output_index=index, content_index=0, text=text),
                    write("response.content_part.done", item_id=item["id"], output_index=index,
                          content_index=0, part=part)]
        elif kind == "message":
            part = item["content"][0]
            out += [write("response.content_part.added", item_id=item["id"], output_index=index,
                          content_index=0, part=text_part("", [])),
                    write("response.output_text.delta", item_id=item["id"], output_index=index,
                          content_index=0, delta=part["text"], logprobs=part["logprobs"]),
                    write("response.output_text.done", item_id=item["id"], output_index=index,
                          content_index=0, text=part["text"], logprobs=part["logprobs"]),
                    write("response.content_part.done", item_id=item["id"], output_index=index,
                          content_index=0, part=part)]
        else:
            out += [write("response.function_call_arguments.delta", item_id=item["id"],
                          output_index=index, delta=item["arguments"]),
                    write("response.function_call_arguments.done", item_id=item["id"],
                          output_index=index, name=item["name"], arguments=item["arguments"])]
        out.append(write("response.output_item.done", output_index=index, item=item))
    kind = {"incomplete": "response.incomplete", "failed": "response.failed"}.get(
        obj["status"], "response.completed")
    out.append(write(kind, response=obj))
    return b"".join(out)
