"""A token's own bytes, for logprob entries (OpenAI's `bytes`): a byte-level BPE token may be
part of a UTF-8 character, so its bytes are read from its vocabulary entry, not its decoded
text (which would be U+FFFD)."""

from __future__ import annotations

import re
from functools import cache
from typing import Any

_BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")


@cache
def _byte_decoder() -> dict[str, int]:
    """GPT-2's bytes_to_unicode, inverted: the printable character each byte is written as."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
            *range(ord("®"), ord("ÿ") + 1)]
    chars = list(keep)
    extra = 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(keep, chars, strict=True)}


def _byte_level(tokenizer: Any) -> bool:
    backend = getattr(tokenizer, "backend", None)
    return type(getattr(backend, "decoder", None)).__name__ == "ByteLevel"


def token_bytes(tokenizer: Any, token_id: int) -> list[int]:
    """The bytes token ``token_id`` stands for (its decoded text's UTF-8 when unknown)."""
    id_to_token = getattr(tokenizer, "id_to_token", None)
    piece = id_to_token(token_id) if id_to_token is not None else None
    if isinstance(piece, str):
        fallback = _BYTE_FALLBACK.fullmatch(piece)
        if fallback is not None:
            return [int(fallback.group(1), 16)]
        if _byte_level(tokenizer):
            decoder = _byte_decoder()
            if all(ch in decoder for ch in piece):
                return [decoder[ch] for ch in piece]
    return list(str(tokenizer.decode([token_id])).encode("utf-8"))
