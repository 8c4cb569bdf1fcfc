"""Separating `<think>` reasoning from the answer (docs/behavior.md §4).

A prompt starts in reasoning when the rendered prompt, right-trimmed, ends with `<think>`. The
non-streamed split is at the first `</think>`; the streaming splitter holds back any tail that
could be the start of `</think>` so a tag split across tokens never leaks.
"""

from __future__ import annotations

from dataclasses import dataclass

OPEN_TAG = "<think>"
CLOSE_TAG = "</think>"


def prompt_starts_in_reasoning(rendered_prompt: str) -> bool:
    return rendered_prompt.rstrip().endswith(OPEN_TAG)


def split_reasoning(text: str, in_reasoning: bool) -> tuple[str | None, str]:
    """(reasoning or None, content) for a whole completion."""
    if not in_reasoning:
        return None, text
    head, sep, tail = text.partition(CLOSE_TAG)
    if not sep:
        return (text or None), ""
    return (head or None), tail


def _held_prefix(buffer: str, tag: str) -> int:
    """Length of the longest proper prefix of `tag` that `buffer` ends with."""
    for n in range(min(len(tag) - 1, len(buffer)), 0, -1):
        if buffer.endswith(tag[:n]):
            return n
    return 0


@dataclass
class Delta:
    reasoning: str = ""
    content: str = ""


class ReasoningSplitter:
    """Incremental splitter; each push returns the reasoning and content text now safe to emit."""

    def __init__(self, in_reasoning: bool) -> None:
        self.in_reasoning = in_reasoning
        self._buffer = ""

    def push(self, text: str) -> Delta:
        if not self.in_reasoning:
            return Delta(content=text)
        self._buffer += text
        head, sep, tail = self._buffer.partition(CLOSE_TAG)
        if sep:
            self.in_reasoning = False
            self._buffer = ""
            return Delta(reasoning=head, content=tail)
        hold = _held_prefix(self._buffer, CLOSE_TAG)
        ready = self._buffer[: len(self._buffer) - hold]
        self._buffer = self._buffer[len(self._buffer) - hold :]
        return Delta(reasoning=ready)

    def flush(self) -> Delta:
        rest, self._buffer = self._buffer, ""
        return Delta(reasoning=rest) if self.in_reasoning else Delta(content=rest)


def fold(reasoning: str | None, content: str) -> str:
    """`fold_reasoning_into_content`: `<think>\\n{reasoning}</think>` (+ `\\n\\n{content}`)."""
    if not reasoning:
        return content
    folded = f"{OPEN_TAG}\n{reasoning}{CLOSE_TAG}"
    return folded + (f"\n\n{content}" if content else "")
