"""Incremental detokenization that never emits half a UTF-8 character.

Text is produced by decoding a small window of ids: ``prefix`` ids (already emitted, kept so
that decoders which treat the first token specially behave as in a full decode) plus the ids not
yet emitted. While the decoded window ends in U+FFFD (an incomplete multi-byte character), the
text is held back. The concatenation of everything returned by :meth:`push` and :meth:`flush`
equals ``tokenizer.decode(all_ids)`` for byte-level tokenizers.
"""

from __future__ import annotations

from kiln.text.tokenizer import Tokenizer

_REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = False) -> None:
        self._tok = tokenizer
        self._skip = skip_special_tokens
        self.ids: list[int] = []
        self._prefix = 0  # window start: first id of the last emitted chunk
        self._read = 0  # ids before this index have been emitted
        self.text = ""  # everything emitted so far

    def _decode(self, start: int, end: int | None = None) -> str:
        return self._tok.decode(self.ids[start:end], skip_special_tokens=self._skip)

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
