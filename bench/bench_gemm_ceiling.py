"""How close the quantized products (kiln_kernels/cpu/matmul/gemm.c) run to what one core sustains.

Three figures, in 512-bit FMAs per ns per core (one FMA = 16 multiply-adds):
- the core's ceilings for the products' loop skeleton (bench/kernels/fma_ceiling.c, one thread):
  every operand in registers, and the same FMAs fed by zmm loads from L1 at the 8-row pass's
  ratio (16 loads per 32 FMAs);
- the real kernel on one thread, M = 1..8 rows, on a weight that stays in this core's L2
  (layer 0's gate_up_proj, 1.3 MB of Q4_1 tiles): the products' own arithmetic rate;
- the real kernel on torch's threads over the 120 layer products of the default model (79.6 MB
  of tiles, streamed from memory), each product its own call (a C step runs them in one OpenMP
  region, so it pays less per product than these calls do).

Why it matters: 8 decode streams cost one step of 8 rows, whose products are bound by this rate,
while one stream's step is bound by reading the weights (issue 4's 8-streams-vs-1 figure).

Usage: python -m bench.bench_gemm_ceiling [--repeats 5]
Writes bench/results/gemm_ceiling.json (figures, no asserts).
"""

from __future__ import annotations

import ctypes
import platform
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import torch
from kiln_kernels.cpu.loader import compiler
from kiln_kernels.quant import PackedConcat, PackedWeight

from bench.bench_quant import best_of, repeats_and_default_model, write_report

RESULTS = Path(__file__).parent / "results" / "gemm_ceiling.json"
CEILING_C = Path(__file__).parent / "kernels" / "fma_ceiling.c"
K_CEILING = 576


def core_ceilings(repeats: int) -> dict[str, float]:
    """FMAs per ns of fma_ceiling.c on this thread: registers only, and fed by L1 loads."""
    with tempfile.TemporaryDirectory() as tmp:
        lib_path = Path(tmp) / "fma_ceiling.so"
        subprocess.run([compiler(), "-O3", "-march=native", "-mprefer-vector-width=512",
                        "-shared", "-fPIC", "-o", str(lib_path), str(CEILING_C)], check=True)
        lib = ctypes.CDLL(str(lib_path))
    lib.fma_ceiling.restype = ctypes.c_double
    lib.fma_ceiling.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                                ctypes.c_void_p]
    x = torch.rand(8, K_CEILING)
    sink = torch.zeros(1)
    out = {}
    for name, loads in (("registers", 0), ("l1_loads", 1)):
        out[name] = max(lib.fma_ceiling(loads, x.data_ptr(), K_CEILING, 1 << 22, sink.data_ptr())
                        for _ in range(repeats))
    return out


def kernel_rate(weights: list[PackedWeight | PackedConcat], m: int, repeats: int, calls: int) -> float:
    """FMAs per ns per thread of ``calls`` passes over ``weights`` with M rows (best_of)."""
    xs = {w.in_features: torch.randn(m, w.in_features) for w in weights}
    fmas = calls * sum(m * w.out_features * w.in_features / 16 for w in weights)

    def run() -> None:
        for _ in range(calls):
            for w in weights:
                w.matmul(xs[w.in_features])

    return fmas / best_of(run, repeats) / 1e9 / torch.get_num_threads()


def main() -> None:
    args, loaded = repeats_and_default_model(__doc__, RESULTS)
    fused = loaded.model.cpu_step
    if fused is None:
        raise SystemExit("the default model has no C step here (no C compiler or no AVX-512?)")
    layers = fused.weights.layers
    products = [w for layer in layers for w in (layer.qkv, layer.o, layer.gate_up, layer.down)]
    threads = torch.get_num_threads()
    rows = range(1, 9)

    torch.set_num_threads(1)  # the same (loading) thread: its OpenMP team shrinks, no new team
    try:
        ceilings = core_ceilings(args.repeats)
        hot = {m: kernel_rate([layers[0].gate_up], m, args.repeats, 40) for m in rows}
    finally:
        torch.set_num_threads(threads)
    cold = {m: kernel_rate(products, m, args.repeats, 1) for m in rows}

    print(f"core ceilings (1 thread, FMA/ns): registers only {ceilings['registers']:.2f}, fed by "
          f"zmm L1 loads (16 per 32 FMAs) {ceilings['l1_loads']:.2f}")
    print(f"{'rows':>4} {'kernel, cache-resident, 1 thread':>33} {f'model products, {threads} threads':>30}")
    for m in rows:
        print(f"{m:>4} {hot[m]:>24.2f} FMA/ns {cold[m]:>19.2f} FMA/ns/core")
    report: dict[str, Any] = {
        "benchmark": "gemm_ceiling", "machine": platform.machine(), "torch_threads": threads,
        "unit": "512-bit FMAs per ns per core", "core_ceilings": ceilings,
        "kernel_cache_resident_1_thread": {str(m): v for m, v in hot.items()},
        "model_products": {str(m): v for m, v in cold.items()},
        "weights": {"cache_resident": "layer 0 gate_up_proj, Q4_1 tiles, 3072 x 576",
                    "model_products": f"{len(products)} layer products, Q4_1 tiles"},
    }
    write_report(args.out, report)


if __name__ == "__main__":
    main()
