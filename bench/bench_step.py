"""One forward step of the default model on the CPU (the C step for the quantized GGUF), by shape.

- decode: M sequences decoding one token each at a given context (M = 1, 2, 4, 8; context 100
  and 1,000): what continuous batching pays per step;
- admission: 4 sequences decoding at context 60 beside a prefill chunk of R rows of one long
  sequence at context C (R = 1, 3, 8; C = 200, 800, 1,500): the step a long prompt adds while
  streams run;
- jitter: 300 identical steps (4 decodes at context 60): p50, p99 and max. Identical work, so
  their spread is the machine's (preemption, neighbours), the floor under any p99 latency figure.

Each figure is the median of ``--repeats`` steps of ``model.forward`` (no scheduler, no
sampling), on the loading thread, with a private KV cache.

Usage: python -m bench.bench_step [--repeats 15] [--kv-cache-dtype auto|float16]
Writes bench/results/step.json (step_float16kv.json with a float16 cache; figures, no asserts).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from kiln.model.batch import build_forward_batch
from kiln.model.kv_cache import kv_cache_for
from kiln.model.loader import LoadedModel, load_model

RESULTS = Path(__file__).parent / "results" / "step.json"
BLOCK = 16
LONG = 1600
PER_SEQ_BLOCKS = 80  # 1,280 positions for each decoding sequence


class Bench:
    def __init__(self, loaded: LoadedModel, repeats: int, kv_dtype: torch.dtype) -> None:
        self.m, self.repeats = loaded, repeats
        n_long = LONG // BLOCK + 4
        self.kv = kv_cache_for(loaded.model, n_long + 8 * PER_SEQ_BLOCKS, BLOCK, kv_dtype,
                               loaded.device)  # as served
        self.long_table = list(range(n_long))
        self.tables = [list(range(n_long + i * PER_SEQ_BLOCKS, n_long + (i + 1) * PER_SEQ_BLOCKS))
                       for i in range(8)]
        self.ids = [(i * 37) % 30000 + 100 for i in range(LONG)]

    def forward_ms(self, seqs: list[tuple[list[int], int, list[int]]]) -> float:
        batch = build_forward_batch(seqs, BLOCK, "last", self.m.device)
        start = time.perf_counter()
        self.m.model.forward(batch, self.kv)
        return 1000 * (time.perf_counter() - start)

    def fill(self, table: list[int], n: int) -> None:
        """Prefill positions 0..n-1 of one sequence in 64-token chunks."""
        for p in range(0, n, 64):
            self.forward_ms([(self.ids[p:min(n, p + 64)], p, table)])

    def decode(self, m: int, ctx: int) -> float:
        times = [self.forward_ms([([7], ctx + k, self.tables[i]) for i in range(m)])
                 for k in range(self.repeats)]
        return statistics.median(times)

    def admission(self, rows: int, ctx: int) -> float:
        times = []
        for k in range(self.repeats):
            seqs = [([7], 60 + k, self.tables[i]) for i in range(4)]
            seqs.append((self.ids[ctx:ctx + rows], ctx, self.long_table))
            times.append(self.forward_ms(seqs))
        return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--kv-cache-dtype", choices=["auto", "float16"], default="auto",
                    help="auto: the model's float32 (exact); float16: half K/V")
    ap.add_argument("--out", type=Path, default=None,
                    help="default bench/results/step.json (step_float16kv.json for float16)")
    args = ap.parse_args()
    loaded = load_model(None)
    half = args.kv_cache_dtype == "float16"
    out = args.out or (RESULTS.with_name("step_float16kv.json") if half else RESULTS)
    b = Bench(loaded, args.repeats, torch.float16 if half else loaded.dtype)
    for table in b.tables:
        b.fill(table, 1000)
    b.fill(b.long_table, LONG - 64)
    decode = [{"rows": m, "context": c, "ms": round(b.decode(m, c), 2)}
              for c in (100, 1000) for m in (1, 2, 4, 8)]
    four = round(b.decode(4, 60), 2)
    admission = [{"chunk_rows": r, "context": c, "ms": round(b.admission(r, c), 2)}
                 for c in (200, 800, 1500) for r in (1, 3, 8)]
    same = sorted(b.forward_ms([([7], 60, b.tables[i]) for i in range(4)]) for _ in range(300))
    jitter = {"steps": len(same), "p50_ms": round(same[150], 2), "p99_ms": round(same[296], 2),
              "max_ms": round(same[-1], 2), "p99_over_p50": round(same[296] / same[150], 2)}
    print(f"{'decode rows':>11} {'context':>7} {'ms/step':>8} {'tok/s':>7}")
    for d in decode:
        print(f"{d['rows']:>11} {d['context']:>7} {d['ms']:8.2f} {1000 * d['rows'] / d['ms']:7.1f}")
    print(f"4 decodes at context 60: {four:.2f} ms; beside a chunk of R rows at context C:")
    for a in admission:
        print(f"  R={a['chunk_rows']} C={a['context']:>4}: {a['ms']:6.2f} ms "
              f"({a['ms'] / four:.2f}x the 4 decodes)")
    print(f"300 identical steps (4 decodes at context 60): p50 {jitter['p50_ms']:.2f} ms, p99 "
          f"{jitter['p99_ms']:.2f} ms ({jitter['p99_over_p50']:.2f}x), max {jitter['max_ms']:.2f} ms")
    report: dict[str, Any] = {
        "benchmark": "forward_step", "machine": platform.machine(),
        "kv_cache_dtype": args.kv_cache_dtype,
        "torch_threads": torch.get_num_threads(), "repeats": args.repeats,
        "decode": decode, "four_decodes_ms": four, "admission": admission, "jitter": jitter,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
