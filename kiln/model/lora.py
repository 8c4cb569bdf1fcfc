"""PEFT LoRA adapters: loading, validation against the base model, content hash.

An adapter folder holds ``adapter_config.json`` (``r``, ``lora_alpha``, ``target_modules``,
optionally ``use_rslora``) and ``adapter_model.safetensors`` with PEFT key names::

    base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight   [r, in]
    base_model.model.model.layers.{i}.self_attn.q_proj.lora_B.weight   [out, r]

(the ``base_model.model.`` prefix is optional). The delta of a targeted projection is
``scaling * B @ A`` with ``scaling = alpha / r`` (``alpha / sqrt(r)`` under rsLoRA).

A :class:`LoraAdapter` is immutable once built: a request that resolved an adapter keeps its
weights even when the folder is rewritten or deleted while it runs. Batched application lives in
``kiln.model.lora_slots``.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import torch

from kiln.model.checkpoint.config import ModelConfig

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"

ATTN_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_MODULES = ("gate_proj", "up_proj", "down_proj")
LORA_MODULES = ATTN_MODULES + MLP_MODULES

_KEY = re.compile(
    r"^(?:base_model\.model\.)?model\.layers\.(\d+)\.(self_attn|mlp)\."
    r"(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)\.lora_([AB])\.weight$")


class AdapterLoadError(ValueError):
    """The adapter folder is missing, malformed, or does not fit the base model."""


def tensor_sha256_update(h: hashlib._Hash, name: str, tensor: torch.Tensor) -> None:
    """Feed name, dtype, shape and raw bytes of one tensor into ``h`` (an adapter's content
    hash, and a model's: ``kiln.model.hashing``)."""
    t = tensor.detach().contiguous().cpu()
    header = f"{name}\0{str(t.dtype).removeprefix('torch.')}\0{list(t.shape)}\0"
    h.update(header.encode("utf-8"))
    h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())



def module_shape(cfg: ModelConfig, module: str) -> tuple[int, int]:
    """``(in_features, out_features)`` of projection ``module`` in ``cfg``'s model."""
    q_out = cfg.num_heads * cfg.head_dim
    kv_out = cfg.num_kv_heads * cfg.head_dim
    shapes = {
        "q_proj": (cfg.hidden_size, q_out), "k_proj": (cfg.hidden_size, kv_out),
        "v_proj": (cfg.hidden_size, kv_out), "o_proj": (q_out, cfg.hidden_size),
        "gate_proj": (cfg.hidden_size, cfg.intermediate_size),
        "up_proj": (cfg.hidden_size, cfg.intermediate_size),
        "down_proj": (cfg.intermediate_size, cfg.hidden_size),
    }
    if module not in shapes:
        raise ValueError(f"unknown LoRA module {module!r}")
    return shapes[module]


@dataclass(frozen=True)
class LoraAdapter:
    """One loaded LoRA adapter (weights on the CPU, never mutated after construction)."""

    name: str
    rank: int
    alpha: float
    use_rslora: bool
    target_modules: tuple[str, ...]  # modules that have weights, in LORA_MODULES order
    # (layer, module) -> (A [r, in], B [out, r]); absent pairs contribute nothing
    weights: Mapping[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = field(repr=False)
    content_sha256: str
    path: str | None = None

    @property
    def scaling(self) -> float:
        """``alpha / r`` (``alpha / sqrt(r)`` under rsLoRA): the factor on ``B @ A``."""
        return self.alpha / (math.sqrt(self.rank) if self.use_rslora else self.rank)

    def delta(self, layer: int, module: str) -> torch.Tensor | None:
        """``scaling * B @ A`` ``[out, in]`` in float32 for one projection, or None."""
        pair = self.weights.get((layer, module))
        if pair is None:
            return None
        a, b = pair
        return self.scaling * (b.float() @ a.float())


def _parse_config(raw: Mapping[str, Any]) -> tuple[int, float, bool, tuple[str, ...] | None]:
    """(r, alpha, use_rslora, declared target modules or None for 'derive from the keys')."""
    r = raw.get("r")
    if isinstance(r, bool) or not isinstance(r, int) or r <= 0:
        raise AdapterLoadError(f"adapter_config.json: r must be a positive integer, got {r!r}")
    alpha = raw.get("lora_alpha", r)
    if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not math.isfinite(alpha):
        raise AdapterLoadError(f"adapter_config.json: lora_alpha must be a number, got {alpha!r}")
    rslora = raw.get("use_rslora", False)
    if not isinstance(rslora, bool):
        raise AdapterLoadError("adapter_config.json: use_rslora must be a boolean")
    for unsupported in ("rank_pattern", "alpha_pattern"):
        if raw.get(unsupported):
            raise AdapterLoadError(f"adapter_config.json: {unsupported} is not supported")
    for flag in ("use_dora", "fan_in_fan_out"):
        if raw.get(flag):
            raise AdapterLoadError(f"adapter_config.json: {flag}=true is not supported")
    if raw.get("bias", "none") not in ("none", None):
        raise AdapterLoadError("adapter_config.json: LoRA biases are not supported")
    if raw.get("modules_to_save"):
        raise AdapterLoadError("adapter_config.json: modules_to_save is not supported")
    targets = raw.get("target_modules")
    declared: tuple[str, ...] | None
    if targets is None or targets == "all-linear":
        declared = None
    elif isinstance(targets, str):
        declared = (targets,)
    elif isinstance(targets, list) and all(isinstance(t, str) for t in targets):
        declared = tuple(targets)
    else:
        raise AdapterLoadError("adapter_config.json: target_modules must be a list of names")
    if declared is not None:
        bad = sorted(set(declared) - set(LORA_MODULES))
        if bad:
            raise AdapterLoadError(
                f"adapter_config.json: unsupported target_modules {bad}; "
                f"supported: {list(LORA_MODULES)}")
    return r, float(alpha), rslora, declared


def adapter_from_state(name: str, config: Mapping[str, Any],
                       tensors: Mapping[str, torch.Tensor], model_cfg: ModelConfig,
                       path: str | None = None) -> LoraAdapter:
    """Build and validate an adapter from a parsed config and PEFT-named tensors."""
    r, alpha, rslora, declared = _parse_config(config)
    halves: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        m = _KEY.match(key)
        if m is None:
            raise AdapterLoadError(f"{WEIGHTS_FILE}: unexpected tensor {key!r}")
        layer, group, module, half = int(m[1]), m[2], m[3], m[4]
        if (group == "self_attn") != (module in ATTN_MODULES):
            raise AdapterLoadError(f"{WEIGHTS_FILE}: {module} is not under {group} in {key!r}")
        if layer >= model_cfg.num_layers:
            raise AdapterLoadError(
                f"{WEIGHTS_FILE}: {key!r} names layer {layer}, the base model has "
                f"{model_cfg.num_layers} layers")
        if declared is not None and module not in declared:
            raise AdapterLoadError(f"{WEIGHTS_FILE}: {key!r} is not in target_modules")
        if group != "self_attn" and model_cfg.is_moe(layer):
            raise AdapterLoadError(f"{WEIGHTS_FILE}: {key!r}: layer {layer}'s MLP is a mixture "
                                   "of experts (adapters on its experts are not supported)")
        if not tensor.is_floating_point():
            raise AdapterLoadError(f"{WEIGHTS_FILE}: {key!r} is not a float tensor")
        halves.setdefault((layer, module), {})[half] = tensor
    if not halves:
        raise AdapterLoadError(f"{WEIGHTS_FILE}: no LoRA weights found")
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = {}
    for (layer, module), pair in sorted(halves.items()):
        where = f"layer {layer} {module}"
        if set(pair) != {"A", "B"}:
            missing = "lora_B" if "A" in pair else "lora_A"
            raise AdapterLoadError(f"{WEIGHTS_FILE}: {where} has no {missing} weight")
        a, b = pair["A"], pair["B"]
        n_in, n_out = module_shape(model_cfg, module)
        if tuple(a.shape) != (r, n_in) or tuple(b.shape) != (n_out, r):
            raise AdapterLoadError(
                f"{WEIGHTS_FILE}: {where}: lora_A {list(a.shape)} / lora_B {list(b.shape)} do "
                f"not fit the base model (expected [{r}, {n_in}] / [{n_out}, {r}] for r={r})")
        if not (bool(torch.isfinite(a).all()) and bool(torch.isfinite(b).all())):
            raise AdapterLoadError(f"{WEIGHTS_FILE}: {where} holds non-finite values")
        weights[(layer, module)] = (a.detach().cpu().contiguous(), b.detach().cpu().contiguous())
    present = {module for _, module in weights}
    h = hashlib.sha256(b"kiln-lora-adapter-v1\0")
    h.update(json.dumps(dict(config), sort_keys=True, separators=(",", ":"),
                        default=str).encode("utf-8"))
    for key in sorted(tensors):
        tensor_sha256_update(h, key, tensors[key])
    return LoraAdapter(
        name=name, rank=r, alpha=alpha, use_rslora=rslora,
        target_modules=tuple(mod for mod in LORA_MODULES if mod in present),
        weights=MappingProxyType(weights), content_sha256=h.hexdigest(), path=path)


def load_adapter(folder: str | Path, model_cfg: ModelConfig,
                 name: str | None = None) -> LoraAdapter:
    """Load a PEFT adapter folder and validate it against ``model_cfg``.

    Raises :class:`AdapterLoadError` for a missing file, bad JSON, unsupported options or
    tensors whose shapes do not fit the base model.
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    folder = Path(folder)
    cfg_path, w_path = folder / CONFIG_FILE, folder / WEIGHTS_FILE
    for p in (cfg_path, w_path):
        if not p.is_file():
            raise AdapterLoadError(f"adapter {folder.name!r}: {p.name} is missing")
    try:
        raw = json.loads(cfg_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise AdapterLoadError(f"adapter {folder.name!r}: bad {CONFIG_FILE}: {e}") from e
    if not isinstance(raw, dict):
        raise AdapterLoadError(f"adapter {folder.name!r}: {CONFIG_FILE} is not a JSON object")
    try:
        tensors = load_file(str(w_path), device="cpu")
    except (OSError, SafetensorError) as e:
        raise AdapterLoadError(f"adapter {folder.name!r}: bad {WEIGHTS_FILE}: {e}") from e
    try:
        return adapter_from_state(name or folder.name, raw, tensors, model_cfg, str(folder))
    except AdapterLoadError as e:
        raise AdapterLoadError(f"adapter {folder.name!r}: {e}") from None
