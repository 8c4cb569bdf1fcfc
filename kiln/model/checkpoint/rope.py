"""Rotary frequency scaling for contexts longer than the one a model was trained on: the kinds
Llama-family checkpoints ship, read from a ``config.json`` or a GGUF file, refused otherwise.

- ``llama3`` (Llama 3.1, 3.2, 3.3): frequencies whose wavelength is longer than
  ``original_max_position / low_freq_factor`` are divided by ``factor``, those shorter than
  ``original_max_position / high_freq_factor`` kept, the ones between blended.
- ``linear``: every frequency divided by ``factor``.
- ``divisors``: one divisor per frequency, as a GGUF file holds them (``rope_freqs.weight``:
  llama.cpp's converter writes ``llama3`` scaling this way, and divides by them as here).

The scaled frequencies are computed in one place (``kiln.model.layers.RotaryEmbedding``), and
the torch path, the Triton kernels and the C step all read them from there.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

# what the C step, the torch path and the kernels can run: anything else is refused at load
KINDS = ("llama3", "linear", "divisors")


class RopeScalingError(ValueError):
    """A rope scaling this server does not implement (the loader reports it as unsupported)."""


@dataclass(frozen=True)
class RopeScaling:
    kind: str  # one of KINDS
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192
    divisors: tuple[float, ...] = ()  # kind "divisors": one per frequency (head_dim / 2)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise RopeScalingError(f"rope scaling {self.kind!r} is not supported")
        numbers = (self.factor, self.low_freq_factor, self.high_freq_factor, *self.divisors)
        if not all(math.isfinite(x) and x > 0 for x in numbers):
            raise RopeScalingError("rope scaling factors must be finite and positive")
        if self.kind == "llama3" and self.high_freq_factor <= self.low_freq_factor:
            raise RopeScalingError("rope scaling llama3 needs high_freq_factor > low_freq_factor")
        if self.kind == "divisors" and not self.divisors:
            raise RopeScalingError("rope scaling divisors: none given")

    def to_hf(self) -> dict[str, Any]:
        """The ``rope_scaling`` of a ``config.json`` (a GGUF's divisors have none)."""
        if self.kind == "llama3":
            return {"rope_type": "llama3", "factor": self.factor,
                    "low_freq_factor": self.low_freq_factor,
                    "high_freq_factor": self.high_freq_factor,
                    "original_max_position_embeddings": self.original_max_position}
        if self.kind == "linear":
            return {"rope_type": "linear", "factor": self.factor}
        raise RopeScalingError("a GGUF file's rope frequency divisors have no config.json form")


def from_hf(cfg: Mapping[str, Any]) -> RopeScaling | None:
    """``rope_scaling`` (transformers 4) or ``rope_parameters`` (5) of a ``config.json``."""
    spec = cfg.get("rope_scaling") or cfg.get("rope_parameters")
    if not isinstance(spec, Mapping):
        return None
    kind = spec.get("rope_type", spec.get("type"))
    if kind in (None, "default"):
        return None
    if kind == "llama3":
        return RopeScaling("llama3", factor=float(spec.get("factor", 8.0)),
                           low_freq_factor=float(spec.get("low_freq_factor", 1.0)),
                           high_freq_factor=float(spec.get("high_freq_factor", 4.0)),
                           original_max_position=int(spec.get(
                               "original_max_position_embeddings", 8192)))
    if kind == "linear":
        return RopeScaling("linear", factor=float(spec.get("factor", 1.0)))
    raise RopeScalingError(f"rope_scaling type {kind!r} is not supported")


def from_gguf(meta: Mapping[str, Any], arch: str, divisors: tuple[float, ...] | None,
              head_dim: int) -> RopeScaling | None:
    """A GGUF's ``rope_freqs.weight`` divisors (``divisors``), or its ``rope.scaling.type``
    (``linear`` with ``rope.scaling.factor``); both given, each frequency gets both."""
    kind = str(meta.get(f"{arch}.rope.scaling.type", "none"))
    if kind not in ("none", "linear"):
        raise RopeScalingError(f"GGUF rope scaling {kind!r} is not supported")
    linear = float(meta.get(f"{arch}.rope.scaling.factor", 1.0)) if kind == "linear" else 1.0
    if divisors is None:
        return RopeScaling("linear", factor=linear) if kind == "linear" else None
    if len(divisors) != head_dim // 2:
        raise RopeScalingError(f"rope_freqs.weight has {len(divisors)} values, not one per "
                               f"rotary frequency ({head_dim // 2})")
    return RopeScaling("divisors", divisors=tuple(d * linear for d in divisors))


def inv_freq(head_dim: int, theta: float, scaling: RopeScaling | None = None) -> np.ndarray:
    """The rotary frequencies (float32 ``[head_dim / 2]``), scaled as ``scaling`` says: the one
    place every path takes them from (the torch path's ``RotaryEmbedding``, the Triton kernels,
    the C step), computed without torch.

    transformers' formula, ``1 / theta ** (arange(0, dim, 2) / dim)`` in float32, with the power
    correctly rounded (float64's, rounded once to float32): torch's float32 ``pow`` is vectorised
    by the CPU's instruction set and lands 1-2 ulp away from that in about one frequency of
    thirty configurations (measured: 0 on SmolLM2's), numpy's float32 ``pow`` on nearly all of
    them. These are the same bits on every machine, with or without torch; everything after
    the power is float32 arithmetic in transformers' order, with torch's scalar rules (a
    tensor over a scalar divides; a scalar over a tensor multiplies the reciprocal), so a
    ``llama3`` scaling is transformers' blend, bit for bit, over the same base."""
    exps = np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)
    powers = (np.float64(theta) ** exps.astype(np.float64)).astype(np.float32)
    base = np.float32(1.0) / powers
    return base if scaling is None else _scaled(base, scaling)


def _over(x: float, t: np.ndarray) -> np.ndarray:
    """``x / t`` as torch computes a Python scalar over a float32 tensor: ``(1 / t) * x``."""
    return (np.float32(1.0) / t) * np.float32(x)


def _scaled(f: np.ndarray, s: RopeScaling) -> np.ndarray:
    one = np.float32
    if s.kind == "linear":
        return f / one(s.factor)
    if s.kind == "divisors":
        return f / np.asarray(s.divisors, dtype=np.float32)
    old = s.original_max_position
    low_wavelen, high_wavelen = old / s.low_freq_factor, old / s.high_freq_factor
    wavelen = _over(2 * math.pi, f)
    out = np.where(wavelen > one(low_wavelen), f / one(s.factor), f)
    smooth = (_over(old, wavelen) - one(s.low_freq_factor)) / one(
        s.high_freq_factor - s.low_freq_factor)
    blended = (one(1.0) - smooth) * out / one(s.factor) + smooth * out
    between = ~(wavelen < one(high_wavelen)) & ~(wavelen > one(low_wavelen))
    return np.where(between, blended, out).astype(np.float32)
