"""What the request log (`--request-log`) costs per request, apart from serving: the event loop's
share (``RequestLog.record``: queue one captured request) and the writer thread's (decode the
request and the stream, build the line, write it), for a streamed chat answer of `--tokens`
tokens with logprobs, and for the same non-streamed. Writes `bench/results/request_log.json`.

    python -m bench.bench_request_log --requests 2000 --tokens 24
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.live_server import RESULTS
from kiln.request_log import Captured, RequestLog


def _chunk(i: int) -> dict[str, Any]:
    token = f" tok{i}"
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": {"content": token}, "token_ids": [100 + i],
                         "logprobs": {"content": [{"token": token, "logprob": -0.5,
                                                   "bytes": list(token.encode()),
                                                   "top_logprobs": []}]}}]}


def captured(tokens: int, stream: bool) -> Captured:
    request = {"messages": [{"role": "user", "content": "Write a short line about the sea."}],
               "max_tokens": tokens, "logprobs": True, "stream": stream,
               "return_token_ids": True}
    if stream:
        body = b"".join(b"data: " + json.dumps(_chunk(i)).encode() + b"\n\n"
                        for i in range(tokens)) + b"data: [DONE]\n\n"
        media = "text/event-stream"
    else:
        body = json.dumps({"id": "chatcmpl-1", "object": "chat.completion", "choices": [{
            "index": 0, "message": {"role": "assistant", "content": "x" * 4 * tokens},
            "finish_reason": "length", "token_ids": list(range(tokens)),
            "logprobs": {"content": [_chunk(i)["choices"][0]["logprobs"]["content"][0]
                                     for i in range(tokens)]}}]}).encode()
        media = "application/json"
    return Captured(time.time(), "rid", "POST", "/v1/chat/completions", 200, 1.0,
                    json.dumps(request).encode(), body, media)


def measure(n: int, item: Captured, folder: Path) -> dict[str, float]:
    log = RequestLog(folder, max_bytes=64 * 1024 * 1024, max_age_s=3600.0)
    started = time.perf_counter()
    for _ in range(n):
        log.record(item)
    queued = time.perf_counter() - started
    log.close()  # the writer's work, to the last line on disk
    total = time.perf_counter() - started
    return {"record_us_per_request": round(queued / n * 1e6, 2),
            "written_us_per_request": round(total / n * 1e6, 1),
            "bytes_per_line": round(sum(p.stat().st_size for p in folder.glob("*.jsonl")) / n)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_request_log", description=__doc__)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--tokens", type=int, default=24)
    parser.add_argument("--out", type=Path, default=RESULTS / "request_log.json")
    args = parser.parse_args(argv)
    out: dict[str, Any] = {"requests": args.requests, "tokens": args.tokens}
    for stream in (True, False):
        with tempfile.TemporaryDirectory(prefix="kiln-reqlog-") as tmp:
            out["stream" if stream else "json"] = measure(
                args.requests, captured(args.tokens, stream), Path(tmp))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
