"""Wire request fields -> what the engine runs: SamplingParams (presets, overrides, max_tokens,
stop strings) and the model and adapter mix a request runs under (``resolve_model``,
``select``). The fields this server refuses are ``kiln.api.requests.refused``'s.

A request starts from the sampling preset it names (unknown names fall back to
`qwen3-thinking-general`, docs/behavior.md §5.1); without one, from the server's default: preset of
`--default-sampling-preset` when given, else the model's own generation_config.json (vLLM's
`--generation-config auto`; fields it lacks, and every GGUF, take vLLM's neutral values).
Explicit fields override it. `max_tokens` wins over `max_completion_tokens` when both are
non-null, the default is the model's generation_config.json `max_new_tokens`, else 2048, and the
result is clamped to what is left of the context window.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from msgspec import UNSET

from kiln.adapters import AdapterNotFound, InvalidAdapterName, validate_name
from kiln.api.backend import Backend
from kiln.api.errors import ApiError
from kiln.api.submission import engine_error
from kiln.api.wire_values import GenRequest, opt
from kiln.engine.errors import EngineError
from kiln.engine.lora_mix import MAX_MIX_ENTRIES
from kiln.engine.request import SamplingParams, is_greedy
from kiln.presets import DEFAULT_PRESET, NEUTRAL, PRESETS, Preset, canonical_preset
from kiln.text.stop_automaton import StopAutomaton

DEFAULT_MAX_TOKENS = 2048
U64 = 2**64
__all__ = ["NEUTRAL", "PRESETS", "Preset"]  # re-exported for the handlers and tests


def preset_name(requested: str) -> str:
    return canonical_preset(requested) or DEFAULT_PRESET


# generation_config.json keys vLLM's `--generation-config auto` reads as sampling defaults
_MODEL_FIELDS = {"temperature": float, "top_p": float, "top_k": int, "min_p": float,
                 "repetition_penalty": float}


def model_defaults(generation_config: Mapping[str, Any] | None) -> Preset:
    """The model's own sampling defaults: each field generation_config.json sets (a finite
    number), the rest neutral. A top_k of 0 or less is off (0)."""
    values: dict[str, Any] = {}
    for key, kind in _MODEL_FIELDS.items():
        raw = (generation_config or {}).get(key)
        if isinstance(raw, bool) or not isinstance(raw, int | float) or not math.isfinite(raw):
            continue
        values[key] = max(0, int(raw)) if kind is int else float(raw)
    return dataclasses.replace(NEUTRAL, **values)


def server_default(default_preset: str | None, generation_config: Mapping[str, Any] | None
                   ) -> Preset:
    """Where a request that names no preset starts: ``--default-sampling-preset`` when the
    server has one, else the model's generation config."""
    if default_preset is not None:
        return PRESETS[preset_name(default_preset)]
    return model_defaults(generation_config)


def state_default(state: Any) -> Preset:
    """``server_default`` for a running app (AppState): its config and its backend's model."""
    return server_default(state.config.default_sampling_preset, state.backend.generation_config)


def model_max_tokens(generation_config: Mapping[str, Any] | None) -> int | None:
    """generation_config.json's ``max_new_tokens`` (a positive integer), which vLLM's
    `--generation-config auto` takes as the default max_tokens; None when it has none.
    ``max_length`` is not read: it counts the prompt too (transformers), and vLLM ignores it."""
    raw = (generation_config or {}).get("max_new_tokens")
    return raw if isinstance(raw, int) and not isinstance(raw, bool) and raw > 0 else None


def state_max_tokens(state: Any) -> int | None:
    """``model_max_tokens`` of a running app's model (whatever sampling preset applies: presets
    set no length)."""
    return model_max_tokens(state.backend.generation_config)


def normalize_stop(stop: Any) -> tuple[str, ...]:
    """Dedupe, sort, and drop any stop string that contains another (docs/behavior.md §15.8)."""
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


def effective_max_tokens(requested: int | None, prompt_len: int, max_model_len: int,
                         model_default: int | None = None) -> int:
    """Chat's and batch's max_tokens: the request's, else the model's max_new_tokens
    (``state_max_tokens``), else 2048; clamped to what is left of the context window."""
    if requested is not None:
        wanted = requested
    else:
        wanted = DEFAULT_MAX_TOKENS if model_default is None else model_default
    return max(0, min(wanted, max_model_len - prompt_len))


def _num(value: Any, default: float) -> float:
    v = opt(value)
    if v is None:
        return default
    f = float(v)
    return f if math.isfinite(f) else default


def sampling_params(
    req: GenRequest, *, max_tokens: int, stop: tuple[str, ...], seed: int | None, base: Preset,
) -> SamplingParams:
    """Build the engine's SamplingParams from a chat, batch or completions wire request.

    The request's own fields win; the rest come from the preset it names, else ``base`` (the
    server's default, ``state_default``). A greedy request (``is_greedy``: a temperature below
    1e-5 or top_k 1) takes penalties only from its fields or a preset it names
    (docs/decisions.md): no default may change the argmax."""
    named = opt(req.sampling_preset)
    preset = base if named is None else PRESETS[preset_name(named)]
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
        ignore_eos=bool(opt(req.ignore_eos)),
        seed=None if seed is None else seed % U64,
    )


def choice_seed(seed: Any, index: int) -> int | None:
    s = opt(seed)
    return None if s is None else (int(s) + index) % U64


# -- the model and adapters a request runs under (docs/behavior.md §6) ------------------------
# Chat's and batch's `adapter` is tri-state: missing = the server default, null or "" = base, a
# name = that adapter (scoring on `/v1/completions` runs the base model unless `model` names an
# adapter, docs/decisions.md). `adapters: [{name, scale}]` composes. `model` may name one (vLLM);
# combining that with `adapter`/`adapters` is a 400. Unknown names are 404 `adapter_not_found`;
# names with separators or traversal are 400 `invalid_adapter_name`.

MAX_COMPOSED = MAX_MIX_ENTRIES  # the engine owns the limit


@dataclass(frozen=True)
class Selection:
    mix: tuple[tuple[str, float], ...]  # (adapter name, scale); empty = base
    lora: tuple[tuple[Any, float], ...]  # loaded adapters for the engine
    param: str | None = None  # the field named when the mix makes the logits non-finite

    @property
    def label(self) -> str:
        return "+".join(name for name, _ in self.mix) or "base"


BASE = Selection((), ())


def adapter_not_found(name: str, param: str) -> ApiError:
    return ApiError(404, "adapter_not_found", f"adapter {name!r} not found", param=param)


def check_adapter_name(name: str, param: str) -> str:
    try:
        return validate_name(name)
    except InvalidAdapterName as exc:
        raise ApiError(400, "invalid_adapter_name", str(exc), param=param) from None


async def load_mix(backend: Backend, mix: list[tuple[str, float]], param: str) -> Selection:
    names = [check_adapter_name(name, param) for name, _ in mix]
    store = backend.adapter_store
    for name in names:
        if store is None or not store.exists(name):
            raise adapter_not_found(name, param)
    try:
        lora = await backend.prepare_lora([(n, s) for n, (_, s) in zip(names, mix, strict=True)])
    except InvalidAdapterName as exc:
        raise ApiError(400, "invalid_adapter_name", str(exc), param=param) from None
    except AdapterNotFound as exc:
        raise ApiError(404, "adapter_not_found", str(exc), param=param) from None
    except ValueError as exc:
        raise ApiError(
            400, "adapter_load_failed", f"adapter cannot be used: {exc}", param=param
        ) from None
    except EngineError as exc:  # the engine is not running (adapters load on its thread)
        raise engine_error(exc) from None
    return Selection(tuple((n, s) for n, (_, s) in zip(names, mix, strict=True)), lora,
                     _blamed(param, [s for _, s in mix]))


def _blamed(param: str, scales: list[float]) -> str:
    """The field to name when this mix overflows: of a composition, the largest scale."""
    if param != "adapters":
        return param
    return f"adapters[{max(range(len(scales)), key=lambda i: abs(scales[i]))}].scale"


def _composition(adapters: Any) -> list[tuple[str, float]]:
    if len(adapters) == 0:
        raise ApiError(
            400, "invalid_compose_request", "adapters must not be empty", param="adapters"
        )
    if len(adapters) > MAX_COMPOSED:
        raise ApiError(
            400, "invalid_compose_request",
            f"at most {MAX_COMPOSED} adapters can be composed", param="adapters",
        )
    return [(a.name, float(a.scale)) for a in adapters]


async def select(
    backend: Backend, adapter: Any, adapters: Any, model_adapter: str | None, *, tri_state: bool
) -> Selection:
    """The adapter mix of a chat or batch request (tri_state: a missing ``adapter`` is the server
    default), or of a completions request (no default)."""
    given_adapters = adapters is not UNSET and adapters is not None
    if model_adapter is not None:
        if (adapter is not UNSET and adapter not in (None, "")) or given_adapters:
            raise ApiError(
                400, "invalid_compose_request",
                "model names an adapter; do not also send adapter or adapters", param="model",
            )
        return await load_mix(backend, [(model_adapter, 1.0)], "model")
    if given_adapters:
        if isinstance(adapter, str) and adapter:
            raise ApiError(
                400, "invalid_compose_request", "use adapter or adapters, not both",
                param="adapters",
            )
        return await load_mix(backend, _composition(adapters), "adapters")
    if adapter is UNSET:
        store = backend.adapter_store
        default = store.default if (tri_state and store is not None) else None
        return await load_mix(backend, [(default, 1.0)], "adapter") if default else BASE
    if adapter is None or adapter == "":
        return BASE
    return await load_mix(backend, [(str(adapter), 1.0)], "adapter")


def resolve_model(backend: Backend, requested: str | None) -> tuple[str, str | None]:
    """docs/decisions.md: missing/null -> the served model; served id or alias -> fine; name of an
    available adapter -> that adapter; else 404. Returns (model id to report, adapter or None)."""
    if requested is None or requested == backend.model_id or requested in backend.aliases:
        return backend.model_id, None
    adapter = adapter_named_by_model(backend, requested)
    if adapter is not None:
        return adapter, adapter
    names = [backend.model_id, *adapter_names(backend)]
    shown = ", ".join(names[:9]) + (f" and {len(names) - 9} more" if len(names) > 9 else "")
    raise ApiError(
        404, "model_not_found", f"model {requested!r} is not served here; available: {shown}",
        param="model",
    )


async def resolve_model_adapter(backend: Backend, model: str | None, adapter: Any,
                                adapters: Any) -> tuple[str, Selection]:
    """A chat or batch request's model (the id to report) and adapter mix, in one step."""
    reported, model_adapter = resolve_model(backend, model)
    return reported, await select(backend, adapter, adapters, model_adapter, tri_state=True)


def adapter_names(backend: Backend) -> list[str]:
    """Adapters that `model` can name: one named like the served model or an alias is shadowed
    by it (`model` selects the base), so it is not listed as a second card with the same id."""
    store = backend.adapter_store
    served = {backend.model_id, *backend.aliases}
    return [i.name for i in (store.list() if store is not None else []) if i.name not in served]


def adapter_named_by_model(backend: Backend, model: str | None) -> str | None:
    store = backend.adapter_store
    if model is None or store is None or model == backend.model_id:
        return None
    try:
        name = validate_name(model)
    except InvalidAdapterName:
        return None
    return name if store.exists(name) else None
