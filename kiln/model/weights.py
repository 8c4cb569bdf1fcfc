"""Allocate a model without initialising it, and fill its parameters tensor by tensor.

Loaders never hold two full copies of the weights: the model is built on the ``meta`` device,
each parameter is allocated once in its final dtype/device, and each checkpoint tensor is copied
into it as soon as it is read.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn
from tqdm import tqdm

from kiln.model.base import CausalLM
from kiln.model.checkpoint.config import ModelConfig, WeightLoadError
from kiln.model.registry import build_model

# Checkpoint tensors that carry no weights of ours (recomputed or redundant).
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def empty_model(cfg: ModelConfig, dtype: torch.dtype, device: torch.device) -> CausalLM:
    """The model for ``cfg`` with uninitialised parameters of ``dtype`` on ``device``."""
    with torch.device("meta"):
        model = build_model(cfg)
    for module in model.modules():
        for name, param in list(module._parameters.items()):
            if param is None:
                continue
            module._parameters[name] = nn.Parameter(
                torch.empty(param.shape, dtype=dtype, device=device), requires_grad=False)
    model.eval()
    return model


class WeightSink:
    """Copies named checkpoint tensors into a model's parameters, checking names and shapes."""

    def __init__(self, model: CausalLM) -> None:
        self.model = model
        self.params: dict[str, torch.Tensor] = dict(model.named_parameters())
        self.loaded: set[str] = set()

    def put(self, name: str, tensor: torch.Tensor) -> None:
        if name.endswith(_IGNORED_SUFFIXES):
            return
        if name == "lm_head.weight" and self.model.config.tie_word_embeddings:
            return  # some tied checkpoints store the copy; the embedding is used
        param = self._param(name, tuple(tensor.shape))
        with torch.no_grad():
            param.copy_(tensor)
        self.loaded.add(name)

    def held_elsewhere(self, name: str, shape: tuple[int, ...]) -> None:
        """Account for a checkpoint tensor the model keeps in another form (packed blocks whose
        float32 copy was released), checking its name and shape as :meth:`put` does."""
        self._param(name, shape)
        self.loaded.add(name)

    def _param(self, name: str, shape: tuple[int, ...]) -> torch.Tensor:
        param = self.params.get(name)
        if param is None:
            raise WeightLoadError(f"checkpoint tensor {name!r} has no place in the model")
        if shape != tuple(param.shape):
            raise WeightLoadError(f"tensor {name!r} has shape {shape}, "
                                  f"the model expects {tuple(param.shape)}")
        return param

    def finish(self) -> None:
        missing = sorted(set(self.params) - self.loaded)
        if missing:
            more = f" (and {len(missing) - 5} more)" if len(missing) > 5 else ""
            raise WeightLoadError(f"checkpoint lacks tensors {missing[:5]}{more}")


def progress(items: Iterable[Any], total: int, desc: str) -> Iterable[Any]:
    """A tqdm bar on stderr, only when stderr is a terminal."""
    bar: Iterable[Any] = tqdm(items, total=total, desc=desc, unit="tensor", leave=False,
                              disable=not sys.stderr.isatty())
    return bar
