"""The CPU quantized-weight kernels (kiln_kernels.quant) on the default model's own weights.

For every projection of the 30 layers plus the LM head, the product of M activation rows with
- the packed GGUF blocks (the C kernel: Q4_1 layers, Q8_0 head), and
- the same weights as float32 tensors (torch ``F.linear``, MKL) - the torch baseline;
M = 1 is single-sequence decode (bytes bound: GB/s of weights read), M = 8 is eight streams
(arithmetic bound: GMAC/s). The ceiling beside the GB/s is this machine's measured streaming
read rate (a float32 ``sum`` over 512 MiB), taken in the same run.

Usage: python -m bench.bench_quant [--repeats 5]
Writes bench/results/quant.json (figures, no asserts).
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path
from typing import Any, cast

import torch
import torch.nn.functional as F
from kiln_kernels.quant import PackedConcat, PackedWeight

from kiln.model.layers import DecoderLayer, SwiGLUMLP
from kiln.model.loader import LoadedModel, load_model

RESULTS = Path(__file__).parent / "results" / "quant.json"


def best_of(fn: Any, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def read_ceiling(repeats: int) -> float:
    """GB/s of a float32 sum over 512 MiB (streaming reads, both threads)."""
    big = torch.ones(128 * 1024 * 1024)
    return big.numel() * 4 / best_of(big.sum, repeats) / 1e9


def products(pairs: list[tuple[PackedWeight | PackedConcat, torch.Tensor]], m: int,
             repeats: int) -> tuple[float, float]:
    """Best seconds for all products of M rows: (packed kernels, torch float32)."""
    xs = {k: torch.randn(m, k) for k in {int(w.shape[1]) for _, w in pairs}}
    ours = best_of(lambda: [p.matmul(xs[int(w.shape[1])]) for p, w in pairs], repeats)
    theirs = best_of(lambda: [F.linear(xs[int(w.shape[1])], w) for _, w in pairs], repeats)
    return ours, theirs


def kernel_bench_parser(description: str | None, out: Path, repeats: int = 5
                        ) -> argparse.ArgumentParser:
    """The CPU kernel benches' shared flags: `--repeats` (best of) and `--out` (the JSON)."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--repeats", type=int, default=repeats, help="each figure is the best of")
    ap.add_argument("--out", type=Path, default=out, help="the JSON file written")
    return ap


def write_report(out: Path, report: dict[str, Any]) -> None:
    """The CPU kernel benches' shared end: the figures as JSON in `out`."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}")


def repeats_and_default_model(description: str | None, out: Path
                              ) -> tuple[argparse.Namespace, LoadedModel]:
    """The CPU kernel benches' shared start: their flags, then the default model."""
    return kernel_bench_parser(description, out).parse_args(), load_model(None)


def main() -> None:
    args, loaded = repeats_and_default_model(__doc__, RESULTS)
    model = loaded.model
    if model.packed_head is None:
        raise SystemExit("the default model has no packed weights here (no C compiler?)")
    pairs: list[tuple[PackedWeight | PackedConcat, torch.Tensor]] = []
    for module in model.model.layers:
        layer = cast(DecoderLayer, module)
        attn, mlp = layer.self_attn, layer.mlp
        assert isinstance(mlp, SwiGLUMLP)
        fused = [(attn.packed_qkv, [attn.q_proj, attn.k_proj, attn.v_proj]),
                 (attn.packed_o, [attn.o_proj]),
                 (mlp.packed_gate_up, [mlp.gate_proj, mlp.up_proj]),
                 (mlp.packed_down, [mlp.down_proj])]
        for packed, linears in fused:
            assert packed is not None
            weights = [lin.weight for lin in linears]
            pairs.append((packed, torch.cat(weights).contiguous()))
    pairs.append((model.packed_head, model.output_weight()))
    packed_bytes = sum(p.nbytes for p, _ in pairs)
    fp32_bytes = sum(w.numel() * 4 for _, w in pairs)
    macs_per_row = sum(w.numel() for _, w in pairs)
    read_gbs = read_ceiling(args.repeats)
    out: dict[str, Any] = {"benchmark": "quant", "model": loaded.served_name,
                           "machine": platform.machine(), "torch_threads": torch.get_num_threads(),
                           "packed_mb": packed_bytes / 1e6, "fp32_mb": fp32_bytes / 1e6,
                           "read_ceiling_gb_s": read_gbs, "rows": {}}
    print(f"weights: packed {packed_bytes / 1e6:.0f} MB, float32 {fp32_bytes / 1e6:.0f} MB; "
          f"streaming read ceiling {read_gbs:.1f} GB/s")
    for m in (1, 8):
        ours, theirs = products(pairs, m, args.repeats)
        row = {"packed_ms": 1e3 * ours, "torch_fp32_ms": 1e3 * theirs, "speedup": theirs / ours,
               "packed_gb_s": packed_bytes / ours / 1e9, "torch_gb_s": fp32_bytes / theirs / 1e9,
               "packed_gmac_s": m * macs_per_row / ours / 1e9,
               "torch_gmac_s": m * macs_per_row / theirs / 1e9}
        out["rows"][str(m)] = row
        print(f"M={m}: packed {row['packed_ms']:.2f} ms ({row['packed_gb_s']:.1f} GB/s, "
              f"{row['packed_gmac_s']:.1f} GMAC/s) | torch float32 {row['torch_fp32_ms']:.2f} ms "
              f"({row['torch_gb_s']:.1f} GB/s, {row['torch_gmac_s']:.1f} GMAC/s) | "
              f"{row['speedup']:.2f}x")
    write_report(args.out, out)


if __name__ == "__main__":
    main()
