"""`make bench`: run every benchmark; each prints its figures and writes bench/results/*.json.

Each benchmark runs in its own Python process. In one process they had shared torch's thread
pools: after `sampling`, `scoring` and `scoring_stall`, `engine` measured 53 tok/s for one stream
against 154 tok/s alone (a second OpenMP team in a process stops libgomp's spinning; README,
"CPU decode")."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

BENCHES = {
    "validate": "bench.bench_validate",
    "engine": "bench.bench_engine",
    "kernels": "bench.kernels.bench_kernels",
    "quant": "bench.bench_quant",
    "formats": "bench.bench_formats",
    "gemm_ceiling": "bench.bench_gemm_ceiling",
    "sampling": "bench.bench_sampling",
    "step": "bench.bench_step",
    "model": "bench.bench_model",
    "serving": "bench.bench_serving",
    "completions": "bench.bench_completions",
    "adapter_serving": "bench.bench_adapter_serving",
    "scoring": "bench.bench_scoring",
    "scoring_stall": "bench.bench_scoring_stall",
    "lora": "bench.bench_lora",
    "lora_engine": "bench.bench_lora_engine",
    "metrics_scrape": "bench.bench_metrics_scrape",
    "hostile": "bench.bench_hostile",
    "peer": "bench.bench_peer",
    "startup": "bench.bench_startup",
    "structured": "bench.bench_structured",
    "grammar_engines": "bench.bench_grammar_engines",
    "sleep": "bench.bench_sleep",
    "request_log": "bench.bench_request_log",
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.run")
    parser.add_argument("names", nargs="*", choices=[*BENCHES, []], default=list(BENCHES))
    args = parser.parse_args(argv)
    failed = []
    for name in args.names or list(BENCHES):
        print(f"== {name} ==", flush=True)
        if subprocess.run([sys.executable, "-m", BENCHES[name]], cwd=ROOT).returncode != 0:
            failed.append(name)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
