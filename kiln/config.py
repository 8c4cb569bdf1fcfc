"""Kiln's settings: one table, and the frozen server configuration it fills.

``SETTINGS`` declares every setting once: its command-line flag, its ``KILN_*`` environment
variable, its type, its default, its help text and the config field it fills. The ``kiln serve``
flags (:mod:`kiln.cli`), the ``serve run`` arguments (:mod:`kiln.scale.ray_serve`), ``from_env``
and the flag reference ``docs/flags.md`` (:mod:`kiln.config_doc`) are all built from it, and
every ``KILN_*`` variable the code reads is declared in it (``ENV_VARS`` is the complete list; a
test checks the source against it). Flags override the environment; bad values fail loudly at
start.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from kiln.engine.config import KV_CACHE_DTYPES, EngineConfig
from kiln.engine.speculative import SpeculativeConfig
from kiln.presets import PRESETS, canonical_preset

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8420
DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024
DEFAULT_GRAMMAR_COMPILE_TIMEOUT_S = 10.0

KINDS = ("str", "int", "float", "bool", "list")
# Where a setting's value goes: a ServerConfig field, a ProcessSettings field (read where no
# ServerConfig is at hand: model loading), or kiln_kernels, which reads its own variable because
# it never imports kiln (the declaration is here all the same).
OWNERS = ("server", "process", "kernels")


class ConfigError(ValueError):
    """A configuration value is invalid."""


@dataclass(frozen=True)
class Setting:
    """One setting: where it is given (flag, environment) and where its value goes."""

    field: str  # the field of its owner's record that it fills
    kind: str  # one of KINDS: how the environment's text is parsed
    default: Any
    help: str
    flag: str | None  # "--port"; None: environment only
    env: str | None  # "KILN_PORT"; None: flag only
    choices: tuple[str, ...] = ()  # the flag's accepted values, when it has a fixed set
    shown_default: str | None = None  # the default in words, where the value alone says little
    owner: str = "server"  # one of OWNERS

    @property
    def dest(self) -> str | None:
        """The argparse attribute of the flag."""
        return self.flag.removeprefix("--").replace("-", "_") if self.flag else None

    @property
    def default_text(self) -> str:
        if self.shown_default is not None:
            return self.shown_default
        if self.kind == "bool":
            return "on" if self.default else "off"
        return "none" if self.default in (None, ()) else str(self.default)


_AUTO = "auto-name"


def _s(name: str, kind: str, default: Any, help_text: str, *, flag: str | None = _AUTO,
       env: str | None = _AUTO, choices: tuple[str, ...] = (), shown: str | None = None,
       owner: str = "server") -> Setting:
    """A setting whose flag is ``--name-with-dashes`` and variable ``KILN_NAME`` unless given."""
    return Setting(field=name, kind=kind, default=default, help=help_text,
                   flag=f"--{name.replace('_', '-')}" if flag == _AUTO else flag,
                   env=f"KILN_{name.upper()}" if env == _AUTO else env, choices=choices,
                   shown_default=shown, owner=owner)


SETTINGS: tuple[Setting, ...] = (
    # the listener and the model
    _s("host", "str", DEFAULT_HOST, "bind address"),
    _s("port", "int", DEFAULT_PORT, "port"),
    _s("model", "str", None, "HF folder or .gguf file",
       shown="the embedded SmolLM2-135M-Instruct"),
    _s("served_model_name", "str", None, "model id reported by the API",
       shown="the model file's or folder's name"),
    _s("model_aliases", "list", (), "extra accepted model id; repeatable",
       flag="--model-alias", env=None),
    _s("chat_template", "str", None, "Jinja chat template file overriding the model's",
       shown="the model's template"),
    _s("dtype", "str", None, "weight and activation dtype",
       choices=("auto", "float32", "bfloat16", "float16"), shown="bfloat16 on CUDA, float32 on CPU"),
    _s("device", "str", None, "torch device", shown="cuda if available, else cpu"),
    _s("max_body_bytes", "int", DEFAULT_MAX_BODY_BYTES, "request body limit in bytes",
       shown="8388608 (8 MiB)"),
    # adapters
    _s("adapter_dir", "str", None, "directory of PEFT LoRA adapters (one per subdir)"),
    _s("max_lora_slots", "int", 8, "adapters resident at once for batched LoRA"),
    _s("max_cpu_loras", "int", 32,
       "adapters kept loaded in host memory, least recently used dropped first"),
    # the engine: KV cache and batching
    _s("max_model_len", "int", None, "context window cap", shown="the model's context length"),
    _s("kv_memory_mb", "int", None, "KV cache size in MiB",
       shown="512, raised to hold one sequence of the context length"),
    _s("kv_cache_dtype", "str", "auto",
       "K/V element type: auto (the model's dtype, exact) or float16 (CPU only: half the "
       "memory and bytes per step, K/V rounded to half precision)", choices=KV_CACHE_DTYPES),
    _s("block_size", "int", 16, "KV block size in tokens"),
    _s("max_num_seqs", "int", 64, "max running sequences"),
    _s("max_num_batched_tokens", "int", 512, "token budget per engine step"),
    _s("max_prefill_tokens_while_decoding", "int", 8,
       "prefill tokens per step while streams decode"),
    _s("prefill_cap_context", "int", 1024,
       "S: while streams decode, a prefill chunk after c context tokens is capped at "
       "cap * S / (S + c)"),
    _s("enable_prefix_caching", "bool", True, "reuse KV blocks of shared prompt prefixes"),
    # thinking and reasoning
    _s("default_thinking_enabled", "bool", None, "enable thinking unless a request says no",
       shown="the chat template's default"),
    _s("default_thinking_budget_tokens", "int", None,
       "thinking budget in tokens for requests that set none"),
    _s("default_thinking_budget_ms", "int", None,
       "thinking budget in milliseconds for requests that set none"),
    _s("fold_reasoning_into_content", "bool", False, "also copy reasoning into content"),
    # operations
    _s("log_level", "str", "info", "log level (the variable also takes trace)",
       choices=("critical", "error", "warning", "info", "debug")),
    _s("api_keys", "list", (),
       "require this bearer key on /v1 routes; repeatable (KILN_API_KEY: a "
       "comma-separated list)", flag="--api-key", env="KILN_API_KEY"),
    _s("metrics_require_auth", "bool", False, "require an API key on /metrics too"),
    _s("max_waiting_requests", "int", 256, "queued requests beyond running ones before 429"),
    _s("request_timeout_s", "float", 600.0, "per-request timeout in seconds"),
    _s("drain_timeout_s", "float", 30.0,
       "on SIGTERM, wait this long (seconds) for in-flight requests"),
    _s("header_timeout_s", "float", 10.0,
       "a request's headers must arrive within this many seconds (else 408)"),
    _s("body_timeout_s", "float", 60.0,
       "a request's body must arrive within this many seconds of its headers (else 408)"),
    _s("keep_alive_s", "float", 5.0, "close an idle kept-alive connection after this (seconds)"),
    _s("max_connections", "int", 1024,
       "open connections; one past it gets 503 server_overloaded"),
    _s("send_timeout_s", "float", 60.0,
       "abort a connection whose client takes no byte of our output for this long (seconds)"),
    # sampling
    _s("default_sampling_preset", "str", None,
       "Kiln preset a request starts from when it names none",
       shown="the model's generation_config.json, else vLLM's neutral values"),
    _s("max_logprobs", "int", 20,
       "most logprobs (completions) or top_logprobs (chat) a request may ask for; more is a 400"),
    _s("grammar_compile_timeout_s", "float", DEFAULT_GRAMMAR_COMPILE_TIMEOUT_S,
       "a structured-output constraint (response_format, structured_outputs, forced "
       "tool_choice) must compile within this many seconds, else 400 naming the field"),
    # a training loop's routes
    _s("enable_weight_updates", "bool", False,
       "serve the training loop's routes: /pause, /resume, /is_paused, /reset_prefix_cache, "
       "/sleep, /wake_up, /is_sleeping, /update_weights_from_disk, /inference/v1/generate "
       "(vLLM's and SGLang's names), behind --api-key when set"),
    _s("speculative_config", "str", None,
       "speculative decoding, vLLM's JSON: {\"method\": \"ngram\", \"num_speculative_tokens\": K, "
       "\"prompt_lookup_max\": N, \"prompt_lookup_min\": M} (n-gram drafts from the request's "
       "own tokens) or {\"method\": \"draft_model\", \"model\": PATH, "
       "\"num_speculative_tokens\": K} (a GGUF with the served model's tokenizer drafts), "
       "verified so that every token equals plain decoding's", shown="none: off"),
    _s("weight_version", "str", "default",
       "the name of the weights served at start, reported on every response (SGLang's "
       "--weight-version); POST /update_weights_from_disk names the weights it loads"),
    # stored responses (the Responses API's store, previous_response_id) and /ui's conversations
    _s("data_dir", "str", None,
       "directory of Kiln's SQLite database (stored responses and /ui's conversations survive "
       "a restart)",
       shown="none: stored responses and conversations are kept in memory"),
    _s("responses_max_count", "int", 1000,
       "stored responses kept; the oldest is evicted past it"),
    _s("responses_max_mb", "int", 64,
       "MiB of stored responses kept; the oldest are evicted past it"),
    _s("responses_max_age_s", "float", 7 * 24 * 3600.0,
       "a stored response older than this (seconds) is evicted", shown="604800 (7 days)"),
    # the request log (kiln/request_log.py)
    _s("request_log", "str", None, "directory of the request log: one JSON line per finished "
       "inference request", shown="none: no request log"),
    _s("request_log_max_mb", "int", 64, "MiB per request-log file; a new file begins past it"),
    _s("request_log_max_age_s", "float", 86400.0, "seconds per request-log file; a new file "
       "begins past it", shown="86400 (1 day)"),
    _s("request_log_text", "bool", True, "keep the text of messages and completions in the "
       "request log (--no-request-log-text leaves it out)"),
    # read outside ServerConfig
    _s("quant_kernels", "bool", True,
       "on the CPU, keep GGUF and bf16/f16 weights in their stored format and run the "
       "C step (0: float32 copies and the torch path)", flag=None, owner="process"),
    _s("kernel_cache", "str", None, "where the C kernels are compiled to",
       flag=None, shown="$XDG_CACHE_HOME/kiln/kernels (~/.cache by default)", owner="kernels"),
    _s("cpu_isa", "str", None,
       "the C kernels' instruction set: the best the CPU has (avx512, avx2, neon, else "
       "plain), or one forced lower, for tests and benchmarks; the same bits on every one",
       flag=None, choices=("avx512", "avx2", "neon", "plain"), shown="the best the CPU has",
       owner="kernels"),
)

# Every KILN_* environment variable, the complete list.
ENV_VARS: dict[str, Setting] = {s.env: s for s in SETTINGS if s.env is not None}


def setting(name: str, owner: str = "server") -> Setting:
    for s in SETTINGS:
        if s.field == name and s.owner == owner:
            return s
    raise KeyError(f"no {owner} setting {name!r}")


def _default(name: str) -> Any:
    return setting(name).default


@dataclass(frozen=True)
class ServerConfig:
    """The server's settings (their defaults come from ``SETTINGS``)."""

    host: str = _default("host")
    port: int = _default("port")
    model: str | None = _default("model")
    served_model_name: str | None = _default("served_model_name")
    model_aliases: tuple[str, ...] = _default("model_aliases")
    chat_template: str | None = _default("chat_template")
    dtype: str | None = _default("dtype")
    device: str | None = _default("device")
    max_body_bytes: int = _default("max_body_bytes")
    max_model_len: int | None = _default("max_model_len")
    kv_memory_mb: int | None = _default("kv_memory_mb")  # None: DEFAULT_KV_MEMORY_MB or more
    kv_cache_dtype: str = _default("kv_cache_dtype")
    block_size: int = _default("block_size")
    max_num_seqs: int = _default("max_num_seqs")
    max_num_batched_tokens: int = _default("max_num_batched_tokens")
    max_prefill_tokens_while_decoding: int = _default("max_prefill_tokens_while_decoding")
    prefill_cap_context: int = _default("prefill_cap_context")
    enable_prefix_caching: bool = _default("enable_prefix_caching")
    default_thinking_enabled: bool | None = _default("default_thinking_enabled")
    default_thinking_budget_tokens: int | None = _default("default_thinking_budget_tokens")
    default_thinking_budget_ms: int | None = _default("default_thinking_budget_ms")
    fold_reasoning_into_content: bool = _default("fold_reasoning_into_content")
    log_level: str = _default("log_level")
    adapter_dir: str | None = _default("adapter_dir")
    max_lora_slots: int = _default("max_lora_slots")
    max_cpu_loras: int = _default("max_cpu_loras")
    api_keys: tuple[str, ...] = _default("api_keys")
    metrics_require_auth: bool = _default("metrics_require_auth")
    max_waiting_requests: int = _default("max_waiting_requests")
    request_timeout_s: float = _default("request_timeout_s")
    drain_timeout_s: float = _default("drain_timeout_s")
    header_timeout_s: float = _default("header_timeout_s")
    body_timeout_s: float = _default("body_timeout_s")
    keep_alive_s: float = _default("keep_alive_s")
    max_connections: int = _default("max_connections")
    send_timeout_s: float = _default("send_timeout_s")
    default_sampling_preset: str | None = _default("default_sampling_preset")
    max_logprobs: int = _default("max_logprobs")
    grammar_compile_timeout_s: float = _default("grammar_compile_timeout_s")
    enable_weight_updates: bool = _default("enable_weight_updates")
    weight_version: str = _default("weight_version")
    speculative_config: str | None = _default("speculative_config")
    data_dir: str | None = _default("data_dir")
    responses_max_count: int = _default("responses_max_count")
    responses_max_mb: int = _default("responses_max_mb")
    responses_max_age_s: float = _default("responses_max_age_s")
    request_log: str | None = _default("request_log")
    request_log_max_mb: int = _default("request_log_max_mb")
    request_log_max_age_s: float = _default("request_log_max_age_s")
    request_log_text: bool = _default("request_log_text")
    extra: Mapping[str, Any] = field(default_factory=dict)
    def __repr__(self) -> str:  # never print API keys
        shown = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "api_keys"}
        keys = f"<{len(self.api_keys)} key(s)>"
        return f"ServerConfig(api_keys={keys}, " + ", ".join(f"{k}={v!r}" for k, v in shown.items()) + ")"

    def __post_init__(self) -> None:
        if not 0 < self.port < 65536:
            raise ConfigError(f"port must be in 1..65535, got {self.port}")
        if self.speculative_config:  # a bad one fails at start, naming the key
            try:
                SpeculativeConfig.parse(self.speculative_config)
            except ValueError as exc:  # json.JSONDecodeError too
                raise ConfigError(str(exc)) from None
        if self.max_body_bytes < 1024:
            raise ConfigError(f"max_body_bytes must be at least 1024, got {self.max_body_bytes}")
        for name in ("kv_memory_mb", "block_size", "max_num_seqs", "max_num_batched_tokens",
                     "max_prefill_tokens_while_decoding", "prefill_cap_context",
                     "max_lora_slots", "max_cpu_loras"):
            if getattr(self, name) is not None and getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)}")
        if self.max_model_len is not None and self.max_model_len <= 0:
            raise ConfigError(f"max_model_len must be positive, got {self.max_model_len}")
        for name in ("default_thinking_budget_tokens", "default_thinking_budget_ms"):
            value = getattr(self, name)
            if value is not None and not 0 <= value <= 2**32 - 1:
                raise ConfigError(f"{name} must be in 0..4294967295, got {value}")
        if self.dtype is not None and self.dtype not in setting("dtype").choices:
            raise ConfigError(f"dtype must be float32, bfloat16, float16 or auto, got {self.dtype}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ConfigError(f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}, "
                              f"got {self.kv_cache_dtype}")
        if self.max_waiting_requests < 0:
            raise ConfigError("max_waiting_requests must be >= 0")
        if not (0 < self.request_timeout_s < math.inf and 0 <= self.drain_timeout_s < math.inf):
            raise ConfigError("request_timeout_s must be > 0 and drain_timeout_s >= 0, both "
                              "finite (for no practical limit, give a large number)")
        for name in ("header_timeout_s", "body_timeout_s", "keep_alive_s", "send_timeout_s"):
            if not 0 < getattr(self, name) < math.inf:
                raise ConfigError(f"{name} must be > 0 and finite, got {getattr(self, name)}")
        if self.max_connections <= 0:
            raise ConfigError(f"max_connections must be positive, got {self.max_connections}")
        if any(not k or k != k.strip() for k in self.api_keys):
            raise ConfigError("API keys must be non-empty and have no surrounding whitespace")
        if self.default_sampling_preset is not None and canonical_preset(
                self.default_sampling_preset) is None:
            raise ConfigError(f"default_sampling_preset {self.default_sampling_preset!r} is not a "
                              f"preset ({', '.join(PRESETS)})")
        if not 0 < self.grammar_compile_timeout_s < math.inf:
            raise ConfigError("grammar_compile_timeout_s must be > 0 and finite, got "
                              f"{self.grammar_compile_timeout_s}")
        if self.max_logprobs < 0:
            raise ConfigError(f"max_logprobs must be >= 0, got {self.max_logprobs}")
        if self.responses_max_count <= 0 or self.responses_max_mb <= 0:
            raise ConfigError("responses_max_count and responses_max_mb must be positive")
        if self.request_log_max_mb <= 0 or not 0 < self.request_log_max_age_s < math.inf:
            raise ConfigError("request_log_max_mb and request_log_max_age_s must be positive")
        if not 0 < self.responses_max_age_s < math.inf:
            raise ConfigError(f"responses_max_age_s must be > 0 and finite, got "
                              f"{self.responses_max_age_s}")
        if self.log_level not in (*setting("log_level").choices, "trace"):  # trace: env only
            raise ConfigError(f"unknown log level {self.log_level!r}")

    def with_overrides(self, **overrides: Any) -> ServerConfig:
        known = {f.name for f in fields(self)}
        unknown = set(overrides) - known
        if unknown:
            raise ConfigError(f"unknown config keys: {sorted(unknown)}")
        return replace(self, **{k: v for k, v in overrides.items() if v is not None})


@dataclass(frozen=True)
class ProcessSettings:
    """Settings for code that runs without a ServerConfig at hand (model loading, also from
    tests and benchmarks); read from the environment when that code runs."""

    quant_kernels: bool = setting("quant_kernels", "process").default


def _parse_bool(name: str, raw: str) -> bool:
    lowered = raw.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{name}={raw!r} is not a boolean (use true/false)")


def parse_env(var: str, raw: str) -> Any:
    """The value of ``KILN_*`` variable ``var`` from its text, as its setting's kind says."""
    kind = ENV_VARS[var].kind
    if kind == "int":
        try:
            return int(raw.strip())
        except ValueError:
            raise ConfigError(f"{var}={raw!r} is not an integer") from None
    if kind == "bool":
        return _parse_bool(var, raw)
    if kind == "float":
        try:
            return float(raw)
        except ValueError:
            raise ConfigError(f"{var} is not a number") from None
    if kind == "list":
        items = tuple(part.strip() for part in raw.split(",") if part.strip())
        if not items:  # e.g. KILN_API_KEY="," : set, yet nothing in it
            raise ConfigError(f"{var} is set but names nothing")
        return items
    return raw


def _env_values(owner: str, environ: Mapping[str, str] | None) -> dict[str, Any]:
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    for var, s in ENV_VARS.items():
        raw = env.get(var)
        if s.owner == owner and raw is not None and raw != "":
            values[s.field] = parse_env(var, raw)
    return values


def from_env(environ: Mapping[str, str] | None = None) -> ServerConfig:
    """Build a config from `KILN_*` variables (read once, here)."""
    return ServerConfig(**_env_values("server", environ))


def process_settings(environ: Mapping[str, str] | None = None) -> ProcessSettings:
    """The process-wide settings from their `KILN_*` variables."""
    return ProcessSettings(**_env_values("process", environ))


# -- the engine's share of the server configuration -------------------------------------------

def engine_config(config: ServerConfig) -> EngineConfig:
    """The engine settings (KV cache, batching, LoRA slots) of a server configuration."""
    return EngineConfig(
        block_size=config.block_size,
        kv_memory_mb=config.kv_memory_mb,
        kv_cache_dtype=config.kv_cache_dtype,
        max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=config.max_num_batched_tokens,
        max_prefill_tokens_while_decoding=config.max_prefill_tokens_while_decoding,
        prefill_cap_context=config.prefill_cap_context,
        enable_prefix_caching=config.enable_prefix_caching,
        max_model_len=config.max_model_len,
        max_lora_slots=config.max_lora_slots,
        weight_version=config.weight_version,
        speculative=None if not config.speculative_config
        else SpeculativeConfig.parse(config.speculative_config),
    )
