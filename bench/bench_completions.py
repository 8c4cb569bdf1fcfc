"""Completions serving figures (issue 25) through the real HTTP server.

- aggregate decode tok/s of 8 concurrent ``/v1/completions`` streams beside the same 8 streams on
  ``/v1/chat/completions`` (goal: within 5% of each other). Both routes run the same prompt token
  ids (the chat prompts rendered by ``/v1/chat/completions/render`` are the completions prompts),
  temperature 0, ``ignore_eos``, the same max_tokens;
- the cost of ``logprobs: 20`` per step: the same 8 completions streams with 20 alternatives per
  token against none, as tok/s and as ms per engine step (8 tokens a step while all 8 decode).

The same cost in-process (best of ``--repeats``, robust on a shared machine): the engine's
``Sampler.token_logprobs`` for 8 rows of the default model's vocabulary with 20 alternatives, and
the API's formatting of 8 tokens' OpenAI logprob arrays with 20 alternatives each
(``CompletionLogprobs.add_generated``, which decodes every alternative in context).

Rates are client-side, over the span in which all streams decode (after the last stream's first
token, up to the first stream's last), as bench_serving's concurrent figure: chat counts its
``kiln.token_timing`` events, completions the ``token_ids`` of each chunk (``return_token_ids``;
``stream_interval`` 1 sends one chunk per engine step). Rounds alternate the three
configurations; the best round of each is reported beside all rounds, and the median over rounds
of completions/chat (the two run back to back in each round).

Usage: python -m bench.bench_completions [--max-tokens 128] [--rounds 7] [--repeats 50]
                                         [--model PATH]
Writes bench/results/completions.json (figures, no asserts).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

import httpx

from bench.live_server import running_server
from bench.serving_client import STREAM_TIMEOUT_S, StreamResult, chat_body, stream_chat, user_prompt

RESULTS = Path(__file__).parent / "results" / "completions.json"
STREAMS = 8


async def stream_completion(client: httpx.AsyncClient, body: dict[str, Any]
                            ) -> list[tuple[float, int]]:
    """POST a streaming completions request: (arrival, tokens) per chunk that carried tokens."""
    chunks: list[tuple[float, int]] = []
    async with client.stream("POST", "/v1/completions", json=body,
                             timeout=STREAM_TIMEOUT_S) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread())[:500]!r}")
        async for line in r.aiter_lines():
            now = time.perf_counter()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            obj = json.loads(line[6:])
            if "error" in obj:
                raise RuntimeError(f"stream error: {obj['error']}")
            n = sum(len(c.get("token_ids") or ()) for c in obj.get("choices") or ())
            if n:
                chunks.append((now, n))
    return chunks


def window_rate(streams: list[list[tuple[float, int]]]) -> float:
    """Tokens arriving while every stream decodes, over that span. A stream's first chunk is its
    start (the tokens in it were made before the span)."""
    start = max(s[0][0] for s in streams)
    end = min(s[-1][0] for s in streams)
    tokens = sum(n for s in streams for t, n in s if start < t <= end)
    return tokens / (end - start) if end > start else 0.0


def as_chunks(res: StreamResult) -> list[tuple[float, int]]:
    return [(t, 1) for t in res.arrivals]


async def chat_round(client: httpx.AsyncClient, messages: list[str], n: int) -> float:
    results = await asyncio.gather(*(stream_chat(client, chat_body(m, n)) for m in messages))
    return window_rate([as_chunks(r) for r in results])


async def completions_round(client: httpx.AsyncClient, prompts: list[list[int]], n: int,
                            logprobs: int | None) -> float:
    body: dict[str, Any] = {"temperature": 0, "max_tokens": n, "ignore_eos": True,
                            "stream": True, "return_token_ids": True}
    if logprobs is not None:
        body["logprobs"] = logprobs
    results = await asyncio.gather(*(stream_completion(client, {**body, "prompt": p})
                                     for p in prompts))
    return window_rate(results)


async def measure(url: str, n: int, rounds: int) -> dict[str, Any]:
    limits = httpx.Limits(max_connections=32, max_keepalive_connections=32)
    async with httpx.AsyncClient(base_url=url, limits=limits) as client:
        messages = [user_prompt(300 + i) for i in range(STREAMS)]
        prompts = []
        for m in messages:
            r = await client.post("/v1/chat/completions/render",
                                  json=chat_body(m, n, stream=False), timeout=60)
            r.raise_for_status()
            prompts.append(r.json()["token_ids"])
        await stream_chat(client, chat_body("Hello!", 8))  # warm-up, both routes
        await completions_round(client, prompts[:2], 8, 20)
        runs: dict[str, list[float]] = {"chat": [], "completions": [], "completions_lp20": []}
        for k in range(rounds):
            print(f"round {k + 1}/{rounds} ...", flush=True)
            runs["chat"].append(await chat_round(client, messages, n))
            runs["completions"].append(await completions_round(client, prompts, n, None))
            runs["completions_lp20"].append(await completions_round(client, prompts, n, 20))
    best = {k: max(v) for k, v in runs.items()}
    step_ms = {k: 1000 * STREAMS / v for k, v in best.items()}
    # each round runs the routes back to back: the median of the per-round ratios cancels the
    # drift of a shared machine between rounds better than the best rounds do
    paired = sorted(c / h for c, h in zip(runs["completions"], runs["chat"], strict=True))
    return {
        "streams": STREAMS, "max_tokens": n, "prompt_tokens": [len(p) for p in prompts],
        "tok_s": best, "tok_s_all": runs,
        "completions_vs_chat_pct": 100 * (best["completions"] / best["chat"] - 1),
        "completions_vs_chat_pct_median_of_rounds": 100 * (paired[len(paired) // 2] - 1),
        "step_ms": step_ms,
        "logprobs20_cost_ms_per_step": step_ms["completions_lp20"] - step_ms["completions"],
        "logprobs20_cost_pct": 100 * (step_ms["completions_lp20"] / step_ms["completions"] - 1),
    }


def in_process(repeats: int, k: int = 20) -> dict[str, float]:
    """ms per step of logprobs' two parts, 8 rows, greedy rows (no penalties)."""
    from types import SimpleNamespace

    import torch

    from kiln.api.replies.logprobs import CompletionLogprobs
    from kiln.engine.outputs import TokenLogprobs
    from kiln.engine.request import SamplingParams
    from kiln.engine.sampler import Sampler
    from kiln.model.loader import load_model

    loaded = load_model(None)
    vocab = loaded.config.vocab_size
    torch.manual_seed(0)
    logits = torch.randn(STREAMS, vocab) * 3
    seqs: Any = [SimpleNamespace(sampling=SamplingParams(temperature=0.0, logprobs=k))
                 for _ in range(STREAMS)]
    tokens = logits.argmax(dim=-1).tolist()
    sampler = Sampler(torch.device("cpu"), loaded.model.plan.sampler)  # as the runner builds it
    engine = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        tops = sampler.token_logprobs(logits, seqs, tokens)
        engine.append(time.perf_counter() - t0)
    tok = loaded.tokenizer
    context = tok.encode("Write a long, detailed essay about the ocean.")
    api = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for row, top in enumerate(tops):
            assert isinstance(top, TokenLogprobs)
            lps = CompletionLogprobs()
            lps.add_generated(tok, context, [tokens[row]], [top])
            lps.wire()
        api.append(time.perf_counter() - t0)
    return {"engine_token_logprobs_ms": 1000 * min(engine),
            "api_format_ms": 1000 * min(api), "rows": STREAMS, "alternatives": k,
            "vocab": vocab}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_completions")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--in-process-only", action="store_true",
                        help="only the in-process logprobs figures (no server)")
    parser.add_argument("--model", default=None)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    serve_args = ["--model", args.model] if args.model else []
    figures: dict[str, Any] = {}
    if not args.in_process_only:
        with running_server(serve_args, log_path=RESULTS.parent / "bench_completions_server.log"
                            ) as server:
            figures = asyncio.run(measure(server.url, args.max_tokens, args.rounds))
    figures["logprobs20_in_process"] = in_process(args.repeats)
    out = {"machine": platform.platform(), "processor": platform.processor(),
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "load_average": list(os.getloadavg()), **figures}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
