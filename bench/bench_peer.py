"""Kiln against llama.cpp's ``llama-server`` on the same GGUF files, one after the other in one
run, with the same client and sampling (greedy, ``ignore_eos``, 127.0.0.1 only). One pairing
more, "bf16 (HF folder)": Kiln serves an HF folder of bf16 safetensors (what RL and distillation
users load), llama-server, which cannot read safetensors, the BF16 GGUF of exactly those weights
(the folder is written from it by ``python -m bench.peers.hf_folder``).

Per file and server: seconds from start to a healthy /health, single-stream decode tok/s (best
of ``--repeats``), 8-stream aggregate tok/s, and the server's RSS at health and after the runs,
with the part of it that is the KV cache (Kiln maps its cache from zero pages, resident once
written; llama.cpp clears its whole cache at start), and the prefill rate (prompt tokens per
second of a one-token completion over a fresh ~600-900-token prompt, best of ``--repeats``). The rate of a stream is (tokens - 1) over
the span from its first to its last content chunk (prefill left out), counted the same way for
both servers; the single-stream figure is also given as a fraction of the memory-bandwidth bound
(this machine's streaming read rate, measured in the same run, over the bytes of the file's
tensors: each decoded token reads every weight once; for the folder, its GGUF's: the same
weights). Kiln's KV cache is sized from the GGUF of the pair.

The peer: ``bash bench/peers/build_llama_cpp.sh`` (llama.cpp from the llama-cpp-python 0.3.36
sdist) and ``bash bench/peers/requantize.sh`` (the default model as Q4_K_M, Q5_K_M, Q6_K, Q8_0,
F16, BF16, IQ4_XS, IQ4_NL) into build-peers/, then ``python -m bench.peers.hf_folder`` for the
folder (FOLDER below), and ``python -m bench.peers.shaped_gguf`` + ``llama-quantize`` for files
of Qwen2.5-0.5B's and Llama 3.2 1B's shapes in Q4_K_M (SHAPED, LLAMA_SHAPED below: random
weights, the tensor types of the published files). Files, the folder or servers not there are skipped, and said so.

Usage: python -m bench.bench_peer [--files A.gguf ...] [--only TEXT ...] [--tokens 128]
[--repeats 3]   (--only: the default rows whose name holds one of the TEXTs, any case)
Writes bench/results/peer.json (figures, no asserts).
"""

from __future__ import annotations

import argparse
import asyncio
import compileall
import contextlib
import json
import os
import platform
import random
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench.live_server import BENCH_FLAGS, ROOT
from bench.serving_client import STREAM_TIMEOUT_S, user_prompt
from kiln.testing import ServerProcess, free_port, serve_command, start, stop, wait_started

RESULTS = ROOT / "bench" / "results" / "peer.json"
PEERS = ROOT / "build-peers"
LLAMA_SERVER = PEERS / "build" / "bin" / "llama-server"
# --isa avx2: both servers built for AVX2 only (LLAMA_ISA=avx2 bash bench/peers/build_llama_cpp.sh,
# and Kiln with KILN_CPU_ISA=avx2), the machines most users have, on any x86 CPU
PEER_BUILDS = {"native": LLAMA_SERVER, "avx2": PEERS / "build-avx2" / "bin" / "llama-server"}
STARTUP_TIMEOUT_S = 300.0
REQUANTIZED = ("Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0", "F16", "BF16", "IQ4_XS", "IQ4_NL")
BF16_GGUF = PEERS / "models" / "smollm2-135m-BF16.gguf"
FOLDER = PEERS / "models" / "smollm2-135m-bf16-hf"  # bench.peers.hf_folder BF16_GGUF FOLDER
FOLDER_ROW = "bf16 (HF folder)"
# Qwen2.5-0.5B's shapes, random weights, as llama-quantize writes Q4_K_M (Q4_K, Q5_0, Q6_K, Q8_0):
# python -m bench.peers.shaped_gguf F16.gguf, then llama-quantize F16.gguf SHAPED Q4_K_M
SHAPED = PEERS / "models" / "qwen2.5-0.5b-shaped-Q4_K_M.gguf"
# Llama 3.2 1B's shapes and llama3 rope scaling, the same way (--shape llama3.2-1b)
LLAMA_SHAPED = PEERS / "models" / "llama3.2-1b-shaped-Q4_K_M.gguf"


@dataclass(frozen=True)
class Pair:
    """One row: ``kiln`` (a GGUF file or an HF folder) served by Kiln, ``gguf`` by llama-server;
    the KV sizing and the tensor bytes are the GGUF's."""

    name: str
    kiln: Path
    gguf: Path


def file_pair(path: Path) -> Pair:
    return Pair(path.name, path, path)


def default_pairs() -> list[Pair]:
    from kiln.model.checkpoint.locate import default_model_path

    files = [Path(default_model_path())]
    files += [PEERS / "models" / f"smollm2-135m-{q}.gguf" for q in REQUANTIZED]
    files += [SHAPED, LLAMA_SHAPED]
    pairs = [file_pair(p) for p in files if p.is_file()]
    if BF16_GGUF.is_file() and (FOLDER / "config.json").is_file():
        pairs.append(Pair(FOLDER_ROW, FOLDER, BF16_GGUF))
    elif BF16_GGUF.is_file():
        print(f"no {FOLDER}: python -m bench.peers.hf_folder {BF16_GGUF} {FOLDER} "
              f"(the {FOLDER_ROW!r} row skipped)")
    return pairs


PEER_CONTEXT = 8192  # llama-server -c: the KV cache's tokens (over its -np 8 slots), f16


def peer_cache(model: Path) -> tuple[int, int]:
    """(MiB, context tokens) of llama-server's cache for ``model``: PEER_CONTEXT tokens of
    float16 K and V in every layer; a model whose context is longer than that (Qwen2.5's
    32,768) is served at the cache's length, as llama-server's -c serves it."""
    from kiln.model.checkpoint.gguf_index import GGUFIndex

    meta = GGUFIndex(model).metadata
    arch = meta["general.architecture"]
    layers, heads = int(meta[f"{arch}.block_count"]), int(meta[f"{arch}.attention.head_count"])
    kv_heads = int(meta.get(f"{arch}.attention.head_count_kv", heads))
    head_dim = int(meta[f"{arch}.embedding_length"]) // heads
    per_token = 2 * layers * kv_heads * head_dim * 2  # K and V, 2 bytes each
    mib = -(-per_token * PEER_CONTEXT // (1024 * 1024))
    return mib, min(int(meta.get(f"{arch}.context_length", PEER_CONTEXT)), PEER_CONTEXT)


def kv_match_flags(model: Path) -> list[str]:
    """Kiln's KV cache and context as llama-server's (``peer_cache``), so the RSS figures
    compare the same cache (Kiln's default is 512 MiB of float32)."""
    mib, context = peer_cache(model)
    return ["--kv-cache-dtype", "float16", "--kv-memory-mb", str(mib),
            "--max-model-len", str(context)]


@contextlib.contextmanager
def started(kind: str, pair: Pair, log_path: Path,
            threads: int) -> Iterator[tuple[ServerProcess, float]]:
    """A Kiln or llama-server process on a free 127.0.0.1 port; (server, seconds to healthy)."""
    port = free_port()
    if kind == "kiln":
        cmd = serve_command([*BENCH_FLAGS, *kv_match_flags(pair.gguf), "--model", str(pair.kiln)],
                            port=port)
    else:
        cmd = [str(LLAMA_SERVER), "-m", str(pair.gguf), "--host", "127.0.0.1", "--port", str(port),
               "-t", str(threads), "-c", str(PEER_CONTEXT), "-np", "8", "--no-webui"]
    t0 = time.perf_counter()
    server = start(cmd, url=f"http://127.0.0.1:{port}", log_path=log_path, cwd=ROOT)
    try:
        wait_started(server, STARTUP_TIMEOUT_S)
        yield server, time.perf_counter() - t0
    finally:
        stop(server)


async def one_stream(client: httpx.AsyncClient, prompt: str, tokens: int) -> float:
    """Decode tok/s of one greedy streamed chat request (content chunks' arrival times)."""
    body = {"messages": [{"role": "user", "content": prompt}], "temperature": 0,
            "max_tokens": tokens, "ignore_eos": True, "stream": True}
    arrivals: list[float] = []
    async with client.stream("POST", "/v1/chat/completions", json=body,
                             timeout=STREAM_TIMEOUT_S) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread())[:300]!r}")
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            obj = json.loads(line[6:])
            for choice in obj.get("choices") or []:
                if (choice.get("delta") or {}).get("content"):
                    arrivals.append(time.perf_counter())
    if len(arrivals) < 2:
        return 0.0
    return (len(arrivals) - 1) / (arrivals[-1] - arrivals[0])


PREFILL_WORDS = 600  # ~600-900 tokens: within one of llama-server's 1,024-token slots
_WORDS = ("river stone cloud paper window orange music table light north garden silver "
          "winter market engine letter forest bridge candle mirror").split()


async def prefill_rate(client: httpx.AsyncClient, seed: int) -> float:
    """Prompt tokens per second of a non-streamed completion of one token over a fresh prompt
    (another per call, so neither server has its prefix cached): the prefill, plus one token."""
    rng = random.Random(seed)
    prompt = " ".join(rng.choice(_WORDS) for _ in range(PREFILL_WORDS))
    t0 = time.perf_counter()
    r = await client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 1,
                                                   "temperature": 0}, timeout=STREAM_TIMEOUT_S)
    elapsed = time.perf_counter() - t0
    if r.status_code != 200:
        raise RuntimeError(f"HTTP {r.status_code}: {r.text[:300]!r}")
    return int(r.json()["usage"]["prompt_tokens"]) / elapsed


async def measure(url: str, tokens: int, repeats: int, streams: int) -> dict[str, Any]:
    # a new connection per request, for both servers: llama-server closes a connection after a
    # streamed response, and a pooled client's next request on it failed ("Server disconnected")
    limits = httpx.Limits(max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=url, limits=limits) as client:
        await one_stream(client, user_prompt(0), 16)  # warm-up
        single = [await one_stream(client, user_prompt(100 + r), tokens) for r in range(repeats)]
        multi = []
        for r in range(repeats):
            rates = await asyncio.gather(*(one_stream(client, user_prompt(200 + 10 * r + i),
                                                      tokens) for i in range(streams)))
            multi.append(sum(rates))
        prefill = [await prefill_rate(client, 300 + r) for r in range(repeats)]
    return {"single_tok_s": max(single), "single_all": single,
            f"streams{streams}_tok_s": max(multi), f"streams{streams}_all": multi,
            "prefill_tok_s": max(prefill), "prefill_all": prefill}


def rss_mib(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    m = re.search(r"VmRSS:\s+(\d+)", status)
    return int(m[1]) / 1024 if m else float("nan")


def kv_resident_mib(pid: int) -> float:
    """Resident MiB of Kiln's KV cache: its tensors are the process's shared anonymous maps
    ("/dev/zero (deleted)" in smaps), resident only where a block has been written."""
    total, in_kv = 0, False
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        head = line.split()
        if head and "-" in head[0] and not head[0].endswith(":"):
            in_kv = line.rstrip().endswith("/dev/zero (deleted)")
        elif in_kv and head and head[0] == "Rss:":
            total += int(head[1])
    return total / 1024


def kv_cache_mib(model: Path) -> float:
    """The KV cache both servers hold (peer_cache); llama-server's is resident in full from
    the start (llama.cpp clears its KV buffer when it allocates it)."""
    return float(peer_cache(model)[0])


def tensor_bytes(path: Path) -> int:
    from kiln.model.checkpoint.gguf_index import GGUFIndex

    return sum(t.n_bytes for t in GGUFIndex(path).tensors)


_CEILING = """
import time, torch
big = torch.ones(128 * 1024 * 1024)
big.sum()
best = float("inf")
for _ in range(5):
    t = time.perf_counter()
    big.sum()
    best = min(best, time.perf_counter() - t)
print(big.numel() * 4 / best / 1e9)
"""


def read_ceiling_gb_s() -> float:
    """The streaming read rate (GB/s), measured in a child process: this one never loads torch,
    whose library pages it would then share with Kiln's server, keeping them in the server's
    RSS (the server hands back the ones it ran only at start-up, which the kernel does not
    do for a page another process maps)."""
    out = subprocess.run([sys.executable, "-c", _CEILING], capture_output=True, text=True,
                         check=True, timeout=300)
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--files", nargs="*", type=Path, default=None, help="GGUF files")
    ap.add_argument("--only", nargs="*", default=None, help="default rows holding a TEXT")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2, help="llama-server -t")
    ap.add_argument("--out", type=Path, default=None, help="default: bench/results/peer.json, "
                    "peer-avx2.json with --isa avx2")
    ap.add_argument("--isa", choices=tuple(PEER_BUILDS), default="native",
                    help="avx2: Kiln's AVX2 build (KILN_CPU_ISA) against llama.cpp's AVX2 build")
    args = ap.parse_args()
    global LLAMA_SERVER
    LLAMA_SERVER = PEER_BUILDS[args.isa]
    if args.isa != "native":
        os.environ["KILN_CPU_ISA"] = args.isa  # the Kiln servers started below inherit it
    if args.out is None:
        args.out = RESULTS if args.isa == "native" else RESULTS.with_name(f"peer-{args.isa}.json")
    pairs = [file_pair(p) for p in args.files] if args.files else default_pairs()
    if args.only:
        pairs = [p for p in pairs if any(t.lower() in p.name.lower() for t in args.only)]
    kinds = ["kiln"] + (["llama"] if LLAMA_SERVER.is_file() else [])
    if "llama" not in kinds:
        print(f"no {LLAMA_SERVER}: run bash bench/peers/build_llama_cpp.sh (Kiln only)")
    # an installed Kiln starts from compiled bytecode (pip writes it at install); an editable
    # checkout under PYTHONDONTWRITEBYTECODE=1 would compile every module at each start (~0.12 s)
    for package in ("kiln", "kiln_kernels"):
        compileall.compile_dir(ROOT / package, quiet=2)
    ceiling = read_ceiling_gb_s()
    out: dict[str, Any] = {"benchmark": "peer", "machine": platform.machine(), "isa": args.isa,
                           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                           "read_ceiling_gb_s": ceiling, "tokens": args.tokens, "files": {}}
    print(f"streaming read ceiling {ceiling:.1f} GB/s")
    for pair in pairs:
        size = tensor_bytes(pair.gguf)
        bound = ceiling * 1e9 / size
        row: dict[str, Any] = {"kiln_model": str(pair.kiln), "peer_model": str(pair.gguf),
                               "tensor_mb": size / 1e6, "bound_tok_s": bound}
        stem = pair.kiln.name.removesuffix(".gguf")
        for kind in kinds:
            log = ROOT / "bench" / "results" / f"peer-{kind}-{stem}.log"
            with started(kind, pair, log, args.threads) as (server, healthy_s):
                healthy_rss = rss_mib(server.pid)
                fig = asyncio.run(measure(server.url, args.tokens, args.repeats, args.streams))
                kv = (kv_resident_mib(server.pid) if kind == "kiln"
                      else kv_cache_mib(pair.gguf))
                fig.update(healthy_s=healthy_s, rss_mib=rss_mib(server.pid),
                           rss_healthy_mib=healthy_rss, kv_resident_mib=kv,
                           bound_fraction=fig["single_tok_s"] / bound)
            row[kind] = fig
            print(f"{pair.name} {kind}: healthy {healthy_s:.1f} s, single "
                  f"{fig['single_tok_s']:.1f} tok/s ({100 * fig['bound_fraction']:.0f}% of the "
                  f"{bound:.0f} tok/s bound), {args.streams} streams "
                  f"{fig[f'streams{args.streams}_tok_s']:.1f} tok/s, prefill "
                  f"{fig['prefill_tok_s']:.0f} tok/s, RSS {fig['rss_mib']:.0f} MiB "
                  f"(at health {healthy_rss:.0f}; KV resident {kv:.0f})",
                  flush=True)
        out["files"][pair.name] = row
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
