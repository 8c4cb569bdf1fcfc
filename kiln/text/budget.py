"""Thinking-budget resolution and its metadata record (docs/behavior.md §3.1, §3.2, §3.6).

This module resolves the configured budget per dimension; the decode-time controller that forces
`</think>` is separate.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from msgspec import UNSET


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
