"""Does prompt scoring stall the streams that are decoding? One stream decodes through `kiln
serve` while a ~3,900-token prompt is scored (`/v1/completions`, `prompt_logprobs: 5`); reported:
the scoring time, and the stream's longest inter-token gap and token count meanwhile.

Scoring runs one 64-token chunk at a time between the engine's steps (kiln.engine.scoring
.ScoringJob). Scored in one piece, as it was before, the stream's longest gap was the whole
scoring time (17.6 s here).

Usage: python -m bench.bench_scoring_stall
Writes bench/results/scoring_stall.json (figures, no asserts).
"""

from __future__ import annotations

import asyncio
import json
import platform
import time
from pathlib import Path
from typing import Any

import httpx

from bench.live_server import running_server
from bench.serving_client import STREAM_TIMEOUT_S, StreamResult, chat_body, stream_chat, user_prompt

RESULTS = Path(__file__).parent / "results" / "scoring_stall.json"
PROMPT = " ".join(f"word{i % 97} river stone" for i in range(800))  # ~3,900 tokens (cap 4,096)


async def measure(url: str) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=url, timeout=STREAM_TIMEOUT_S) as client:
        stop, run = asyncio.Event(), StreamResult()
        task = asyncio.create_task(stream_chat(client, chat_body(user_prompt(3), 3000), run, stop))
        deadline = time.perf_counter() + 120
        while len(run.arrivals) < 10:  # the stream is decoding
            if time.perf_counter() > deadline or task.done():
                raise RuntimeError("the decoding stream did not start")
            await asyncio.sleep(0.01)
        t0 = time.perf_counter()
        r = await client.post("/v1/completions", json={"prompt": PROMPT, "prompt_logprobs": 5,
                                                      "max_tokens": 0})
        t1 = time.perf_counter()
        if r.status_code != 200:
            raise RuntimeError(f"scoring: HTTP {r.status_code}: {r.text[:300]}")
        await asyncio.sleep(0.3)
        stop.set()
        await asyncio.wait_for(task, STREAM_TIMEOUT_S)
    # every gap that ends inside the scoring (or just after it: the one spanning its end)
    gaps = [b - a for a, b in zip(run.arrivals, run.arrivals[1:], strict=False)
            if t0 <= b <= t1 + 0.3]
    return {"prompt_tokens": r.json()["usage"]["prompt_tokens"], "scoring_s": t1 - t0,
            "stream_tokens_meanwhile": len(gaps),
            "stream_longest_gap_ms": 1000 * max(gaps) if gaps else None}


def main() -> None:
    with running_server([], log_path=RESULTS.with_name("scoring_stall_server.log")) as server:
        out = asyncio.run(measure(server.url))
    report = {"benchmark": "scoring_stall", "machine": platform.machine(), **out}
    gap = out["stream_longest_gap_ms"]
    print(f"scoring {out['prompt_tokens']} tokens took {out['scoring_s']:.1f} s; the decoding "
          f"stream got {out['stream_tokens_meanwhile']} tokens meanwhile, longest gap "
          f"{gap:.0f} ms" if gap is not None else "no tokens meanwhile")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
