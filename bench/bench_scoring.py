"""Prompt-logprob scoring of a long prompt on the default model: wall time and peak memory.

Usage: python -m bench.bench_scoring [--tokens 4096] [--top-k 5] [--max-model-len 8192]
                                     [--kv-memory-mb 256] [--repeats 2]
The measurement runs in a fresh subprocess: load the model, build and start the engine, touch
every page of the KV cache (it is preallocated serving memory), run one small warm-up scoring,
then read ``ru_maxrss`` before and after scoring the long prompt. Where Linux allows it the peak
is reset first (``/proc/self/clear_refs`` = 5), so the figure is the scoring peak above the
steady state, not a loading transient. Goal: under 64 MiB. Writes bench/results/scoring.json.

It runs twice: with glibc's default allocator settings (what a plain ``kiln serve`` gets: freed
large blocks may stay resident because the mmap threshold grows), and with
``MALLOC_MMAP_THRESHOLD_=65536`` (large tensors always mmapped, so the peak is close to the
tensors' true working set).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results" / "scoring.json"
GOAL_MIB = 64.0


def _rss_kib() -> int:
    """Current resident set size in KiB (Linux /proc; falls back to the peak)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def _reset_peak() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def child(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from kiln.engine.config import EngineConfig
    from kiln.engine.loop import AsyncEngine
    from kiln.engine.runner import Runner
    from kiln.engine.scoring import CHUNK_TOKENS, score_prompt
    from kiln.model import load_model

    loaded = load_model(None, device="cpu")
    eng = AsyncEngine(loaded, EngineConfig(max_model_len=args.max_model_len,
                                           kv_memory_mb=args.kv_memory_mb))
    runner = eng.executor
    assert isinstance(runner, Runner)
    with torch.inference_mode():
        side = runner.torch_step()
        for t in (*side.kv.k, *side.kv.v):
            t.fill_(0.0)  # make the preallocated cache resident before the baseline
    eng.start()
    pool = eng.scheduler.pool
    vocab = loaded.config.vocab_size
    gen = torch.Generator().manual_seed(0)
    long_ids = torch.randint(0, vocab, (args.tokens,), generator=gen).tolist()
    warm_ids = long_ids[:64]

    async def score(ids: list[int]) -> int:
        chunk = args.chunk_tokens or CHUNK_TOKENS
        out = await eng.run_exclusive(lambda: score_prompt(
            side.model, side.kv, pool, ids, args.top_k, chunk_tokens=chunk))
        return len(out)

    try:
        asyncio.run(score(warm_ids))
        reset = _reset_peak()
        rss_before = _rss_kib()
        peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        walls = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            n = asyncio.run(score(long_ids))
            walls.append(time.perf_counter() - start)
            assert n == args.tokens - 1
        peak_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        free_after = pool.num_free_blocks
    finally:
        eng.shutdown()
    return {
        "tokens": args.tokens,
        "top_k": args.top_k,
        "chunk_tokens": args.chunk_tokens or CHUNK_TOKENS,
        "repeats": args.repeats,
        "wall_s": [round(w, 3) for w in walls],
        "wall_s_best": round(min(walls), 3),
        "tokens_per_s": round(args.tokens / min(walls), 1),
        "rss_before_mib": round(rss_before / 1024, 1),
        "maxrss_before_mib": round(peak_before / 1024, 1),
        "maxrss_after_mib": round(peak_after / 1024, 1),
        "peak_above_baseline_mib": round((peak_after - max(peak_before, rss_before)) / 1024, 1),
        "peak_reset": reset,
        "kv_blocks_free_after": free_after,
        "kv_blocks_total": pool.num_blocks,
        "torch_threads": torch.get_num_threads(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--top-k", type=int, default=5)
    ap.add_argument("--max-model-len", type=int, default=8192)
    ap.add_argument("--kv-memory-mb", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--chunk-tokens", type=int, default=0, help="0: the engine's default")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args)))
        return
    cmd = [sys.executable, "-m", "bench.bench_scoring", "--child", "--tokens", str(args.tokens),
           "--top-k", str(args.top_k), "--max-model-len", str(args.max_model_len),
           "--kv-memory-mb", str(args.kv_memory_mb), "--repeats", str(args.repeats),
           "--chunk-tokens", str(args.chunk_tokens)]
    runs: dict[str, Any] = {}
    for name, extra in (("glibc_default", {}), ("mmap_threshold_64k",
                                                {"MALLOC_MMAP_THRESHOLD_": "65536"})):
        env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")} | extra
        proc = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env,
                              cwd=Path(__file__).resolve().parent.parent)
        figures = json.loads(proc.stdout.strip().splitlines()[-1])
        figures["meets_goal"] = figures["peak_above_baseline_mib"] < GOAL_MIB
        runs[name] = figures
        print(f"[{name}] scored {figures['tokens']} tokens (K={figures['top_k']}, chunk "
              f"{figures['chunk_tokens']}): best {figures['wall_s_best']} s "
              f"({figures['tokens_per_s']} tok/s), peak memory above baseline "
              f"{figures['peak_above_baseline_mib']} MiB (goal < {GOAL_MIB:.0f} MiB, "
              f"peak reset: {figures['peak_reset']})", flush=True)
    result = {"bench": "scoring", "model": "SmolLM2-135M-Instruct (fp32, cpu)",
              "machine": platform.machine(), "python": platform.python_version(),
              "goal_mib": GOAL_MIB, "runs": runs}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
