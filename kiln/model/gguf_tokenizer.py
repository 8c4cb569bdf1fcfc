"""Build a `tokenizers` tokenizer from GGUF metadata (``tokenizer.ggml.*``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import tokenizers
from tokenizers import AddedToken, decoders, models, pre_tokenizers, processors

from kiln.model.config import UnsupportedModelError
from kiln.text.tokenizer import Tokenizer

# llama.cpp token types
_CONTROL = 3
_USER_DEFINED = 4

# Pre-tokenizer split patterns of the BPE families llama.cpp names in tokenizer.ggml.pre.
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                 r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
                r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def _pre_tokenizer(pre: str) -> pre_tokenizers.PreTokenizer:
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    if pre == "smollm":
        return pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    if pre in ("llama-bpe", "llama3", "smaug-bpe"):
        split = pre_tokenizers.Split(tokenizers.Regex(_LLAMA3_SPLIT), behavior="isolated")
        return pre_tokenizers.Sequence([split, byte_level])
    if pre in ("qwen2", "deepseek-r1-qwen"):
        split = pre_tokenizers.Split(tokenizers.Regex(_QWEN2_SPLIT), behavior="isolated")
        return pre_tokenizers.Sequence([split, byte_level])
    if pre in ("gpt-2", "gpt2", "default", ""):
        return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    raise UnsupportedModelError(f"GGUF tokenizer pre-tokenizer {pre!r} is not supported")


def tokenizer_from_gguf(meta: Mapping[str, Any]) -> Tokenizer:
    """The byte-level BPE tokenizer a GGUF file describes (``tokenizer.ggml.model = gpt2``)."""
    kind = meta.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise UnsupportedModelError(
            f"GGUF tokenizer model {kind!r} is not supported (only byte-level BPE 'gpt2')")
    tokens: list[str] = list(meta["tokenizer.ggml.tokens"])
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges", [])]
    types: list[int] = list(meta.get("tokenizer.ggml.token_type", [1] * len(tokens)))
    vocab = {tok: i for i, tok in enumerate(tokens)}
    pre = str(meta.get("tokenizer.ggml.pre", "default"))
    bpe = models.BPE(vocab=vocab, merges=merges, ignore_merges=pre in ("llama-bpe", "llama3"))
    tok = tokenizers.Tokenizer(bpe)
    tok.pre_tokenizer = _pre_tokenizer(pre)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                            for i, t in enumerate(types) if t == _CONTROL])
    tok.add_tokens([AddedToken(tokens[i], special=False, normalized=False)
                    for i, t in enumerate(types) if t == _USER_DEFINED])

    def token_at(key: str) -> str | None:
        idx = meta.get(key)
        return tokens[int(idx)] if isinstance(idx, int) and 0 <= idx < len(tokens) else None

    bos = token_at("tokenizer.ggml.bos_token_id")
    eos = token_at("tokenizer.ggml.eos_token_id")
    if bos is not None and meta.get("tokenizer.ggml.add_bos_token", False):
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
            special_tokens=[(bos, vocab[bos])])
    eos_ids = [int(meta[k]) for k in ("tokenizer.ggml.eos_token_id",
                                      "tokenizer.ggml.eot_token_id",
                                      "tokenizer.ggml.eom_token_id") if k in meta]
    return Tokenizer(tok, eos_token_ids=eos_ids, bos_token=bos, eos_token=eos)
