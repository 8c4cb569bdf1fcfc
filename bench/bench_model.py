"""Model-level figures for the default model: load time, peak RSS, prefill and decode speed,
ours vs transformers on the same fp32 weights, in the same run.

Usage: python -m bench.bench_model [--repeats 3] [--prefill-tokens 512] [--decode-tokens 64]
Writes bench/results/model.json (figures, no asserts).

- load: ``load_model(None)`` wall time and ``ru_maxrss`` in a fresh subprocess (import time
  reported apart). transformers cannot read the GGUF here (needs ``accelerate``), so its figure is
  ``LlamaForCausalLM.from_pretrained`` of the same fp32 weights saved as an HF folder
  (safetensors), also in a fresh subprocess.
- prefill: one forward over a ``--prefill-tokens`` prompt, logits of the last row only (ours;
  transformers with ``logits_to_keep=1``, plus its all-rows figure for reference).
- decode: greedy, one sequence; the first token comes from the prefill, the remaining
  ``decode_tokens - 1`` are decode steps: rate = (n - 1) / (time(n tokens) - time(1 token)).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from bench._transformers_ref import build_reference, hf_generate, hf_prefill
from kiln.model.batch import build_forward_batch
from kiln.model.kv_cache import kv_cache_for
from kiln.model.loader import LoadedModel, load_model

RESULTS = Path(__file__).parent / "results" / "model.json"
ROOT = Path(__file__).resolve().parent.parent
BLOCK = 16
TEXT = ("The old lighthouse keeper climbed the spiral stairs every evening, lit the great lamp, "
        "and watched the ships pass safely through the narrow, rocky channel below his tower. ")

_LOAD_OURS = """
import json, resource, time
t0 = time.perf_counter()
import torch  # noqa: F401
from kiln.model.loader import load_model
t1 = time.perf_counter()
m = load_model(None)
t2 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "load_s": t2 - t1,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""

_LOAD_HF = """
import json, resource, sys, time
t0 = time.perf_counter()
import torch  # noqa: F401
from transformers import LlamaForCausalLM
t1 = time.perf_counter()
ref = LlamaForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32)
t2 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "load_s": t2 - t1,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def _subprocess_json(code: str, *argv: str) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-c", code, *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"subprocess failed ({proc.returncode}): {proc.stderr[-2000:]}")
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


def _stats(xs: list[float]) -> dict[str, float]:
    return {"best": min(xs), "median": statistics.median(xs), "n": len(xs)}


def prompt_ids(loaded: LoadedModel, n: int) -> list[int]:
    """``n`` ids of real text (the paragraph repeated with a counter), no special tokens."""
    ids: list[int] = []
    i = 0
    while len(ids) < n:
        ids.extend(loaded.tokenizer.encode(f"({i}) " + TEXT))
        i += 1
    return ids[:n]


class OurGreedy:
    """Our model driven directly: a private KV cache, one sequence, greedy argmax."""

    def __init__(self, loaded: LoadedModel, max_tokens: int) -> None:
        self.model = loaded.model
        n_blocks = -(-max_tokens // BLOCK) + 1
        self.kv = kv_cache_for(loaded.model, n_blocks, BLOCK, loaded.dtype,
                               loaded.device)  # as served
        self.table = list(range(n_blocks))
        self.device = loaded.device

    def prefill_seconds(self, prompt: list[int]) -> float:
        start = time.perf_counter()
        batch = build_forward_batch([(prompt, 0, self.table)], BLOCK, "last", self.device)
        self.model.forward(batch, self.kv)
        return time.perf_counter() - start

    def generate(self, prompt: list[int], n: int) -> tuple[list[int], float, float]:
        """Greedy ``n`` tokens; returns (tokens, seconds to the first token, total seconds)."""
        start = time.perf_counter()
        batch = build_forward_batch([(prompt, 0, self.table)], BLOCK, "last", self.device)
        tok = int(torch.argmax(self.model.forward(batch, self.kv)[0]))
        first = time.perf_counter() - start
        out = [tok]
        pos = len(prompt)
        while len(out) < n:
            batch = build_forward_batch([([tok], pos, self.table)], BLOCK, "last", self.device)
            tok = int(torch.argmax(self.model.forward(batch, self.kv)[0]))
            out.append(tok)
            pos += 1
        return out, first, time.perf_counter() - start


def measure(loaded: LoadedModel, ref: Any, args: argparse.Namespace) -> dict[str, Any]:
    long_prompt = prompt_ids(loaded, args.prefill_tokens)
    msg = [{"role": "user", "content": "Write a long story about a lighthouse keeper."}]
    chat = loaded.tokenizer.encode(loaded.chat_template.render(msg, add_generation_prompt=True))
    pad = min(loaded.tokenizer.eos_token_ids) if loaded.tokenizer.eos_token_ids else 0
    n = args.decode_tokens
    ours = OurGreedy(loaded, max(len(long_prompt), len(chat) + n) + BLOCK)

    # warm-up both (first calls allocate and pick kernels)
    ours.prefill_seconds(long_prompt[:64])
    ours.generate(chat, 4)
    hf_prefill(ref, long_prompt[:64])
    hf_generate(ref, [chat], 4, pad)

    o_pre, h_pre, h_pre_all = [], [], []
    for _ in range(args.repeats):
        o_pre.append(ours.prefill_seconds(long_prompt))
        h_pre.append(hf_prefill(ref, long_prompt, logits_to_keep=1))
        h_pre_all.append(hf_prefill(ref, long_prompt, logits_to_keep=0))
    o_dec, h_dec = [], []
    o_tokens: list[int] = []
    h_tokens: list[int] = []
    for _ in range(args.repeats):
        o_tokens, first, total = ours.generate(chat, n)
        o_dec.append((n - 1) / (total - first))
        h1 = hf_generate(ref, [chat], 1, pad).seconds
        res = hf_generate(ref, [chat], n, pad)
        h_tokens = res.tokens[0]
        h_dec.append((n - 1) / max(1e-9, res.seconds - h1))
    agree = next((i for i, (a, b) in enumerate(zip(o_tokens, h_tokens, strict=True)) if a != b),
                 len(o_tokens))
    p = len(long_prompt)
    return {
        "prefill_tokens": p,
        "decode_tokens": n,
        "decode_prompt_tokens": len(chat),
        "ours": {
            "prefill_s": _stats(o_pre),
            "prefill_tok_s": p / min(o_pre),
            "prefill_tok_s_median": p / statistics.median(o_pre),
            "decode_tok_s": max(o_dec),
            "decode_tok_s_median": statistics.median(o_dec),
        },
        "transformers": {
            "prefill_s": _stats(h_pre),
            "prefill_tok_s": p / min(h_pre),
            "prefill_tok_s_median": p / statistics.median(h_pre),
            "prefill_all_logits_tok_s": p / min(h_pre_all),
            "decode_tok_s": max(h_dec),
            "decode_tok_s_median": statistics.median(h_dec),
        },
        "greedy_tokens_identical_prefix": agree,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--prefill-tokens", type=int, default=512)
    ap.add_argument("--decode-tokens", type=int, default=64)
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--threads", type=int, default=None,
                    help="torch intra-op threads (default: torch's own choice)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    print("loading (fresh subprocesses) ...", flush=True)
    load_ours = _subprocess_json(_LOAD_OURS)
    loaded = load_model(None)
    ref = build_reference(loaded)
    with tempfile.TemporaryDirectory(prefix="kiln-bench-hf-") as folder:
        ref.save_pretrained(folder)  # the same weights as an HF folder (safetensors)
        load_hf = _subprocess_json(_LOAD_HF, folder)
    figures = measure(loaded, ref, args)
    o, h = figures["ours"], figures["transformers"]
    rows = [
        ("load (s)", load_ours["load_s"], load_hf["load_s"]),
        ("peak RSS after load (MB)", load_ours["peak_rss_mb"], load_hf["peak_rss_mb"]),
        (f"prefill {figures['prefill_tokens']} tok (tok/s)", o["prefill_tok_s"],
         h["prefill_tok_s"]),
        (f"decode {figures['decode_tokens']} tok, 1 seq (tok/s)", o["decode_tok_s"],
         h["decode_tok_s"]),
    ]
    print(f"{'measure':40} {'ours':>10} {'transformers':>13} {'ours/hf':>8}")
    for name, a, b in rows:
        print(f"{name:40} {a:10.2f} {b:13.2f} {a / b:8.2f}")
    print(f"(best of {args.repeats}; medians: ours prefill {o['prefill_tok_s_median']:.1f}, "
          f"decode {o['decode_tok_s_median']:.1f}; hf prefill {h['prefill_tok_s_median']:.1f}, "
          f"decode {h['decode_tok_s_median']:.1f}; hf prefill with all-row logits "
          f"{h['prefill_all_logits_tok_s']:.1f} tok/s)")
    print(f"import: ours {load_ours['import_s']:.2f} s, transformers {load_hf['import_s']:.2f} s; "
          "ours loads the Q4_1 GGUF (projections and the tied embedding kept as blocks, norms "
          "in fp32); transformers cannot read it here, so "
          "its load is from_pretrained of the same fp32 weights saved as safetensors")
    print(f"greedy tokens identical for the first {figures['greedy_tokens_identical_prefix']}"
          f"/{figures['decode_tokens']}")
    report = {
        "benchmark": "model",
        "model": loaded.served_name,
        "device": str(loaded.device),
        "dtype": str(loaded.dtype),
        "machine": platform.machine(),
        "torch_threads": torch.get_num_threads(),
        "repeats": args.repeats,
        "load": {"ours": load_ours, "transformers": load_hf},
        **figures,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
