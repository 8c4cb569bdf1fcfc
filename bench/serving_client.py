"""The measuring client of the serving benchmarks: streamed chat requests with each token's
arrival time (a ``kiln.token_timing`` SSE event per token, asked for by ``include_performance``)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

TOPICS = ["the ocean", "autumn leaves", "gravity", "a city at night", "neural networks",
          "volcanoes", "the moon landing", "bread baking", "chess openings", "rainforests"]
STREAM_TIMEOUT_S = 300.0


@dataclass
class StreamResult:
    arrivals: list[float] = field(default_factory=list)  # one per token, perf_counter seconds
    sent: float = 0.0
    completion_tokens: int | None = None
    finish_reason: str | None = None

    def decode_rate(self) -> float:
        n = len(self.arrivals)
        if n < 2 or self.arrivals[-1] <= self.arrivals[0]:
            return 0.0
        return (n - 1) / (self.arrivals[-1] - self.arrivals[0])


def user_prompt(i: int) -> str:
    return f"Write a long, detailed essay about {TOPICS[i % len(TOPICS)]}. (#{i})"


def chat_body(content: str, max_tokens: int, stream: bool = True) -> dict[str, Any]:
    body: dict[str, Any] = {"messages": [{"role": "user", "content": content}],
                            "temperature": 0, "max_tokens": max_tokens, "ignore_eos": True,
                            "stream": stream}
    if stream:
        body["include_performance"] = True
        body["stream_options"] = {"include_usage": True}
    return body


async def stream_chat(client: httpx.AsyncClient, body: dict[str, Any],
                      result: StreamResult | None = None,
                      stop: asyncio.Event | None = None) -> StreamResult:
    """POST a streaming chat request; record each token's arrival. Returns early (closing the
    connection, which aborts the request) once ``stop`` is set."""
    res = result or StreamResult()
    res.sent = time.perf_counter()
    async with client.stream("POST", "/v1/chat/completions", json=body,
                             timeout=STREAM_TIMEOUT_S) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread())[:500]!r}")
        async for line in r.aiter_lines():
            now = time.perf_counter()
            if not line.startswith("data: "):
                continue
            data = line[6:]
            if data == "[DONE]":
                break
            if '"kiln.token_timing"' in data:  # the measuring client parses no more than it needs
                res.arrivals.append(now)
                continue
            obj = json.loads(data)
            if "error" in obj:
                raise RuntimeError(f"stream error: {obj['error']}")
            if obj.get("usage"):
                res.completion_tokens = int(obj["usage"]["completion_tokens"])
            for choice in obj.get("choices") or []:
                if choice.get("finish_reason"):
                    res.finish_reason = choice["finish_reason"]
            if stop is not None and stop.is_set():
                break
    return res


def pct(xs: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    s = sorted(xs)
    if not s:
        return float("nan")
    k = max(0, min(len(s) - 1, int(-(-q * len(s) // 100)) - 1))
    return s[k]
