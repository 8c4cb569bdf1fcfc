"""Load a GGUF file into the model: each matrix the CPU kernels can hold as its tiles (tiled
during start-up's imports where ``kiln serve`` began that, ``kiln.model.early_tiles``), the
rest dequantized to float32; the tokenizer from the metadata."""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from kiln_kernels.quant import PackedWeight

from kiln.model.base import CausalLM
from kiln.model.config import ModelConfig, UnsupportedModelError, WeightLoadError
from kiln.model.early_tiles import take_tiled
from kiln.model.gguf_index import GGUFIndex
from kiln.model.gguf_tensors import (
    ROPE_FREQS,
    dequantize,
    read_config,
    row_permutation,
    tile,
    unpackable,
    unpermute_qk,
)
from kiln.model.gguf_tokenizer import tokenizer_from_gguf
from kiln.model.plan import pack_weights
from kiln.model.quantized import install_packed
from kiln.model.weights import WeightSink, empty_model, progress
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
_BLOCK_RE = re.compile(r"^blk\.(\d+)\.([a-z_]+)\.(weight|bias)$")


def hf_name(gguf_name: str) -> str:
    """The HF state-dict name of a GGUF tensor name."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    m = _BLOCK_RE.match(gguf_name)
    if m is None or m.group(2) not in _BLOCK_NAMES:
        raise WeightLoadError(f"unknown GGUF tensor {gguf_name!r}")
    return f"model.layers.{m.group(1)}.{_BLOCK_NAMES[m.group(2)]}.{m.group(3)}"


@dataclass
class GGUFContents:
    model: CausalLM
    config: ModelConfig
    tokenizer: Tokenizer
    chat_template: str | None
    metadata: dict[str, Any]


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
    tiled = take_tiled(Path(path))  # tiled on a thread during start-up's imports, if it was
    try:
        reader = tiled.reader if tiled is not None and tiled.reader else GGUFIndex(path)
    except (ValueError, OSError) as exc:
        raise UnsupportedModelError(f"cannot read GGUF file {path}: {exc}") from exc
    meta = reader.metadata
    if not any(t.name == "token_embd.weight" for t in reader.tensors):
        raise WeightLoadError("GGUF file has no token_embd.weight")
    cfg = read_config(reader)
    model = empty_model(cfg, dtype, device)
    sink = WeightSink(model)
    packed: dict[str, PackedWeight] | None = {} if pack_weights(
        dtype, device, quant_kernels=quant_kernels) else None
    deferred: dict[str, PackedWeight] = {}  # packed; float32 values written only if needed
    unpacked: dict[str, list[str]] = {}  # why -> the matrices kept as float32 for that reason
    tiles = tiled.tiles if tiled is not None else {}
    for tensor in progress(reader.tensors, len(reader.tensors), "loading GGUF"):
        if tensor.name == ROPE_FREQS:  # read into the config (its rope scaling)
            continue
        heads = row_permutation(cfg, tensor.name)
        name = hf_name(tensor.name)
        why = unpackable(tensor) if len(tensor.shape) > 1 else "1-D"
        if why != "1-D" and why is not None and packed is not None:
            unpacked.setdefault(why, []).append(tensor.name)
        pw = None
        if why is None:
            fmt, tile_array = (tiles.pop(tensor.name) if tensor.name in tiles
                               else tile(tensor, heads))
            pw = PackedWeight(fmt, torch.from_numpy(tile_array))  # type: ignore[arg-type]
        if pw is not None and packed is not None:
            packed[name] = deferred[name] = pw
            continue
        if pw is not None:  # gguf-py's float32 values, bit for bit (tests), ~3x faster here
            weight = pw.dequantize()
        else:
            arr = dequantize(tensor)
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
