"""A live `python -m kiln serve` subprocess for the benchmarks, soak and live fuzzing: start it
on a free 127.0.0.1 port, wait for /health, read its engine gauges and /proc figures, stop it.
Only the process started here is ever signalled."""

from __future__ import annotations

import contextlib
import json
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
PYTHON = sys.executable

# SmolLM2-135M-Instruct (config.json: hidden 576, 3 KV heads x 64 = 192, 30 layers).
SMOLLM2_LAYERS = 30
SMOLLM2_HIDDEN = 576
SMOLLM2_KV_OUT = 192


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    url: str
    log_path: Path

    @property
    def pid(self) -> int:
        return int(self.proc.pid)

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


def _wait_healthy(server: Server, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise RuntimeError(f"server exited with {server.proc.returncode}:\n{server.log_tail()}")
        try:
            if httpx.get(server.url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    raise RuntimeError(f"server not healthy after {timeout_s:.0f} s:\n{server.log_tail()}")


def stop_server(server: Server, grace_s: float = 15.0) -> int | None:
    """SIGTERM, then SIGKILL after `grace_s`; only ever the process this module started."""
    if server.proc.poll() is None:
        server.proc.send_signal(signal.SIGTERM)
        try:
            server.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            server.proc.kill()
            server.proc.wait(timeout=10)
    return server.proc.returncode


@contextlib.contextmanager
def running_server(
    args: Sequence[str] = (), *, log_path: Path, startup_timeout_s: float = 240.0
) -> Iterator[Server]:
    """`python -m kiln serve` on a free 127.0.0.1 port; stopped on exit, whatever happens."""
    port = free_port()
    cmd = [PYTHON, "-m", "kiln", "serve", "--host", "127.0.0.1", "--port", str(port),
           "--log-level", "warning", "--drain-timeout-s", "5", *args]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("wb") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    server = Server(proc, f"http://127.0.0.1:{port}", log_path)
    try:
        _wait_healthy(server, startup_timeout_s)
        yield server
    finally:
        stop_server(server)


_METRIC = re.compile(r'^(kiln_engine\{name="(\w+)"\}|vllm:num_requests_(running|waiting)\{[^}]*\})'
                     r"\s+([0-9.eE+-]+)$")


def snapshot(server: Server) -> dict[str, float]:
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


def wait_idle(server: Server, timeout_s: float = 60.0) -> dict[str, float]:
    deadline = time.monotonic() + timeout_s
    while True:
        stats = snapshot(server)
        idle = all(stats.get(k, 0) == 0 for k in ("vllm_running", "vllm_waiting", "kv_blocks_used"))
        if idle or time.monotonic() > deadline:
            return stats
        time.sleep(0.5)


