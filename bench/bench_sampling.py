"""The CPU samplers per step, over the default model's vocabulary size (49,152), for the sampling
settings requests bring: the C sampler the engine runs on the CPU
(kiln_kernels.sampling.native.sample_rows: per-row parameter lists, penalty history as id lists)
beside the torch
reference (sample_reference, dense [rows, vocab] history), on the same inputs.

Rows: 1 and 8. Settings: greedy; Kiln's default preset (temperature 1.0, top-p 0.95, top-k 20,
presence penalty 1.5, with 50 generated tokens of history); temperature only (top-k off: every
token is a candidate and hashed); top-p only; min-p. Two kinds of logits: random normal x 3
(flat: top-p 0.95 keeps thousands of tokens, past the 1,024-token prefix) and the default
model's next-token logits for 8 chat prompts (peaked: at temperature 0.8, top-p 0.95 kept 1 to 76
tokens when this was written).

Usage: python -m bench.bench_sampling [--repeats 30]
Writes bench/results/sampling.json (figures, no asserts).
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
from kiln_kernels.sampling import SamplingTensors, sample_reference
from kiln_kernels.sampling.native import (
    FLOAT_COLUMNS,
    INT_COLUMNS,
    native_available,
    sample_rows,
)

RESULTS = Path(__file__).parent / "results" / "sampling.json"
VOCAB = 49152
SETTINGS: dict[str, dict[str, Any]] = {
    "greedy": {"temperature": 0.0},
    "default preset": {"temperature": 1.0, "top_p": 0.95, "top_k": 20, "presence_penalty": 1.5,
                       "output_tokens": list(range(50))},
    "temperature only": {"temperature": 0.8, "top_k": 0},
    "top-p only": {"temperature": 0.8, "top_p": 0.95, "top_k": 0},
    "min-p": {"temperature": 0.8, "min_p": 0.05, "top_k": 0},
}


PROMPTS = ["Write a story about a dragon.", "What is the capital of France?", "List five fruits.",
           "Explain gravity.", "Tell me a joke.", "Describe the ocean.", "How do computers work?",
           "Write a poem about rain."]


def model_logits() -> torch.Tensor:
    """float32 [8, vocab]: the default model's next-token logits after each chat prompt."""
    from kiln.model.batch import build_forward_batch
    from kiln.model.kv_cache import KVCache
    from kiln.model.loader import load_model

    m = load_model(None)
    kv = KVCache(m.config, 8 * 8, 16, m.dtype, m.device)
    rows = []
    for i, text in enumerate(PROMPTS):
        ids = m.tokenizer.encode(m.chat_template.render([{"role": "user", "content": text}],
                                                        add_generation_prompt=True))
        batch = build_forward_batch([(ids, 0, list(range(i * 8, i * 8 + 8)))], 16, "last")
        rows.append(m.model.forward(batch, kv)[0])
    return torch.stack(rows)


def time_ms(logits: torch.Tensor, setting: dict[str, Any], repeats: int,
            native: bool) -> float:
    rows, vocab = logits.shape
    p = SamplingTensors.build([dict(setting, seed=i, step=3) for i in range(rows)], vocab)
    hist = [list(setting.get("output_tokens", [])) for _ in range(rows)]
    floats = list(zip(*(getattr(p, n).tolist() for n in FLOAT_COLUMNS), strict=True))
    ints = list(zip(*(getattr(p, n).tolist() for n in INT_COLUMNS), strict=True))

    def run() -> None:
        if native:  # as the engine's Sampler calls it: plain lists
            sample_rows(logits, floats, ints, hist)
        else:
            sample_reference(logits, p)

    run()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    if not native_available():
        raise SystemExit("the C kernels do not build here (no C compiler?)")
    results = []
    real = model_logits()
    print(f"{'logits':7} {'setting':18} {'rows':>4} {'C ms':>8} {'torch ms':>9}")
    for kind in ("random", "model"):
        for name, setting in SETTINGS.items():
            for rows in (1, 8):
                logits = (real[:rows] if kind == "model" else
                          torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(rows)) * 3)
                ms = time_ms(logits, setting, args.repeats, native=True)
                ref = time_ms(logits, setting, args.repeats, native=False)
                results.append({"logits": kind, "setting": name, "rows": rows,
                                "ms_per_step_median": round(ms, 3),
                                "torch_reference_ms_median": round(ref, 3)})
                print(f"{kind:7} {name:18} {rows:>4} {ms:8.2f} {ref:9.2f}")
    report = {"benchmark": "sampling", "vocab": VOCAB, "machine": platform.machine(),
              "torch_threads": torch.get_num_threads(), "results": results}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
