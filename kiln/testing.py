"""A live `python -m kiln serve` for tests and benchmarks: start it on a free 127.0.0.1 port with
the given flags and environment, wait until /health answers, stop it (SIGTERM, then SIGKILL),
keep its output in a log file; and ``map_resident_bytes``, what of the KV cache's maps is
resident (the sleep test and bench_sleep).

Why it lives in the package: tests/ and bench/ both start servers, and neither may import the
other (a test must not depend on benchmark code, and benchmarks are not built on test code), so
the one helper sits in the package both of them exercise. It imports only the standard library
(no httpx, which is a dev-only dependency) and nothing else of kiln, and no serving module
imports it (tests/test_import_boundaries.py checks both).

Waits are hang bounds only: a server that is slow to load on a busy machine is waited for, and
no caller's verdict may depend on how long anything took. Only processes started here are ever
signalled."""

from __future__ import annotations

import contextlib
import http.client
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

HOST = "127.0.0.1"
STARTUP_TIMEOUT_S = 300.0  # loading the default model on a loaded CI machine
_POLL_S = 0.05
# /health on 127.0.0.1, never through a proxy named in the environment
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def serve_command(args: Sequence[str] = (), *, port: int) -> list[str]:
    """`python -m kiln serve` on 127.0.0.1:`port` with `args` after (a later flag wins)."""
    return [sys.executable, "-m", "kiln", "serve", "--host", HOST, "--port", str(port), *args]


@dataclass(frozen=True)
class ServerProcess:
    """A server process started by `start`, the URL it serves and the file its output goes to."""

    proc: subprocess.Popen[bytes]
    url: str
    log_path: Path

    @property
    def pid(self) -> int:
        return int(self.proc.pid)

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


def healthy(url: str) -> bool:
    """Whether GET `url`/health answers 200 now."""
    try:
        with _OPENER.open(url + "/health", timeout=2) as response:
            return int(response.status) == 200
    except (OSError, http.client.HTTPException):  # refused, reset, a 503 (HTTPError), ...
        return False


def wait_healthy(url: str, *, alive: Callable[[], bool] = lambda: True,
                 describe: Callable[[], str] = lambda: "",
                 timeout_s: float = STARTUP_TIMEOUT_S) -> None:
    """Until `url`/health answers 200. RuntimeError (with `describe()`, e.g. the log's tail) as
    soon as `alive()` is false, or after `timeout_s`, a hang bound only."""
    deadline = time.monotonic() + timeout_s
    while not healthy(url):
        if not alive():
            raise RuntimeError(f"the server at {url} stopped before it was healthy\n{describe()}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"the server at {url} not healthy after {timeout_s:.0f} s\n"
                               f"{describe()}")
        time.sleep(_POLL_S)


def start(cmd: Sequence[str], *, url: str, log_path: Path, env: Mapping[str, str] | None = None,
          cwd: Path | None = None) -> ServerProcess:
    """Start `cmd` (any server: `serve_command`, or a peer for comparison) with its stdout and
    stderr in `log_path` and `env` over this process's environment; nothing is waited for."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("wb") as log:
        proc = subprocess.Popen(list(cmd), cwd=cwd, stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, **(env or {})})
    return ServerProcess(proc, url, log_path)


def wait_started(server: ServerProcess, timeout_s: float = STARTUP_TIMEOUT_S) -> None:
    """`wait_healthy` for a started process: fails at once, with its log, if it exits."""
    wait_healthy(server.url, alive=lambda: server.proc.poll() is None,
                 describe=lambda: f"exit {server.proc.returncode}; log:\n{server.log_tail()}",
                 timeout_s=timeout_s)


def stop(server: ServerProcess, grace_s: float = 30.0) -> int | None:
    """SIGTERM, then SIGKILL if it still runs after `grace_s`; its exit code."""
    if server.proc.poll() is None:
        server.proc.send_signal(signal.SIGTERM)
        try:
            server.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            server.proc.kill()
            server.proc.wait(timeout=30)
    return server.proc.returncode


@contextlib.contextmanager
def running_server(args: Sequence[str] = (), *, log_path: Path,
                   env: Mapping[str, str] | None = None, cwd: Path | None = None,
                   startup_timeout_s: float = STARTUP_TIMEOUT_S,
                   grace_s: float = 30.0) -> Iterator[ServerProcess]:
    """`kiln serve` with `args` on a free 127.0.0.1 port, healthy when entered, stopped on exit
    whatever happens (a caller may stop or signal it first)."""
    port = free_port()
    server = start(serve_command(args, port=port), url=f"http://{HOST}:{port}",
                   log_path=log_path, env=env, cwd=cwd)
    try:
        wait_started(server, startup_timeout_s)
        yield server
    finally:
        stop(server, grace_s)


def map_resident_bytes(maps: Sequence[object]) -> int:
    """Resident bytes of these anonymous maps (the KV cache's,
    ``kiln.model.native.c_model.map_of``), read from this process's /proc/self/smaps over the
    maps' own address ranges (Linux)."""
    import ctypes

    starts = {ctypes.addressof(ctypes.c_char.from_buffer(m)) for m in maps}  # type: ignore[arg-type]
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if head and "-" in head[0] and not head[0].endswith(":"):
            lo, hi = (int(x, 16) for x in head[0].split("-"))
            inside = any(lo <= a < hi for a in starts)
        elif inside and head and head[0] == "Rss:":
            total += int(head[1]) * 1024
    return total
