"""The output stage: token ids -> text deltas and stop strings (engine thread, no torch).

After each step's ``update_from_output`` the engine hands the step's RequestOutputs here (as
vLLM v1's OutputProcessor takes the engine core's outputs). Each request's new tokens go through
its incremental detokenizer and stop-string matcher (``StopChecker``); a request whose text
completes a stop string is finished in the scheduler (which frees its blocks) and its output
says so. The scheduler itself stops on token ids and lengths only. Logprob text, echo and
grammar state belong here too when they come.

Which tokens make text: the scheduler ends a request with "stop" only on a token id (EOS or a
``stop_token_ids`` entry), and that token is never detokenized; a request that ends with "stop"
or "length" flushes the detokenizer and releases the text held back for a possible stop string;
"abort" and "error" end without more text.

Stop strings (``StopChecker``): text from the detokenizer is emitted eagerly except for the
longest tail that could still be the start of a stop string; that tail is held back until it
either completes a stop string (then the text is cut before it and generation stops) or can no
longer match (then released).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from kiln.engine.outputs import RequestOutput, trimmed
from kiln.engine.repetition import REPETITION
from kiln.engine.request import Request, SamplingParams
from kiln.text.stop_automaton import automaton

__all__ = ["Detokenizer", "FinishStopped", "OutputProcessor", "StopChecker"]


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


# The scheduler's side: end a running request stopped by a stop string (blocks freed) and
# return its final output, or None when the scheduler no longer holds it.
# (request id, tokens to drop from its end) -> its final output (Scheduler.finish_stopped)
FinishStopped = Callable[[str, int], RequestOutput | None]


class OutputProcessor:
    """Per-request text state, kept from ``add_request`` until the request's final output
    passes through ``process``. The detokenizer factory makes one per request from its sampling
    params (skip_special_tokens, spaces_between_special_tokens). Without a factory no text is
    made and stop strings are not matched (an engine over token ids only, as tests build)."""

    def __init__(self, detokenizer: Callable[[SamplingParams], Detokenizer] | None = None
                 ) -> None:
        self._detokenizer = detokenizer
        self._checkers: dict[str, StopChecker] = {}

    @property
    def num_requests(self) -> int:
        return len(self._checkers)

    def add_request(self, req: Request) -> None:
        """Start ``req``'s text (call once the scheduler accepted it)."""
        if self._detokenizer is not None:
            self._checkers[req.request_id] = StopChecker(self._detokenizer(req.sampling),
                                                        req.sampling.stop)

    def process(self, outputs: list[RequestOutput], finish: FinishStopped) -> list[RequestOutput]:
        """Fill in each output's ``text_delta``; an output whose text completed a stop string
        becomes its request's final output (``finish`` ends it in the scheduler). The outputs
        are updated in place and returned."""
        for out in outputs:
            checker = (self._checkers.pop(out.request_id, None) if out.finished
                       else self._checkers.get(out.request_id))
            if checker is not None:
                self._text(out, checker, finish)
        return outputs

    def _text(self, out: RequestOutput, checker: StopChecker, finish: FinishStopped) -> None:
        ids = out.new_token_ids
        if out.finish_reason in ("abort", "error"):
            return
        if out.finish_reason == "stop" and out.stop_reason != REPETITION:
            ids = ids[:-1]  # ended on a token id (EOS, stop_token_ids): that token makes no text
        text = ""
        matched: str | None = None
        used = 0  # the tokens pushed, up to the one that completed a stop string
        for token_id in ids:
            delta, matched = checker.push(token_id)
            text += delta
            used += 1
            if matched is not None:
                break
        if matched is not None:
            out.text_delta = text
            self._stopped(out, matched, finish, len(out.new_token_ids) - used)
            return
        if out.finished:  # "stop" or "length": the held-back text is released
            tail, matched = checker.finish()
            text += tail
            if matched is not None:
                out.stop_reason = matched
        out.text_delta = text

    def _stopped(self, out: RequestOutput, stop: str, finish: FinishStopped,
                 extra: int = 0) -> None:
        """``out``'s text completed the stop string ``stop``: it is the request's last output.
        ``extra``: tokens of ``out`` after the one that completed it (a verify step's,
        kiln.engine.speculative): plain decoding never made them, so they are dropped here and
        in the scheduler's record of the request."""
        if extra:
            keep = len(out.new_token_ids) - extra
            del out.new_token_ids[keep:], out.new_logprobs[keep:], out.new_forced[keep:]
            del out.new_top_logprobs[keep:]
        if not out.finished:
            self._checkers.pop(out.request_id, None)
            final = finish(out.request_id, extra)
            if final is not None:
                out.metrics = final.metrics
                out.thinking_outcome = final.thinking_outcome
                out.num_output_tokens = final.num_output_tokens
                out.weight_spans, out.weight_version = final.weight_spans, final.weight_version
            out.finished = True
        elif extra:  # it had ended in the same step (a length or a stop token after the string)
            out.num_output_tokens -= extra
            out.weight_spans = trimmed(out.weight_spans, out.num_output_tokens)
            if out.metrics is not None:
                del out.metrics.token_times[-extra:], out.metrics.token_phases[-extra:]
        out.finish_reason, out.stop_reason = "stop", stop
