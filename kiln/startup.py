"""Start-up checks for `kiln serve`: a configuration that cannot serve one request fails before
the server listens, as one line on stderr and exit code 2 (the CLI prints ``StartupError``).

- ``check_adapter_dir``: an ``--adapter-dir`` that is missing, not a directory or unreadable (it
  had started and then failed every adapter request).
- ``bind_listener``: the port, bound (not listening) before the model loads, so a port in use
  fails in milliseconds rather than after the load; the same socket is then handed to uvicorn,
  so nothing can take the port in between.
- ``check_kv_capacity``: the KV cache must hold one sequence of the context length
  (``max_model_len`` tokens, as vLLM requires); ``--kv-memory-mb 1`` had started and then
  answered every prompt longer than 16 tokens with an error. (With no ``--kv-memory-mb`` the
  cache is sized to hold one: ``kiln.engine.config.DEFAULT_KV_MEMORY_MB``.)
- ``check_fd_limit``: ``--max-connections`` must fit the process's open-file limit (raised to
  the hard limit when that is enough).
- ``check_kv_memory``: a KV cache whose memory becomes resident as it fills (the CPU's zero-page
  cache) must fit in the memory available once the model is loaded; otherwise the server
  would start and be killed for memory under load instead.
"""

from __future__ import annotations

import math
import os
import resource
import socket
from pathlib import Path

FD_RESERVE = 64  # files besides connections: model files, logs, the engine's pipes, adapters


class StartupError(Exception):
    """A configuration that cannot serve; the message is one line for stderr."""


def check_adapter_dir(path: str | None) -> None:
    if not path:
        return
    folder = Path(path).expanduser()
    if not folder.exists():
        raise StartupError(f"--adapter-dir {path}: no such directory")
    if not folder.is_dir():
        raise StartupError(f"--adapter-dir {path}: not a directory")
    try:
        next(iter(os.scandir(folder)), None)
    except OSError as exc:
        raise StartupError(f"--adapter-dir {path}: cannot be read ({exc.strerror or exc})") from None
    if not os.access(folder, os.R_OK | os.X_OK):
        raise StartupError(f"--adapter-dir {path}: cannot be read (permission denied)")


def bind_listener(host: str, port: int) -> socket.socket:
    """A TCP socket bound to (host, port), not yet listening (uvicorn's own socket options)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        reason = "already in use" if exc.errno == 98 else (exc.strerror or str(exc))
        raise StartupError(f"cannot bind {host}:{port}: {reason}") from None
    sock.set_inheritable(True)
    return sock


def start_listening(sock: socket.socket, host: str, port: int, backlog: int = 2048) -> None:
    """listen() now, so that a port another process took since ``bind_listener`` (possible with
    SO_REUSEADDR while neither listened) is this one line too, not uvicorn's traceback."""
    try:
        sock.listen(backlog)
    except OSError as exc:
        sock.close()
        raise StartupError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


def _kv_flag(kv_memory_mb: int | None) -> str:
    return "the default KV cache" if kv_memory_mb is None else f"--kv-memory-mb {kv_memory_mb}"


def check_kv_capacity(*, num_blocks: int, block_size: int, bytes_per_block: int,
                      max_model_len: int, kv_memory_mb: int | None) -> None:
    """The cache must hold ceil(max_model_len / block_size) blocks: one sequence of the context
    length. A smaller cache could only serve prompts the context length promises to accept."""
    needed = math.ceil(max_model_len / block_size)
    if num_blocks >= needed:
        return
    need_mb = math.ceil(needed * bytes_per_block / (1024 * 1024))
    fits = num_blocks * block_size
    raise StartupError(
        f"the KV cache cannot hold one request of the context length: "
        f"{_kv_flag(kv_memory_mb)} holds {num_blocks} block(s) of {block_size} tokens ({fits} tokens), "
        f"max_model_len {max_model_len} needs {needed} blocks; use --kv-memory-mb {need_mb} or "
        f"more, or --max-model-len {fits} or less")


def available_memory(meminfo: Path = Path("/proc/meminfo"),
                     cgroup: Path = Path("/sys/fs/cgroup")) -> int | None:
    """Bytes this process can still make resident: the kernel's MemAvailable, or less where a
    cgroup (v2) memory limit leaves less; None where neither can be read (not Linux)."""
    found: list[int] = []
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    try:
        limit = (cgroup / "memory.max").read_text().strip()
        if limit != "max":
            used = int((cgroup / "memory.current").read_text().strip())
            found.append(max(0, int(limit) - used))
    except (OSError, ValueError):
        pass
    return min(found) if found else None


def check_kv_memory(*, kv_bytes: int, available: int | None, kv_memory_mb: int | None,
                    block_size: int, bytes_per_block: int) -> None:
    """A cache resident on demand must fit in ``available`` bytes (None: not known, no check)."""
    if available is None or kv_bytes <= available:
        return
    mib = 1024 * 1024
    fix = f"use --kv-memory-mb {max(1, available // mib)} or less"
    if kv_memory_mb is None:  # the default grew to one context: a shorter context fits
        fits = max(1, available // bytes_per_block) * block_size
        fix += f" and --max-model-len {fits} or less"
    raise StartupError(
        f"the KV cache does not fit in memory: {_kv_flag(kv_memory_mb)} maps "
        f"{math.ceil(kv_bytes / mib)} MiB, and {available // mib} MiB are available with the "
        f"model loaded; {fix}")


def check_fd_limit(max_connections: int) -> None:
    """Raise the soft open-file limit towards the hard one if --max-connections needs it."""
    want = max_connections + FD_RESERVE
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= want:
        return
    if hard == resource.RLIM_INFINITY or hard >= want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        return
    raise StartupError(
        f"--max-connections {max_connections} needs {want} open files, but the limit is "
        f"{hard} (ulimit -n); lower --max-connections to {max(1, hard - FD_RESERVE)} or less")
