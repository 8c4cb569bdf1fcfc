from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kiln.text import IncrementalDetokenizer, Tokenizer
from kiln.text.tokenizer import decode_text

SAMPLES = ["caf\u00e9 \u4f60\u597d\u4e16\u754c \U0001F600\U0001F680 na\u00efve",
           "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8 \U0001F9D1\u200D\U0001F4BB ok",
           "plain ascii, then \u00e9t\u00e9 and \U0001F600"]


def _stream(tok: Tokenizer, ids: list[int], skip: bool = False) -> list[str]:
    detok = IncrementalDetokenizer(tok, skip_special_tokens=skip)
    chunks = [detok.push(i) for i in ids]
    chunks.append(detok.flush())
    return chunks


def _byte_ids(tok: Tokenizer, text: str) -> list[int]:
    """One id per UTF-8 byte (byte-level alphabet tokens): the worst case for streaming."""
    table = {b: c for b, c in enumerate(_bytes_to_unicode())}
    ids = [tok.token_to_id(table[b]) for b in text.encode("utf-8")]
    assert all(i is not None for i in ids)
    return [i for i in ids if i is not None]


def _bytes_to_unicode() -> list[str]:
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    out: dict[int, str] = {b: chr(b) for b in keep}
    n = 0
    for b in range(256):
        if b not in out:
            out[b] = chr(256 + n)
            n += 1
    return [out[b] for b in range(256)]


def test_multibyte_held_back_until_complete(tiny_tok: Tokenizer) -> None:
    ids = _byte_ids(tiny_tok, "\u00e9\U0001F600")
    detok = IncrementalDetokenizer(tiny_tok)
    assert [detok.push(i) for i in ids] == ["", "\u00e9", "", "", "", "\U0001F600"]
    assert detok.flush() == ""


def test_byte_by_byte_equals_one_shot(tiny_tok: Tokenizer, smollm_tok: Tokenizer) -> None:
    for tok in (tiny_tok, smollm_tok):
        for text in SAMPLES:
            for ids in (_byte_ids(tok, text), tok.encode(text)):
                chunks = _stream(tok, ids)
                assert "".join(chunks) == tok.decode(ids) == text
                assert not any("\ufffd" in c for c in chunks)


def test_random_ids_equal_one_shot(tiny_tok: Tokenizer) -> None:
    rng = random.Random(1234)
    for _ in range(300):
        ids = [rng.randrange(tiny_tok.vocab_size) for _ in range(rng.randrange(1, 30))]
        for skip in (False, True):
            assert "".join(_stream(tiny_tok, ids, skip)) == tiny_tok.decode(ids, skip)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from(["a", " ", "\u00e9", "\u4f60", "\U0001F600", "<|im_end|>",
                                 "<think>", "\n", "x1", "\u0416"]), max_size=25),
       st.booleans())
def test_text_streams_without_replacement_chars(tiny_tok: Tokenizer, parts: list[str],
                                                skip: bool) -> None:
    text = "".join(parts)
    for ids in (tiny_tok.encode(text), _byte_ids(tiny_tok, text.replace("<|im_end|>", "")
                                                 .replace("<think>", ""))):
        chunks = _stream(tiny_tok, ids, skip)
        assert "".join(chunks) == tiny_tok.decode(ids, skip_special_tokens=skip)
        assert not any("\ufffd" in c for c in chunks)


@pytest.mark.parametrize("text", ["x 世界", "héllo 世界 🙂 👩‍👩‍👧 done", "plain ascii words"])
def test_decoded_tokens_in_context_join_to_the_text(smollm_tok: Tokenizer, text: str) -> None:
    """Scoring's decoded_token: a token that completes a character split across byte tokens
    carries the whole character, one that does not carries "" (it had given U+FFFD pieces)."""
    from kiln.text.tokenizer import decode_in_context

    ids = smollm_tok.encode(text, add_special_tokens=False)
    pieces = [decode_in_context(smollm_tok, ids[max(0, i - 4):i])(t) for i, t in enumerate(ids)]
    assert "".join(pieces) == text
    assert not any("\ufffd" in p for p in pieces)
    if "世" in text:
        assert "世" in pieces or any(p.endswith("世") for p in pieces)


@pytest.mark.parametrize(("skip", "spaces", "want"), [
    (True, True, "assistant\nHi"),
    (False, False, "<|im_start|>assistant\nHi<|im_end|><|im_end|>"),
    (False, True, "<|im_start|> assistant\nHi <|im_end|> <|im_end|>"),
])
def test_special_tokens_kept_and_spaced_on_request(smollm_tok: Tokenizer, skip: bool,
                                                   spaces: bool, want: str) -> None:
    """skip_special_tokens false keeps their text; spaces_between_special_tokens puts a space
    beside each, as Hugging Face's slow tokenizers do. Streamed equals decoded at once."""
    ids = smollm_tok.encode("<|im_start|>assistant\nHi<|im_end|><|im_end|>")
    assert sum(map(smollm_tok.is_special, ids)) == 3  # the markers are single special tokens
    detok = IncrementalDetokenizer(smollm_tok, skip_special_tokens=skip,
                                   spaces_between_special_tokens=spaces)
    chunks = [detok.push(i) for i in ids]
    chunks.append(detok.flush())
    assert "".join(chunks) == decode_text(smollm_tok, ids, skip, spaces) == want
