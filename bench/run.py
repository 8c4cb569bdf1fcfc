"""`make bench`: run every benchmark; each prints its figures and writes bench/results/*.json."""

from __future__ import annotations

import argparse
import runpy
import sys

BENCHES = {
    "validate": "bench.bench_validate",
    "engine": "bench.bench_engine",
    "kernels": "bench.kernels.bench_kernels",
    "quant": "bench.bench_quant",
    "gemm_ceiling": "bench.bench_gemm_ceiling",
    "sampling": "bench.bench_sampling",
    "step": "bench.bench_step",
    "model": "bench.bench_model",
    "serving": "bench.bench_serving",
    "adapter_serving": "bench.bench_adapter_serving",
    "scoring": "bench.bench_scoring",
    "scoring_stall": "bench.bench_scoring_stall",
    "lora": "bench.bench_lora",
    "lora_engine": "bench.bench_lora_engine",
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.run")
    parser.add_argument("names", nargs="*", choices=[*BENCHES, []], default=list(BENCHES))
    args = parser.parse_args(argv)
    for name in args.names or list(BENCHES):
        print(f"== {name} ==", flush=True)
        saved = sys.argv
        sys.argv = [BENCHES[name]]
        try:
            runpy.run_module(BENCHES[name], run_name="__main__")
        finally:
            sys.argv = saved
    return 0


if __name__ == "__main__":
    sys.exit(main())
