"""Build a `tokenizers` tokenizer from GGUF metadata (``tokenizer.ggml.*``): byte-level BPE
(``gpt2``: Llama 3, Qwen, SmolLM) or SentencePiece BPE (``llama``: Llama 2, TinyLlama, Mistral).

A SentencePiece GGUF carries pieces and scores, no merges. llama.cpp tokenizes it by merging,
again and again, the adjacent pair whose joined piece is in the vocabulary with the highest
score (the leftmost of equals), and spells what is left in byte pieces (``<0x41>``). A BPE
whose merges are every split of every piece into two pieces, ranked by the joined piece's
score, merges alike where every character of a piece is itself a piece, as in a trained
vocabulary (Llama 2's and Phi-3's are); `tokenizers` runs it with byte fallback (checked against llama.cpp's own
test vectors: tests/model/test_gguf_vocabularies.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import tokenizers
from tokenizers import AddedToken, decoders, models, normalizers, pre_tokenizers, processors

from kiln.model.checkpoint.config import UnsupportedModelError
from kiln.text.tokenizer import Tokenizer

# llama.cpp token types
_UNKNOWN = 2
_CONTROL = 3
_USER_DEFINED = 4

# Pre-tokenizer split patterns of the BPE families llama.cpp names in tokenizer.ggml.pre.
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                 r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
                r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# Qwen3.5's: Qwen2's with combining marks (\p{M}) kept with the letters
_QWEN35_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}|"
                 r" ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# Mistral's Tekken (Mistral Nemo, Mistral Small 3; llama models in GGUF): words split before an
# upper-case run, as its tokenizer.json's pattern does
_TEKKEN_SPLIT = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|"
                 r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|"
                 r"\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# DeepSeek Coder's (a llama model): one split after another
_DEEPSEEK_CODER_SPLITS = (r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+",
                          "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+", r"\p{N}")


def _pre_tokenizer(pre: str) -> pre_tokenizers.PreTokenizer:
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    if pre == "smollm":
        return pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    if pre in ("llama-bpe", "llama3", "smaug-bpe"):
        split = pre_tokenizers.Split(tokenizers.Regex(_LLAMA3_SPLIT), behavior="isolated")
        return pre_tokenizers.Sequence([split, byte_level])
    if pre in ("qwen2", "deepseek-r1-qwen", "qwen35", "tekken"):
        pattern = {"qwen35": _QWEN35_SPLIT, "tekken": _TEKKEN_SPLIT}.get(pre, _QWEN2_SPLIT)
        split = pre_tokenizers.Split(tokenizers.Regex(pattern), behavior="isolated")
        return pre_tokenizers.Sequence([split, byte_level])
    if pre == "deepseek-coder":
        return pre_tokenizers.Sequence([
            *(pre_tokenizers.Split(tokenizers.Regex(p), behavior="isolated")
              for p in _DEEPSEEK_CODER_SPLITS), byte_level])
    if pre in ("gpt-2", "gpt2", "default", ""):
        return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    raise UnsupportedModelError(f"GGUF tokenizer pre-tokenizer {pre!r} is not supported")


_SPACE = "\u2581"  # SentencePiece's visible space


def _byte_level(meta: Mapping[str, Any], vocab: dict[str, int]) -> tokenizers.Tokenizer:
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges", [])]
    pre = str(meta.get("tokenizer.ggml.pre", "default"))
    bpe = models.BPE(vocab=vocab, merges=merges,
                     ignore_merges=pre in ("llama-bpe", "llama3", "tekken"))
    tok = tokenizers.Tokenizer(bpe)
    tok.pre_tokenizer = _pre_tokenizer(pre)
    tok.decoder = decoders.ByteLevel()
    return tok


def spm_merges(tokens: list[str], scores: list[float],
               vocab: dict[str, int]) -> list[tuple[str, str]]:
    """Every split of every piece into two pieces of the vocabulary, the joined piece's score
    highest first (its id breaks ties, so the order is total)."""
    ranked = sorted(range(len(tokens)), key=lambda i: (-scores[i], i))
    return [(piece[:cut], piece[cut:]) for i in ranked for piece in (tokens[i],)
            for cut in range(1, len(piece)) if piece[:cut] in vocab and piece[cut:] in vocab]


def _sentencepiece(meta: Mapping[str, Any], tokens: list[str],
                   vocab: dict[str, int]) -> tokenizers.Tokenizer:
    scores = [float(x) for x in meta.get("tokenizer.ggml.scores", [0.0] * len(tokens))]
    unk_id = meta.get("tokenizer.ggml.unknown_token_id")
    unk = tokens[unk_id] if isinstance(unk_id, int) and 0 <= unk_id < len(tokens) else None
    tok = tokenizers.Tokenizer(models.BPE(
        vocab=vocab, merges=spm_merges(tokens, scores, vocab), unk_token=unk, fuse_unk=True,
        byte_fallback=True))
    # llama.cpp puts a space before the text and after each special token (tokenizers
    # normalizes each stretch between added tokens apart), then spells spaces as U+2581
    prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", True))
    spaces = normalizers.Replace(" ", _SPACE)
    tok.normalizer = normalizers.Sequence([normalizers.Prepend(_SPACE), spaces]) if prefix \
        else spaces
    steps = [decoders.Replace(_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    tok.decoder = decoders.Sequence(steps + ([decoders.Strip(" ", 1, 0)] if prefix else []))
    return tok


def tokenizer_from_gguf(meta: Mapping[str, Any]) -> Tokenizer:
    """The tokenizer a GGUF file describes: byte-level BPE (``tokenizer.ggml.model = gpt2``) or
    SentencePiece BPE (``llama``)."""
    kind = meta.get("tokenizer.ggml.model")
    if kind not in ("gpt2", "llama"):
        raise UnsupportedModelError(
            f"GGUF tokenizer model {kind!r} is not supported (byte-level BPE 'gpt2' and "
            "SentencePiece 'llama' are)")
    tokens: list[str] = list(meta["tokenizer.ggml.tokens"])
    types: list[int] = list(meta.get("tokenizer.ggml.token_type", [1] * len(tokens)))
    vocab = {tok: i for i, tok in enumerate(tokens)}
    tok = _byte_level(meta, vocab) if kind == "gpt2" else _sentencepiece(meta, tokens, vocab)
    special = (_CONTROL,) if kind == "gpt2" else (_CONTROL, _UNKNOWN)  # <unk> in SentencePiece
    tok.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                            for i, t in enumerate(types) if t in special])
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
