"""Does using a LoRA adapter or logprobs slow the server down afterwards? Single-stream decode
tok/s of the base model through `kiln serve`, before and after a request that names a rank-64
adapter and one that asks for logprobs.

Why: the adapter's first use reads its files and checks its tensors with torch. On a thread other
than the engine's, that starts a second OpenMP team, and on a 2-core CPU libgomp then stops
spinning at the C step's barriers for the rest of the process (measured before the fix: 131-136
-> 53-55 tok/s). `kiln serve` reads adapters on the engine thread; this benchmark watches that.
And both requests' steps run on the runner's torch side (kiln.engine.runner: the adapter's on
the C model's torch twin, the logprobs' as torch's sampling over the C step's logits); the plain
requests after them run on the C path again, at its speed (until 2026-12-07 the first such
request moved every later step to the torch runner for good).

Usage: python -m bench.bench_adapter_serving [--repeats 3]
Writes bench/results/adapter_serving.json (figures, no asserts).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import shutil
import tempfile
from pathlib import Path
from typing import Any

import httpx

from bench.live_server import running_server, write_random_adapter
from bench.serving_client import STREAM_TIMEOUT_S, chat_body, stream_chat, user_prompt

RESULTS = Path(__file__).parent / "results" / "adapter_serving.json"
RANK = 64  # A is [64, 576]: large enough for torch to run its checks on several threads


async def rates(client: httpx.AsyncClient, repeats: int, first: int) -> list[float]:
    return [(await stream_chat(client, chat_body(user_prompt(first + i), 64))).decode_rate()
            for i in range(repeats)]


async def measure(url: str, repeats: int) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=url, timeout=STREAM_TIMEOUT_S) as client:
        await stream_chat(client, chat_body(user_prompt(0), 4))  # warm-up
        before = await rates(client, repeats, 100)
        for name, extra in (("adapter", {"adapter": "big"}),
                            ("logprobs", {"logprobs": True, "top_logprobs": 3})):
            body = {**chat_body(user_prompt(1), 8, stream=False), **extra}
            r = await client.post("/v1/chat/completions", json=body)
            if r.status_code != 200:
                raise RuntimeError(f"{name} request: HTTP {r.status_code}: {r.text[:300]}")
        after = await rates(client, repeats, 200)
    return {"before_tok_s": before, "after_tok_s": after,
            "after_over_before": max(after) / max(before)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="kiln-bench-adapters-"))
    try:
        write_random_adapter(root, "big", rank=RANK)
        with running_server(["--adapter-dir", str(root)],
                            log_path=RESULTS.with_name("adapter_serving_server.log")) as server:
            out = asyncio.run(measure(server.url, args.repeats))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    report = {"benchmark": "adapter_serving", "machine": platform.machine(), "rank": RANK,
              "repeats": args.repeats, **out}
    print(f"single-stream tok/s before an adapter and a logprobs request "
          f"{max(out['before_tok_s']):.1f}, "
          f"after {max(out['after_tok_s']):.1f} ({out['after_over_before']:.2f}x; best of "
          f"{args.repeats})")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
