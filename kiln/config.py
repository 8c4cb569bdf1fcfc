"""Frozen server configuration, validated at construction.

Every `KILN_*` environment variable is declared in `ENV_VARS` and read once, in `from_env`.
Command-line flags override the environment; bad values fail loudly at start.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from kiln.engine.config import KV_CACHE_DTYPES
from kiln.presets import PRESETS, canonical_preset

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8420
DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024


class ConfigError(ValueError):
    """A configuration value is invalid."""


@dataclass(frozen=True)
class ServerConfig:
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    model: str | None = None
    served_model_name: str | None = None
    model_aliases: tuple[str, ...] = ()
    chat_template: str | None = None
    dtype: str | None = None
    device: str | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_model_len: int | None = None
    kv_memory_mb: int = 512
    kv_cache_dtype: str = "auto"
    block_size: int = 16
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 512
    max_prefill_tokens_while_decoding: int = 8
    prefill_cap_context: int = 1024
    enable_prefix_caching: bool = True
    default_thinking_enabled: bool | None = None
    default_thinking_budget_tokens: int | None = None
    default_thinking_budget_ms: int | None = None
    fold_reasoning_into_content: bool = False
    log_level: str = "info"
    adapter_dir: str | None = None
    max_lora_slots: int = 8
    max_cpu_loras: int = 32
    api_keys: tuple[str, ...] = ()
    metrics_require_auth: bool = False
    max_waiting_requests: int = 256
    request_timeout_s: float = 600.0
    drain_timeout_s: float = 30.0
    header_timeout_s: float = 10.0
    body_timeout_s: float = 60.0
    keep_alive_s: float = 5.0
    max_connections: int = 1024
    send_timeout_s: float = 60.0
    default_sampling_preset: str | None = None
    max_logprobs: int = 20
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __repr__(self) -> str:  # never print API keys
        shown = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "api_keys"}
        keys = f"<{len(self.api_keys)} key(s)>"
        return f"ServerConfig(api_keys={keys}, " + ", ".join(f"{k}={v!r}" for k, v in shown.items()) + ")"

    def __post_init__(self) -> None:
        if not 0 < self.port < 65536:
            raise ConfigError(f"port must be in 1..65535, got {self.port}")
        if self.max_body_bytes < 1024:
            raise ConfigError(f"max_body_bytes must be at least 1024, got {self.max_body_bytes}")
        for name in ("kv_memory_mb", "block_size", "max_num_seqs", "max_num_batched_tokens",
                     "max_prefill_tokens_while_decoding", "prefill_cap_context",
                     "max_lora_slots", "max_cpu_loras"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)}")
        if self.max_model_len is not None and self.max_model_len <= 0:
            raise ConfigError(f"max_model_len must be positive, got {self.max_model_len}")
        for name in ("default_thinking_budget_tokens", "default_thinking_budget_ms"):
            value = getattr(self, name)
            if value is not None and not 0 <= value <= 2**32 - 1:
                raise ConfigError(f"{name} must be in 0..4294967295, got {value}")
        if self.dtype not in (None, "float32", "bfloat16", "float16", "auto"):
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
        if self.max_logprobs < 0:
            raise ConfigError(f"max_logprobs must be >= 0, got {self.max_logprobs}")
        if self.log_level not in ("critical", "error", "warning", "info", "debug", "trace"):
            raise ConfigError(f"unknown log level {self.log_level!r}")

    def with_overrides(self, **overrides: Any) -> ServerConfig:
        known = {f.name for f in fields(self)}
        unknown = set(overrides) - known
        if unknown:
            raise ConfigError(f"unknown config keys: {sorted(unknown)}")
        return replace(self, **{k: v for k, v in overrides.items() if v is not None})


def _parse_bool(name: str, raw: str) -> bool:
    lowered = raw.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{name}={raw!r} is not a boolean (use true/false)")


def _parse_int(name: str, raw: str) -> int:
    try:
        return int(raw.strip())
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not an integer") from None


# name -> (config field, parser)
ENV_VARS: dict[str, tuple[str, str]] = {
    "KILN_HOST": ("host", "str"),
    "KILN_PORT": ("port", "int"),
    "KILN_MODEL": ("model", "str"),
    "KILN_SERVED_MODEL_NAME": ("served_model_name", "str"),
    "KILN_CHAT_TEMPLATE": ("chat_template", "str"),
    "KILN_DTYPE": ("dtype", "str"),
    "KILN_DEVICE": ("device", "str"),
    "KILN_MAX_BODY_BYTES": ("max_body_bytes", "int"),
    "KILN_MAX_MODEL_LEN": ("max_model_len", "int"),
    "KILN_KV_MEMORY_MB": ("kv_memory_mb", "int"),
    "KILN_KV_CACHE_DTYPE": ("kv_cache_dtype", "str"),
    "KILN_BLOCK_SIZE": ("block_size", "int"),
    "KILN_MAX_NUM_SEQS": ("max_num_seqs", "int"),
    "KILN_MAX_NUM_BATCHED_TOKENS": ("max_num_batched_tokens", "int"),
    "KILN_MAX_PREFILL_TOKENS_WHILE_DECODING": ("max_prefill_tokens_while_decoding", "int"),
    "KILN_PREFILL_CAP_CONTEXT": ("prefill_cap_context", "int"),
    "KILN_ENABLE_PREFIX_CACHING": ("enable_prefix_caching", "bool"),
    "KILN_DEFAULT_THINKING_ENABLED": ("default_thinking_enabled", "bool"),
    "KILN_DEFAULT_THINKING_BUDGET_TOKENS": ("default_thinking_budget_tokens", "int"),
    "KILN_DEFAULT_THINKING_BUDGET_MS": ("default_thinking_budget_ms", "int"),
    "KILN_FOLD_REASONING_INTO_CONTENT": ("fold_reasoning_into_content", "bool"),
    "KILN_LOG_LEVEL": ("log_level", "str"),
    "KILN_API_KEY": ("api_keys", "list"),
    "KILN_ADAPTER_DIR": ("adapter_dir", "str"),
    "KILN_MAX_LORA_SLOTS": ("max_lora_slots", "int"),
    "KILN_MAX_CPU_LORAS": ("max_cpu_loras", "int"),
    "KILN_METRICS_REQUIRE_AUTH": ("metrics_require_auth", "bool"),
    "KILN_MAX_WAITING_REQUESTS": ("max_waiting_requests", "int"),
    "KILN_REQUEST_TIMEOUT_S": ("request_timeout_s", "float"),
    "KILN_DRAIN_TIMEOUT_S": ("drain_timeout_s", "float"),
    "KILN_HEADER_TIMEOUT_S": ("header_timeout_s", "float"),
    "KILN_BODY_TIMEOUT_S": ("body_timeout_s", "float"),
    "KILN_KEEP_ALIVE_S": ("keep_alive_s", "float"),
    "KILN_MAX_CONNECTIONS": ("max_connections", "int"),
    "KILN_SEND_TIMEOUT_S": ("send_timeout_s", "float"),
    "KILN_DEFAULT_SAMPLING_PRESET": ("default_sampling_preset", "str"),
    "KILN_MAX_LOGPROBS": ("max_logprobs", "int"),
}


def from_env(environ: Mapping[str, str] | None = None) -> ServerConfig:
    """Build a config from `KILN_*` variables (read once, here)."""
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    for var, (name, kind) in ENV_VARS.items():
        raw = env.get(var)
        if raw is None or raw == "":
            continue
        if kind == "int":
            values[name] = _parse_int(var, raw)
        elif kind == "bool":
            values[name] = _parse_bool(var, raw)
        elif kind == "float":
            try:
                values[name] = float(raw)
            except ValueError:
                raise ConfigError(f"{var} is not a number") from None
        elif kind == "list":
            values[name] = tuple(part.strip() for part in raw.split(",") if part.strip())
            if not values[name]:  # e.g. KILN_API_KEY="," : set, yet nothing in it
                raise ConfigError(f"{var} is set but names nothing")
        else:
            values[name] = raw
    return ServerConfig(**values)
