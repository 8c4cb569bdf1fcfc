"""The decode-time thinking-budget controller and pre-decode checks (docs/behavior.md §3.3-§3.5).

``ThinkingBudgetController.decide`` runs at every token boundary of a request whose budget
applies: given the tokens generated so far and the model's sampled candidate it returns the token
to emit and whether it was forced. Once a trigger fires (thinking-token budget, time budget or the
completion limit) the close sequence (the tokenizer's encoding of ``</think>``) is forced token by
token; afterwards the model's samples are accepted again. Pure Python: no clock, no tokenizer.
"""

from __future__ import annotations

import json

from kiln.text.thinking import Outcome

CLOSE_TAG = "</think>"

TRIGGER_TOKENS = "tokens"
TRIGGER_TIME = "time"
TRIGGER_MAX_TOKENS = "max_tokens"


def close_progress(generated: list[int], close: tuple[int, ...]) -> int:
    """Length of the longest proper prefix of ``close`` that is a suffix of ``generated``."""
    for k in range(min(len(close) - 1, len(generated)), 0, -1):
        if tuple(generated[-k:]) == close[:k]:
            return k
    return 0


def _ends_with(generated: list[int], close: tuple[int, ...]) -> bool:
    n = len(close)
    return len(generated) >= n and tuple(generated[-n:]) == close


class ThinkingBudgetController:
    """State machine: active -> forcing(trigger) -> closed(trigger), or naturally closed."""

    def __init__(
        self,
        close_ids: tuple[int, ...],
        max_thinking_tokens: int | None,
        max_time_ms: int | None,
        completion_limit: int,
    ) -> None:
        if not close_ids:
            raise ValueError("the close sequence must contain at least one token")
        if max_thinking_tokens is not None and max_thinking_tokens < 0:
            raise ValueError("max_thinking_tokens must be >= 0")
        if max_time_ms is not None and max_time_ms < 0:
            raise ValueError("max_time_ms must be >= 0")
        self.close_ids = tuple(close_ids)
        self.max_thinking_tokens = max_thinking_tokens
        self.max_time_ms = max_time_ms
        self.completion_limit = completion_limit
        self.start_ms: float | None = None
        self.last_ms: float | None = None
        self.trigger: str | None = None
        self.forcing = False
        self.closed = False
        self._thinking_tokens = 0
        self._elapsed_ms: float | None = None  # frozen at publication; None while active

    # -- the decision ----------------------------------------------------------------------------
    def decide(self, generated: list[int], candidate: int, now_ms: float) -> tuple[int, bool]:
        """-> (token to emit, forced?) after ``generated`` (docs/behavior.md §3.4)."""
        if self.start_ms is None:
            self.start_ms = now_ms  # the first decode candidate
        self.last_ms = now_ms
        close = self.close_ids
        if self.closed:  # 1
            return candidate, False
        if _ends_with(generated, close):  # 2
            self._publish_natural(len(generated) - len(close), now_ms)
            return candidate, False
        progress = close_progress(generated, close)  # 3
        thinking = len(generated) - progress
        expected = close[progress]
        if self.forcing:  # 4
            self._advance_forced(progress)
            return expected, True
        trigger = self._trigger(generated, thinking, now_ms)  # 5
        if trigger is None or candidate == expected:  # 6, 7: the natural path
            if progress + 1 == len(close) and candidate == expected:
                self._publish_natural(thinking, now_ms)
            return candidate, False
        self.trigger = trigger  # 8
        self.forcing = True
        self._thinking_tokens = thinking
        self._elapsed_ms = now_ms - self.start_ms
        self._advance_forced(progress)
        return expected, True

    def _trigger(self, generated: list[int], thinking: int, now_ms: float) -> str | None:
        if self.max_thinking_tokens is not None and thinking >= self.max_thinking_tokens:
            return TRIGGER_TOKENS
        assert self.start_ms is not None
        if self.max_time_ms is not None and now_ms - self.start_ms >= self.max_time_ms:
            return TRIGGER_TIME
        if len(generated) + len(self.close_ids) >= self.completion_limit:
            return TRIGGER_MAX_TOKENS
        return None

    def _advance_forced(self, progress: int) -> None:
        if progress + 1 == len(self.close_ids):
            self.forcing = False
            self.closed = True

    def _publish_natural(self, thinking: int, now_ms: float) -> None:
        if self.closed or self.forcing or self.trigger is not None:
            return
        assert self.start_ms is not None
        self.closed = True
        self._thinking_tokens = thinking
        self._elapsed_ms = now_ms - self.start_ms

    # -- the terminal state ------------------------------------------------------------------------
    @property
    def active(self) -> bool:
        return not self.closed and self.trigger is None

    def elapsed_ms(self, now_ms: float | None = None) -> float:
        """Frozen at publication; live (to ``now_ms`` or the last boundary) while active."""
        if self._elapsed_ms is not None:
            return self._elapsed_ms
        if self.start_ms is None:
            return 0.0
        now = now_ms if now_ms is not None else self.last_ms
        return max(0.0, (now if now is not None else self.start_ms) - self.start_ms)

    def outcome(self, completion_tokens: int, now_ms: float | None = None) -> Outcome:
        """The terminal outcome (§3.5): a model that never closed thought for every token."""
        thinking = self._thinking_tokens
        if not self.closed and self.trigger is None:
            thinking = completion_tokens
        return Outcome(
            triggered=self.trigger is not None,
            closed=self.closed,
            thinking_tokens=thinking,
            thinking_time_ms=int(self.elapsed_ms(now_ms)),
            trigger=self.trigger,
        )


# -- validation before decode (§3.3) ---------------------------------------------------------------
def _overlaps(stop: str, tag: str) -> bool:
    """A proper suffix of one equals a prefix of the other (either direction)."""
    for k in range(1, min(len(stop), len(tag)) + 1):
        if stop[-k:] == tag[:k] or tag[-k:] == stop[:k]:
            return True
    return False


def stop_conflict(stop: str, tag: str = CLOSE_TAG) -> bool:
    return stop == "" or stop in tag or tag in stop or _overlaps(stop, tag)


def validate_budget(
    close_text_roundtrip_ok: bool,
    close_len: int,
    effective_max_tokens: int,
    stops: tuple[str, ...],
) -> str | None:
    """The error message for a budget that cannot be honoured, or None (400 chat_invalid_request).

    Call only when the budget applies; ``effective_max_tokens`` is after context clamping.
    """
    problem = budget_problem(close_text_roundtrip_ok, close_len, effective_max_tokens, stops)
    return None if problem is None else problem[0]


def budget_problem(
    close_text_roundtrip_ok: bool,
    close_len: int,
    effective_max_tokens: int,
    stops: tuple[str, ...],
) -> tuple[str, str | None] | None:
    """``validate_budget``'s message with the request field at fault (None: the tokenizer)."""
    tag = json.dumps(CLOSE_TAG)
    if not close_text_roundtrip_ok or close_len <= 0:
        return (f"the tokenizer's encoding of {tag} does not decode back to exactly {tag}, "
                "so the thinking budget cannot force the close sequence", None)
    if effective_max_tokens < close_len:
        return (f"effective max_tokens {effective_max_tokens} cannot fit the {close_len}-token "
                f"{tag} thinking close sequence", "max_tokens")
    for stop in stops:
        if stop_conflict(stop):
            return (f"stop sequence {json.dumps(stop)} conflicts with the {tag} thinking close "
                    "sequence (empty, contained in it, containing it or overlapping it)", "stop")
    return None
