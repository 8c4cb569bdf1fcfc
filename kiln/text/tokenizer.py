"""Tokenizer wrapper over the `tokenizers` package, with the model's special-token facts; and
decoding text back from ids (at the end of the module): incremental detokenization that never
emits half a UTF-8 character, and decoding a candidate token in context.

Incremental decoding: text is produced by decoding a small window of ids: ``prefix`` ids
(already emitted, kept so that decoders which treat the first token specially behave as in a
full decode) plus the ids not yet emitted. While the decoded window ends in U+FFFD (an
incomplete multi-byte character), the text is held back. The concatenation of everything
returned by :meth:`IncrementalDetokenizer.push` and :meth:`IncrementalDetokenizer.flush` equals
``tokenizer.decode(all_ids)`` for byte-level tokenizers.

``skip_special_tokens`` leaves special tokens out of the text; without it,
``spaces_between_special_tokens`` puts a space between each special token's text and the text
beside it, as Hugging Face's slow tokenizers (and vLLM's detokenizer over them) do.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import tokenizers


def _token_content(value: Any) -> str | None:
    """tokenizer_config entries are a string or an AddedToken dict ``{"content": ...}``."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def _ids(value: Any) -> list[int]:
    """``eos_token_id`` may be an int, a list of ints, or absent."""
    if isinstance(value, bool) or value is None:
        return []
    if isinstance(value, int):
        return [value]
    if isinstance(value, list):
        return [int(v) for v in value if isinstance(v, int) and not isinstance(v, bool)]
    return []


class Tokenizer:
    """Encode/decode plus the special tokens a server needs (BOS, EOS ids)."""

    def __init__(self, tok: tokenizers.Tokenizer, *, eos_token_ids: Iterable[int] = (),
                 bos_token: str | None = None, eos_token: str | None = None) -> None:
        self._tok = tok
        self.vocab_size: int = tok.get_vocab_size(with_added_tokens=True)
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.bos_token_id: int | None = tok.token_to_id(bos_token) if bos_token else None
        eos = set(eos_token_ids)
        if eos_token is not None:
            eos_id = tok.token_to_id(eos_token)
            if eos_id is not None:
                eos.add(eos_id)
        self.eos_token_ids: frozenset[int] = frozenset(eos)
        self.special_ids: frozenset[int] = frozenset(
            i for i, t in tok.get_added_tokens_decoder().items() if t.special)
        self._max_chars: int | None = None  # characters one token can cover, at most

    @classmethod
    def from_hf(cls, tokenizer_json: str | Path, *, tokenizer_config: Mapping[str, Any] | None
                = None, config: Mapping[str, Any] | None = None,
                generation_config: Mapping[str, Any] | None = None) -> Tokenizer:
        """From ``tokenizer.json`` plus the folder's config dicts (any may be empty).

        EOS ids are the union of ``config.json``'s and ``generation_config.json``'s
        ``eos_token_id`` (an int or a list) and ``tokenizer_config.json``'s ``eos_token``.
        """
        tok = tokenizers.Tokenizer.from_file(str(tokenizer_json))
        tc = tokenizer_config or {}
        eos_ids = _ids((config or {}).get("eos_token_id"))
        eos_ids += _ids((generation_config or {}).get("eos_token_id"))
        bos = _token_content(tc.get("bos_token"))
        # tokenizer_config decides when it names bos_token (even as null, as Qwen does)
        if "bos_token" not in tc and (config or {}).get("bos_token_id") is not None:
            bos_id = _ids((config or {}).get("bos_token_id"))
            bos = tok.id_to_token(bos_id[0]) if bos_id else None
        eos = _token_content(tc.get("eos_token"))
        if eos is None and eos_ids:
            eos = tok.id_to_token(eos_ids[0])
        return cls(tok, eos_token_ids=eos_ids, bos_token=bos, eos_token=eos)

    @property
    def backend(self) -> tokenizers.Tokenizer:
        """The underlying `tokenizers.Tokenizer`."""
        return self._tok

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return str(self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def surely_over(self, text: str, tokens: int) -> bool:
        """Whether ``text`` must encode to more than ``tokens`` tokens, known without encoding
        it (encoding holds the GIL: a 7 MB prompt had stalled every stream for ~4 s before its
        context_length_exceeded). A token covers at most as many characters as its longest
        vocabulary string, with no normalizer; a normalizer may compose up to a few characters
        into one (NFC, NFKC), so then 4 times that."""
        if self._max_chars is None:
            longest = max((len(t) for t in self._tok.get_vocab(with_added_tokens=True)), default=1)
            self._max_chars = longest * (1 if self._tok.normalizer is None else 4)
        return len(text) > self._max_chars * tokens

    def token_to_id(self, token: str) -> int | None:
        tid = self._tok.token_to_id(token)
        return None if tid is None else int(tid)

    def id_to_token(self, token_id: int) -> str | None:
        tok = self._tok.id_to_token(token_id)
        return None if tok is None else str(tok)

    def is_special(self, token_id: int) -> bool:
        return token_id in self.special_ids

    def content_sha256(self) -> str:
        """sha256 of the vocabulary (token -> id, added tokens included) as canonical JSON."""
        vocab = self._tok.get_vocab(with_added_tokens=True)
        data = json.dumps(vocab, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
        return hashlib.sha256(data.encode("utf-8")).hexdigest()

    def config_sha256(self) -> str:
        """sha256 of the special-token configuration (BOS/EOS, EOS ids, special ids)."""
        data = json.dumps({
            "bos_token": self.bos_token, "bos_token_id": self.bos_token_id,
            "eos_token": self.eos_token, "eos_token_ids": sorted(self.eos_token_ids),
            "special_ids": sorted(self.special_ids),
        }, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
        return hashlib.sha256(data.encode("utf-8")).hexdigest()


# -- decoding --------------------------------------------------------------------------------------
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
