"""Load a Hugging Face model folder: config.json, safetensors (sharded or single), tokenizer.

On the CPU (float32 models), bfloat16 / float16 matrices are held as they are, two bytes a
weight, and widened exactly in registers by the C step (``kiln_kernels.quant.pack_dense``): no
float32 copy of them is made when every step runs in C. Where ``kiln serve`` tiled them during
its imports (``kiln.model.native.early_tiles``), those matrices are taken as they are and not read
again."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from kiln_kernels.quant import PackedWeight, pack_dense
from safetensors import SafetensorError, safe_open

from kiln.model.base import CausalLM
from kiln.model.checkpoint.config import ModelConfig, WeightLoadError
from kiln.model.checkpoint.hf_tensors import packable, read_json, safetensors_files
from kiln.model.float32_copies import install_packed
from kiln.model.native.early_tiles import take_tiled
from kiln.model.native.plan import pack_weights
from kiln.model.weights import WeightSink, empty_model, progress
from kiln.text.tokenizer import Tokenizer


@dataclass
class HFContents:
    model: CausalLM
    config: ModelConfig
    tokenizer: Tokenizer
    chat_template: str | None
    generation_config: dict[str, Any]
    tokenizer_config: dict[str, Any]


def _optional_json(path: Path) -> dict[str, Any]:
    return read_json(path) if path.is_file() else {}


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


_HALF_NAMES = {torch.bfloat16: "BF16", torch.float16: "F16"}


def load_hf_folder(folder: str | Path, dtype: torch.dtype, device: torch.device, *,
                   quant_kernels: bool = True) -> HFContents:
    root = Path(folder)
    hf_config = read_json(root / "config.json")
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
    tiled = take_tiled(root)  # tiled on a thread during start-up's imports, if it was
    tiles = tiled.tiles if tiled is not None and packing else {}
    for path in safetensors_files(root):
        try:
            with safe_open(str(path), framework="pt", device="cpu") as f:
                keys = list(f.keys())
                for key in progress(keys, len(keys), f"loading {path.name}"):
                    if key in tiles:
                        fmt, array = tiles.pop(key)
                        packed[key] = PackedWeight(fmt, torch.from_numpy(array))  # type: ignore[arg-type]
                        continue
                    tensor = f.get_tensor(key)
                    if cfg.norm_shift and key.endswith("norm.weight"):  # Gemma: 1 + w
                        tensor = tensor.to(torch.float32) + cfg.norm_shift
                    if packing and packable(key, _HALF_NAMES.get(tensor.dtype),
                                            tuple(tensor.shape), cfg.tie_word_embeddings):
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
