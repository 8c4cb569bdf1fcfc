"""Prometheus metrics: one registry per process, rendered by GET /metrics.

Kiln's own `kiln_*` series, plus the `vllm:*` gauges that the Gateway API Inference Extension
(llm-d's endpoint picker) reads to route between replicas: waiting and running requests, KV-cache
usage, LoRA adapter info and the cache configuration (`vllm:cache_config_info`).

The series are defined here; each layer records its own facts in them: the connection layer
its connections (kiln/connections.py), the app its HTTP requests (kiln/api/app.py), the
handlers each finished engine request (``observe_request``, kiln/api/submission.py);
the engine's gauges and the cache configuration are read at each scrape (``observe_engine``,
``observe_cache_config``, from kiln/api/handlers/meta.py).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

REGISTRY = CollectorRegistry()

_LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)

REQUESTS = Counter(
    "kiln_http_requests_total", "HTTP requests by route, method and status.",
    ["route", "method", "status"], registry=REGISTRY,
)
HTTP_LATENCY = Histogram(
    "kiln_http_request_duration_seconds", "HTTP request latency (to the last body byte).",
    ["route"], registry=REGISTRY, buckets=_LATENCY,
)
TOKENS = Counter(
    "kiln_tokens_total", "Tokens processed, by kind (prompt, generation).", ["kind"],
    registry=REGISTRY,
)
TTFT = Histogram(
    "kiln_time_to_first_token_seconds", "Time from arrival to the first generated token.",
    registry=REGISTRY, buckets=_LATENCY,
)
ITL = Histogram(
    "kiln_inter_token_latency_seconds", "Gaps between consecutive generated tokens.",
    registry=REGISTRY, buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
)
E2E = Histogram(
    "kiln_request_e2e_seconds", "Engine request latency from arrival to its last token.",
    registry=REGISTRY, buckets=_LATENCY,
)
QUEUE = Histogram(
    "kiln_request_queue_seconds", "Time from arrival until the engine first scheduled it.",
    registry=REGISTRY, buckets=_LATENCY,
)
FINISHED = Counter(
    "kiln_requests_finished_total", "Engine requests by finish reason.", ["finish_reason"],
    registry=REGISTRY,
)
ENGINE = Gauge("kiln_engine", "Engine state gauges (from the scheduler).", ["name"],
               registry=REGISTRY)
RUNNING = Gauge("vllm:num_requests_running", "Requests running in the engine.", ["model_name"],
                registry=REGISTRY)
WAITING = Gauge("vllm:num_requests_waiting", "Requests waiting for the engine.", ["model_name"],
                registry=REGISTRY)
KV_USAGE = Gauge("vllm:kv_cache_usage_perc", "Fraction of KV-cache blocks in use (0..1).",
                 ["model_name"], registry=REGISTRY)
PREFIX_HIT = Gauge("kiln_prefix_cache_hit_rate", "Prefix-cache hit tokens / queried tokens.",
                   registry=REGISTRY)
LORA_INFO = Gauge(
    "vllm:lora_requests_info", "Loaded LoRA adapters (value: scrape time).",
    ["running_lora_adapters", "waiting_lora_adapters", "max_lora"], registry=REGISTRY,
)
CONNECTIONS = Gauge("kiln_http_connections", "Open HTTP connections.", registry=REGISTRY)
CONNECTIONS_ENDED = Counter(
    "kiln_http_connections_ended_total",
    "Connections the server ended itself, by reason (header_timeout, body_timeout, "
    "send_timeout, overloaded, bad_request, draining).", ["reason"], registry=REGISTRY,
)

# vLLM's speculative-decoding counters (kiln.engine.speculative), advanced from the scheduler's
# running totals
SPEC_COUNTERS = {name: Counter(f"vllm:{name}", help_text, registry=REGISTRY) for name, help_text in (
    ("spec_decode_num_drafts", "Verify steps a request drafted in."),
    ("spec_decode_num_draft_tokens", "Draft tokens proposed."),
    ("spec_decode_num_accepted_tokens", "Draft tokens accepted."))}
_spec_seen: dict[str, float] = {}

CACHE_CONFIG = Gauge(
    "vllm:cache_config_info", "KV-cache configuration (value 1; the labels carry it).",
    ["block_size", "num_gpu_blocks", "cache_dtype", "enable_prefix_caching"], registry=REGISTRY,
)


def observe_cache_config(block_size: int, num_blocks: int, cache_dtype: str,
                         prefix_caching: bool) -> None:
    """vLLM's info gauge, under its label names (an endpoint picker reads `num_gpu_blocks` as
    the KV capacity; on the CPU it is the count of blocks in host memory)."""
    CACHE_CONFIG.clear()
    CACHE_CONFIG.labels(block_size=str(block_size), num_gpu_blocks=str(num_blocks),
                        cache_dtype=cache_dtype,
                        enable_prefix_caching=str(prefix_caching)).set(1.0)


def observe_engine(
    stats: dict[str, float], model: str = "", adapters: tuple[str, ...] = (), max_lora: int = 0
) -> None:
    for name, value in stats.items():
        ENGINE.labels(name=name).set(value)
        counter = SPEC_COUNTERS.get(name)
        if counter is not None and value > _spec_seen.get(name, 0.0):
            counter.inc(value - _spec_seen.get(name, 0.0))
            _spec_seen[name] = value
    RUNNING.labels(model_name=model).set(stats.get("running", 0.0))
    WAITING.labels(model_name=model).set(stats.get("waiting", 0.0))
    total = stats.get("kv_blocks_total", 0.0)
    KV_USAGE.labels(model_name=model).set(stats.get("kv_blocks_used", 0.0) / total if total else 0.0)
    queried = stats.get("prefix_cache_query_tokens", 0.0)
    PREFIX_HIT.set(stats.get("prefix_cache_hit_tokens", 0.0) / queried if queried else 0.0)
    LORA_INFO.clear()
    LORA_INFO.labels(
        running_lora_adapters=",".join(adapters), waiting_lora_adapters="", max_lora=str(max_lora)
    ).set(1.0)



def render() -> tuple[bytes, str]:
    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST
