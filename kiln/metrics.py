"""Prometheus metrics: one registry per process, rendered by GET /metrics."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

REGISTRY = CollectorRegistry()

REQUESTS = Counter(
    "kiln_requests_total", "Inference requests by route and outcome.", ["route", "outcome"],
    registry=REGISTRY,
)
TOKENS = Counter(
    "kiln_tokens_total", "Tokens processed, by kind (prompt, completion).", ["kind"],
    registry=REGISTRY,
)
TTFT = Histogram(
    "kiln_time_to_first_token_seconds", "Time to first token.", registry=REGISTRY,
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
LATENCY = Histogram(
    "kiln_request_latency_seconds", "End-to-end request latency.", registry=REGISTRY,
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
)
ENGINE = Gauge("kiln_engine", "Engine state gauges.", ["name"], registry=REGISTRY)


def observe_engine(stats: dict[str, float]) -> None:
    for name, value in stats.items():
        ENGINE.labels(name=name).set(value)


def render() -> tuple[bytes, str]:
    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST
