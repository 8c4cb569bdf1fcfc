"""`python -m bench.bench_speculative [--repeats 3]`: what n-gram speculation
(--speculative-config) does to decode speed, on the default model. Two `kiln serve` processes,
one after the other (speculation off, then on), on the same three workloads:

- **editing**: the prompt holds a ~400-token Python source file and asks for it back with one
  identifier renamed (greedy, up to 400 tokens): the answer mostly copies the prompt;
- **retrieval**: a passage and a question answered by quoting it (greedy, up to 160 tokens);
- **free chat**: a short story (temperature 0.7, seeded, up to 160 tokens).

Each workload single-stream (tokens/s of one request, the median of ``--repeats``) and with 8
concurrent streams (all their tokens over the wall time). Every answer with speculation is
checked equal to the one without (token ids). Prints a table and writes
bench/results/speculative.json.

``--draft PATH`` measures the draft-model kind instead (``PATH`` drafts for the served model,
``--model`` or the default): e.g. the default model's F16 file served with its Q4_K_M file
drafting, files bench.bench_peer writes under build-peers/models."""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from bench.live_server import running_server

ROOT = Path(__file__).resolve().parent.parent
SPEC = json.dumps({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4,
                   "prompt_lookup_min": 2})
SOURCE = (ROOT / "kiln" / "engine" / "speculative.py").read_text(encoding="utf-8")
SOURCE = SOURCE[SOURCE.index("def ngram_draft"):SOURCE.index("def drafts_allowed")]
PASSAGE = (
    "The lighthouse at Point Reyes was built in 1870 and first lit on December 1 of that year. "
    "Its first-order Fresnel lens has 1,032 glass prisms and was made in France in 1867. The "
    "light stands 265 feet above the ocean, and on clear nights it could be seen 24 nautical "
    "miles away. Keepers climbed 308 steps down from the headland to reach it, and the wind "
    "there has been measured at 133 miles per hour.")
WORKLOADS: dict[str, dict[str, Any]] = {
    "editing": {"messages": [{"role": "user", "content": (
        "Here is a Python function:\n\n" + SOURCE + "\nRewrite it with the function "
        "`ngram_draft` renamed to `lookup_draft`. Output only the code.")}],
        "max_tokens": 400, "temperature": 0},
    "retrieval": {"messages": [{"role": "user", "content": (
        PASSAGE + "\n\nQuoting the passage word for word, when was the lighthouse built and "
        "how far could its light be seen?")}], "max_tokens": 160, "temperature": 0},
    "free chat": {"messages": [{"role": "user", "content":
                                "Write a short story about a lighthouse keeper."}],
                  "max_tokens": 160, "temperature": 0.7, "seed": 7},
}
STREAMS = 8


def one(url: str, body: dict[str, Any], seed: int | None = None) -> tuple[list[int], float]:
    payload = {**body, "return_token_ids": True, "ignore_eos": False}
    if seed is not None and "seed" in body:
        payload["seed"] = seed
    with httpx.Client(base_url=url, timeout=600.0) as client:
        started = time.perf_counter()
        r = client.post("/v1/chat/completions", json=payload)
        elapsed = time.perf_counter() - started
    r.raise_for_status()
    return r.json()["choices"][0]["token_ids"], elapsed


def _seeded(url: str, body: dict[str, Any], i: int) -> tuple[list[int], float]:
    return one(url, body, seed=100 + i)


def measure(url: str, repeats: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, body in WORKLOADS.items():
        one(url, body)  # warm (and the prefix cache: each repeat then prefills the same)
        runs = [one(url, body) for _ in range(repeats)]
        tokens = runs[0][0]
        single = statistics.median(len(t) / s for t, s in runs)
        started = time.perf_counter()
        with ThreadPoolExecutor(STREAMS) as pool:
            many = list(pool.map(functools.partial(_seeded, url, body), range(STREAMS)))
        wall = time.perf_counter() - started
        out[name] = {"tokens": tokens, "single_tok_s": single,
                     "streams_tok_s": sum(len(t) for t, _ in many) / wall,
                     "streams_tokens": [t for t, _ in many]}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--model", default=None, help="the served model (default: the default)")
    ap.add_argument("--draft", default=None, help="a draft model: the draft_model kind")
    args = ap.parse_args(argv)
    spec = SPEC if args.draft is None else json.dumps(
        {"method": "draft_model", "model": args.draft, "num_speculative_tokens": 4})
    served = [] if args.model is None else ["--model", args.model]
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for label, extra in (("off", []), ("on", ["--speculative-config", spec])):
            with running_server(["--kv-memory-mb", "256", "--max-model-len", "4096", *served,
                                 *extra],
                                log_path=Path(tmp) / f"{label}.log") as server:
                results[label] = measure(server.url, args.repeats)
    rows = []
    for name in WORKLOADS:
        off, on = results["off"][name], results["on"][name]
        assert on["tokens"] == off["tokens"], f"{name}: speculation changed the tokens"
        assert on["streams_tokens"] == off["streams_tokens"], f"{name}: 8 streams changed"
        rows.append({"workload": name, "tokens": len(off["tokens"]),
                     "single_off": round(off["single_tok_s"], 1),
                     "single_on": round(on["single_tok_s"], 1),
                     "single_ratio": round(on["single_tok_s"] / off["single_tok_s"], 2),
                     "streams_off": round(off["streams_tok_s"], 1),
                     "streams_on": round(on["streams_tok_s"], 1),
                     "streams_ratio": round(on["streams_tok_s"] / off["streams_tok_s"], 2)})
    print("| workload | tokens | 1 stream off | on | on/off | 8 streams off | on | on/off |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['workload']} | {r['tokens']} | {r['single_off']} | {r['single_on']} | "
              f"{r['single_ratio']} | {r['streams_off']} | {r['streams_on']} | "
              f"{r['streams_ratio']} |")
    name = "speculative.json" if args.draft is None else "speculative_draft_model.json"
    out = Path(__file__).parent / "results" / name
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
