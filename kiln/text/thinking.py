"""A request's thinking, outside the decode loop: whether its prompt opens in reasoning and how
its output splits into reasoning and answer (docs/behavior.md §4), and the thinking budget it runs
under, resolved per dimension, with its metadata record (§3.1, §3.2, §3.6). The decode-time
controller that forces `</think>` is kiln.text.thinking_budget.

A prompt starts in reasoning when the rendered prompt, right-trimmed, ends with `<think>`. The
non-streamed split is at the first `</think>`; the streaming splitter holds back any tail that
could be the start of `</think>` so a tag split across tokens never leaks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from msgspec import UNSET

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


@dataclass(frozen=True)
class Dimension:
    limit: int | None
    source: str


def resolve_dimension(requested: Any, server_default: int | None) -> Dimension:
    """omitted -> inherit the server default; null -> unlimited; integer -> that limit."""
    if requested is UNSET:
        if server_default is None:
            return Dimension(None, "unlimited")
        return Dimension(server_default, "server_default")
    if requested is None:
        return Dimension(None, "request_unlimited")
    return Dimension(int(requested), "request")


@dataclass(frozen=True)
class BudgetConfig:
    tokens: Dimension
    time_ms: Dimension

    @property
    def configured(self) -> bool:
        return self.tokens.limit is not None or self.time_ms.limit is not None

    def effective(self) -> dict[str, Any]:
        """The `effective` fields, in the record's field order."""
        out: dict[str, Any] = {"configured": self.configured}
        if self.tokens.limit is not None:
            out["max_tokens"] = self.tokens.limit
        if self.time_ms.limit is not None:
            out["max_time_ms"] = self.time_ms.limit
        out["tokens_source"] = self.tokens.source
        out["time_source"] = self.time_ms.source
        return out


def resolve(
    requested_tokens: Any, requested_ms: Any, default_tokens: int | None, default_ms: int | None
) -> BudgetConfig:
    return BudgetConfig(
        resolve_dimension(requested_tokens, default_tokens),
        resolve_dimension(requested_ms, default_ms),
    )


@dataclass(frozen=True)
class Outcome:
    triggered: bool
    closed: bool
    thinking_tokens: int
    thinking_time_ms: int
    trigger: str | None = None

    def wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {"triggered": self.triggered}
        if self.trigger is not None:
            out["trigger"] = self.trigger
        out.update(
            closed=self.closed,
            thinking_tokens=self.thinking_tokens,
            thinking_time_ms=self.thinking_time_ms,
        )
        return out


def record(config: BudgetConfig, applied: bool, outcome: Outcome | None) -> dict[str, Any]:
    """The flat record: configured, applied, max_*?, sources, triggered, then the outcome."""
    eff = config.effective()
    out: dict[str, Any] = {"configured": eff.pop("configured"), "applied": applied or bool(outcome)}
    out.update(eff)
    out["triggered"] = bool(outcome and outcome.triggered)
    if outcome is not None:
        if outcome.trigger is not None:
            out["trigger"] = outcome.trigger
        out["closed"] = outcome.closed
        out["thinking_tokens"] = outcome.thinking_tokens
        out["thinking_time_ms"] = outcome.thinking_time_ms
    return out
