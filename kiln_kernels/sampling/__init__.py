"""Sampling: penalties, temperature, top-k / min-p / top-p, counter-hash Gumbel-max.

``sample`` runs the Triton sampler on CUDA tensors and the torch reference elsewhere; both give
the same tokens for the same inputs (see ``reference.py`` for the order of operations).

The names below are imported on first use (PEP 562), so that importing the C sampler's binding
(:mod:`.native`) does not import torch. ``counter_hash`` is its submodule's
(``kiln_kernels.sampling.counter_hash.counter_hash``), as the submodule's name would shadow it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from .counter_hash import counter_uniform
    from .params import SamplingTensors
    from .reference import apply_penalties, filter_threshold, greedy_rows, sample_reference

_WHERE = {
    "counter_uniform": "counter_hash",
    "SamplingTensors": "params", "apply_penalties": "reference",
    "filter_threshold": "reference", "greedy_rows": "reference", "sample_reference": "reference",
}

__all__ = [
    "SamplingTensors",
    "apply_penalties",
    "counter_uniform",
    "filter_threshold",
    "greedy_rows",
    "sample",
    "sample_reference",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


def sample(logits: torch.Tensor, p: SamplingTensors) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (token ids int64 [B], behaviour logprob float32 [B]). Triton on CUDA, torch otherwise."""
    if logits.is_cuda:
        from .sampler import sample_triton

        return sample_triton(logits, p)
    from .reference import sample_reference

    return sample_reference(logits, p)
