from __future__ import annotations

import pytest

from kiln.text import Tokenizer

CHATML = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging"
          " Face<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
          "<|im_start|>assistant\n")


def test_gguf_tokenizer_chatml_ids(smollm_tok: Tokenizer) -> None:
    ids = smollm_tok.encode(CHATML)
    assert ids[:7] == [1, 9690, 198, 2683, 359, 253, 5356]
    assert len(ids) == 37
    assert smollm_tok.decode(ids) == CHATML
    assert smollm_tok.vocab_size == 49152
    assert smollm_tok.eos_token_ids == frozenset({2})
    assert (smollm_tok.bos_token, smollm_tok.eos_token) == ("<|im_start|>", "<|im_end|>")


def test_gguf_tokenizer_round_trips(smollm_tok: Tokenizer) -> None:
    for text in ["  two  spaces\tand\ttabs\r\n", "digits 1234567 and 3.14", "don't we'll",
                 "caf\u00e9 \u4f60\u597d \U0001F600", "def f(x):\n    return x**2\n"]:
        assert smollm_tok.decode(smollm_tok.encode(text)) == text
    assert smollm_tok.encode("12") == [smollm_tok.token_to_id("1"), smollm_tok.token_to_id("2")]


def test_special_tokens_and_lookup(tiny_tok: Tokenizer) -> None:
    im_end = tiny_tok.token_to_id("<|im_end|>")
    assert im_end is not None and im_end in tiny_tok.eos_token_ids
    assert tiny_tok.id_to_token(im_end) == "<|im_end|>"
    assert tiny_tok.token_to_id("<no such token>") is None
    ids = tiny_tok.encode("<|im_start|>hi<|im_end|>")
    assert ids[0] == tiny_tok.token_to_id("<|im_start|>") and ids[-1] == im_end
    assert tiny_tok.decode(ids, skip_special_tokens=True) == "hi"
    # <think> is an added but not special token: kept when skipping specials
    think = tiny_tok.encode("<think>x</think>")
    assert tiny_tok.decode(think, skip_special_tokens=True) == "<think>x</think>"


def test_hashes(tiny_tok: Tokenizer, smollm_tok: Tokenizer) -> None:
    assert tiny_tok.content_sha256() != smollm_tok.content_sha256()
    assert len(tiny_tok.content_sha256()) == 64
    same = Tokenizer(tiny_tok.backend, eos_token_ids=[0], eos_token="<|im_end|>")
    assert same.content_sha256() == tiny_tok.content_sha256()
    assert same.config_sha256() != tiny_tok.config_sha256()


@pytest.mark.parametrize("text", [
    "#" * 800, " " * 2000, "\n" + " " * 79 + "x", "plain words " * 50, "世界🙂" * 100,
    "a" * 3000, "1234567890" * 30,
])
def test_surely_over_never_claims_a_text_that_fits(smollm_tok: Tokenizer, text: str) -> None:
    """The cheap bound that rejects huge prompts before encoding them is sound: a text that
    encodes to n tokens is never 'surely over' n; and far longer texts are caught."""
    n = len(smollm_tok.encode(text))
    assert not smollm_tok.surely_over(text, n)
    assert smollm_tok.surely_over(text * 200, n)
