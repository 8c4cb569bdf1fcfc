"""The request log on a live `kiln serve` (default model): streams still open when SIGTERM
arrives finish in the drain, and after the process exits every request is in the log exactly
once, with the token ids the client received."""

from __future__ import annotations

import json
import signal
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from kiln.testing import running_server
from tests import HANG_S

pytestmark = pytest.mark.slow

N = 6


def test_every_request_is_logged_once_across_a_sigterm(tmp_path: Path) -> None:
    folder = tmp_path / "log"
    args = ["--request-log", str(folder), "--drain-timeout-s", "600"]
    results: dict[str, list[int]] = {}
    started = threading.Barrier(N + 1)

    def stream(i: int, url: str) -> None:
        body = {"messages": [{"role": "user", "content": f"Count to {i + 5}."}],
                "max_tokens": 24, "temperature": 0, "return_token_ids": True, "stream": True}
        tokens: list[int] = []
        with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=HANG_S) as r:
            rid = r.headers["x-request-id"]
            started.wait(HANG_S)
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    for choice in json.loads(line[6:]).get("choices", []):
                        tokens += choice.get("token_ids") or []
        results[rid] = tokens

    with running_server(args, log_path=tmp_path / "server.log") as server:
        for i in range(2):  # finished before the signal
            body = {"messages": [{"role": "user", "content": f"Hi {i}"}], "max_tokens": 4,
                    "return_token_ids": True}
            r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=HANG_S)
            results[r.headers["x-request-id"]] = r.json()["choices"][0]["token_ids"]
        warm = httpx.post(server.url + "/v1/completions", timeout=HANG_S,
                          json={"prompt": "Hi", "max_tokens": 2}).headers["x-request-id"]
        workers = [threading.Thread(target=stream, args=(i, server.url)) for i in range(N)]
        for w in workers:
            w.start()
        started.wait(HANG_S)  # every stream is open (its headers came back)
        server.proc.send_signal(signal.SIGTERM)  # they finish in the drain
        for w in workers:
            w.join(HANG_S)
        assert server.proc.wait(HANG_S) in (0, -signal.SIGTERM)  # uvicorn re-raises it
    got: list[dict[str, Any]] = []
    for path in sorted(folder.glob("requests-*.jsonl")):
        got += [json.loads(line) for line in path.read_text().splitlines()]
    assert len(results) == N + 2
    assert sorted(x["request_id"] for x in got) == sorted([warm, *results])  # each once
    for line in got:
        if line["request_id"] in results:
            assert line["status"] == 200
            assert line["token_ids"] == [results[line["request_id"]]]
