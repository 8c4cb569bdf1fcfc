"""How long a /metrics scrape takes while the server decodes, as an endpoint picker sees it.

llm-d's endpoint picker scrapes each model server every 50 ms by default; a scrape that takes a
large share of that interval, or that stalls the event loop the streams are delivered on, costs
every request. This runs `kiln serve` on the default model with 8 concurrent 128-token streams
and scrapes /metrics every 50 ms (400 scrapes at most, bounded), reporting the scrape latency's
p50 / p99 / max, beside the same scrapes on the idle server.

Usage: python -m bench.bench_metrics_scrape [--scrapes 200]
Writes bench/results/metrics_scrape.json (figures, no asserts).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench.live_server import running_server
from bench.serving_client import STREAM_TIMEOUT_S, chat_body, stream_chat, user_prompt

RESULTS = Path(__file__).parent / "results" / "metrics_scrape.json"
INTERVAL_S = 0.05
STREAMS = 8


def _summary(ms: list[float]) -> dict[str, float]:
    ordered = sorted(ms)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return {"n": len(ms), "p50_ms": statistics.median(ms), "p99_ms": p99, "max_ms": ordered[-1]}


async def scrapes(client: httpx.AsyncClient, count: int, until: asyncio.Event | None) -> list[float]:
    out: list[float] = []
    for _ in range(count):  # bounded
        if until is not None and until.is_set():
            break
        start = time.perf_counter()
        r = await client.get("/metrics")
        out.append((time.perf_counter() - start) * 1000)
        assert r.status_code == 200
        await asyncio.sleep(max(0.0, INTERVAL_S - (time.perf_counter() - start)))
    return out


async def measure(url: str, count: int) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=url, timeout=STREAM_TIMEOUT_S) as client:
        await stream_chat(client, chat_body(user_prompt(0), 4))  # warm-up
        idle = await scrapes(client, count // 2, None)
        done = asyncio.Event()

        async def streams() -> None:
            await asyncio.gather(*(stream_chat(client, chat_body(user_prompt(i), 128))
                                   for i in range(STREAMS)))
            done.set()

        load = asyncio.create_task(streams())
        busy = await scrapes(client, count, done)
        await load
    return {"idle": _summary(idle), "under_8_streams": _summary(busy)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--scrapes", type=int, default=400)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp, \
            running_server(log_path=Path(tmp) / "server.log") as server:
        figures = asyncio.run(measure(server.url, args.scrapes))
    record = {"machine": platform.processor() or platform.machine(),
              "date": time.strftime("%Y-%m-%d"), "interval_ms": INTERVAL_S * 1000,
              "streams": STREAMS, **figures}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
