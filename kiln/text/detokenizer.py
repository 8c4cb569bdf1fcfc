"""Incremental detokenization that never emits half a UTF-8 character.

Text is produced by decoding a small window of ids: ``prefix`` ids (already emitted, kept so
that decoders which treat the first token specially behave as in a full decode) plus the ids not
yet emitted. While the decoded window ends in U+FFFD (an incomplete multi-byte character), the
text is held back. The concatenation of everything returned by :meth:`push` and :meth:`flush`
equals ``tokenizer.decode(all_ids)`` for byte-level tokenizers.

``skip_special_tokens`` leaves special tokens out of the text; without it,
``spaces_between_special_tokens`` puts a space between each special token's text and the text
beside it, as Hugging Face's slow tokenizers (and vLLM's detokenizer over them) do.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kiln.text.tokenizer import Tokenizer

_REPLACEMENT = "\ufffd"


def decode_text(tokenizer: Tokenizer, ids: list[int], skip_special_tokens: bool,
                spaces_between_special_tokens: bool = False) -> str:
    """``tokenizer.decode``; when special tokens are kept and spaced, the runs of ordinary
    tokens and each special token decoded apart and joined with single spaces."""
    if skip_special_tokens or not spaces_between_special_tokens:
        return tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)
    parts: list[str] = []
    run: list[int] = []
    for token_id in ids:
        if tokenizer.is_special(token_id):
            if run:
                parts.append(tokenizer.decode(run))
                run = []
            parts.append(tokenizer.decode([token_id]))
        else:
            run.append(token_id)
    if run:
        parts.append(tokenizer.decode(run))
    return " ".join(parts)


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = False,
                 spaces_between_special_tokens: bool = False) -> None:
        self._tok = tokenizer
        self._skip = skip_special_tokens
        self._spaces = spaces_between_special_tokens
        self.ids: list[int] = []
        self._prefix = 0  # window start: first id of the last emitted chunk
        self._read = 0  # ids before this index have been emitted
        self.text = ""  # everything emitted so far

    def _decode(self, start: int, end: int | None = None) -> str:
        return decode_text(self._tok, self.ids[start:end], self._skip, self._spaces)

    def push(self, token_id: int) -> str:
        """Add one id; return the text that became stable (may be "")."""
        self.ids.append(token_id)
        prefix_text = self._decode(self._prefix, self._read)
        full = self._decode(self._prefix)
        if full.endswith(_REPLACEMENT) or len(full) <= len(prefix_text):
            return ""
        new = full[len(prefix_text):]
        self._prefix = self._read
        self._read = len(self.ids)
        self.text += new
        return new

    def flush(self) -> str:
        """Return whatever is still held back (an incomplete character decodes as U+FFFD)."""
        prefix_text = self._decode(self._prefix, self._read)
        full = self._decode(self._prefix)
        new = full[len(prefix_text):]
        self._prefix = self._read
        self._read = len(self.ids)
        self.text += new
        return new


def decode_in_context(tokenizer: Any, tail: list[int]) -> Callable[[int], str]:
    """A decoder of candidate tokens at the position after ``tail`` (the preceding tokens), for
    logprob entries' ``decoded_token``: decode(tail + token) minus the complete characters of
    decode(tail). A token that completes a character split across tokens carries the whole
    character; one that leaves it incomplete carries only its complete characters (often ""),
    so joining the observed tokens' texts gives the text. ``tail`` is decoded once."""
    before = str(tokenizer.decode(tail)).rstrip(_REPLACEMENT)

    def decode(token_id: int) -> str:
        after = str(tokenizer.decode([*tail, token_id]))
        if not after.startswith(before):
            return str(tokenizer.decode([token_id]))
        return after[len(before):].rstrip(_REPLACEMENT)

    return decode
