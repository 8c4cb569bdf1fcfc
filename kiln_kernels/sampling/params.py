"""Batched sampling parameters: one row per sequence being sampled this step."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any

import torch

_U64 = 1 << 64
_I63 = 1 << 63


def to_int64_bits(value: int) -> int:
    """Any Python int -> the signed int64 with the same low 64 bits (seeds are uint64 on the wire)."""
    v = int(value) % _U64
    return v - _U64 if v >= _I63 else v


@dataclass
class SamplingTensors:
    """Per-row sampling parameters for a batch of B rows over a vocabulary of V tokens.

    temperature < 1e-5 means greedy; top_k <= 0 (or >= V) is off; top_p <= 0 or >= 1 is off;
    min_p <= 0 is off (above 1 it acts as 1); repetition_penalty 1.0 is off. Seeds are uint64
    bit patterns stored in int64.
    """

    temperature: torch.Tensor  # float32 [B]
    top_k: torch.Tensor  # int32 [B]
    top_p: torch.Tensor  # float32 [B]
    min_p: torch.Tensor  # float32 [B]
    presence_penalty: torch.Tensor  # float32 [B]
    frequency_penalty: torch.Tensor  # float32 [B]
    repetition_penalty: torch.Tensor  # float32 [B]
    output_counts: torch.Tensor  # int32 [B, V]
    prompt_mask: torch.Tensor  # bool [B, V]
    seeds: torch.Tensor  # int64 [B]
    steps: torch.Tensor  # int64 [B]

    @property
    def batch(self) -> int:
        return int(self.temperature.shape[0])

    def validate(self, batch: int, vocab: int) -> None:
        """Raise ValueError unless every field has the documented dtype and shape."""
        spec: dict[str, tuple[torch.dtype, tuple[int, ...]]] = {
            "temperature": (torch.float32, (batch,)),
            "top_k": (torch.int32, (batch,)),
            "top_p": (torch.float32, (batch,)),
            "min_p": (torch.float32, (batch,)),
            "presence_penalty": (torch.float32, (batch,)),
            "frequency_penalty": (torch.float32, (batch,)),
            "repetition_penalty": (torch.float32, (batch,)),
            "output_counts": (torch.int32, (batch, vocab)),
            "prompt_mask": (torch.bool, (batch, vocab)),
            "seeds": (torch.int64, (batch,)),
            "steps": (torch.int64, (batch,)),
        }
        for name, (dtype, shape) in spec.items():
            t = getattr(self, name)
            if not isinstance(t, torch.Tensor):
                raise ValueError(f"SamplingTensors.{name} must be a tensor")
            if t.dtype != dtype or tuple(t.shape) != shape:
                raise ValueError(
                    f"SamplingTensors.{name}: expected {dtype} {list(shape)}, "
                    f"got {t.dtype} {list(t.shape)}"
                )

    def to(self, device: torch.device | str) -> SamplingTensors:
        return SamplingTensors(**{f.name: getattr(self, f.name).to(device) for f in fields(self)})

    def select(self, rows: torch.Tensor | list[int]) -> SamplingTensors:
        """The sub-batch made of the given row indices (in that order)."""
        idx = torch.as_tensor(rows, dtype=torch.long, device=self.temperature.device)
        return SamplingTensors(**{f.name: getattr(self, f.name)[idx] for f in fields(self)})

    @staticmethod
    def build(
        rows: list[dict[str, Any]] | Iterable[Mapping[str, Any]],
        vocab: int,
        device: torch.device | str | None = None,
    ) -> SamplingTensors:
        """Build from plain dicts. Keys (all optional): temperature (1.0), top_k (0), top_p (1.0),
        min_p (0.0), presence_penalty (0.0), frequency_penalty (0.0), repetition_penalty (1.0),
        seed (0, any int; taken mod 2**64), step (0), output_tokens (list of ids),
        prompt_tokens (list of ids)."""
        rows = list(rows)
        dev = torch.device(device) if device is not None else torch.device("cpu")
        b = len(rows)

        def col(key: str, default: float, dtype: torch.dtype) -> torch.Tensor:
            vals = [r.get(key, default) for r in rows]
            vals = [default if v is None else v for v in vals]
            return torch.tensor(vals, dtype=dtype).reshape(b)

        counts = torch.zeros((b, vocab), dtype=torch.int32)
        prompt = torch.zeros((b, vocab), dtype=torch.bool)
        for i, r in enumerate(rows):
            out = [int(t) for t in r.get("output_tokens") or []]
            if out:
                ids = torch.tensor(out, dtype=torch.long)
                counts[i] = torch.bincount(ids, minlength=vocab)[:vocab].to(torch.int32)
            pr = [int(t) for t in r.get("prompt_tokens") or []]
            if pr:
                prompt[i, torch.tensor(pr, dtype=torch.long)] = True
        seeds = torch.tensor([to_int64_bits(r.get("seed") or 0) for r in rows], dtype=torch.int64)
        steps = torch.tensor([to_int64_bits(r.get("step") or 0) for r in rows], dtype=torch.int64)
        built = SamplingTensors(
            temperature=col("temperature", 1.0, torch.float32),
            top_k=col("top_k", 0, torch.int32),
            top_p=col("top_p", 1.0, torch.float32),
            min_p=col("min_p", 0.0, torch.float32),
            presence_penalty=col("presence_penalty", 0.0, torch.float32),
            frequency_penalty=col("frequency_penalty", 0.0, torch.float32),
            repetition_penalty=col("repetition_penalty", 1.0, torch.float32),
            output_counts=counts,
            prompt_mask=prompt,
            seeds=seeds.reshape(b),
            steps=steps.reshape(b),
        )
        return built.to(dev)
