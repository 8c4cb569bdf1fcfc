"""GGUF vocabularies (kiln/model/checkpoint/gguf_tokenizer.py). SentencePiece
(``tokenizer.ggml.model = llama``: Llama 2, TinyLlama, Mistral): the tokenizer built from pieces and
scores gives the ids of llama.cpp's algorithm, written out here as the reference (merge the adjacent
pair whose joined piece scores highest, the leftmost of equals, until none joins; spell what is left
in byte pieces), and a model with such a vocabulary loads and chats through its template. The
byte-level BPE pre-tokenizers split as their families' tokenizers do. Where the llama.cpp tree
the peer benchmark builds is present, its own test vectors are checked for every vocabulary."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from tokenizers import decoders

from kiln.model import load_model
from kiln.model.checkpoint.gguf_tokenizer import _pre_tokenizer, tokenizer_from_gguf
from kiln.text.tokenizer import Tokenizer
from tests.e2e.app_client import app_client
from tests.tiny_models import (
    _CORPUS,
    SPM_SPACE,
    random_tensors,
    tiny_config,
    toy_spm_vocab,
    write_tiny_gguf,
)

VOCABS = Path(__file__).parents[2] / "build-peers/llama_cpp_python-0.3.36/vendor/llama.cpp/models"


def reference_ids(text: str, pieces: list[str], scores: list[float]) -> list[int]:
    """llama.cpp's SentencePiece tokenization of ``text`` (no BOS, space prefix on)."""
    if not text:
        return []
    ids = {p: i for i, p in enumerate(pieces)}
    symbols = list(SPM_SPACE + text.replace(" ", SPM_SPACE))
    while True:
        best: tuple[float, int] | None = None
        for i in range(len(symbols) - 1):
            joined = ids.get(symbols[i] + symbols[i + 1])
            if joined is not None and (best is None or scores[joined] > best[0]):
                best = (scores[joined], i)
        if best is None:
            break
        i = best[1]
        symbols[i:i + 2] = [symbols[i] + symbols[i + 1]]
    out: list[int] = []
    for s in symbols:
        out.extend([ids[s]] if s in ids else [ids[f"<0x{b:02X}>"] for b in s.encode()])
    return out


def _toy_tokenizer() -> tuple[Tokenizer, list[str], list[float]]:
    tokens, scores, types = toy_spm_vocab()
    meta = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.scores": scores, "tokenizer.ggml.token_type": types,
            "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
            "tokenizer.ggml.unknown_token_id": 0, "tokenizer.ggml.add_bos_token": True}
    return tokenizer_from_gguf(meta), tokens, scores


def _texts() -> list[str]:
    """The corpus, its pieces cut anywhere, and random strings over its characters and a few
    it has not (left to the byte pieces): spaces at either end, runs of spaces, newlines."""
    rng = random.Random(3)
    alphabet = [*sorted(set("".join(_CORPUS))), "\U0001F600", "\u4e16", "Q", "z", "\t", "\u00ff"]
    texts = [*_CORPUS, "", " ", "  ", "\n", " Hello world", "Hello  world ", "Qz\U0001F600"]
    for _ in range(300):
        line = rng.choice(_CORPUS)
        a = rng.randrange(len(line))
        texts.append(line[a:a + rng.randrange(1, 40)])
        texts.append("".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 30))))
    return texts


def test_ids_are_llama_cpps() -> None:
    tok, pieces, scores = _toy_tokenizer()
    for text in _texts():
        assert tok.encode(text, add_special_tokens=False) == reference_ids(text, pieces,
                                                                            scores), text


def test_text_round_trips_and_bos_is_added() -> None:
    tok, pieces, _ = _toy_tokenizer()
    for text in _texts():
        assert tok.decode(tok.encode(text, add_special_tokens=False)) == text, text
    assert tok.encode("Hello", add_special_tokens=True)[0] == 1  # tokenizer.ggml.add_bos_token
    assert tok.eos_token_ids == {2}
    # control tokens in the text are tokens, and the text after one gets the space prefix
    ids = tok.encode("<s>Hello</s>", add_special_tokens=False)
    assert ids[0] == 1 and ids[-1] == 2
    assert ids[1:-1] == reference_ids("Hello", pieces, _toy_tokenizer()[2])
    assert tok.decode(ids, skip_special_tokens=True) == "Hello"


def test_a_sentencepiece_gguf_model_loads_and_chats(tmp_path: Path) -> None:
    cfg = tiny_config("llama")
    path = write_tiny_gguf(tmp_path / "spm.gguf", cfg, random_tensors(cfg), spm=True)
    loaded = load_model(str(path))
    _, pieces, scores = _toy_tokenizer()
    text = "Hello, world!"
    assert loaded.tokenizer.encode(text, add_special_tokens=True) == [
        1, *reference_ids(text, pieces, scores)]
    with app_client(loaded, str(path)) as c:
        rendered = c.post("/v1/chat/completions/render", json={
            "messages": [{"role": "user", "content": "Hi"}]}).json()
        assert rendered["prompt"] == "<s>[INST] Hi [/INST]"
        # the BOS the template wrote, then the text after it with the space prefix
        assert rendered["token_ids"] == [1, *reference_ids("[INST] Hi [/INST]", pieces, scores)]
        body = c.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 6, "temperature": 0,
            "ignore_eos": True, "return_token_ids": True}).json()
        choice = body["choices"][0]
        assert len(choice["token_ids"]) == 6
        assert choice["message"]["content"] == loaded.tokenizer.decode(choice["token_ids"])
        # streamed, the deltas join to the same text (the decoder strips the prefix space of
        # a whole decode only; the incremental detokenizer decodes windows)
        stream = c.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 6, "temperature": 0,
            "ignore_eos": True, "stream": True, "logprobs": True})
        chunks = [json.loads(line[6:]) for line in stream.text.splitlines()
                  if line.startswith("data: {")]
        deltas = [ch["choices"][0] for ch in chunks if ch["choices"]]
        assert "".join(d["delta"].get("content") or "" for d in deltas) == \
            choice["message"]["content"]
        tokens = [t for d in deltas for t in (d.get("logprobs") or {}).get("content") or []]
        assert len(tokens) == 6


@pytest.mark.skipif(not VOCABS.is_dir(), reason="no llama.cpp tree (bash bench/peers/"
                                                "build_llama_cpp.sh unpacks one)")
@pytest.mark.parametrize("name", ["llama-spm", "phi-3", "gpt-2", "llama-bpe", "qwen2", "qwen35",
                                  "deepseek-coder"])
def test_llama_cpps_own_vectors(name: str) -> None:
    """llama.cpp's test-tokenizer-0 inputs and ids for its vocabularies of those families."""
    from kiln.model.checkpoint.gguf_index import GGUFIndex

    base = VOCABS / f"ggml-vocab-{name}.gguf"
    tok = tokenizer_from_gguf(GGUFIndex(base).metadata)
    texts = base.with_name(base.name + ".inp").read_text(encoding="utf-8").split(
        "\n__ggml_vocab_test__\n")
    texts[-1] = texts[-1].removesuffix("\n__ggml_vocab_test__")
    wants = base.with_name(base.name + ".out").read_text(encoding="utf-8").split("\n")
    for text, want in zip(texts, wants, strict=False):
        ids = tok.encode(text, add_special_tokens=False)
        assert ids == [int(x) for x in want.split()], text
        assert tok.decode(ids) == text


@pytest.mark.parametrize(("pre", "text", "pieces"), [
    # Qwen3.5 keeps combining marks with their letters; Qwen2 splits them off
    ("qwen35", "cafe\u0301 ok", ["cafe\u0301", " ok"]),
    ("qwen2", "cafe\u0301 ok", ["cafe", "\u0301", " ok"]),
    # Tekken: a word splits before an upper-case run; digits one by one
    ("tekken", "HelloWorld JSONParser 42", ["Hello", "World", " JSONParser", " ", "4", "2"]),
    # DeepSeek Coder: line breaks, letter runs, punctuation runs and digits apart
    ("deepseek-coder", "if x:\n  return 42", ["if", " x", ":", "\n", " ", " return", " ", "4",
                                               "2"]),
])
def test_pre_tokenizers_split_as_their_families(pre: str, text: str, pieces: list[str]) -> None:
    split = [p for p, _ in _pre_tokenizer(pre).pre_tokenize_str(text)]
    assert [decoders.ByteLevel().decode([p]) for p in split] == pieces
