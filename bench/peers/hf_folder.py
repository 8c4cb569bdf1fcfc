"""A Hugging Face model folder holding exactly a float GGUF's weights (the benchmark's
"bf16 (HF folder)" pairing: Kiln serves the folder, llama-server, which cannot read safetensors,
the GGUF).

Writes config.json (LlamaForCausalLM / Qwen2 / Qwen3, ``torch_dtype`` the matrices' type),
model.safetensors, tokenizer.json (the tokenizer Kiln builds from the GGUF's metadata),
tokenizer_config.json (special tokens, the chat template) and generation_config.json (token ids
only: no sampling defaults, as the GGUF has none). Every BF16 / F16 tensor keeps its bits; F32
tensors (the norms) are written as bfloat16 where that is exact, else as float32; tensor names
are HF's, and llama q/k rows are put back in HF order as Kiln's GGUF loader does. Tied
embeddings stay tied (no lm_head.weight when the GGUF has no output.weight). Quantized tensors
are refused: the folder is for float files (make one with ``requantize.sh BF16``).

Usage: python -m bench.peers.hf_folder SRC.gguf OUT_DIR
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import save_file

from kiln.model.checkpoint.gguf_index import GGUFIndex, GGUFTensor
from kiln.model.checkpoint.gguf_tensors import read_config, row_permutation, unpermute_qk
from kiln.model.checkpoint.gguf_tokenizer import tokenizer_from_gguf
from kiln.model.gguf_loader import hf_name

_HALVES = {"BF16": torch.bfloat16, "F16": torch.float16}
_DTYPE_NAMES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}
# tokenizer.ggml.<key>_token_id -> tokenizer_config.json's name of that token
_SPECIAL = {"bos": "bos_token", "eos": "eos_token", "unknown": "unk_token", "padding": "pad_token"}


def hf_tensor(tensor: GGUFTensor, heads: int | None) -> torch.Tensor:
    """One GGUF tensor in HF layout: rows first, q/k rows un-permuted (``heads`` not None)."""
    shape = tuple(reversed(tensor.shape))
    kind = tensor.tensor_type.name
    if kind not in (*_HALVES, "F32"):
        raise ValueError(f"{tensor.name} is {kind}: only F32, F16 and BF16 tensors are written")
    rows = np.ascontiguousarray(tensor.data).view(np.uint8).reshape(shape[0] if
                                                                    len(shape) > 1 else 1, -1)
    if heads is not None:
        rows = unpermute_qk(rows, heads)  # whole rows move: the bytes of each are unchanged
    dtype = _HALVES.get(kind, torch.float32)
    out = torch.from_numpy(np.array(rows, copy=True)).view(dtype).reshape(shape)
    if dtype == torch.float32 and torch.equal(out.to(torch.bfloat16).float(), out):
        return out.to(torch.bfloat16)  # exact: the norms of a bf16 model
    return out


def write_folder(src: Path, out: Path) -> Path:
    index = GGUFIndex(src)
    meta, tensors = index.metadata, index.tensors
    cfg = read_config(index)
    state = {hf_name(t.name): hf_tensor(t, row_permutation(cfg, t.name)) for t in tensors}
    out.mkdir(parents=True, exist_ok=True)
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})

    tokens: list[str] = list(meta["tokenizer.ggml.tokens"])

    def token_id(key: str) -> int | None:
        v = meta.get(f"tokenizer.ggml.{key}_token_id")
        return int(v) if isinstance(v, int) and 0 <= v < len(tokens) else None

    ids = {k: token_id(k) for k in _SPECIAL}
    eos_ids = [i for k in ("eos", "eot", "eom") if (i := token_id(k)) is not None]
    matrix = state["model.embed_tokens.weight"].dtype
    config = {**cfg.to_hf(), "torch_dtype": _DTYPE_NAMES[matrix], "bos_token_id": ids["bos"],
              "eos_token_id": ids["eos"], "pad_token_id": ids["padding"],
              "attention_bias": cfg.qkv_bias, "mlp_bias": False, "rope_scaling": None}
    if cfg.arch == "llama":
        config["pretraining_tp"] = 1
    _write_json(out / "config.json", config)
    _write_json(out / "generation_config.json", {
        "bos_token_id": ids["bos"], "eos_token_id": eos_ids[0] if len(eos_ids) == 1 else eos_ids,
        "pad_token_id": ids["padding"]})
    tokenizer_from_gguf(meta).backend.save(str(out / "tokenizer.json"))
    template = meta.get("tokenizer.chat_template")
    tok_config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": cfg.max_position,
        "add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token", False)),
        "clean_up_tokenization_spaces": False,
        **{_SPECIAL[k]: tokens[i] for k, i in ids.items() if i is not None}}
    if isinstance(template, str):
        tok_config["chat_template"] = template
    _write_json(out / "tokenizer_config.json", tok_config)
    return out


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("src", type=Path, help="a GGUF file of F32 / F16 / BF16 tensors")
    ap.add_argument("out", type=Path, help="the folder to write (created)")
    args = ap.parse_args()
    print(write_folder(args.src, args.out))


if __name__ == "__main__":
    main()
