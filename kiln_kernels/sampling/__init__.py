"""Sampling: penalties, temperature, top-k / min-p / top-p, counter-hash Gumbel-max.

``sample`` runs the Triton sampler on CUDA tensors and the torch reference elsewhere; both give
the same tokens for the same inputs (see ``reference.py`` for the order of operations).
"""

from __future__ import annotations

import torch

from .counter_hash import counter_hash, counter_uniform
from .params import SamplingTensors
from .reference import apply_penalties, filter_threshold, greedy_rows, sample_reference

__all__ = [
    "SamplingTensors",
    "apply_penalties",
    "counter_hash",
    "counter_uniform",
    "filter_threshold",
    "greedy_rows",
    "sample",
    "sample_reference",
]


def sample(logits: torch.Tensor, p: SamplingTensors) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (token ids int64 [B], behaviour logprob float32 [B]). Triton on CUDA, torch otherwise."""
    if logits.is_cuda:
        from .sampler import sample_triton

        return sample_triton(logits, p)
    return sample_reference(logits, p)
