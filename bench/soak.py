"""Soak test: bounded mixed traffic against a real `python -m kiln serve` subprocess.

For `--duration` seconds, `--concurrency` client tasks send a seeded mix from 127.0.0.1: chat
(streaming and not, n>1, stop strings, thinking budgets, adapters), client disconnects mid-stream
and mid-non-stream, bad bodies (malformed JSON, wrong types, over-limit n, too-large batch, wrong
content type), scoring and batch requests. Every request gets exactly one recorded outcome; a
request that neither got a complete response, nor an error, nor was deliberately disconnected is
"lost". After the run the server is left to go idle and compared with the post-warm-up baseline:
KV blocks used, running/waiting requests (GET /metrics), RSS, open files and threads (/proc).
Writes `bench/results/soak.json`; exits 1 on lost requests, unexpected outcomes or leaks.

    python -m bench.soak --duration 600 --concurrency 16
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import httpx

from bench.live_server import (
    RESULTS,
    running_server,
    snapshot,
    wait_idle,
    write_random_adapter,
)
from bench.soak_traffic import MESSAGES, Outcome, Spec, make_spec
from kiln.api.request_logging import LOGGED
from kiln.testing import ServerProcess

SAFETY_TIMEOUT_S = 120.0  # a request still unanswered after this is counted as lost
def _error_code(content: bytes) -> str:
    try:
        return str(json.loads(content)["error"]["code"])
    except (ValueError, KeyError, TypeError):
        return "non-json-error"


def _check_json(spec: Spec, data: Any) -> tuple[str, list[str]]:
    """('' or what is wrong, finish reasons) for a 200 non-streaming body."""
    if spec.path == "/v1/completions":
        choice = data["choices"][0]
        ok = len(choice["prompt_logprobs"]) == data["usage"]["prompt_tokens"]
        return ("" if ok else "prompt_logprobs length != prompt_tokens"), [choice["finish_reason"]]
    items = data["completions"] if spec.path == "/v1/completions/batch" else data["choices"]
    finish = [c.get("finish_reason") for c in items]
    if len(finish) != spec.choices:
        return f"{len(finish)} choices, expected {spec.choices}", finish
    if any(f not in ("stop", "length", "tool_calls") for f in finish):
        return f"bad finish reasons {finish}", finish
    return "", finish


async def _stream(client: httpx.AsyncClient, spec: Spec, headers: dict[str, str],
                  start: float) -> Outcome:
    out = Outcome(spec.kind, "ok")
    finish: dict[int, str] = {}
    last: dict[int, float] = {}
    chunks, done = 0, False
    async with client.stream("POST", spec.path, json=spec.body, headers=headers) as r:
        out.status = r.status_code
        if r.status_code != 200:
            await r.aread()
            out.outcome = "expected_error" if r.status_code in spec.expect else "unexpected_status"
            out.detail = _error_code(r.content)
            return out
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            payload = line[6:]
            if payload == "[DONE]":
                done = True
                break
            chunk = json.loads(payload)
            chunks += 1
            now = time.monotonic()
            for choice in chunk.get("choices", []):
                idx, delta = choice.get("index", 0), choice.get("delta", {})
                if delta.get("content") or delta.get("reasoning_content"):
                    if out.ttft_s is None:
                        out.ttft_s = now - start
                    if idx in last:
                        out.itl_s.append(now - last[idx])
                    last[idx] = now
                if choice.get("finish_reason"):
                    finish[idx] = choice["finish_reason"]
            if spec.disconnect_after_chunks is not None and chunks >= spec.disconnect_after_chunks:
                out.outcome = "disconnected"
                return out  # leaving the context manager closes the connection mid-stream
    out.finish = [finish[i] for i in sorted(finish)]
    if spec.disconnect_after_chunks is not None:
        out.detail = "finished before the client disconnected"
    if not done:
        out.outcome, out.detail = "lost", "stream ended without [DONE]"
    elif len(finish) != spec.choices:
        out.outcome = "invalid_response"
        out.detail = f"finish for {sorted(finish)}, expected {spec.choices} choices"
    return out


async def send(client: httpx.AsyncClient, spec: Spec) -> Outcome:
    """One request with an id of its own (X-Request-Id), its outcome carrying the id."""
    rid = f"soak-{uuid.uuid4().hex}"
    out = await _send(client, spec, {"content-type": spec.content_type, "x-request-id": rid})
    out.request_id, out.path = rid, spec.path
    return out


async def _send(client: httpx.AsyncClient, spec: Spec, headers: dict[str, str]) -> Outcome:
    start = time.monotonic()
    try:
        if spec.stream:
            return await asyncio.wait_for(_stream(client, spec, headers, start), SAFETY_TIMEOUT_S)
        timeout = spec.client_timeout_s or SAFETY_TIMEOUT_S
        content = spec.raw if spec.raw is not None else json.dumps(spec.body).encode()
        r = await client.post(spec.path, content=content, headers=headers, timeout=timeout)
    except (TimeoutError, httpx.TimeoutException) as exc:
        if spec.client_timeout_s is not None:
            return Outcome(spec.kind, "disconnected", detail="client timeout")
        return Outcome(spec.kind, "lost", detail=f"no answer in {SAFETY_TIMEOUT_S:.0f} s: {exc!r}")
    except httpx.HTTPError as exc:
        return Outcome(spec.kind, "transport_error", detail=repr(exc)[:300])
    out = Outcome(spec.kind, "ok", status=r.status_code)
    if r.status_code != 200:
        out.outcome = "expected_error" if r.status_code in spec.expect else "unexpected_status"
        out.detail = _error_code(r.content)
        return out
    if 200 not in spec.expect:
        out.outcome, out.detail = "unexpected_status", "accepted a bad body"
        return out
    try:
        problem, out.finish = _check_json(spec, r.json())
    except (ValueError, KeyError, TypeError, IndexError) as exc:
        problem = f"malformed 200 body: {exc!r}"
    if problem:
        out.outcome, out.detail = "invalid_response", problem
    return out


# -- server-side gauges -------------------------------------------------------------------------

def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 2)


# -- the run ----------------------------------------------------------------------------------


async def drive(url: str, duration_s: float, concurrency: int, seed: int, adapters: bool,
                on_tick: Callable[[], None]) -> tuple[list[Outcome], int]:
    outcomes: list[Outcome] = []
    started = 0
    deadline = time.monotonic() + duration_s
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=SAFETY_TIMEOUT_S) as client:

        async def worker(i: int) -> None:
            nonlocal started
            rng = random.Random(seed * 1000 + i)
            while time.monotonic() < deadline:
                spec = make_spec(rng, adapters)
                started += 1
                try:
                    outcomes.append(await send(client, spec))
                except Exception as exc:  # a harness or protocol surprise: recorded, not hidden
                    outcomes.append(Outcome(spec.kind, "invalid_response", detail=repr(exc)[:300]))

        async def ticker() -> None:
            while time.monotonic() < deadline:
                await asyncio.to_thread(on_tick)
                await asyncio.sleep(5)

        await asyncio.gather(ticker(), *(worker(i) for i in range(concurrency)))
    return outcomes, started


def disconnect_probe(server: ServerProcess, stream: bool, timeout_s: float = 30.0) -> float | None:
    """Seconds from a client disconnect (a long generation, mid-stream or mid-response) until
    the engine holds nothing; None if it still runs after `timeout_s` (abort did not happen)."""
    body = {"messages": MESSAGES[0], "max_tokens": 1024, "ignore_eos": True, "stream": stream}
    url = server.url + "/v1/chat/completions"
    if stream:
        with httpx.stream("POST", url, json=body, timeout=SAFETY_TIMEOUT_S) as r:
            for i, _ in enumerate(r.iter_lines()):
                if i >= 3:
                    break
    else:
        try:
            httpx.post(url, json=body, timeout=2.0)
        except httpx.TimeoutException:
            pass
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        stats = snapshot(server)
        if stats.get("vllm_running", 0) == 0 and stats.get("kv_blocks_used", 0) == 0:
            return round(time.monotonic() - start, 2)
        time.sleep(0.1)
    return None


def request_log_check(folder: Path, sent: list[Outcome]) -> dict[str, Any]:
    """Every request the soak sent to a logged route, found in the request log exactly once."""
    seen: Counter[str] = Counter()
    for path in sorted(folder.glob("requests-*.jsonl")):
        for line in path.read_text().splitlines():
            seen[json.loads(line)["request_id"]] += 1
    wanted = [o.request_id for o in sent if o.path in LOGGED]
    return {"lines": sum(seen.values()), "requests_to_logged_routes": len(wanted),
            "missing": sum(1 for rid in wanted if seen[rid] == 0),
            "duplicated": sum(1 for rid in wanted if seen[rid] > 1),
            "files": len(list(folder.glob("requests-*.jsonl")))}


def rss_slope(series: list[dict[str, float]]) -> float | None:
    """Least-squares RSS growth (MiB/min) over the second half of the run."""
    half = series[len(series) // 2:]
    if len(half) < 3:
        return None
    ts, ys = [p["t_s"] for p in half], [p["rss_mib"] for p in half]
    mt, my = sum(ts) / len(ts), sum(ys) / len(ys)
    var = sum((t - mt) ** 2 for t in ts)
    return round(60 * sum((t - mt) * (y - my) for t, y in zip(ts, ys, strict=True)) / var, 2)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__)
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of traffic")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--warmup", type=float, default=15.0,
                        help="seconds of the same traffic before the baseline")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--no-adapters", action="store_true")
    parser.add_argument("--request-log", action="store_true",
                        help="serve with --request-log and check, after the server's SIGTERM, "
                             "that every request to a logged route is in the log exactly once")
    parser.add_argument("--out", type=Path, default=RESULTS / "soak.json")
    args = parser.parse_args(argv)
    adapters = not args.no_adapters
    with tempfile.TemporaryDirectory(prefix="kiln-soak-") as tmp:
        server_args: list[str] = []
        if args.request_log:
            server_args += ["--request-log", str(Path(tmp) / "requests")]
        if adapters:
            write_random_adapter(Path(tmp) / "adapters")
            server_args += ["--adapter-dir", str(Path(tmp) / "adapters")]
        with running_server(server_args, log_path=Path(tmp) / "server.log") as server:
            warm, _ = asyncio.run(drive(server.url, args.warmup, args.concurrency,
                                        args.seed + 1, adapters, lambda: None))
            baseline = wait_idle(server)
            series: list[dict[str, float]] = []
            t0 = time.monotonic()

            def tick() -> None:
                with_time = {"t_s": round(time.monotonic() - t0, 1), **snapshot(server)}
                series.append(with_time)

            outcomes, started = asyncio.run(
                drive(server.url, args.duration, args.concurrency, args.seed, adapters, tick))
            wall = time.monotonic() - t0
            after = wait_idle(server)
            probes = {"stream_s": disconnect_probe(server, stream=True),
                      "nonstream_s": disconnect_probe(server, stream=False)}
            alive = server.proc.poll() is None
        log_text = server.log_path.read_text(errors="replace")  # stopped: SIGTERM, drained
        logged = request_log_check(Path(tmp) / "requests", [*warm, *outcomes]) \
            if args.request_log else None
    log_copy = args.out.with_name(args.out.stem + "_server.log")
    log_copy.parent.mkdir(parents=True, exist_ok=True)
    log_copy.write_text(log_text)
    log_errors = Counter(line.strip() for line in log_text.splitlines()
                         if re.match(r"^(ERROR\b|\w*(Error|Exception)\b.*:)", line.strip()))
    record = report(args, outcomes, started, wall, baseline, after, series, alive, log_errors)
    record["server_log"] = str(log_copy)
    record["warmup_outcomes"] = dict(Counter(o.outcome for o in warm))
    record["abort_after_disconnect"] = probes
    record["rss_slope_mib_per_min"] = rss_slope(series)
    if None in probes.values():
        record["passed"] = False
    if logged is not None:
        record["request_log"] = logged
        record["passed"] = record["passed"] and logged["missing"] == 0 and \
            logged["duplicated"] == 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps({k: v for k, v in record.items() if k not in ("series", "problems")},
                     indent=2))
    print(f"soak: wrote {args.out}")
    return 0 if record["passed"] else 1


def report(args: argparse.Namespace, outcomes: list[Outcome], started: int, wall: float,
           baseline: dict[str, float], after: dict[str, float], series: list[dict[str, float]],
           alive: bool, log_errors: Counter[str]) -> dict[str, Any]:
    by_outcome = Counter(o.outcome for o in outcomes)
    errors = Counter(f"{o.kind}:{o.status}:{o.detail}" for o in outcomes
                     if o.outcome in ("expected_error", "unexpected_status"))
    lost = by_outcome["lost"] + (started - len(outcomes))
    bad = [asdict(o) for o in outcomes
           if o.outcome in ("lost", "unexpected_status", "invalid_response", "transport_error")]
    ttft = [o.ttft_s for o in outcomes if o.ttft_s is not None]
    itl = [x for o in outcomes for x in o.itl_s]
    leaks = {k: {"baseline": baseline.get(k), "after": after.get(k),
                 "delta": round(after.get(k, 0) - baseline.get(k, 0), 2)}
             for k in ("kv_blocks_used", "vllm_running", "vllm_waiting", "rss_mib", "open_fds",
                       "threads")}
    engine_leak = any(after.get(k, 0) != 0
                      for k in ("kv_blocks_used", "vllm_running", "vllm_waiting"))
    fd_leak = after.get("open_fds", 0) - baseline.get("open_fds", 0) > 8
    passed = lost == 0 and not bad and not engine_leak and not fd_leak and alive and not log_errors
    return {
        "duration_s": args.duration, "wall_s": round(wall, 1), "concurrency": args.concurrency,
        "seed": args.seed, "adapters": not args.no_adapters, "requests_started": started,
        "requests_recorded": len(outcomes), "requests_per_s": round(len(outcomes) / wall, 2),
        "outcomes": dict(by_outcome), "by_kind": dict(Counter(o.kind for o in outcomes)),
        "finish_reasons": dict(Counter(f for o in outcomes for f in o.finish)),
        "errors_by_kind": dict(errors.most_common()), "lost": lost,
        "ttft_ms": {"p50": percentile(ttft, 0.5), "p99": percentile(ttft, 0.99), "n": len(ttft)},
        "itl_ms": {"p50": percentile(itl, 0.5), "p99": percentile(itl, 0.99), "n": len(itl)},
        "leaks": leaks, "peak_rss_mib": max((s["rss_mib"] for s in series), default=None),
        "peak_kv_blocks_used": max((s.get("kv_blocks_used", 0) for s in series), default=None),
        "server_alive": alive, "server_log_errors": dict(log_errors.most_common(20)),
        "passed": passed, "problems": bad[:50], "series": series,
    }


if __name__ == "__main__":
    sys.exit(main())
