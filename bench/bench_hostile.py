"""Hostile and careless clients against a live `python -m kiln serve` (default model, 127.0.0.1):
what the server holds (open connections, fds, RSS) before, during and after the attack, and
whether normal traffic keeps its latency (p50/p99 TTFT of a steady streaming chat probe, alone
and during the attack).

The attack (bench/hostile_clients.py, its own process): idle connections, headers that never
end, bodies that never arrive, streaming chats whose responses are never read, malformed
chunked bodies, oversized headers, and a burst of connections past ``--max-connections``.
Attackers reconnect whenever the server closes them, so the server meets the attack all along.

Goals (issue 28): the probe's p99 TTFT during the attack within 2x its value alone; after the
attack the server holds no connection beyond its baseline and its fds and RSS within 5%.

Usage: python -m bench.bench_hostile [--quick]
Writes bench/results/hostile.json (figures, no asserts).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import platform
import re
import time
from dataclasses import asdict
from typing import Any

import httpx

from bench.hostile_clients import Attack, run_attack
from bench.live_server import RESULTS, running_server, snapshot, wait_idle
from bench.serving_client import STREAM_TIMEOUT_S, chat_body, pct, stream_chat, user_prompt
from kiln.testing import ServerProcess

OUT = RESULTS / "hostile.json"
_CONNECTIONS = re.compile(r"^kiln_http_connections\s+([0-9.eE+-]+)$", re.M)


def held(server: ServerProcess) -> dict[str, Any]:
    """Open connections (the server's gauge, less the one asking), fds and RSS."""
    stats = snapshot(server)
    r = httpx.get(server.url + "/metrics", timeout=10)
    m = _CONNECTIONS.search(r.text) if r.status_code == 200 else None
    # None: this very request was refused (503 server_overloaded, past --max-connections)
    return {"connections": (float(m[1]) - 1) if m else None,
            "open_fds": stats["open_fds"], "rss_mib": round(stats["rss_mib"], 1),
            "running": stats.get("vllm_running", 0.0)}


async def probe(url: str, count: int, interval_s: float) -> dict[str, Any]:
    """``count`` short streaming chats, one at a time, ``interval_s`` apart: TTFT of each."""
    ttfts, errors = [], []
    async with httpx.AsyncClient(base_url=url, timeout=STREAM_TIMEOUT_S) as client:
        for i in range(count):
            try:
                res = await stream_chat(client, chat_body(user_prompt(i), max_tokens=4))
                if res.arrivals:
                    ttfts.append(res.arrivals[0] - res.sent)
            except (httpx.HTTPError, RuntimeError) as exc:
                errors.append(str(exc)[:200])
            await asyncio.sleep(interval_s)
    return {"n": len(ttfts), "errors": errors,
            "ttft_p50_ms": round(pct(ttfts, 50) * 1000, 1) if ttfts else None,
            "ttft_p99_ms": round(pct(ttfts, 99) * 1000, 1) if ttfts else None}


def wait_released(server: ServerProcess, baseline: dict[str, Any], timeout_s: float) -> float:
    """Seconds until the server is back to its baseline connections and fds (or timeout_s)."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        now = held(server)
        if back_to_baseline(baseline, now):
            return time.monotonic() - started
        time.sleep(0.5)
    return float("nan")


def _ratio(a: dict[str, Any], b: dict[str, Any]) -> float | None:
    if not (a["ttft_p99_ms"] and b["ttft_p99_ms"]):
        return None
    return round(float(a["ttft_p99_ms"]) / float(b["ttft_p99_ms"]), 2)


def back_to_baseline(before: dict[str, Any], after: dict[str, Any]) -> bool:
    """No connection beyond the baseline; fds and RSS within 5% (an fd's worth of slack: the
    asking /metrics connection may still be open when /proc is read, or already gone)."""
    return bool(after["connections"] is not None and before["connections"] is not None
                and after["connections"] <= before["connections"]
                and after["open_fds"] <= max(before["open_fds"] * 1.05, before["open_fds"] + 1)
                and abs(after["rss_mib"] - before["rss_mib"]) <= 0.05 * before["rss_mib"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.bench_hostile")
    ap.add_argument("--quick", action="store_true", help="a smaller attack and fewer probes")
    ap.add_argument("--probes", type=int, default=200)
    ap.add_argument("--interval-s", type=float, default=0.2)
    ap.add_argument("--header-timeout-s", type=float, default=5.0)
    ap.add_argument("--body-timeout-s", type=float, default=10.0)
    ap.add_argument("--keep-alive-s", type=float, default=5.0)
    ap.add_argument("--max-connections", type=int, default=1024)
    ap.add_argument("--send-timeout-s", type=float, default=10.0)
    args = ap.parse_args(argv)
    scale = 4 if args.quick else 1
    probes = max(10, args.probes // scale)
    flags = ["--header-timeout-s", str(args.header_timeout_s), "--body-timeout-s",
             str(args.body_timeout_s), "--keep-alive-s", str(args.keep_alive_s),
             "--max-connections", str(args.max_connections),
             "--send-timeout-s", str(args.send_timeout_s)]
    with running_server(flags, log_path=RESULTS / "hostile_server.log") as server:
        port = int(server.url.rsplit(":", 1)[1])
        attack = Attack(port=port, max_seconds=600, idle=300 // scale,
                        slow_headers=150 // scale, slow_bodies=150 // scale,
                        stalled_streams=8 // scale, stream_tokens=32,
                        burst=(args.max_connections - 600 // scale + 200))
        asyncio.run(probe(server.url, 5, 0.1))  # warm-up
        wait_idle(server)
        before = held(server)
        alone = asyncio.run(probe(server.url, probes, args.interval_s))
        ctx = multiprocessing.get_context("spawn")
        stop, burst, out = ctx.Event(), ctx.Event(), ctx.Queue()
        attacker = ctx.Process(target=run_attack, args=(attack, stop, burst, out), daemon=True)
        attacker.start()
        time.sleep(3)  # the attackers connect
        wait_idle(server, timeout_s=300)  # the stalled streams' tokens are generated (engine
        # work, not the connection attack: the probe runs once it is done)
        during = held(server)
        attacked = asyncio.run(probe(server.url, probes, args.interval_s))
        during_end = held(server)
        burst.set()
        time.sleep(4)
        during_burst = held(server)
        time.sleep(6)  # the burst's answers are read (hostile_clients.BURST_READ_S)
        stop.set()
        outcomes = out.get(timeout=120)
        attacker.join(timeout=30)
        released_s = wait_released(server, before, timeout_s=60)
        after = held(server)
        after_probe = asyncio.run(probe(server.url, probes, args.interval_s))
        server_log = server.log_tail(2000)
    ratio = _ratio(attacked, alone)
    result = {
        "machine": f"{platform.node()} {platform.machine()} ({multiprocessing.cpu_count()} cpus)",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "server_flags": flags, "attack": asdict(attack),
        "held": {"before": before, "during": during, "end_of_probe": during_end,
                 "burst": during_burst, "after": after},
        "released_after_s": round(released_s, 1),
        "probe": {"alone": alone, "attack": attacked, "after": after_probe},
        "p99_ttft_ratio_attack_vs_alone": round(ratio, 2) if ratio else None,
        "p99_ttft_ratio_attack_vs_after": _ratio(attacked, after_probe),
        "goal_p99_within_2x": bool(ratio is not None and ratio <= 2.0),
        "goal_back_to_baseline": back_to_baseline(before, after),
        "attack_outcomes": dict(sorted(outcomes.items())),
        "server_log_tail": server_log,
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "server_log_tail"}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
