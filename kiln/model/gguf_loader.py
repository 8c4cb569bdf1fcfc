"""Load a GGUF file: dequantize tensor by tensor into the model, tokenizer from metadata."""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch
from kiln_kernels.quant import GGML_TYPES, PackedWeight, pack_ggml

from kiln.model.base import CausalLM
from kiln.model.config import ModelConfig, UnsupportedModelError, config_from_gguf
from kiln.model.gguf_index import GGUFIndex, GGUFTensor
from kiln.model.gguf_tokenizer import tokenizer_from_gguf
from kiln.model.plan import pack_weights
from kiln.model.quantized import install_packed
from kiln.model.weights import WeightLoadError, WeightSink, empty_model, progress
from kiln.text.tokenizer import Tokenizer

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_BLOCK_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
log = logging.getLogger("kiln.model")
ROPE_FREQS = "rope_freqs.weight"  # Llama 3.1+: one divisor per rotary frequency
_BLOCK_RE = re.compile(r"^blk\.(\d+)\.([a-z_]+)\.(weight|bias)$")


def hf_name(gguf_name: str) -> str:
    """The HF state-dict name of a GGUF tensor name."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    m = _BLOCK_RE.match(gguf_name)
    if m is None or m.group(2) not in _BLOCK_NAMES:
        raise WeightLoadError(f"unknown GGUF tensor {gguf_name!r}")
    return f"model.layers.{m.group(1)}.{_BLOCK_NAMES[m.group(2)]}.{m.group(3)}"


def unpermute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's q/k row order (for GGML's interleaved RoPE) to HF's rotate_half order."""
    out = w.shape[0]
    rest = w.shape[1:]
    return w.reshape(n_head, out // n_head // 2, 2, *rest).swapaxes(1, 2).reshape(out, *rest)


@dataclass
class GGUFContents:
    model: CausalLM
    config: ModelConfig
    tokenizer: Tokenizer
    chat_template: str | None
    metadata: dict[str, Any]


def _dequantize(tensor: GGUFTensor) -> np.ndarray:
    arr = np.asarray(gguf.quants.dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)
    if not arr.flags.writeable:  # F32 tensors come back as read-only views of the mmap
        arr = arr.copy()
    shape = tuple(reversed(tensor.shape))
    return arr.reshape(shape)


def _row_permutation(cfg: ModelConfig, name: str) -> int | None:
    """The head count whose llama.cpp q/k row order this tensor needs undone (llama only)."""
    if cfg.arch != "llama":
        return None
    if name.endswith("attn_q.weight"):
        return cfg.num_heads
    if name.endswith("attn_k.weight"):
        return cfg.num_kv_heads
    return None


def _unpackable(tensor: GGUFTensor) -> str | None:
    """Why the kernels cannot hold this matrix (None: they can): its type has no kernel, or
    its rows do not come in fours (the tiles' unit)."""
    if tensor.tensor_type.name not in GGML_TYPES:
        return f"type {tensor.tensor_type.name} has no CPU kernel"
    if int(tensor.shape[-1]) % 4:
        return f"{int(tensor.shape[-1])} rows, not a multiple of 4"
    if int(tensor.shape[0]) % GGML_TYPES[tensor.tensor_type.name][0]:
        return f"{int(tensor.shape[0])} columns, not whole blocks"
    return None


def _pack(tensor: GGUFTensor, heads: int | None) -> PackedWeight:
    """A 2-D quantized tensor's raw blocks, rows in HF order, packed for the CPU kernels."""
    rows = int(tensor.shape[-1]) if len(tensor.shape) > 1 else 1
    raw = np.ascontiguousarray(tensor.data).view(np.uint8).reshape(rows, -1)
    if heads is not None:
        raw = unpermute_qk(raw, heads)
    with warnings.catch_warnings():
        # A read-only view of the file's map, read once by the packer, which writes the tiles
        # to new memory: no copy of the file's bytes first (that copy was a third of an F16
        # file's load, 0.17 of 0.52 s for the default model's).
        warnings.filterwarnings("ignore", "The given NumPy array is not writable")
        return pack_ggml(torch.from_numpy(raw), tensor.tensor_type.name)


def release_freed_heap() -> None:
    """Give the heap pages the load freed back to the system (glibc's ``malloc_trim``, after a
    garbage collection: the reader's arrays are freed only then). Called once a load is done.

    Packing copies each tensor on its way to its tiles; glibc keeps most of what those copies
    freed (its mmap threshold rises after the first large frees, so later copies come from the
    heap), which for the default Q4_1 model was 77 MB of RSS after load, nearly the file's size
    again. A no-op where the C library has no ``malloc_trim``."""
    gc.collect()
    name = ctypes.util.find_library("c")
    trim = getattr(ctypes.CDLL(name), "malloc_trim", None) if name else None
    if trim is not None:
        trim(0)


def load_gguf(path: str | Path, dtype: torch.dtype, device: torch.device, *,
              quant_kernels: bool = True) -> GGUFContents:
    try:
        reader = GGUFIndex(path)
    except (ValueError, OSError) as exc:
        raise UnsupportedModelError(f"cannot read GGUF file {path}: {exc}") from exc
    meta = reader.metadata
    names = {t.name for t in reader.tensors}
    embd = next((t for t in reader.tensors if t.name == "token_embd.weight"), None)
    if embd is None:
        raise WeightLoadError("GGUF file has no token_embd.weight")
    freqs = next((t for t in reader.tensors if t.name == ROPE_FREQS), None)
    cfg = config_from_gguf(
        meta, vocab_size=int(embd.shape[1]), has_output="output.weight" in names,
        has_qkv_bias="blk.0.attn_q.bias" in names, has_qk_norm="blk.0.attn_q_norm.weight" in names,
        rope_divisors=None if freqs is None else tuple(float(x) for x in _dequantize(freqs).ravel()))
    model = empty_model(cfg, dtype, device)
    sink = WeightSink(model)
    packed: dict[str, PackedWeight] | None = {} if pack_weights(
        dtype, device, quant_kernels=quant_kernels) else None
    deferred: dict[str, PackedWeight] = {}  # packed; float32 values written only if needed
    unpacked: dict[str, list[str]] = {}  # why -> the matrices kept as float32 for that reason
    for tensor in progress(reader.tensors, len(reader.tensors), "loading GGUF"):
        if tensor.name == ROPE_FREQS:  # read into the config (its rope scaling)
            continue
        heads = _row_permutation(cfg, tensor.name)
        name = hf_name(tensor.name)
        why = _unpackable(tensor) if len(tensor.shape) > 1 else "1-D"
        if why != "1-D" and why is not None and packed is not None:
            unpacked.setdefault(why, []).append(tensor.name)
        pw = _pack(tensor, heads) if why is None else None
        if pw is not None and packed is not None:
            packed[name] = deferred[name] = pw
            continue
        if pw is not None:  # gguf-py's float32 values, bit for bit (tests), ~3x faster here
            weight = pw.dequantize()
        else:
            arr = _dequantize(tensor)
            weight = torch.from_numpy(arr if heads is None else unpermute_qk(arr, heads))
        sink.put(name, weight)
        del weight
    if unpacked:
        log.warning("GGUF matrices on the float32 torch path (no C step for this model): %s",
                    "; ".join(f"{why}: {', '.join(names)}" for why, names in unpacked.items()))
    install_packed(model, sink, deferred)
    sink.finish()
    template = meta.get("tokenizer.chat_template")
    return GGUFContents(model=model, config=cfg, tokenizer=tokenizer_from_gguf(meta),
                        chat_template=template if isinstance(template, str) else None,
                        metadata=meta)
