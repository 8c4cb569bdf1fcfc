"""Load a Hugging Face model folder: config.json, safetensors (sharded or single), tokenizer.

On the CPU (float32 models), bfloat16 / float16 matrices are held as they are, two bytes a
weight, and widened exactly in registers by the C step (``kiln_kernels.quant.pack_dense``): no
float32 copy of them is made when every step runs in C."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from kiln_kernels.quant import PackedWeight, pack_dense
from safetensors import SafetensorError, safe_open

from kiln.model.base import CausalLM
from kiln.model.config import ModelConfig
from kiln.model.plan import pack_weights
from kiln.model.quantized import install_packed
from kiln.model.weights import WeightLoadError, WeightSink, empty_model, progress
from kiln.text.tokenizer import Tokenizer


@dataclass
class HFContents:
    model: CausalLM
    config: ModelConfig
    tokenizer: Tokenizer
    chat_template: str | None
    generation_config: dict[str, Any]
    tokenizer_config: dict[str, Any]


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise WeightLoadError(f"cannot read {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise WeightLoadError(f"{path} is not a JSON object")
    return data


def _optional_json(path: Path) -> dict[str, Any]:
    return _read_json(path) if path.is_file() else {}


def safetensors_files(folder: Path) -> list[Path]:
    """The weight files, in shard order: from the index, or the single file, or all of them."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        weight_map = _read_json(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise WeightLoadError(f"{index} has no weight_map")
        files = sorted({str(v) for v in weight_map.values()})
        paths = [folder / f for f in files]
        for p in paths:
            if not p.is_file():
                raise WeightLoadError(f"shard {p.name} named in the index is missing")
        return paths
    single = folder / "model.safetensors"
    if single.is_file():
        return [single]
    found = sorted(folder.glob("*.safetensors"))
    if not found:
        raise WeightLoadError(f"no safetensors weights in {folder}")
    return found


def chat_template_source(folder: Path, tokenizer_config: dict[str, Any]) -> str | None:
    """``chat_template.jinja`` if present, else ``tokenizer_config.json``'s chat_template."""
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    tpl = tokenizer_config.get("chat_template")
    if isinstance(tpl, str):
        return tpl
    if isinstance(tpl, list):  # [{"name": "default", "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in tpl if isinstance(t, dict)}
        chosen = named.get("default")
        return chosen if isinstance(chosen, str) else None
    return None


def _packable(name: str, t: torch.Tensor, tied: bool) -> bool:
    """A bfloat16 / float16 projection, embedding or head the C step can hold as it is (rows in
    fours, columns in 32s). Float32 checkpoints keep the torch path."""
    return (t.dtype in (torch.bfloat16, torch.float16) and t.dim() == 2
            and t.shape[0] % 4 == 0 and t.shape[1] % 32 == 0
            and (name.endswith("_proj.weight") or name == "model.embed_tokens.weight"
                 or (name == "lm_head.weight" and not tied)))


def load_hf_folder(folder: str | Path, dtype: torch.dtype, device: torch.device, *,
                   quant_kernels: bool = True) -> HFContents:
    root = Path(folder)
    hf_config = _read_json(root / "config.json")
    cfg = ModelConfig.from_hf(hf_config)
    generation_config = _optional_json(root / "generation_config.json")
    tokenizer_config = _optional_json(root / "tokenizer_config.json")
    tok_file = root / "tokenizer.json"
    if not tok_file.is_file():
        raise WeightLoadError(f"{root} has no tokenizer.json")
    tokenizer = Tokenizer.from_hf(tok_file, tokenizer_config=tokenizer_config,
                                  config=hf_config, generation_config=generation_config)
    model = empty_model(cfg, dtype, device)
    sink = WeightSink(model)
    packing = pack_weights(dtype, device, quant_kernels=quant_kernels)
    packed: dict[str, PackedWeight] = {}  # half-precision matrices, kept as they are
    for path in safetensors_files(root):
        try:
            with safe_open(str(path), framework="pt", device="cpu") as f:
                keys = list(f.keys())
                for key in progress(keys, len(keys), f"loading {path.name}"):
                    tensor = f.get_tensor(key)
                    if packing and _packable(key, tensor, cfg.tie_word_embeddings):
                        packed[key] = pack_dense(tensor)
                    else:
                        sink.put(key, tensor)
        except SafetensorError as exc:  # corrupt or truncated: a load error, not a traceback
            raise WeightLoadError(f"{path} is not a readable safetensors file: {exc}") from None
    install_packed(model, sink, packed)
    sink.finish()
    return HFContents(model=model, config=cfg, tokenizer=tokenizer,
                      chat_template=chat_template_source(root, tokenizer_config),
                      generation_config=generation_config, tokenizer_config=tokenizer_config)
