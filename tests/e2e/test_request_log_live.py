"""The request log on a live `kiln serve` (default model): streams still open when SIGTERM
arrives finish in the drain, and after the process exits every request is in the log exactly
once, with the token ids the client received; `kiln log export` turns the log into datasets that
the `datasets` library's JSON loader reads, the token ids intact."""

from __future__ import annotations

import json
import signal
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from kiln.cli import main as kiln_main
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
                "max_tokens": 24, "temperature": 0, "return_token_ids": True, "stream": True,
                "logprobs": i % 2 == 0, **({"top_logprobs": 2} if i % 2 == 0 else {})}
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
            assert line["finish_reasons"][0] in ("stop", "length")

    datasets = pytest.importorskip("datasets")  # a dev dependency (lm-eval's)
    distill, sft = tmp_path / "distill.jsonl", tmp_path / "sft.jsonl"
    assert kiln_main(["log", "export", "--request-log", str(folder), "--format", "distill",
                      "--out", str(distill)]) == 0
    assert kiln_main(["log", "export", "--request-log", str(folder), "--out", str(sft)]) == 0
    rows = datasets.load_dataset("json", data_files=str(distill), split="train")
    assert sorted(r["id"].split(":")[0] for r in rows) == sorted(results)  # chat, token ids
    for row in rows:
        assert row["completion_token_ids"] == results[row["id"].split(":")[0]]
        assert row["prompt_token_ids"] and row["prompt_messages"][0]["role"] == "user"
        if row["logprobs"] is not None:
            assert len(row["logprobs"]) == len(row["completion_token_ids"])
            assert all(len(top) == 2 for top in row["top_logprobs"])
    assert sum(r["logprobs"] is not None for r in rows) == N // 2
    chats = datasets.load_dataset("json", data_files=str(sft), split="train")
    assert len(chats) == N + 2
    assert all([m["role"] for m in r["messages"]] == ["user", "assistant"] for r in chats)
