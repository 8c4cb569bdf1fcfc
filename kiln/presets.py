"""Kiln's named sampling presets (the Qwen3 model cards' advice, docs/behavior.md §5.1) and
vLLM's neutral defaults. A leaf module: the configuration checks preset names against it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Preset:
    temperature: float
    top_p: float
    top_k: int
    min_p: float
    repetition_penalty: float
    presence_penalty: float
    frequency_penalty: float


PRESETS: dict[str, Preset] = {
    "qwen3-thinking-general": Preset(1.0, 0.95, 20, 0.0, 1.0, 1.5, 0.0),
    "qwen3-thinking-coding": Preset(0.6, 0.95, 20, 0.0, 1.0, 0.0, 0.0),
    "qwen3-non-thinking-general": Preset(0.7, 0.8, 20, 0.0, 1.0, 1.5, 0.0),
    "qwen3-non-thinking-reasoning": Preset(1.0, 0.95, 20, 0.0, 1.0, 1.5, 0.0),
    "greedy": Preset(0.0, 1.0, 0, 0.0, 1.0, 0.0, 0.0),
}
_ALIASES = {
    "qwen3.5-thinking-coding": "qwen3-thinking-coding",
    "qwen3.5-non-thinking-general": "qwen3-non-thinking-general",
    "qwen3.5-non-thinking-reasoning": "qwen3-non-thinking-reasoning",
}
DEFAULT_PRESET = "qwen3-thinking-general"
# vLLM's defaults with no generation config: every filter and penalty off, temperature 1.
NEUTRAL = Preset(1.0, 1.0, 0, 0.0, 1.0, 0.0, 0.0)


def canonical_preset(name: str) -> str | None:
    """A preset name or alias -> its canonical name; None when it names no preset."""
    key = name.strip().lower()
    key = _ALIASES.get(key, key)
    return key if key in PRESETS else None
