"""Incremental tool-call parsing for SSE streams (docs/behavior.md §10, docs/decisions.md).

Content streams eagerly. The streamer holds back a trailing proper prefix of ``<tool_call>`` and
up to 64 whitespace characters before it (so the text before a call can be right-trimmed). Once
``<tool_call>`` appears, the text before it is emitted right-trimmed and the block is buffered
until ``</tool_call>``; a block that parses becomes one complete tool call, one that does not is
emitted as content verbatim (with the whitespace that preceded it). A block still open at the
end is the call as far as it was written, or nothing (``kiln.text.tools.partial_call``). An output whose first
non-blank character is ``{`` is held while it could still be a bare-JSON call (Kiln's fallback).

Everything streamed concatenates to :func:`kiln.text.tools.parse_tool_calls` of the full text,
except when a run of more than 64 whitespace characters precedes a call or ends the output (the
one-shot parse trims all of it; the stream has already sent the excess).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from kiln.text.tools import (
    CLOSE_TAG,
    OPEN_TAG,
    ToolCall,
    ToolSet,
    bare_call,
    parse_block,
    parse_with,
    partial_call,
)

MAX_HELD_WHITESPACE = 64

_START, _BARE, _TEXT, _BLOCK = "start", "bare", "text", "block"


@dataclass
class StreamEvents:
    content: str = ""
    tool_calls: list[tuple[int, ToolCall]] = field(default_factory=list)


def _held_prefix(buffer: str, tag: str) -> int:
    """Length of the longest proper prefix of ``tag`` that ``buffer`` ends with."""
    for n in range(min(len(tag) - 1, len(buffer)), 0, -1):
        if buffer.endswith(tag[:n]):
            return n
    return 0


def _trailing_whitespace(text: str, limit: int) -> int:
    n = 0
    while n < limit and n < len(text) and text[len(text) - 1 - n].isspace():
        n += 1
    return n


class ToolCallStreamer:
    def __init__(self, tools: list[Any] | None) -> None:
        self._tools = ToolSet(tools)
        self._mode = _START
        self._buf = ""  # text mode: held tail; start/bare mode: everything so far
        self._block = ""  # block mode: "<tool_call>..." so far
        self._scan = 0  # block mode: where the search for the closing tag resumes
        self._pending_ws = ""  # whitespace trimmed before the current block
        self._bare_done = False  # bare mode: the held text is one complete declared call
        self._next_index = 0

    def closes_with(self, stop: str) -> bool:
        """Whether ``stop`` (a client's stop string that ended generation) completes the open
        `<tool_call>` block into a call that parses: then it is pushed back for parsing, as
        the non-streamed answer does; otherwise it must not reach the stream."""
        return self._mode == _BLOCK and bool(
            parse_with(self._block + stop, self._tools, partial=False).tool_calls)

    @property
    def emitted_calls(self) -> int:
        """How many tool calls have been emitted so far."""
        return self._next_index

    def push(self, text: str) -> StreamEvents:
        """Add generated text; return the content and completed calls now safe to emit."""
        if not self._tools.enabled:
            return StreamEvents(text)
        events = StreamEvents()
        if self._mode == _BLOCK:
            self._block += text
        else:
            self._buf += text
        if self._mode == _START:
            self._start()
        if self._mode == _BARE:
            self._bare(text)
        if self._mode in (_TEXT, _BLOCK):
            self._drain(events)
        return events

    def finish(self) -> StreamEvents:
        """End of generation: flush held text; an unterminated block is the call as far as it
        was written (``partial_call``), or nothing, never content."""
        if not self._tools.enabled:
            return StreamEvents()
        if self._mode == _BARE:
            parsed = parse_with(self._buf, self._tools)
            events = StreamEvents(parsed.content)
            for call in parsed.tool_calls:
                events.tool_calls.append((self._next_index, call))
                self._next_index += 1
        elif self._mode == _BLOCK:
            events = StreamEvents()
            cut = partial_call(self._block[len(OPEN_TAG):], self._tools)
            if cut is not None:
                events.tool_calls.append((self._next_index, cut))
                self._next_index += 1
        else:
            events = StreamEvents(self._buf.rstrip() if self._next_index else self._buf)
        self._mode, self._buf, self._block, self._pending_ws = _TEXT, "", "", ""
        return events

    def _start(self) -> None:
        """Before the first non-blank character, hold everything: it may begin a bare call."""
        head = self._buf.lstrip()
        if not head:
            return
        self._mode = _BARE if head[0] == "{" and self._tools.names else _TEXT

    def _bare(self, new_text: str) -> None:
        """Leave bare mode once the output can no longer be a single declared-call object."""
        if self._bare_done:
            if new_text.strip():
                self._mode = _TEXT
            return
        if "}" not in new_text:
            return
        try:
            obj, end = json.JSONDecoder().raw_decode(self._buf.lstrip())
        except ValueError:
            return  # incomplete (or invalid) JSON: keep holding until more text or the end
        tail = self._buf.lstrip()[end:]
        if tail.strip() or bare_call(obj, self._tools) is None:
            self._mode = _TEXT
        else:
            self._bare_done = True

    def _drain(self, events: StreamEvents) -> None:
        while True:
            if self._mode == _BLOCK:
                end = self._block.find(CLOSE_TAG, self._scan)
                if end < 0:
                    self._scan = max(len(OPEN_TAG), len(self._block) - len(CLOSE_TAG) + 1)
                    return
                stop = end + len(CLOSE_TAG)
                call = parse_block(self._block[len(OPEN_TAG):end], self._tools)
                if call is None:
                    events.content += self._pending_ws + self._block[:stop]
                else:
                    events.tool_calls.append((self._next_index, call))
                    self._next_index += 1
                self._buf, self._block, self._pending_ws = self._block[stop:], "", ""
                self._mode = _TEXT
                continue
            start = self._buf.find(OPEN_TAG)
            if start >= 0:
                before = self._buf[:start]
                trimmed = before.rstrip()
                events.content += trimmed
                self._pending_ws = before[len(trimmed):]
                self._block, self._buf = self._buf[start:], ""
                self._scan = len(OPEN_TAG)
                self._mode = _BLOCK
                continue
            hold = _held_prefix(self._buf, OPEN_TAG)
            ready = self._buf[: len(self._buf) - hold]
            hold += _trailing_whitespace(ready, MAX_HELD_WHITESPACE)
            cut = len(self._buf) - hold
            events.content += self._buf[:cut]
            self._buf = self._buf[cut:]
            return
