"""Engine token logprobs -> the wire: OpenAI's completions arrays and chat `content[]`.

The values come from the engine's output stage (``TokenLogprobs``: the distribution the sampler
used); echoed prompt positions come from the scoring route (``PositionScore``). A token's text
is decoded after up to four preceding tokens, so a character split across tokens belongs to the
token that completes it and the texts join into the choice's text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kiln.api._generated.wire import ChatTokenLogprob, ChatTopLogprob
from kiln.api._generated.wire import CompletionLogprobs as WireLogprobs
from kiln.api.backend import PositionScore
from kiln.engine.outputs import TokenLogprobs
from kiln.text.token_bytes import token_bytes
from kiln.text.tokenizer import decode_in_context

CONTEXT = 4  # preceding tokens decoded with a token, as scoring's decoded_token


@dataclass
class CompletionLogprobs:
    """OpenAI's legacy arrays for one choice, built position by position."""

    as_ids: bool = False  # return_tokens_as_token_ids
    tokens: list[str] = field(default_factory=list)
    token_logprobs: list[float | None] = field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = field(default_factory=list)
    text_offset: list[int] = field(default_factory=list)
    offset: int = 0  # characters so far

    def _name(self, text: str, token_id: int) -> str:
        return f"token_id:{token_id}" if self.as_ids else text

    def add(self, tokenizer: Any, context: Sequence[int], token_id: int, logprob: float | None,
            top: Sequence[tuple[int, float]] | None) -> None:
        decode = decode_in_context(tokenizer, list(context[-CONTEXT:]))
        text = decode(token_id)
        self.tokens.append(self._name(text, token_id))
        self.token_logprobs.append(logprob)
        if top is None or logprob is None:
            self.top_logprobs.append(None)
        else:
            entries: dict[str, float] = {}
            for tid, lp in top:
                entries.setdefault(self._name(decode(tid), tid), lp)
            entries.setdefault(self._name(text, token_id), logprob)
            self.top_logprobs.append(entries)
        self.text_offset.append(self.offset)
        self.offset += len(text)

    def add_echo(self, tokenizer: Any, prompt: Sequence[int], scores: Sequence[PositionScore]
                 ) -> None:
        """The prompt's positions: the first has no logprob; the others the scoring route's."""
        self.add(tokenizer, (), prompt[0], None, None)
        for pos, s in enumerate(scores, start=1):
            self.add(tokenizer, prompt[max(0, pos - CONTEXT):pos], prompt[pos], s.logprob,
                     list(zip(s.top_ids, s.top_logprobs, strict=True)))

    def add_generated(self, tokenizer: Any, context: Sequence[int], ids: Sequence[int],
                      entries: Sequence[TokenLogprobs | None]) -> None:
        ctx = list(context[-CONTEXT:])
        for tid, entry in zip(ids, entries, strict=True):
            if entry is None:  # forced by a thinking budget: no distribution it was drawn from
                self.add(tokenizer, ctx, tid, None, None)
            else:
                self.add(tokenizer, ctx, tid, entry.logprob,
                         list(zip(entry.top_ids, entry.top_logprobs, strict=True)))
            ctx = [*ctx[1 - CONTEXT:], tid]

    def wire(self) -> WireLogprobs:
        return WireLogprobs(tokens=self.tokens, token_logprobs=self.token_logprobs,
                            top_logprobs=self.top_logprobs, text_offset=self.text_offset)


def chat_content(tokenizer: Any, context: Sequence[int], ids: Sequence[int],
                 entries: Sequence[TokenLogprobs | None], *, as_ids: bool = False
                 ) -> list[ChatTokenLogprob]:
    """Chat `logprobs.content[]` for generated ``ids`` after ``context``. A token the thinking
    budget forced (no entry) carries logprob -9999.0, OpenAI's floor, and no alternatives.
    ``as_ids`` (return_tokens_as_token_ids): each token is written ``token_id:<id>`` (its bytes
    stay the token's own)."""
    out: list[ChatTokenLogprob] = []
    ctx = list(context[-CONTEXT:])
    for tid, entry in zip(ids, entries, strict=True):
        decode = decode_in_context(tokenizer, ctx)
        top = [] if entry is None else [
            ChatTopLogprob(token=_token(decode, t, as_ids), logprob=lp,
                           bytes=token_bytes(tokenizer, t))
            for t, lp in zip(entry.top_ids, entry.top_logprobs, strict=True)]
        out.append(ChatTokenLogprob(
            token=_token(decode, tid, as_ids),
            logprob=-9999.0 if entry is None else entry.logprob,
            bytes=token_bytes(tokenizer, tid), top_logprobs=top))
        ctx = [*ctx[1 - CONTEXT:], tid]
    return out


def _token(decode: Any, token_id: int, as_ids: bool) -> str:
    return f"token_id:{token_id}" if as_ids else str(decode(token_id))
