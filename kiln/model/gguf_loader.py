"""Load a GGUF file into the model: each matrix the CPU kernels can hold as its tiles (tiled
during start-up's imports where ``kiln serve`` began that, ``kiln.model.native.early_tiles``), the
rest dequantized to float32; the tokenizer from the metadata."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from kiln_kernels.quant import PackedWeight

from kiln.model.base import CausalLM
from kiln.model.checkpoint.config import ModelConfig, UnsupportedModelError, WeightLoadError
from kiln.model.checkpoint.gguf_index import GGUFIndex
from kiln.model.checkpoint.gguf_tensors import (
    ROPE_FREQS,
    dequantize,
    expert_names,
    hf_name,
    read_config,
    row_permutation,
    tile,
    unpackable,
    unpermute_qk,
)
from kiln.model.checkpoint.gguf_tokenizer import tokenizer_from_gguf
from kiln.model.float32_copies import install_packed
from kiln.model.native.early_tiles import Tiled, take_tiled
from kiln.model.native.plan import pack_weights
from kiln.model.weights import WeightSink, empty_model, progress
from kiln.text.tokenizer import Tokenizer

__all__ = ["GGUFContents", "hf_name", "load_gguf"]  # hf_name: moved
log = logging.getLogger("kiln.model")


@dataclass
class GGUFContents:
    model: CausalLM
    config: ModelConfig
    tokenizer: Tokenizer
    chat_template: str | None
    metadata: dict[str, Any]


def load_gguf(path: str | Path, dtype: torch.dtype, device: torch.device, *,
              quant_kernels: bool = True, tiled: Tiled | None = None) -> GGUFContents:
    """The model, config, tokenizer and chat template of a GGUF file. ``tiled``: tiles of its
    matrices made already (``kiln.model.native.c_model.CModel`` passes the ones it runs on, so the
    two share them); else start-up's, if it tiled this file (``early_tiles``). The tiles taken are
    removed from ``tiled.tiles``."""
    if tiled is None:
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
        stacked = expert_names(tensor.name, cfg.num_experts)
        if stacked is not None:  # the experts' float32 values, one matrix each (torch path)
            values = dequantize(tensor)
            if values.shape[0] != len(stacked):
                raise WeightLoadError(f"{tensor.name}: {values.shape[0]} experts, the config "
                                      f"says {len(stacked)}")
            for name, matrix in zip(stacked, values, strict=True):
                sink.put(name, torch.from_numpy(np.ascontiguousarray(matrix)))
            continue
        heads = row_permutation(cfg, tensor.name)
        name = hf_name(tensor.name, cfg.sandwich_norms)
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
