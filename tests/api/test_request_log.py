"""The request log (--request-log): one JSON line per finished inference request (JSON or
stream, success or error), written by its own thread and all written when the app shuts down;
only the inference routes; text left out with --no-request-log-text; a new file past the size
bound. The live drain on SIGTERM: tests/e2e/test_request_log_live.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from starlette.testclient import TestClient

from kiln.api.app import build_app
from kiln.config import ServerConfig
from kiln.request_log import OMITTED, Captured, RequestLog
from tests.api.fake_backend import FakeBackend

CHAT = {"messages": [{"role": "user", "content": "secret question"}], "max_tokens": 4,
        "return_token_ids": True}


def lines(folder: Path) -> list[dict[str, Any]]:
    out = []
    for path in sorted(folder.glob("requests-*.jsonl")):
        out += [json.loads(line) for line in path.read_text().splitlines()]
    return out


def run(folder: Path, **config: Any) -> list[str]:
    app = build_app(ServerConfig(request_log=str(folder), **config), FakeBackend(reply="fine"))
    ids = []
    with TestClient(app, raise_server_exceptions=False) as c:
        r = c.post("/v1/chat/completions", json=CHAT)
        assert r.status_code == 200
        ids.append(r.headers["x-request-id"])
        r = c.post("/v1/chat/completions", json={**CHAT, "stream": True})
        assert r.status_code == 200
        ids.append(r.headers["x-request-id"])
        r = c.post("/v1/chat/completions", json={**CHAT, "temperature": -1})
        assert r.status_code == 400
        ids.append(r.headers["x-request-id"])
        assert c.get("/v1/models").status_code == 200  # not an inference route: not logged
        assert c.post("/v1/conversations", json={}).status_code == 200  # nor this
    return ids


def test_each_inference_request_is_one_line(tmp_path: Path) -> None:
    ids = run(tmp_path)
    got = lines(tmp_path)  # the shutdown wrote them all
    assert [x["request_id"] for x in got] == ids
    plain, streamed, refused = got
    assert plain["route"] == "/v1/chat/completions" and plain["status"] == 200
    assert plain["request"] == CHAT and not plain["stream"]
    assert plain["response"]["choices"][0]["message"]["content"] == "fine"
    assert plain["token_ids"] == [plain["response"]["choices"][0]["token_ids"]]
    assert plain["finish_reasons"] == [plain["response"]["choices"][0]["finish_reason"]]
    assert plain["duration_ms"] >= 0 and plain["time"] > 0 and plain["adapter"] is None
    assert streamed["stream"] and streamed["response"]["events"][-1] == "[DONE]"
    text = "".join(e["choices"][0]["delta"].get("content", "")
                   for e in streamed["response"]["events"][:-1] if e.get("choices"))
    assert text == "fine"
    assert streamed["token_ids"] == plain["token_ids"]
    assert refused["status"] == 400 and refused["response"]["error"]["param"] == "temperature"


def test_text_is_left_out_when_asked(tmp_path: Path) -> None:
    run(tmp_path, request_log_text=False)
    raw = "".join(p.read_text() for p in tmp_path.glob("*.jsonl"))
    assert "secret question" not in raw and "fine" not in raw
    plain = lines(tmp_path)[0]
    assert plain["request"]["messages"] == [{"role": "user", "content": OMITTED}]
    assert plain["token_ids"] and plain["request"]["max_tokens"] == 4  # the rest is kept


def test_a_new_file_begins_past_the_size_bound(tmp_path: Path) -> None:
    log = RequestLog(tmp_path, max_bytes=600, max_age_s=3600.0)
    body = json.dumps({"x": "y" * 200}).encode()
    for i in range(6):
        log.record(Captured(1.0, f"r{i}", "POST", "/v1/completions", 200, 1.0, body, body,
                            "application/json"))
    log.close()
    files = sorted(tmp_path.glob("requests-*.jsonl"))
    assert len(files) >= 3
    assert all(p.stat().st_size <= 600 for p in files)
    assert [x["request_id"] for x in lines(tmp_path)] == [f"r{i}" for i in range(6)]
    log.record(Captured(2.0, "later", "POST", "/v1/completions", 200, 1.0, b"", b"", ""))
    log.close()  # a record after a close opens a new file
    assert lines(tmp_path)[-1]["request_id"] == "later"
