"""SIGTERM drains: in-flight requests finish within the deadline, new connections are refused,
and the process exits."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.tiny_models import write_tiny_llama

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_sigterm_drains_in_flight_requests(tmp_path: Path) -> None:
    folder = write_tiny_llama(tmp_path / "m", seed=3)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "kiln", "serve", "--model", str(folder), "--port", str(port),
         "--kv-memory-mb", "16", "--drain-timeout-s", "20", "--log-level", "warning"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "KILN_MAX_NUM_BATCHED_TOKENS": "64"},
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        else:
            raise AssertionError("server did not start")
        result: dict[str, object] = {}
        started = threading.Event()

        def long_stream() -> None:
            body = {"messages": [{"role": "user", "content": "hello"}], "stream": True,
                    "max_tokens": 400, "ignore_eos": True, "temperature": 0}
            lines = []
            with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=120) as r:
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        lines.append(line)
                        started.set()
            result["done"] = lines[-1] == "data: [DONE]"
            finish = [json.loads(x[6:]) for x in lines[:-1]]
            result["finish"] = [c["choices"][0].get("finish_reason") for c in finish
                                if c.get("choices")][-1]

        worker = threading.Thread(target=long_stream)
        worker.start()
        assert started.wait(timeout=120), "the stream never started"  # it is in the engine
        proc.send_signal(signal.SIGTERM)
        refused, deadline = False, time.monotonic() + 60
        while not refused and time.monotonic() < deadline:  # no new connections once draining
            try:
                httpx.get(url + "/health", timeout=2)
                time.sleep(0.05)
            except httpx.HTTPError:
                refused = True
        assert refused
        worker.join(timeout=120)
        assert result.get("done") is True and result.get("finish") == "length", result
        assert proc.wait(timeout=30) in (0, -signal.SIGTERM)  # uvicorn re-raises the signal
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
