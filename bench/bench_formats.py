"""The CPU products in every weight format (kiln_kernels.quant), on one random but valid
[2048, 1536] matrix each (1536 = 6 K-quant super-blocks): the time of M = 1 (single-stream
decode) and M = 8 rows against it, the weight bytes read per second, and the multiply-adds per
second. Formats are interleaved over the rounds and each figure is the best of them (the
machine is shared: the minimum is the least disturbed run).

Usage: python -m bench.bench_formats [--threads 1] [--repeats 15] (--rounds: the same)
  [--types Q4_1,Q5_0] (a subset, comma-separated)
Writes bench/results/formats.json (figures, no asserts).
"""

from __future__ import annotations

import platform
import time
from pathlib import Path
from typing import Any

import torch
from kiln_kernels.quant import GGML_TYPES, pack_ggml
from kiln_kernels.testing import random_raw

from bench.bench_quant import kernel_bench_parser, write_report

RESULTS = Path(__file__).parent / "results" / "formats.json"
N, K = 2048, 1536
TYPES = ["Q4_0", "Q4_1", "Q8_0", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "F16",
         "BF16", "F32"]


def main() -> None:
    ap = kernel_bench_parser(__doc__, RESULTS, repeats=15)
    ap.add_argument("--rounds", dest="repeats", type=int, help="--repeats, by its older name")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--types", default=",".join(TYPES), help="comma-separated GGML types")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    weights = {t: pack_ggml(random_raw(t, N, K, amp=0.05), t) for t in args.types.split(",")
               if t in GGML_TYPES}
    xs = {m: torch.randn(m, K) for m in (1, 8)}
    best = {(t, m): float("inf") for t in weights for m in xs}
    for _ in range(args.repeats):  # rounds: the formats interleaved
        for t, pw in weights.items():
            for m, x in xs.items():
                for _ in range(10):
                    start = time.perf_counter()
                    pw.matmul(x)
                    best[t, m] = min(best[t, m], time.perf_counter() - start)
    out: dict[str, Any] = {"benchmark": "formats", "machine": platform.machine(),
                           "threads": args.threads, "shape": [N, K], "formats": {}}
    for t, pw in weights.items():
        row = {"bits_per_weight": 8 * pw.nbytes / (N * K)}
        for m in xs:
            s = best[t, m]
            row[f"m{m}_ms"] = 1e3 * s
            row[f"m{m}_gb_s"] = pw.nbytes / s / 1e9
            row[f"m{m}_gmac_s"] = m * N * K / s / 1e9
        out["formats"][t] = row
        print(f"{t:5s} {row['bits_per_weight']:5.2f} bit/w | M=1 {row['m1_ms']:.3f} ms "
              f"{row['m1_gb_s']:5.1f} GB/s | M=8 {row['m8_ms']:.3f} ms "
              f"{row['m8_gmac_s']:5.1f} GMAC/s")
    write_report(args.out, out)


if __name__ == "__main__":
    main()
