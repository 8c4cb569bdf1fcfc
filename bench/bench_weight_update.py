"""`python -m bench.bench_weight_update [--shaped] [--streams 4] [--mode keep]`: what
POST /update_weights_from_disk costs a serving server. A `kiln serve` process (torch-free, as it
starts) on a model file, with --enable-weight-updates; ``--streams`` clients stream greedy chat
turns without pause (a bounded number of turns); after a steady stretch, the update to a second
file of the same shapes, then one more request:

- ``update_to_first_token_s``: from sending the update to the first token of a request sent as
  soon as the update answered (that request's final weight_version is the new one: checked);
- ``load_s`` and ``total_s``: the server's own figures (loading beside the serving weights, and
  the whole call);
- ``dip``: the streams' tokens/s while the update ran over their tokens/s in the stretch before
  it (1.0: no dip), and ``after``: the stretch after it over the one before.

Files: the default model's GGUF, updated to a copy of itself (the same bytes, really loaded); with
``--shaped``, Qwen2.5-0.5B's shapes in F16 (bench.peers.shaped_gguf, seeds 0 and 1: written to
build-peers/models when missing). Prints one line per file and writes
bench/results/weight_update-MODE.json."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from bench.live_server import running_server
from kiln.model.checkpoint.locate import default_model_path

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "build-peers" / "models"
RESULTS = Path(__file__).parent / "results"  # weight_update-MODE.json
BODY: dict[str, Any] = {"messages": [{"role": "user", "content": "Tell me about the sea."}],
                        "max_tokens": 48, "temperature": 0, "ignore_eos": True, "stream": True}
STEADY_S = 6.0  # the stretch before (and after) the update the rates are taken over
MAX_TURNS = 400  # per stream: a bound on the load loop


def shaped_pair() -> tuple[Path, Path]:
    files = (MODELS / "qwen2.5-0.5b-shaped-F16.gguf", MODELS / "qwen2.5-0.5b-shaped-F16-seed1.gguf")
    for seed, path in enumerate(files):
        if not path.is_file():
            MODELS.mkdir(parents=True, exist_ok=True)
            subprocess.run([sys.executable, "-m", "bench.peers.shaped_gguf", str(path),
                            "--seed", str(seed)], check=True, cwd=ROOT)
    return files


def stream_turns(url: str, stop: threading.Event, times: list[float]) -> None:
    """Greedy turns, one after another, each token's arrival time appended to ``times``."""
    with httpx.Client(base_url=url, timeout=600.0) as client:
        for _ in range(MAX_TURNS):
            if stop.is_set():
                return
            with client.stream("POST", "/v1/chat/completions", json=BODY) as r:
                for line in r.iter_lines():
                    if line.startswith("data: {") and '"content":' in line:
                        times.append(time.monotonic())


def first_token_after(url: str) -> tuple[float, str]:
    """(seconds to the first token, the final weight_version) of one streamed request."""
    sent = time.monotonic()
    first = None
    version = ""
    with httpx.Client(base_url=url, timeout=600.0) as client, \
            client.stream("POST", "/v1/chat/completions", json=BODY) as r:
        for line in r.iter_lines():
            if first is None and line.startswith("data: {") and '"content":' in line:
                first = time.monotonic()
            if '"weight_version"' in line:
                version = json.loads(line[6:])["weight_version"]
    assert first is not None, "no token"
    return first - sent, version


def rate(times: list[float], start: float, end: float) -> float:
    return sum(start <= t < end for t in times) / max(end - start, 1e-9)


def measure(model: Path, new: Path, streams: int, mode: str, log: Path) -> dict[str, Any]:
    args = ["--model", str(model), "--enable-weight-updates", "--kv-memory-mb", "256",
            "--max-model-len", "4096"]
    with running_server(args, log_path=log) as server:
        stop = threading.Event()
        times: list[list[float]] = [[] for _ in range(streams)]
        threads = [threading.Thread(target=stream_turns, args=(server.url, stop, t), daemon=True)
                   for t in times]
        for t in threads:
            t.start()
        time.sleep(2 * STEADY_S)  # warm, then the stretch before
        with httpx.Client(base_url=server.url, timeout=600.0) as client:
            t0 = time.monotonic()
            r = client.post("/update_weights_from_disk", json={
                "model_path": str(new), "weight_version": "bench-new", "mode": mode})
            t1 = time.monotonic()
        r.raise_for_status()
        ttft, version = first_token_after(server.url)
        assert version == "bench-new", version
        update_to_first = (t1 - t0) + ttft  # the request is sent as the update answers
        time.sleep(STEADY_S)
        stop.set()
        for t in threads:
            t.join(600.0)
    merged = sorted(x for t in times for x in t)
    before = rate(merged, t0 - STEADY_S, t0)
    during = rate(merged, t0, t1) if t1 > t0 else before
    after = rate(merged, t1 + 1.0, t1 + 1.0 + STEADY_S - 1.0)
    body = r.json()
    return {"model": model.name, "new": new.name, "mode": mode, "streams": streams,
            "update_to_first_token_s": round(update_to_first, 3),
            "load_s": body["load_s"], "total_s": body["total_s"],
            "tok_s_before": round(before, 1), "tok_s_during": round(during, 1),
            "tok_s_after": round(after, 1), "dip": round(during / max(before, 1e-9), 3),
            "after": round(after / max(before, 1e-9), 3)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--shaped", action="store_true", help="also Qwen2.5-0.5B's shapes (F16)")
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--mode", choices=("abort", "wait", "keep"), default="keep")
    args = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        default = Path(default_model_path())
        copy = Path(tmp) / f"copy-{default.name}"
        shutil.copyfile(default, copy)
        pairs = [(default, copy)]
        if args.shaped:
            pairs.append(shaped_pair())
        for model, new in pairs:
            row = measure(model, new, args.streams, args.mode, Path(tmp) / f"{model.stem}.log")
            print(", ".join(f"{k} {v}" for k, v in row.items()), flush=True)
            rows.append(row)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"weight_update-{args.mode}.json").write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
