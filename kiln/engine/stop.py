"""Incremental text with stop strings: a stop string never reaches the caller's text.

Text from the detokenizer is emitted eagerly except for the longest tail that could still be
the start of a stop string; that tail is held back until it either completes a stop string
(then the text is cut before it and generation stops) or can no longer match (then released).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from kiln.text.stop_automaton import automaton


class Detokenizer(Protocol):
    def push(self, token_id: int) -> str: ...

    def flush(self) -> str: ...


class StopChecker:
    """Wraps an incremental detokenizer; ``push`` returns (text_delta, matched stop or None).

    Matching runs on a ``StopAutomaton`` whose state persists across tokens, so each token costs
    time in its own new characters only, however many stop strings there are. Among the matches
    that end in a token's text, the earliest start wins, then the shortest string."""

    def __init__(self, detok: Detokenizer, stop: Sequence[str] = ()) -> None:
        self._detok = detok
        stops = tuple(s for s in stop if s)
        self._ac = automaton(stops) if stops else None
        self._state = 0  # the automaton's state after the text so far; its depth is held back
        self._held = ""
        self.stopped = False

    def push(self, token_id: int) -> tuple[str, str | None]:
        if self.stopped:
            return "", None
        return self._scan(self._detok.push(token_id), final=False)

    def finish(self) -> tuple[str, str | None]:
        """Flush the detokenizer and release held-back text (at the end of generation)."""
        if self.stopped:
            return "", None
        return self._scan(self._detok.flush(), final=True)

    def _scan(self, new: str, final: bool) -> tuple[str, str | None]:
        text = self._held + new
        self._held = ""
        ac = self._ac
        if ac is None:
            return text, None
        base = len(text) - len(new)
        cut: tuple[int, str] | None = None
        state = self._state
        for j, ch in enumerate(new):
            state = ac.step(state, ch)
            for m in ac.matches_at(state):
                stop = ac.patterns[m]
                start = base + j + 1 - len(stop)
                if cut is None or (start, len(stop)) < (cut[0], len(cut[1])):
                    cut = (start, stop)
        if cut is not None:
            self.stopped = True
            return text[: cut[0]], cut[1]
        self._state = state
        if final:
            return text, None
        keep = ac.depth[state]  # the longest suffix that could still become a stop string
        if keep:
            self._held = text[-keep:]
            text = text[:-keep]
        return text, None
