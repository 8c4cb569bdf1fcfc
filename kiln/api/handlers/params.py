"""Wire request fields -> engine SamplingParams: presets, overrides, max_tokens, stop strings.

Kiln's rules (reference §5, §15): a request starts from a preset (default
`qwen3-thinking-general`, or `qwen3-thinking-coding` when tools are present and no preset is
named; unknown names fall back to thinking-general), explicit fields override it, `max_tokens`
wins over `max_completion_tokens` when both are non-null, the default is 2048, and the result is
clamped to what is left of the context window.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from msgspec import UNSET

from kiln.engine.request import SamplingParams
from kiln.text.stop_automaton import StopAutomaton

DEFAULT_MAX_TOKENS = 2048
U64 = 2**64


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


def opt(value: Any) -> Any:
    """UNSET (field missing) and None (explicit null) both mean 'not given' for sampling."""
    return None if value is UNSET else value


def preset_name(requested: str | None, has_tools: bool) -> str:
    if requested is None:
        return "qwen3-thinking-coding" if has_tools else DEFAULT_PRESET
    key = requested.strip().lower()
    key = _ALIASES.get(key, key)
    return key if key in PRESETS else DEFAULT_PRESET


def normalize_stop(stop: Any) -> tuple[str, ...]:
    """Dedupe, sort, and drop any stop string that contains another (reference §15.8)."""
    if stop is None or stop is UNSET:
        return ()
    items = [stop] if isinstance(stop, str) else [s for s in stop if isinstance(s, str)]
    if not items:
        return ()
    if "" in items:
        return ("",)
    ac = StopAutomaton(sorted(set(items)))  # linear in the strings' length, not quadratic in count
    return tuple(s for i, s in enumerate(ac.patterns) if not ac.contains_another(i))


def requested_max_tokens(max_tokens: Any, max_completion_tokens: Any) -> int | None:
    mt, mct = opt(max_tokens), opt(max_completion_tokens)
    if mt is not None:
        return int(mt)
    if mct is not None:
        return int(mct)
    return None


def effective_max_tokens(requested: int | None, prompt_len: int, max_model_len: int) -> int:
    wanted = DEFAULT_MAX_TOKENS if requested is None else requested
    return max(0, min(wanted, max_model_len - prompt_len))


def _num(value: Any, default: float) -> float:
    v = opt(value)
    if v is None:
        return default
    f = float(v)
    return f if math.isfinite(f) else default


def is_greedy(temperature: float, top_k: int) -> bool:
    """Reference §5.2: temperature 0, or top_k 1 (at a finite positive temperature)."""
    return temperature == 0.0 or (top_k == 1 and math.isfinite(temperature) and temperature > 0)


def sampling_params(
    req: Any, *, max_tokens: int, stop: tuple[str, ...], seed: int | None, has_tools: bool,
    base: Preset | None = None,
) -> SamplingParams:
    """Build the engine's SamplingParams from a chat, batch or completions wire request.

    The request's own fields win; the rest come from the named preset, else ``base`` (when
    given), else Kiln's default preset. A greedy request (temperature 0 or top_k 1) takes
    penalties only from its own fields or a preset it names (DESIGN §6): the default preset's
    presence penalty must not change the argmax."""
    named = opt(getattr(req, "sampling_preset", None))
    preset = PRESETS[preset_name(named, has_tools)] if base is None or named is not None else base
    top_k_req = opt(req.top_k)
    # top_k: -1 is vLLM's "off", as 0 is Kiln's
    top_k = preset.top_k if top_k_req is None else max(0, int(top_k_req))
    temperature = _num(req.temperature, preset.temperature)
    if is_greedy(temperature, top_k) and named is None:
        preset = NEUTRAL
    return SamplingParams(
        temperature=temperature,
        top_p=_num(req.top_p, preset.top_p),
        top_k=top_k,
        min_p=_num(req.min_p, preset.min_p),
        presence_penalty=_num(req.presence_penalty, preset.presence_penalty),
        frequency_penalty=_num(req.frequency_penalty, preset.frequency_penalty),
        repetition_penalty=_num(req.repetition_penalty, preset.repetition_penalty),
        max_tokens=max_tokens,
        stop=stop,
        ignore_eos=bool(opt(getattr(req, "ignore_eos", False))),
        seed=None if seed is None else seed % U64,
    )


def choice_seed(seed: Any, index: int) -> int | None:
    s = opt(seed)
    return None if s is None else (int(s) + index) % U64
