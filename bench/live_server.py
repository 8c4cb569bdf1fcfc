"""A live `python -m kiln serve` subprocess for the benchmarks, soak and live fuzzing, started
and stopped by kiln.testing (shared with the tests); here: the benchmarks' flags, a random
adapter for the default model, and the server's engine gauges and /proc figures."""

from __future__ import annotations

import contextlib
import json
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from kiln import testing
from kiln.testing import ServerProcess

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
PYTHON = sys.executable

# SmolLM2-135M-Instruct (config.json: hidden 576, 3 KV heads x 64 = 192, 30 layers).
SMOLLM2_LAYERS = 30
SMOLLM2_HIDDEN = 576
SMOLLM2_KV_OUT = 192


def write_random_adapter(root: Path, name: str = "style", rank: int = 4, seed: int = 0) -> Path:
    """A small random PEFT LoRA (q_proj and v_proj, every layer) for the default model."""
    import numpy as np
    from safetensors.numpy import save_file

    rng = np.random.default_rng(seed)
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, Any] = {}
    for layer in range(SMOLLM2_LAYERS):
        for module, n_out in (("q_proj", SMOLLM2_HIDDEN), ("v_proj", SMOLLM2_KV_OUT)):
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{module}"
            a = rng.standard_normal((rank, SMOLLM2_HIDDEN)).astype(np.float32) * 0.01
            b = rng.standard_normal((n_out, rank)).astype(np.float32) * 0.01
            tensors[f"{prefix}.lora_A.weight"] = a
            tensors[f"{prefix}.lora_B.weight"] = b
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    config = {"r": rank, "lora_alpha": 2 * rank, "target_modules": ["q_proj", "v_proj"],
              "peft_type": "LORA", "bias": "none"}
    (folder / "adapter_config.json").write_text(json.dumps(config))
    return folder


# Every benchmark's server logs warnings only and drains briefly when stopped.
BENCH_FLAGS = ("--log-level", "warning", "--drain-timeout-s", "5")


def running_server(
    args: Sequence[str] = (), *, log_path: Path, startup_timeout_s: float = 240.0
) -> contextlib.AbstractContextManager[ServerProcess]:
    """`python -m kiln serve` (kiln.testing) with the benchmarks' flags, then `args`."""
    return testing.running_server([*BENCH_FLAGS, *args], log_path=log_path, cwd=ROOT,
                                  startup_timeout_s=startup_timeout_s)


_METRIC = re.compile(r'^(kiln_engine\{name="(\w+)"\}|vllm:num_requests_(running|waiting)\{[^}]*\})'
                     r"\s+([0-9.eE+-]+)$")


def snapshot(server: ServerProcess) -> dict[str, float]:
    stats: dict[str, float] = {}
    text = httpx.get(server.url + "/metrics", timeout=10).text
    for line in text.splitlines():
        m = _METRIC.match(line)
        if m:
            stats[m[2] or f"vllm_{m[3]}"] = float(m[4])
    proc = Path(f"/proc/{server.pid}")
    status = (proc / "status").read_text()
    stats["rss_mib"] = int(re.search(r"VmRSS:\s+(\d+)", status)[1]) / 1024  # type: ignore[index]
    stats["threads"] = int(re.search(r"Threads:\s+(\d+)", status)[1])  # type: ignore[index]
    stats["open_fds"] = len(list((proc / "fd").iterdir()))
    return stats


def wait_idle(server: ServerProcess, timeout_s: float = 60.0) -> dict[str, float]:
    deadline = time.monotonic() + timeout_s
    while True:
        stats = snapshot(server)
        idle = all(stats.get(k, 0) == 0 for k in ("vllm_running", "vllm_waiting", "kv_blocks_used"))
        if idle or time.monotonic() > deadline:
            return stats
        time.sleep(0.5)


