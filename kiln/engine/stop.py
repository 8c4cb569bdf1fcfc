"""Incremental text with stop strings: a stop string never reaches the caller's text.

Text from the detokenizer is emitted eagerly except for the longest tail that could still be
the start of a stop string; that tail is held back until it either completes a stop string
(then the text is cut before it and generation stops) or can no longer match (then released).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class Detokenizer(Protocol):
    def push(self, token_id: int) -> str: ...

    def flush(self) -> str: ...


class StopChecker:
    """Wraps an incremental detokenizer; ``push`` returns (text_delta, matched stop or None)."""

    def __init__(self, detok: Detokenizer, stop: Sequence[str] = ()) -> None:
        self._detok = detok
        self._stops = tuple(s for s in stop if s)
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
        if not self._stops:
            return text, None
        cut: tuple[int, str] | None = None
        for s in self._stops:
            i = text.find(s)
            if i >= 0 and (cut is None or (i, len(s)) < (cut[0], len(cut[1]))):
                cut = (i, s)
        if cut is not None:
            self.stopped = True
            return text[: cut[0]], cut[1]
        if final:
            return text, None
        keep = self._holdback(text)
        if keep:
            self._held = text[-keep:]
            text = text[:-keep]
        return text, None

    def _holdback(self, text: str) -> int:
        """Length of the longest suffix of ``text`` that is a proper prefix of a stop string."""
        best = 0
        for s in self._stops:
            for n in range(min(len(s) - 1, len(text)), best, -1):
                if text.endswith(s[:n]):
                    best = n
                    break
        return best
