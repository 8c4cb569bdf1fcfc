"""A random-weight F16 GGUF with a real model's shapes, for timing files like the ones users
bring (no model hub is reachable here). Decode speed depends on the shapes and the tensor
types, not on the values: greedy with ``ignore_eos`` runs every token either way.

``qwen2.5-0.5b`` is Qwen2.5-0.5B-Instruct's (and Qwen2.5-Coder-0.5B's) architecture: qwen2,
24 layers, hidden 896, FFN 4864, 14 heads of 64 with 2 KV heads, q/k/v biases, tied embedding,
vocabulary 151,936. ``llama-quantize`` then writes it as its users download it (Q4_K_M:
896-column matrices are not a multiple of the K-quants' 256 and fall back to Q5_0, as in the
published files). ``llama3.2-1b`` is Llama 3.2 1B Instruct's: llama, 16 layers, hidden 2048,
FFN 8192, 32 heads of 64 with 8 KV heads, tied embedding, vocabulary 128,256, and its llama3
rope scaling as ``rope_freqs.weight``. The tokenizer is the default model's (its tokens, merges and chat template),
the vocabulary padded with unused tokens to the model's size.

Usage: python -m bench.peers.shaped_gguf OUT.gguf [--shape qwen2.5-0.5b] [--seed 0]
then: build-peers/build/bin/llama-quantize OUT.gguf OUT-Q4_K_M.gguf Q4_K_M
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class Shape:
    arch: str
    layers: int
    hidden: int
    ffn: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    qkv_bias: bool
    rope_theta: float
    rms_eps: float
    context: int


SHAPES = {
    "qwen2.5-0.5b": Shape("qwen2", 24, 896, 4864, 14, 2, 64, 151_936, True, 1_000_000.0, 1e-6,
                          32_768),
    "llama3.2-1b": Shape("llama", 16, 2048, 8192, 32, 8, 64, 128_256, False, 500_000.0, 1e-5,
                         131_072),
}
# Llama 3.1+'s rope scaling, as llama.cpp's converter writes it (rope_freqs.weight): the
# shapes whose config.json has rope_type llama3 (factor, low and high frequency factors,
# original context)
LLAMA3_ROPE = {"llama3.2-1b": (32.0, 1.0, 4.0, 8192)}


def _tensors(s: Shape, rng: np.random.Generator) -> dict[str, np.ndarray]:
    def mat(out: int, inp: int) -> np.ndarray:
        return (rng.standard_normal((out, inp), dtype=np.float32) * 0.02).astype(np.float16)

    def vec(n: int, base: float) -> np.ndarray:
        return (base + rng.standard_normal(n, dtype=np.float32) * 0.02).astype(np.float32)

    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    out = {"token_embd.weight": mat(s.vocab, s.hidden), "output_norm.weight": vec(s.hidden, 1.0)}
    for i in range(s.layers):
        b = f"blk.{i}."
        out.update({
            b + "attn_norm.weight": vec(s.hidden, 1.0), b + "ffn_norm.weight": vec(s.hidden, 1.0),
            b + "attn_q.weight": mat(q, s.hidden), b + "attn_k.weight": mat(kv, s.hidden),
            b + "attn_v.weight": mat(kv, s.hidden), b + "attn_output.weight": mat(s.hidden, q),
            b + "ffn_gate.weight": mat(s.ffn, s.hidden), b + "ffn_up.weight": mat(s.ffn, s.hidden),
            b + "ffn_down.weight": mat(s.hidden, s.ffn)})
        if s.qkv_bias:
            out.update({b + "attn_q.bias": vec(q, 0.0), b + "attn_k.bias": vec(kv, 0.0),
                        b + "attn_v.bias": vec(kv, 0.0)})
    return out


def write(path: Path, shape: str = "qwen2.5-0.5b", seed: int = 0) -> Path:
    import gguf
    from kiln_kernels.testing import add_model_header, llama3_rope_freqs

    from kiln.model.checkpoint.gguf_index import GGUFIndex
    from kiln.model.checkpoint.locate import default_model_path

    s = SHAPES[shape]
    meta = GGUFIndex(default_model_path()).metadata
    tokens = [str(t) for t in meta["tokenizer.ggml.tokens"]]
    types = [int(t) for t in meta["tokenizer.ggml.token_type"]]
    pad = s.vocab - len(tokens)
    tokens += [f"<|unused_{i}|>" for i in range(pad)]
    types += [5] * pad  # unused
    w = gguf.GGUFWriter(str(path), s.arch)
    add_model_header(w, layers=s.layers, context=s.context, hidden=s.hidden, ffn=s.ffn,
                     heads=s.heads, kv_heads=s.kv_heads, rms_eps=s.rms_eps,
                     rope_theta=s.rope_theta)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(str(meta.get("tokenizer.ggml.pre", "default")))
    w.add_token_list(tokens)
    w.add_token_merges([str(m) for m in meta["tokenizer.ggml.merges"]])
    w.add_token_types(types)
    for key, add in (("tokenizer.ggml.eos_token_id", w.add_eos_token_id),
                     ("tokenizer.ggml.bos_token_id", w.add_bos_token_id)):
        if key in meta:
            add(int(meta[key]))
    w.add_add_bos_token(False)
    w.add_chat_template(str(meta["tokenizer.chat_template"]))
    if shape in LLAMA3_ROPE:
        divisors = llama3_rope_freqs(s.head_dim, s.rope_theta, *LLAMA3_ROPE[shape])
        w.add_tensor("rope_freqs.weight", np.asarray(divisors, dtype=np.float32))
    for name, arr in _tensors(s, np.random.default_rng(seed)).items():
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-0.5b")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    print(write(args.out, args.shape, args.seed))


if __name__ == "__main__":
    main()
