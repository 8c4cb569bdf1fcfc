"""Codex CLI and Claude Code against `kiln serve`: does each complete one prompt, and what does
each send?

`python -m bench.agent_clients [--out DIR] [--npm-prefix DIR]` installs `@openai/codex` and
`@anthropic-ai/claude-code` with npm into a temporary prefix, starts `kiln serve` (the default
model) on a free port, puts a recording reverse proxy in front of it (127.0.0.1, another free
port; SSE is passed through as it arrives), and runs `codex exec` (a model provider with
`wire_api = "responses"`) and `claude -p` (ANTHROPIC_BASE_URL) with one prompt each, one after
the other. The proxy writes every request (method, path, headers less credentials, the JSON
body) and its answer (status, the body of a non-SSE answer, the event names of an SSE one) to
`proxy.jsonl`; `summary.json` holds, per client, its exit code, output tails, and the requests
it made (the body's top-level field names, tool names, `stream`, `include`, `reasoning`,
`thinking`, ...), every non-200 with Kiln's answer, and whether it completed (exit 0 and at
least one model request answered 200).

`--variants` adds a run of each client with client-side settings that avoid what Kiln refused
(RUNS); each refused request is replayed to Kiln without what the refusal named, until Kiln
answers 200, to list every refusal in it (`--no-replay` turns that off).

No verdict here depends on speed: every wait is a hang bound. Without `npm` or `node` it prints
"skipped: ..." and exits 0. See bench/agent_clients.md for a run's results."""

from __future__ import annotations

import argparse
import contextlib
import copy
import gzip
import http.server
import json
import os
import re
import shutil
import socketserver
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from bench.live_server import running_server
from kiln import testing

ROOT = Path(__file__).resolve().parent.parent
HOST = "127.0.0.1"
PROMPT = "Reply with the single word: hello"
PACKAGES = ("@openai/codex", "@anthropic-ai/claude-code")
NPM_TIMEOUT_S = 900.0
SERVER_START_TIMEOUT_S = 300.0
CLIENT_TIMEOUT_S = 300.0
TAIL_CHARS = 4000
MODEL_ROUTES = ("/v1/responses", "/v1/messages")
# Credentials: their values are never written.
SECRET_HEADERS = {"authorization", "x-api-key", "proxy-authorization", "cookie", "set-cookie",
                  "openai-api-key", "anthropic-api-key"}
# Hop-by-hop headers, not forwarded either way (RFC 9110 7.6.1), and the ones the proxy sets.
HOP_HEADERS = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te",
               "trailer", "upgrade", "host", "content-length", "accept-encoding"}
ERROR_BODY_CHARS = 16_000
SSE_KEEP_EVENTS = 4  # the first and last this many SSE events are kept, each cut to 2,000 chars


# ---------------------------------------------------------------------------------------------
# the recording reverse proxy


def _decode_request_body(raw: bytes, encoding: str) -> bytes:
    """The request body as sent before any content-encoding (gzip, deflate, zstd), for the log
    only; the raw bytes are what is forwarded."""
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return raw
    if encoding == "gzip":
        return gzip.decompress(raw)
    if encoding == "deflate":
        return zlib.decompress(raw)
    if encoding == "zstd":
        import zstandard

        return bytes(zstandard.ZstdDecompressor().decompress(raw, max_output_size=1 << 28))
    raise ValueError(f"unknown content-encoding {encoding!r}")


class _SSEReader:
    """The event names and the first and last few events of an SSE answer, as it passes."""

    def __init__(self) -> None:
        self.buffer = b""
        self.names: list[str] = []
        self.first: list[str] = []
        self.last: list[str] = []

    def feed(self, chunk: bytes) -> None:
        self.buffer += chunk.replace(b"\r\n", b"\n")
        while b"\n\n" in self.buffer:
            event, self.buffer = self.buffer.split(b"\n\n", 1)
            self._event(event.decode("utf-8", "replace"))

    def _event(self, text: str) -> None:
        if not text.strip():
            return
        name = "message"
        data_lines = []
        for line in text.split("\n"):
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                data_lines.append(line[5:].strip())
        data = "\n".join(data_lines)
        if name == "message" and not data_lines:
            return  # a comment (keep-alive)
        if name == "message" and data:  # unnamed events: name them by their JSON type
            with contextlib.suppress(ValueError, AttributeError):
                name = str(json.loads(data).get("type", "message"))
            if data == "[DONE]":
                name = "[DONE]"
        self.names.append(name)
        cut = text[:2000]
        if len(self.first) < SSE_KEEP_EVENTS:
            self.first.append(cut)
        self.last = [*self.last, cut][-SSE_KEEP_EVENTS:]

    def record(self) -> dict[str, Any]:
        counts = Counter(self.names)
        return {"sse_event_count": len(self.names), "sse_event_counts": dict(counts),
                "sse_last_event": self.names[-1] if self.names else None,
                "sse_first_events": self.first, "sse_last_events": self.last}


class RecordingProxy:
    """A threaded HTTP/1.1 reverse proxy on 127.0.0.1 to `upstream`, one JSONL line per
    exchange in `log_path`; `label` (set between clients) tags each line."""

    def __init__(self, upstream: str, log_path: Path) -> None:
        self.upstream = upstream.rstrip("/")
        self.log_path = log_path
        self.label = ""
        self._lock = threading.Lock()
        self._seq = 0
        self._client = httpx.Client(timeout=httpx.Timeout(connect=10, read=900, write=60,
                                                          pool=60),
                                    trust_env=False)
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # quiet
                pass

            def do_GET(self) -> None:
                proxy.handle(self)

            do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = do_GET

        class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
            daemon_threads = True
            allow_reuse_address = True

        self._server = Server((HOST, 0), Handler)
        self.port = int(self._server.server_address[1])
        self.url = f"http://{HOST}:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> RecordingProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._client.close()

    def _write(self, record: dict[str, Any]) -> None:
        with self._lock, self.log_path.open("a") as f:
            f.write(json.dumps(record) + "\n")

    @staticmethod
    def _read_body(h: http.server.BaseHTTPRequestHandler) -> bytes:
        if "chunked" in h.headers.get("Transfer-Encoding", "").lower():
            parts = []
            while True:
                size = int(h.rfile.readline().split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    while h.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    break
                parts.append(h.rfile.read(size))
                h.rfile.readline()
            return b"".join(parts)
        length = int(h.headers.get("Content-Length") or 0)
        return h.rfile.read(length) if length else b""

    def handle(self, h: http.server.BaseHTTPRequestHandler) -> None:
        """Two lines per exchange: the request as it arrives (phase "request"), then the answer
        (phase "response", same seq) when it ends, so a request still running when its client
        is stopped is on record."""
        with self._lock:
            self._seq += 1
            seq = self._seq
        started = time.monotonic()
        raw = self._read_body(h)
        headers = {k.lower(): v for k, v in h.headers.items()}
        request: dict[str, Any] = {
            "phase": "request", "seq": seq, "client": self.label,
            "time": datetime.now(UTC).isoformat(), "method": h.command, "path": h.path,
            "headers": {k: ("<redacted>" if k in SECRET_HEADERS else v)
                        for k, v in headers.items()},
            "body_bytes": len(raw),
        }
        if raw:
            try:
                plain = _decode_request_body(raw, headers.get("content-encoding", ""))
                request["body"] = json.loads(plain)
            except (ValueError, OSError, ImportError) as e:
                request["body_unparsed"] = raw[:4000].decode("utf-8", "replace")
                request["body_parse_error"] = str(e)
        self._write(request)
        record: dict[str, Any] = {"phase": "response", "seq": seq, "client": self.label}
        forward = {k: v for k, v in headers.items() if k not in HOP_HEADERS}
        forward["accept-encoding"] = "identity"  # bodies pass unchanged and are readable here
        reader: _SSEReader | None = None
        try:
            with self._client.stream(h.command, self.upstream + h.path, headers=forward,
                                     content=raw) as response:
                record["status"] = response.status_code
                record["first_byte_s"] = round(time.monotonic() - started, 3)
                record["response_headers"] = dict(response.headers)
                sse = response.headers.get("content-type", "").startswith("text/event-stream")
                no_body = h.command == "HEAD" or response.status_code in (204, 304)
                reader = _SSEReader() if sse else None
                kept = bytearray()
                try:
                    h.send_response(response.status_code)
                    for k, v in response.headers.multi_items():
                        if k.lower() not in HOP_HEADERS:
                            h.send_header(k, v)
                    if not no_body:
                        h.send_header("Transfer-Encoding", "chunked")
                    h.end_headers()
                    for chunk in response.iter_raw():
                        if not chunk:
                            continue
                        if reader is not None:
                            reader.feed(chunk)
                        elif len(kept) < ERROR_BODY_CHARS:
                            kept += chunk
                        if not no_body:
                            h.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                            h.wfile.flush()
                    if not no_body:
                        h.wfile.write(b"0\r\n\r\n")
                        h.wfile.flush()
                except OSError as e:  # the client went away: the upstream stream is closed
                    record["client_disconnected"] = f"{type(e).__name__}: {e}"
                    h.close_connection = True
                if reader is None:
                    text = bytes(kept[:ERROR_BODY_CHARS]).decode("utf-8", "replace")
                    try:
                        record["response_body"] = json.loads(text)
                    except ValueError:
                        record["response_body"] = text
        except (httpx.HTTPError, OSError) as e:
            record["proxy_error"] = f"{type(e).__name__}: {e}"
            if "status" not in record:
                with contextlib.suppress(OSError):
                    h.send_error(502, "upstream failed")
            h.close_connection = True
        finally:
            if reader is not None:
                record.update(reader.record())
            record["seconds"] = round(time.monotonic() - started, 3)
            self._write(record)


def load_exchanges(path: Path) -> list[dict[str, Any]]:
    """proxy.jsonl's request and response lines joined by seq; a request with no response line
    (its client stopped while it ran) has "unfinished": true."""
    by_seq: dict[int, dict[str, Any]] = {}
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        entry = json.loads(line)
        phase = entry.pop("phase", None)
        merged = by_seq.setdefault(entry["seq"], {})
        if phase == "response":
            merged.update({k: v for k, v in entry.items() if k != "client"})
        else:
            merged.update(entry)
    for entry in by_seq.values():
        entry.setdefault("unfinished", "status" not in entry and "proxy_error" not in entry)
    return [by_seq[k] for k in sorted(by_seq) if "method" in by_seq[k]]


# ---------------------------------------------------------------------------------------------
# what each request carried


def _tool_names(tools: Any) -> list[str]:
    """A function tool by its name; any other kind as `name<type>`."""
    names = []
    for tool in tools if isinstance(tools, list) else []:
        if not isinstance(tool, dict):
            continue
        name = tool.get("name") or (tool.get("function") or {}).get("name") or ""
        kind = tool.get("type")
        names.append(name if kind in (None, "function") and name else f"{name}<{kind}>")
    return names


def _item_kinds(items: Any) -> list[str]:
    """Responses `input` / Messages `messages`: role or type of each item, and its block types."""
    if isinstance(items, str):
        return ["<string>"]
    kinds = []
    for item in items if isinstance(items, list) else []:
        if not isinstance(item, dict):
            kinds.append(type(item).__name__)
            continue
        head = item.get("role") or item.get("type") or "?"
        content = item.get("content")
        if isinstance(content, list):
            blocks = ",".join(str(b.get("type")) for b in content if isinstance(b, dict))
            head += f"[{blocks}]"
        elif isinstance(content, str):
            head += "[str]"
        kinds.append(head)
    return kinds


def summarize_request(record: dict[str, Any]) -> dict[str, Any]:
    body = record.get("body") if isinstance(record.get("body"), dict) else None
    out: dict[str, Any] = {"seq": record["seq"], "method": record["method"],
                           "path": record["path"], "status": record.get("status")}
    headers = record.get("headers", {})
    for h in ("anthropic-beta", "anthropic-version", "user-agent", "originator",
              "content-encoding", "openai-beta", "session_id", "x-app"):
        if h in headers:
            out[f"header {h}"] = headers[h]
    if body is not None:
        out["fields"] = sorted(body)
        for key in ("model", "stream", "store", "include", "reasoning", "thinking", "text",
                    "tool_choice", "parallel_tool_calls", "max_output_tokens", "max_tokens",
                    "temperature", "top_p", "top_k", "service_tier", "truncation",
                    "prompt_cache_key", "metadata", "output_config", "context_management",
                    "stop_sequences", "client_metadata", "previous_response_id", "background",
                    "speed", "inference_geo", "betas", "container", "mcp_servers"):
            if key in body:
                out[key] = body[key]
        if "tools" in body:
            out["tools"] = _tool_names(body["tools"])
        if "input" in body:
            out["input_items"] = _item_kinds(body["input"])
        if "messages" in body:
            out["message_items"] = _item_kinds(body["messages"])
        if "instructions" in body:
            out["instructions_chars"] = len(str(body["instructions"]))
        if "system" in body:
            system = body["system"]
            out["system_chars"] = len(json.dumps(system))
            if isinstance(system, list):
                out["system_blocks"] = [sorted(b) for b in system if isinstance(b, dict)]
    elif "body_unparsed" in record:
        out["body_unparsed"] = record["body_unparsed"][:500]
    if record.get("status") != 200:
        out["response_body"] = record.get("response_body")
    if "sse_event_counts" in record:
        out["sse_event_counts"] = record["sse_event_counts"]
        out["sse_last_event"] = record["sse_last_event"]
        if record["sse_last_event"] in ("error", "response.failed", "response.incomplete"):
            out["sse_last_events"] = record["sse_last_events"]
    for key in ("proxy_error", "body_parse_error", "client_disconnected", "first_byte_s"):
        if key in record:
            out[key] = record[key]
    if record.get("unfinished"):
        out["unfinished"] = True
    if record.get("client_disconnected") and "sse_last_events" in record:
        out["sse_last_events"] = record["sse_last_events"]
    out["seconds"] = record.get("seconds")
    return out


# ---------------------------------------------------------------------------------------------
# replaying a refused request: every field Kiln refuses in it, not only the first


_PATH_TOKEN = re.compile(r"([A-Za-z_][\w-]*)|\[(\d+)\]")
_LEADING_PATH = re.compile(r"^([A-Za-z_][\w\-]*(?:\[\d+\]|\.[A-Za-z_][\w\-]*)*)[:\s]")
_UNEXPECTED = re.compile(r"Additional properties are not allowed \((.+?) (?:was|were) unexpected\)")


def _parse_path(text: str) -> list[str | int]:
    return [m[1] if m[1] else int(m[2]) for m in _PATH_TOKEN.finditer(text)]


def _error_of(text: str) -> tuple[str, str | None]:
    try:
        doc = json.loads(text)
    except ValueError:
        return text[:2000], None
    err = doc.get("error", doc) if isinstance(doc, dict) else {}
    if not isinstance(err, dict):
        return str(err)[:2000], None
    return str(err.get("message", text))[:2000], err.get("param")


def _remove(body: dict[str, Any], message: str, param: str | None) -> str | None:
    """Take out of `body` what the refusal names; a description of what went, else None."""
    unexpected = _UNEXPECTED.search(message)
    if unexpected:
        where = param or (message.split(": ", 1)[0] if not message.startswith("Additional")
                          else "")
        node: Any = body
        for step in _parse_path(where):
            node = node[step]
        keys = re.findall(r"'([^']+)'", unexpected[1])
        for key in keys:
            node.pop(key, None)
        return ", ".join(f"{where + '.' if where else ''}{k}" for k in keys)
    lead = param or (m[1] if (m := _LEADING_PATH.match(message)) else None)
    if not lead:
        return None
    path = _parse_path(lead)
    last_index = max((i for i, p in enumerate(path) if isinstance(p, int)), default=None)
    target = path[:last_index + 1] if last_index is not None else path[:1]
    node = body
    try:
        for step in target[:-1]:
            node = node[step]
        del node[target[-1]]
    except (KeyError, IndexError, TypeError):
        return None
    return "".join(f"[{p}]" if isinstance(p, int) else (f".{p}" if i else p)
                   for i, p in enumerate(target))


def replay_refused(upstream: str, record: dict[str, Any], *, max_steps: int = 12,
                   timeout_s: float = CLIENT_TIMEOUT_S) -> list[dict[str, Any]]:
    """POST a refused request's body to Kiln again (its route, headers, `stream` as sent),
    each time without what the last refusal named, until Kiln answers 200 or names nothing
    that can be taken out. The refusals in order: every field of this body Kiln refuses."""
    body = copy.deepcopy(record["body"])
    headers = {k: v for k, v in record.get("headers", {}).items()
               if k in ("content-type", "anthropic-version", "anthropic-beta")}
    steps: list[dict[str, Any]] = []
    with httpx.Client(timeout=httpx.Timeout(timeout_s, connect=10), trust_env=False) as client:
        for _ in range(max_steps):
            step: dict[str, Any] = {}
            started = time.monotonic()
            try:
                with client.stream("POST", upstream + record["path"], json=body,
                                   headers=headers) as response:
                    step["status"] = response.status_code
                    reader = _SSEReader()
                    kept = bytearray()
                    sse = response.headers.get("content-type", "").startswith(
                        "text/event-stream")
                    for chunk in response.iter_raw():
                        if sse:
                            reader.feed(chunk)
                            if any(n.endswith(("delta", "completed", "failed", "error",
                                               "message_stop"))
                                   for n in reader.names):
                                step["note"] = ("accepted; the replay stopped reading at the "
                                                "first content delta or end event")
                                break  # accepted: generation began (or ended), enough here
                        elif len(kept) < ERROR_BODY_CHARS:
                            kept += chunk
            except httpx.HTTPError as e:
                step["error"] = f"{type(e).__name__}: {e}"
                steps.append(step)
                break
            step["seconds"] = round(time.monotonic() - started, 3)
            if step["status"] == 200:
                sse_seen = reader.record()
                step.update({"sse_event_counts": sse_seen["sse_event_counts"],
                             "sse_last_events": sse_seen["sse_last_events"][-2:]}
                            if sse_seen["sse_event_count"]
                            else {"response_body": bytes(kept).decode("utf-8", "replace")[-2000:]})
                steps.append(step)
                break
            message, param = _error_of(bytes(kept).decode("utf-8", "replace"))
            step.update(message=message, param=param)
            removed = _remove(body, message, param)
            step["removed_for_next_try"] = removed
            steps.append(step)
            if removed is None:
                break
    return steps


# ---------------------------------------------------------------------------------------------
# the clients


def _tail(text: str) -> str:
    return text[-TAIL_CHARS:]


def run_client(name: str, cmd: list[str], *, env: dict[str, str], cwd: Path,
               timeout_s: float) -> dict[str, Any]:
    started = time.monotonic()
    timed_out = False
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=err, start_new_session=True)
        try:
            rc: int | None = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 15)  # its own process group: the client and its children
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, 9)
                proc.wait(timeout=10)
            rc = proc.returncode
        out.seek(0)
        err.seek(0)
        stdout = out.read().decode("utf-8", "replace")
        stderr = err.read().decode("utf-8", "replace")
    return {"client": name, "command": cmd, "exit_code": rc, "timed_out": timed_out,
            "seconds": round(time.monotonic() - started, 1),
            "stdout_tail": _tail(stdout), "stderr_tail": _tail(stderr)}


def client_env(home: Path, extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OPENAI_", "ANTHROPIC_", "CODEX_", "CLAUDE_"))}
    env.update({"HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config"),
                "XDG_CACHE_HOME": str(home / ".cache"), "XDG_DATA_HOME": str(home / ".local"),
                "NO_COLOR": "1", "TERM": "dumb", "NO_PROXY": "127.0.0.1,localhost",
                "no_proxy": "127.0.0.1,localhost", **extra})
    return env


# The clients as installed, then each with the client-side settings that take out what Kiln
# refused in the first run (docs: bench/agent_clients.md). Kiln is served with
# --model-alias CLAUDE_ALIAS so Claude Code can name a model it knows the capabilities of.
CLAUDE_ALIAS = "claude-sonnet-4-6"
RUNS: dict[str, dict[str, Any]] = {
    "codex": {"client": "codex", "timeout_scale": 1.0},
    "claude": {"client": "claude", "timeout_scale": 1.0},
    # the hosted web_search tool and the multi_agent_v1 namespace tool off (client settings)
    "codex-trimmed": {"client": "codex", "timeout_scale": 1.0,
                      "config": 'web_search = "disabled"\n', "flags": ["--disable", "multi_agent"]},
    # a model name Claude Code knows (no mid-conversation system message), thinking off (no
    # `thinking: adaptive`, no `context_management`), 256 output tokens (a 135M model rarely
    # stops by itself; the context window is 8,192 tokens)
    "claude-as-sonnet": {"client": "claude", "timeout_scale": 2.0, "model": CLAUDE_ALIAS,
                         "env": {"MAX_THINKING_TOKENS": "0",
                                 "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "256"}},
}
DEFAULT_RUNS = ("codex", "claude")


def codex_config(model: str, proxy_url: str, extra: str = "") -> str:
    return (f'model = {json.dumps(model)}\n'
            'model_provider = "kiln"\n'
            'approval_policy = "never"\n'
            'sandbox_mode = "read-only"\n'
            f'{extra}'
            '\n'
            '[model_providers.kiln]\n'
            'name = "kiln"\n'
            f'base_url = "{proxy_url}/v1"\n'
            'wire_api = "responses"\n'
            'env_key = "KILN_API_KEY"\n')


def run_codex(name: str, spec: dict[str, Any], bin_dir: Path, work: Path, model: str,
              proxy_url: str, timeout_s: float) -> dict[str, Any]:
    home = work / f"{name}-home"
    codex_home = home / ".codex"
    codex_home.mkdir(parents=True)
    config = codex_config(model, proxy_url, spec.get("config", ""))
    (codex_home / "config.toml").write_text(config)
    cwd = work / f"{name}-cwd"
    cwd.mkdir()
    last = work / f"{name}-last-message.txt"
    env = client_env(home, {"CODEX_HOME": str(codex_home), "KILN_API_KEY": "unused"})
    cmd = [str(bin_dir / "codex"), "exec", "--skip-git-repo-check", "--ephemeral",
           "--sandbox", "read-only", "--color", "never", "--json", *spec.get("flags", []),
           "-C", str(cwd), "-o", str(last), PROMPT]
    result = run_client(name, cmd, env=env, cwd=cwd, timeout_s=timeout_s)
    result["config_toml"] = config
    result["last_message"] = last.read_text(errors="replace")[-TAIL_CHARS:] if last.exists() \
        else None
    return result


def run_claude(name: str, spec: dict[str, Any], bin_dir: Path, work: Path, model: str,
               proxy_url: str, timeout_s: float) -> dict[str, Any]:
    home = work / f"{name}-home"
    home.mkdir()
    cwd = work / f"{name}-cwd"
    cwd.mkdir()
    model = spec.get("model", model)
    extra = {"ANTHROPIC_BASE_URL": proxy_url, "ANTHROPIC_API_KEY": "unused",
             "ANTHROPIC_MODEL": model, "ANTHROPIC_SMALL_FAST_MODEL": model,
             "ANTHROPIC_DEFAULT_HAIKU_MODEL": model, "DISABLE_TELEMETRY": "1",
             "DISABLE_AUTOUPDATER": "1", "DISABLE_ERROR_REPORTING": "1",
             "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
             "CLAUDE_CONFIG_DIR": str(home / ".claude"), **spec.get("env", {})}
    env = client_env(home, extra)
    cmd = [str(bin_dir / "claude"), "-p", PROMPT, "--output-format", "json"]
    result = run_client(name, cmd, env=env, cwd=cwd, timeout_s=timeout_s)
    result["env"] = {k: v for k, v in extra.items() if k != "ANTHROPIC_API_KEY"}
    return result


def version(binary: Path, env: dict[str, str]) -> str:
    try:
        done = subprocess.run([str(binary), "--version"], capture_output=True, text=True,
                              timeout=60, env=env, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unknown ({e})"
    return (done.stdout.strip() or done.stderr.strip())


def npm_install(prefix: Path, timeout_s: float) -> Path:
    bin_dir = prefix / "node_modules" / ".bin"
    if all((bin_dir / b).exists() for b in ("codex", "claude")):
        print(f"reusing the install in {prefix}", flush=True)
        return bin_dir
    prefix.mkdir(parents=True, exist_ok=True)
    print(f"npm install --prefix {prefix} {' '.join(PACKAGES)}", flush=True)
    done = subprocess.run(["npm", "install", "--prefix", str(prefix), "--no-audit", "--no-fund",
                           *PACKAGES], capture_output=True, text=True, timeout=timeout_s,
                          stdin=subprocess.DEVNULL)
    if done.returncode != 0 or not all((bin_dir / b).exists() for b in ("codex", "claude")):
        raise RuntimeError(f"npm install failed (exit {done.returncode}):\n"
                           f"{_tail(done.stdout)}\n{_tail(done.stderr)}")
    return bin_dir


def client_report(result: dict[str, Any], records: list[dict[str, Any]]) -> dict[str, Any]:
    requests = [summarize_request(r) for r in records]
    model_requests = [r for r in records
                      if r["method"] == "POST" and r["path"].split("?")[0] in MODEL_ROUTES]
    ok = [r for r in model_requests if r.get("status") == 200]
    non_200 = [{"seq": r["seq"], "method": r["method"], "path": r["path"],
                "status": r.get("status"), "response_body": r.get("response_body"),
                "proxy_error": r.get("proxy_error"), "unfinished": r.get("unfinished")}
               for r in records if r.get("status") != 200]
    stream_errors = [{"seq": r["seq"], "path": r["path"], "last_events": r["sse_last_events"]}
                     for r in records
                     if r.get("sse_last_event") in ("error", "response.failed")]
    return {**result, "completed": result["exit_code"] == 0 and bool(ok),
            "model_requests": len(model_requests), "model_requests_200": len(ok),
            "routes": dict(Counter(f"{r['method']} {r['path']} -> {r.get('status')}"
                                   for r in records)),
            "non_200": non_200, "stream_errors": stream_errors, "requests": requests}


# ---------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _work_dir(keep: Path | None) -> Iterator[Path]:
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        yield keep
        return
    with tempfile.TemporaryDirectory(prefix="kiln-agent-clients-") as d:
        yield Path(d)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.agent_clients", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=None,
                        help="where summary.json, proxy.jsonl and kiln.log go "
                             "(default: a new temporary directory, kept)")
    parser.add_argument("--npm-prefix", type=Path, default=None,
                        help="npm prefix to install into, or reuse when both binaries are "
                             "there (default: a temporary one, removed)")
    parser.add_argument("--client-timeout-s", type=float, default=CLIENT_TIMEOUT_S)
    parser.add_argument("--run", choices=sorted(RUNS), action="append", default=None,
                        help="a run to make (repeatable; default: codex and claude as "
                             "installed, then, with --variants, codex-trimmed and "
                             "claude-as-sonnet)")
    parser.add_argument("--variants", action="store_true",
                        help="also run each client with the client-side settings that avoid "
                             "the refusals of the first runs")
    parser.add_argument("--no-replay", action="store_true",
                        help="do not replay refused requests to Kiln to list every refusal")
    parser.add_argument("--kiln-arg", action="append", default=[],
                        help="an extra argument for `kiln serve` (repeatable)")
    args = parser.parse_args(argv)

    missing = [b for b in ("npm", "node") if shutil.which(b) is None]
    if missing:
        print(f"skipped: {' and '.join(missing)} not found on PATH")
        return 0
    out = args.out or Path(tempfile.mkdtemp(prefix="kiln-agent-clients-out-"))
    out.mkdir(parents=True, exist_ok=True)
    proxy_log = out / "proxy.jsonl"
    proxy_log.write_text("")
    runs = args.run or [*DEFAULT_RUNS, *(n for n in RUNS if n not in DEFAULT_RUNS and args.variants)]
    summary: dict[str, Any] = {"date": datetime.now(UTC).isoformat(timespec="seconds"),
                               "prompt": PROMPT, "out": str(out),
                               "node": subprocess.run(["node", "--version"], capture_output=True,
                                                      text=True).stdout.strip(),
                               "clients": {}}

    with _work_dir(args.npm_prefix) as prefix, \
            tempfile.TemporaryDirectory(prefix="kiln-agent-work-") as work_s:
        work = Path(work_s)
        bin_dir = npm_install(prefix, NPM_TIMEOUT_S)
        env0 = client_env(work, {})
        summary["versions"] = {"codex": version(bin_dir / "codex", env0),
                               "claude": version(bin_dir / "claude", env0)}
        print(f"versions: {summary['versions']}", flush=True)
        kiln_args = [*args.kiln_arg]
        if any("model" in RUNS[n] for n in runs):
            kiln_args += ["--model-alias", CLAUDE_ALIAS]
        print("starting kiln serve (the default model)", flush=True)
        with running_server(kiln_args, log_path=out / "kiln.log",
                            startup_timeout_s=SERVER_START_TIMEOUT_S) as server:
            models = httpx.get(server.url + "/v1/models", timeout=30, trust_env=False).json()
            model = str(models["data"][0]["id"])
            summary["kiln"] = {"url": server.url, "model": model,
                               "command": testing.serve_command(
                                   ["--log-level", "warning", "--drain-timeout-s", "5",
                                    *kiln_args], port=server.port)}
            print(f"kiln serve at {server.url}, model {model!r}", flush=True)
            with RecordingProxy(server.url, proxy_log) as proxy:
                print(f"recording proxy at {proxy.url} -> {proxy_log}", flush=True)
                summary["proxy"] = proxy.url
                runners = {"codex": run_codex, "claude": run_claude}
                for name in runs:
                    spec = RUNS[name]
                    timeout_s = args.client_timeout_s * spec["timeout_scale"]
                    proxy.label = name
                    print(f"running {name} (bound {timeout_s:.0f} s)", flush=True)
                    result = runners[spec["client"]](name, spec, bin_dir, work, model,
                                                     proxy.url, timeout_s)
                    time.sleep(1.0)  # a request still being logged by the proxy's thread
                    mine = [r for r in load_exchanges(proxy_log) if r.get("client") == name]
                    report = client_report(result, mine)
                    if not args.no_replay:
                        for entry in report["non_200"]:
                            record = next(r for r in mine if r["seq"] == entry["seq"])
                            if (isinstance(record.get("body"), dict)
                                    and entry["path"].split("?")[0] in MODEL_ROUTES
                                    and entry["status"] == 400):
                                print(f"  replaying refused request {entry['seq']}", flush=True)
                                entry["replay"] = replay_refused(server.url, record)
                    summary["clients"][name] = report
                    print(f"{name}: exit {report['exit_code']}, completed "
                          f"{report['completed']}, routes {report['routes']}", flush=True)
                proxy.label = "after"
            summary["kiln_log_tail"] = server.log_tail()
    summary["verdict"] = {
        name: {"completed": c["completed"], "exit_code": c["exit_code"],
               "non_200": [f"{e['status']} {e['method']} {e['path']}: "
                           f"{_error_of(json.dumps(e['response_body']))[0]}"
                           for e in c["non_200"]],
               "replayed_refusals": [f"{st['status']} {st.get('message', '')}"
                                     for e in c["non_200"] for st in e.get("replay", [])
                                     if st.get("status") != 200]}
        for name, c in summary["clients"].items()}

    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))
    print(json.dumps(summary["verdict"], indent=2))
    print(f"\nwritten: {out / 'summary.json'}, {proxy_log}, {out / 'kiln.log'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
