"""Serving figures through the real HTTP server (the `make bench` list of issue 4).

The server is ``kiln serve`` in its own process on 127.0.0.1 (a free port), as users run it;
the clients are httpx in this process (bench/serving_client.py).

Figures (each with its goal):
- single-stream decode tok/s (stream, temperature 0, ignore_eos, 64 tokens) vs transformers'
  single-sequence ``generate``: goal >= 3x;
- aggregate decode tok/s of 8 concurrent streams (while all 8 decode) vs transformers' batch-8
  ``generate`` (left-padded, attention mask): goal >= 2x; and vs our own single stream: goal >= 4x;
- p99 inter-token latency of 4 running streams while a ~1,500-token prompt is admitted (from
  its send to its first token) vs the same streams' median ITL before it: goal p99 <= 3x p50
  (the p99/p50 inside the window alone is reported too, and the same streams' median at the
  same contexts with no admission: bench/serving_admission.py);
- server RSS (VmRSS) after N short requests vs after the first 50: goal within 5%.

Decode rates are client-side: every token's arrival is a ``kiln.token_timing`` SSE event
(``include_performance``), and rate = (tokens - 1) / (last arrival - first arrival).
Transformers' rate = rows * (n - 1) / (time(n tokens) - time(1 token)).

Usage: python -m bench.bench_serving [--quick] [--kv-cache-dtype auto|float16]
Writes bench/results/serving.json (figures, no asserts).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import torch

from bench._transformers_ref import build_reference, hf_generate
from bench.live_server import running_server, snapshot
from bench.serving_admission import admission_itl, matched_control
from bench.serving_client import STREAM_TIMEOUT_S, chat_body, stream_chat, user_prompt
from kiln.model.loader import LoadedModel, load_model
from kiln.testing import ServerProcess

RESULTS = Path(__file__).parent / "results" / "serving.json"
# -- transformers baselines --------------------------------------------------------------------
def hf_baselines(loaded: LoadedModel, n: int, repeats: int) -> dict[str, Any]:
    ref = build_reference(loaded)
    tok, tpl = loaded.tokenizer, loaded.chat_template
    prompts = [tok.encode(tpl.render([{"role": "user", "content": user_prompt(i)}],
                                     add_generation_prompt=True)) for i in range(8)]
    pad = min(tok.eos_token_ids) if tok.eos_token_ids else 0
    hf_generate(ref, prompts[:1], 4, pad)  # warm-up
    single, batch = [], []
    for _ in range(repeats):
        t1 = hf_generate(ref, prompts[:1], 1, pad).seconds
        tn = hf_generate(ref, prompts[:1], n, pad).seconds
        single.append((n - 1) / max(1e-9, tn - t1))
        b1 = hf_generate(ref, prompts, 1, pad).seconds
        bn = hf_generate(ref, prompts, n, pad).seconds
        batch.append(8 * (n - 1) / max(1e-9, bn - b1))
    del ref
    gc.collect()
    return {"single_tok_s": max(single), "single_tok_s_all": single,
            "batch8_tok_s": max(batch), "batch8_tok_s_all": batch}


# -- server measurements -----------------------------------------------------------------------
async def single_stream(client: httpx.AsyncClient, n: int, repeats: int) -> dict[str, Any]:
    rates = []
    for r in range(repeats):
        res = await stream_chat(client, chat_body(user_prompt(100 + r), n))
        rates.append(res.decode_rate())
    return {"tok_s": max(rates), "tok_s_all": rates}


async def concurrent_streams(client: httpx.AsyncClient, streams: int, n: int,
                             repeats: int) -> dict[str, Any]:
    """Aggregate decode rate while all the streams decode: tokens arriving after the last stream's
    first token and up to the first stream's last one, over that span (the requests reach the
    engine a few steps apart, so the run's start and end hold steps with fewer streams; like the
    single-stream and transformers rates, this leaves prefill out). The whole run's rate (first
    token of any stream to last of any) is reported beside it."""
    rates, whole = [], []
    for r in range(repeats):
        results = await asyncio.gather(*(
            stream_chat(client, chat_body(user_prompt(200 + 10 * r + i), n))
            for i in range(streams)))
        first = min(x.arrivals[0] for x in results)
        last = max(x.arrivals[-1] for x in results)
        whole.append(sum(len(x.arrivals) - 1 for x in results) / (last - first))
        start = max(x.arrivals[0] for x in results)
        end = min(x.arrivals[-1] for x in results)
        tokens = sum(sum(1 for a in x.arrivals if start < a <= end) for x in results)
        rates.append(tokens / (end - start))
    return {"tok_s": max(rates), "tok_s_all": rates, "tok_s_whole_run_all": whole}


async def rss_growth(client: httpx.AsyncClient, total: int, first: int,
                     concurrency: int, rss: Callable[[], float]) -> dict[str, Any]:
    sem = asyncio.Semaphore(concurrency)
    done = 0
    marks: dict[int, float] = {}

    async def one(i: int) -> None:
        nonlocal done
        async with sem:
            body = chat_body(user_prompt(1000 + i), 4, stream=i % 2 == 0)
            if body["stream"]:
                await stream_chat(client, body)
            else:
                r = await client.post("/v1/chat/completions", json=body, timeout=STREAM_TIMEOUT_S)
                if r.status_code != 200:
                    raise RuntimeError(f"HTTP {r.status_code}: {r.text[:300]}")
            done += 1

    start = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(first)))
    marks[first] = rss()
    await asyncio.gather(*(one(i) for i in range(first, total)))
    marks[total] = rss()
    growth = (marks[total] - marks[first]) / marks[first]
    return {"requests": done, "rss_after_first_mb": marks[first], "rss_after_all_mb": marks[total],
            "first": first, "total": total, "growth_pct": 100 * growth,
            "wall_s": time.perf_counter() - start}


async def serve_all(server: ServerProcess, loaded: LoadedModel, args: argparse.Namespace
                    ) -> dict[str, Any]:
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    async with httpx.AsyncClient(base_url=server.url, limits=limits) as client:
        await stream_chat(client, chat_body("Hello!", 8))  # warm-up
        out: dict[str, Any] = {}
        print("single stream ...", flush=True)
        out["single"] = await single_stream(client, args.max_tokens, args.repeats)
        print("8 concurrent streams ...", flush=True)
        out["concurrent8"] = await concurrent_streams(client, 8, args.max_tokens, args.repeats)
        print("admission ITL ...", flush=True)
        out["admission"] = adm = await admission_itl(client, loaded, args.long_prompt_tokens)
        print("the same streams at the same contexts, no admission ...", flush=True)
        control = await matched_control(client, adm["itl_count"] // 4)
        adm["control"] = control
        adm["ratio_p99_p50_same_context"] = adm["itl_p99_ms"] / control["itl_p50_ms"]
        print(f"RSS over {args.rss_requests} requests ...", flush=True)
        out["rss"] = await rss_growth(client, args.rss_requests, 50, 8,
                                      lambda: snapshot(server)["rss_mib"])
        out["engine_stats"] = snapshot(server)
        return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="1 repeat, 150 RSS requests")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--long-prompt-tokens", type=int, default=1500)
    ap.add_argument("--kv-cache-dtype", choices=["auto", "float16"], default="auto",
                    help="the server's KV cache (float16: see README; results go to "
                         "serving_float16kv.json unless --out)")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--threads", type=int, default=None,
                    help="torch intra-op threads (default: torch's own choice)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    args.repeats = 1 if args.quick else 3
    args.rss_requests = 150 if args.quick else 500

    t0 = time.perf_counter()
    loaded = load_model(None)
    print("transformers baselines ...", flush=True)
    hf = hf_baselines(loaded, args.max_tokens, args.repeats)
    # `kiln serve` in its own process, as users run it (a server sharing this process with the
    # transformers baseline would share its torch thread pools)
    if args.out is None:
        args.out = (RESULTS.with_name("serving_float16kv.json")
                    if args.kv_cache_dtype == "float16" else RESULTS)
    with running_server(["--kv-cache-dtype", args.kv_cache_dtype],
                        log_path=RESULTS.parent / "bench_serving_server.log") as server:
        ours = asyncio.run(serve_all(server, loaded, args))
    single, conc = ours["single"]["tok_s"], ours["concurrent8"]["tok_s"]
    adm, rss = ours["admission"], ours["rss"]
    checks = [
        ("single-stream decode tok/s vs HF generate", single, hf["single_tok_s"],
         single / hf["single_tok_s"], ">= 3x", single / hf["single_tok_s"] >= 3),
        ("8-stream aggregate tok/s vs HF batch-8", conc, hf["batch8_tok_s"],
         conc / hf["batch8_tok_s"], ">= 2x", conc / hf["batch8_tok_s"] >= 2),
        ("8-stream aggregate vs our single stream", conc, single, conc / single, ">= 4x",
         conc / single >= 4),
        (f"ITL p99 in {adm['prompt_tokens']}-tok admission vs p50 (ms)", adm["itl_p99_ms"],
         adm["itl_p50_before_ms"], adm["ratio_p99_p50"], "<= 3x", adm["ratio_p99_p50"] <= 3),
        (f"RSS MB after {rss['total']} vs first {rss['first']} reqs", rss["rss_after_all_mb"],
         rss["rss_after_first_mb"], 1 + rss["growth_pct"] / 100, "<= 1.05x",
         abs(rss["growth_pct"]) <= 5),
    ]
    print(f"\n{'figure':48} {'value':>9} {'baseline':>9} {'ratio':>7} {'goal':>9} result")
    for name, value, base, ratio, goal, ok in checks:
        print(f"{name:48} {value:9.2f} {base:9.2f} {ratio:7.2f} {goal:>9} "
              f"{'PASS' if ok else 'FAIL'}")
    print(f"(rates: best of {args.repeats}; all: ours single {ours['single']['tok_s_all']}, "
          f"ours 8 {ours['concurrent8']['tok_s_all']}, hf single {hf['single_tok_s_all']}, "
          f"hf batch-8 {hf['batch8_tok_s_all']})")
    print(f"admission window {adm['window_s']:.2f} s: {adm['itl_count']} ITLs, p50 "
          f"{adm['itl_p50_ms']:.1f} ms, p99 {adm['itl_p99_ms']:.1f} ms, max "
          f"{adm['itl_max_ms']:.1f} ms (p99/p50 within the window "
          f"{adm['ratio_p99_p50_window']:.2f}); the goal's p50 is the streams' steady decode ITL "
          f"before admission ({adm['itl_count_before']} ITLs, whose own p99/p50 is "
          f"{adm['ratio_p99_p50_before'] or float('nan'):.2f}); the same streams at the same "
          f"contexts with no admission: p50 {adm['control']['itl_p50_ms']:.1f} ms, p99 "
          f"{adm['control']['itl_p99_ms']:.1f} ms (window p99 / that p50 "
          f"{adm['ratio_p99_p50_same_context']:.2f}); "
          f"RSS run {rss['requests']} requests in {rss['wall_s']:.1f} s")
    report = {
        "benchmark": "serving",
        "model": loaded.served_name,
        "device": str(loaded.device),
        "dtype": str(loaded.dtype),
        "weights": ("ours: the GGUF's Q4_1/Q8_0 blocks, dequantized in registers to the same "
                    "float32 values, float32 arithmetic (C decode step)"
                    if loaded.model.plan.step == "c" else "ours: float32 tensors"),
        "compute_plan": loaded.model.plan.as_dict(),
        "baseline_weights": "transformers: the same GGUF dequantized to float32 tensors",
        "machine": platform.machine(),
        "torch_threads": torch.get_num_threads(),
        "quick": args.quick,
        "kv_cache_dtype": args.kv_cache_dtype,
        "max_tokens": args.max_tokens,
        "transformers": hf,
        **ours,
        "checks": [{"figure": c[0], "value": c[1], "baseline": c[2], "ratio": c[3],
                    "goal": c[4], "pass": c[5]} for c in checks],
        "wall_s": time.perf_counter() - t0,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
