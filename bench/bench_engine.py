"""Engine decode throughput on the default model: aggregate tok/s for 1, 8 and 32 streams.

Usage: python -m bench.bench_engine [--streams 1 8 32] [--max-tokens 64] [--temperature 0.8]
Writes bench/results/engine.json (figures, no asserts).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import time
from pathlib import Path
from typing import Any

from kiln.config import ServerConfig, engine_config
from kiln.engine.loop import AsyncEngine
from kiln.engine.outputs import RequestOutput
from kiln.engine.request import Request, SamplingParams
from kiln.serving import EngineBackend

RESULTS = Path(__file__).parent / "results" / "engine.json"
PROMPTS = ["Tell me about the ocean.", "Write a poem about autumn.", "Explain gravity simply.",
           "List some fruits.", "Describe a city at night.", "What is a neural network?"]


async def run_streams(eng: AsyncEngine, prompts: list[list[int]], max_tokens: int,
                      tag: str, temperature: float = 0.8) -> dict[str, Any]:
    async def one(i: int) -> list[RequestOutput]:
        sp = SamplingParams(temperature=temperature, top_p=0.95, max_tokens=max_tokens,
                            ignore_eos=True, seed=i)
        return [o async for o in eng.generate(Request(f"{tag}-{i}", prompts[i], sp))]

    start = time.perf_counter()
    results = await asyncio.gather(*(one(i) for i in range(len(prompts))))
    wall = time.perf_counter() - start
    finals = [r[-1] for r in results]
    tokens = sum(f.num_output_tokens for f in finals)
    ttfts = [f.metrics.ttft for f in finals if f.metrics and f.metrics.ttft is not None]
    itls = [x for f in finals if f.metrics for x in f.metrics.inter_token_latencies]
    decode_walls = [f.metrics.decode_time for f in finals if f.metrics and f.metrics.decode_time]
    decode_tokens = sum(f.num_output_tokens - 1 for f in finals)
    return {
        "streams": len(prompts),
        "output_tokens": tokens,
        "wall_s": round(wall, 4),
        "aggregate_tok_s": round(tokens / wall, 2),
        "decode_tok_s": round(decode_tokens / max(decode_walls), 2) if decode_walls else None,
        "ttft_ms_p50": round(1000 * statistics.median(ttfts), 2) if ttfts else None,
        "itl_ms_p50": round(1000 * statistics.median(itls), 2) if itls else None,
        "itl_ms_max": round(1000 * max(itls), 2) if itls else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--streams", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--device", default=None)
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--temperature", type=float, default=0.8, help="0: greedy (top_p unused)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()

    # As `kiln serve` runs it: the model is loaded and the engine stepped on one thread (the
    # OpenMP team belongs to the calling thread; a second team on 2 cores halves the speed).
    server_config = ServerConfig(device=args.device, dtype=args.dtype,
                                 max_num_seqs=max(64, max(args.streams)))
    backend = EngineBackend.from_config(server_config)
    backend.start()
    loaded, eng = backend.loaded, backend.engine
    config = engine_config(server_config)
    rows: list[dict[str, Any]] = []
    try:
        tok = loaded.tokenizer

        def prompt(i: int) -> list[int]:
            msg = [{"role": "user", "content": PROMPTS[i % len(PROMPTS)] + f" ({i})"}]
            return tok.encode(loaded.chat_template.render(msg, add_generation_prompt=True))

        asyncio.run(run_streams(eng, [prompt(0)], 4, "warmup"))
        for n in args.streams:
            row = asyncio.run(run_streams(eng, [prompt(i) for i in range(n)], args.max_tokens,
                                          f"s{n}", args.temperature))
            rows.append(row)
            print(json.dumps(row))
    finally:
        eng.shutdown()
    report = {
        "benchmark": "engine_decode_throughput",
        "model": loaded.served_name,
        "device": loaded.device_type,
        "dtype": loaded.dtype_name,
        "machine": platform.machine(),
        "max_tokens": args.max_tokens,
        "temperature": args.temperature,
        "engine_config": {"block_size": config.block_size,
                          "max_num_batched_tokens": config.max_num_batched_tokens,
                          "max_num_seqs": config.max_num_seqs},
        "results": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
