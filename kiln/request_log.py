"""The request log (`--request-log DIR`, opt-in): one JSON line per finished request, in files
``requests-<UTC time>-<n>.jsonl`` under DIR, a new file once the current one passes
``--request-log-max-mb`` or ``--request-log-max-age-s``.

``RequestLog.record`` only queues what the edge captured (kiln/api/request_logging.py): the
request's and the response's bytes and the request's facts. A writer thread decodes them, builds
the line (leaving message text out with ``--no-request-log-text``), writes and flushes; so the
event loop never waits on a disk. ``close`` (the app's shutdown, after uvicorn's drain) writes
every line still queued before it returns: a SIGTERM loses none."""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import msgspec

# keys whose values are text a user or the model wrote (left out with --no-request-log-text)
TEXT_KEYS = frozenset({"content", "text", "prompt", "prompts", "input", "instructions", "system",
                       "reasoning_content", "reasoning", "arguments", "token", "bytes",
                       "output_text", "delta", "documents", "stop", "messages_text"})
OMITTED = "<omitted>"


@dataclass(frozen=True)
class Captured:
    """One finished request as the edge saw it."""

    time: float  # when it began (Unix seconds)
    request_id: str
    method: str
    route: str
    status: int
    duration_ms: float
    request_body: bytes
    response_body: bytes
    response_type: str  # the response's media type


def _json(body: bytes) -> Any:
    try:
        return msgspec.json.decode(body) if body else None
    except (msgspec.DecodeError, RecursionError):
        return {"undecodable_bytes": len(body)}


def _events(body: bytes) -> list[Any]:
    """A server-sent event stream's data, each event's JSON (or the [DONE] text)."""
    out: list[Any] = []
    for block in body.decode("utf-8", "replace").split("\n\n"):
        data = "\n".join(line[5:].lstrip() for line in block.split("\n")
                         if line.startswith("data:"))
        if data:
            out.append(data if data == "[DONE]" else _json(data.encode()))
    return out


def redact(value: Any) -> Any:
    """``value`` with every text a user or the model wrote replaced by ``OMITTED``."""
    if isinstance(value, dict):
        return {k: _omit(v) if k in TEXT_KEYS else redact(v) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v) for v in value]
    return value


def _omit(value: Any) -> Any:
    if isinstance(value, str):
        return OMITTED
    if isinstance(value, list):
        return [_omit(v) for v in value]
    if isinstance(value, dict):
        return {k: _omit(v) for k, v in value.items()}
    return value


def _facts(response: Any, events: list[Any] | None) -> dict[str, Any]:
    """What a dataset wants without reading the whole response: token ids and finish reasons per
    choice, the prompt's token ids, the weight version, the rollout provenance hashes."""
    bodies = [e for e in events if isinstance(e, dict)] if events is not None else \
        [response] if isinstance(response, dict) else []
    tokens: dict[int, list[int]] = {}
    finish: dict[int, str] = {}
    out: dict[str, Any] = {}
    for body in bodies:
        if isinstance(body.get("prompt_token_ids"), list):
            out["prompt_token_ids"] = body["prompt_token_ids"]
        if body.get("weight_version"):
            out["weight_version"] = body["weight_version"]
        for choice in body.get("choices") or []:
            if not isinstance(choice, dict):
                continue
            index = int(choice.get("index", 0))
            if isinstance(choice.get("token_ids"), list):
                tokens.setdefault(index, []).extend(choice["token_ids"])
            if choice.get("finish_reason"):
                finish[index] = choice["finish_reason"]
            rollout = choice.get("rollout_provenance")
            if isinstance(rollout, dict):
                out.setdefault("provenance", {})[index] = {
                    k: v for k, v in rollout.items() if k.endswith("sha256")}
    if tokens:
        out["token_ids"] = [tokens[i] for i in sorted(tokens)]
    if finish:
        out["finish_reasons"] = [finish[i] for i in sorted(finish)]
    return out


def line_of(c: Captured, keep_text: bool) -> dict[str, Any]:
    request = _json(c.request_body) if c.request_body else None
    streamed = c.response_type == "text/event-stream"
    events = _events(c.response_body) if streamed else None
    response = {"events": events} if streamed else _json(c.response_body)
    line: dict[str, Any] = {
        "time": c.time, "request_id": c.request_id, "method": c.method, "route": c.route,
        "status": c.status, "duration_ms": round(c.duration_ms, 3), "stream": streamed,
        "adapter": _adapter(request), **_facts(response, events),
        "request": request, "response": response,
    }
    return line if keep_text else redact(line)


def _adapter(request: Any) -> Any:
    if not isinstance(request, dict):
        return None
    return request.get("adapters") or request.get("adapter") or None


class RequestLog:
    """Lines go to ``folder``; a new file past ``max_bytes`` or ``max_age_s``."""

    def __init__(self, folder: str | Path, max_bytes: int, max_age_s: float,
                 keep_text: bool = True) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.max_bytes, self.max_age_s, self.keep_text = max_bytes, max_age_s, keep_text
        self._queue: queue.SimpleQueue[Captured | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._file: IO[bytes] | None = None
        self._opened = 0.0
        self._count = 0  # files opened by this process (their names' last part)

    def record(self, captured: Captured) -> None:
        """Queue one finished request (any thread; never waits on the disk)."""
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._write_all, name="kiln-request-log",
                                                daemon=True)
                self._thread.start()
            self._queue.put(captured)

    def close(self) -> None:
        """Write every queued line, then close the file (a later record opens a new one)."""
        with self._lock:  # held to the end: a record meanwhile waits for the next writer
            thread, self._thread = self._thread, None
            if thread is not None:
                self._queue.put(None)
                thread.join()

    def _write_all(self) -> None:
        encoder = msgspec.json.Encoder()
        while True:
            item = self._queue.get()
            while item is not None:
                self._write(encoder.encode(line_of(item, self.keep_text)) + b"\n")
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
            if self._file is not None:
                self._file.flush()
            if item is None:
                if self._file is not None:
                    self._file.close()
                    self._file = None
                return

    def _write(self, data: bytes) -> None:
        now = time.time()
        f = self._file
        if f is not None and (f.tell() + len(data) > self.max_bytes
                              or now - self._opened > self.max_age_s) and f.tell() > 0:
            f.close()
            f = None
        if f is None:
            self._count += 1
            stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
            f = (self.folder / f"requests-{stamp}-{self._count:04d}.jsonl").open("ab")
            self._file, self._opened = f, now
        f.write(data)
