"""Time each Triton kernel against its torch reference on CUDA; print figures, write JSON.

Usage: python bench/kernels/bench_kernels.py [--out bench/results/kernels.json] [--quick]
Without CUDA it prints a message and writes a JSON file recording the skip (exit code 0).
Figures: achieved GB/s for bandwidth-bound ops (bytes that must move / time) and TFLOP/s for
prefill attention, next to the device's peak bandwidth where known and the torch baseline.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from kiln_kernels.attention import paged_decode_ref, prefill_paged_ref, store_kv_ref
from kiln_kernels.attention.decode import paged_decode_triton
from kiln_kernels.attention.kv_store import store_kv_triton
from kiln_kernels.attention.prefill import prefill_paged_triton
from kiln_kernels.grammar import apply_token_bitmask_ref
from kiln_kernels.grammar.bitmask import apply_token_bitmask_triton
from kiln_kernels.lora import lora_expand_ref, lora_shrink_ref
from kiln_kernels.lora.sgmv import lora_expand_triton, lora_shrink_triton
from kiln_kernels.sampling import SamplingTensors, sample_reference
from kiln_kernels.sampling.sampler import sample_triton

# Peak HBM bandwidth (GB/s) of devices we expect to meet; the ratio is printed when known.
PEAK_GBPS = {"H200": 4800.0, "H100": 3350.0, "A100": 2039.0, "L4": 300.0, "A10": 600.0}


def _time(fn: Callable[[], object], iters: int) -> float:
    """Median seconds per call, CUDA events, after warm-up."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e) / 1e3)
    return sorted(times)[len(times) // 2]


def _paged(b: int, ctx: int, hk: int, d: int, bs: int, dt: torch.dtype) -> dict[str, Any]:
    pages = (ctx + bs - 1) // bs
    nb = b * pages
    kc = torch.randn(nb, bs, hk, d, device="cuda", dtype=dt)
    vc = torch.randn_like(kc)
    tables = torch.randperm(nb, device="cuda").to(torch.int32).view(b, pages)
    seq = torch.full((b,), ctx, dtype=torch.int32, device="cuda")
    return {"kc": kc, "vc": vc, "tables": tables, "seq": seq}


def cases(quick: bool) -> list[tuple[str, Callable[[], object], Callable[[], object], str, float]]:
    """(name, triton fn, torch fn, unit, work) with work in bytes (GB/s) or flops (TFLOP/s)."""
    dt = torch.bfloat16
    out: list[tuple[str, Callable[[], object], Callable[[], object], str, float]] = []
    b, v = (8, 32000) if quick else (64, 151936)
    logits = torch.randn(b, v, device="cuda")
    rows = [{"temperature": 0.8, "top_k": 20, "top_p": 0.95, "seed": i, "presence_penalty": 1.5,
             "output_tokens": list(range(i, 200 + i))} for i in range(b)]  # fmt: skip
    p = SamplingTensors.build(rows, v, "cuda")
    out.append(("sample", lambda: sample_triton(logits, p), lambda: sample_reference(logits, p),
                "GB/s", float(b * v * (4 + 4 + 1 + 4 * 3))))  # fmt: skip
    # the grammar mask: 8 constrained rows of the sampler's logits (writes -inf in place, so
    # repeated calls keep the same work); bytes: the masked rows read and written, the words read
    words = (v + 31) // 32
    bits = torch.randint(-2**31, 2**31, (8, words), device="cuda", dtype=torch.int64)
    bitmask, masked = bits.to(torch.int32), torch.arange(8, device="cuda", dtype=torch.int32)
    gl = logits.clone()
    out.append(("grammar_mask", lambda: apply_token_bitmask_triton(gl, bitmask, masked),
                lambda: apply_token_bitmask_ref(gl, bitmask, masked),
                "GB/s", float(8 * v * 4 * 2 + 8 * words * 4)))  # fmt: skip
    b, ctx = (8, 1024) if quick else (64, 4096)
    pg = _paged(b, ctx, 8, 128, 16, dt)
    qd = torch.randn(b, 32, 128, device="cuda", dtype=dt)
    args = (pg["kc"], pg["vc"], pg["tables"], pg["seq"])
    out.append(("paged_decode", lambda: paged_decode_triton(qd, *args, 128**-0.5),
                lambda: paged_decode_ref(qd, *args, 128**-0.5),
                "GB/s", 2.0 * b * ctx * 8 * 128 * 2))  # fmt: skip
    tn = b * 16
    kn, vn = (torch.randn(tn, 8, 128, device="cuda", dtype=dt) for _ in range(2))
    slots = torch.randperm(pg["kc"].shape[0] * 16, device="cuda")[:tn]
    out.append(("store_kv", lambda: store_kv_triton(kn, vn, pg["kc"], pg["vc"], slots),
                lambda: store_kv_ref(kn, vn, pg["kc"], pg["vc"], slots),
                "GB/s", 4.0 * kn.numel() * 2))  # fmt: skip
    bp, new = (2, 512) if quick else (4, 2048)
    pp = _paged(bp, ctx + new, 8, 128, 16, dt)
    qp = torch.randn(bp * new, 32, 128, device="cuda", dtype=dt)
    qsl = torch.arange(0, bp * new + 1, new, device="cuda", dtype=torch.int32)
    pargs = (pp["kc"], pp["vc"], pp["tables"], qsl, pp["seq"])
    flops = 4.0 * bp * 32 * 128 * new * (ctx + new / 2)
    out.append(("prefill_paged", lambda: prefill_paged_triton(qp, *pargs, 128**-0.5, new),
                lambda: prefill_paged_ref(qp, *pargs, 128**-0.5), "TFLOP/s", flops))  # fmt: skip
    tl_, hi, ho, rk = (64, 4096, 4096, 16)
    a = torch.randn(4, rk, hi, device="cuda", dtype=dt)
    bb = torch.randn(4, ho, rk, device="cuda", dtype=dt)
    xl = torch.randn(tl_, hi, device="cuda", dtype=dt)
    yl = torch.randn(tl_, ho, device="cuda", dtype=dt)
    sl = torch.randint(-1, 4, (tl_,), device="cuda")
    sc = torch.ones(tl_, device="cuda")
    tt = lora_shrink_ref(xl, a, sl)
    out.append(("lora_shrink", lambda: lora_shrink_triton(xl, a, sl),
                lambda: lora_shrink_ref(xl, a, sl), "GB/s", 2.0 * tl_ * (hi + rk * hi)))  # fmt: skip
    out.append(("lora_expand", lambda: lora_expand_triton(yl, tt, bb, sl, sc),
                lambda: lora_expand_ref(yl, tt, bb, sl, sc), "GB/s",
                2.0 * tl_ * (2 * ho + rk * ho)))  # fmt: skip
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/results/kernels.json")
    ap.add_argument("--quick", action="store_true", help="small shapes, few iterations")
    ap.add_argument("--iters", type=int, default=20)
    ns = ap.parse_args()
    path = Path(ns.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    meta: dict[str, Any] = {"time": time.strftime("%Y-%m-%dT%H:%M:%S"), "host": platform.node()}
    if not torch.cuda.is_available():
        print("bench_kernels: CUDA not available; nothing timed (Triton kernels need a GPU).")
        path.write_text(json.dumps({**meta, "skipped": "no CUDA", "results": []}, indent=2))
        return
    name = torch.cuda.get_device_name()
    peak = next((v for k, v in PEAK_GBPS.items() if k in name), None)
    meta.update(device=name, peak_gbps=peak, torch=torch.__version__)
    results = []
    iters = 5 if ns.quick else ns.iters
    print(f"{'op':20s} {'triton ms':>10s} {'torch ms':>10s} {'speedup':>8s}  achieved")
    for op, tri, ref, unit, work in cases(ns.quick):
        t_tri, t_ref = _time(tri, iters), _time(ref, max(3, iters // 4))
        scale = 1e9 if unit == "GB/s" else 1e12
        ach = work / t_tri / scale
        frac = f" ({100 * ach / peak:.0f}% of peak)" if unit == "GB/s" and peak else ""
        print(f"{op:20s} {t_tri * 1e3:10.3f} {t_ref * 1e3:10.3f} {t_ref / t_tri:8.2f}x"
              f"  {ach:.1f} {unit}{frac}")  # fmt: skip
        results.append({"op": op, "triton_s": t_tri, "torch_s": t_ref, "unit": unit,
                        "achieved": ach, "torch_achieved": work / t_ref / scale})  # fmt: skip
    path.write_text(json.dumps({**meta, "results": results}, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
