"""Start-up checks: a configuration that cannot serve one request is one line on stderr and exit
code 2, before the server listens (`python -m kiln serve` as a subprocess, or the check itself
where that tests the same thing)."""

from __future__ import annotations

import os
import resource
import socket
import subprocess
from pathlib import Path

import pytest

from kiln import startup
from kiln.startup import StartupError
from kiln.testing import free_port, serve_command


def serve(*args: str, port: int | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        serve_command(args, port=port or free_port()),
        capture_output=True, text=True, timeout=180,
    )


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, (result.returncode, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("kiln: ") and "Traceback" not in result.stderr
    assert "serving" not in result.stdout  # it never got as far as listening
    return lines[0]


def test_a_kv_cache_too_small_for_one_request_fails_at_start() -> None:
    line = one_line(serve("--kv-memory-mb", "1"))  # the default model: 8,192-token context
    assert "KV cache cannot hold one request of the context length" in line
    assert "max_model_len 8192 needs 512 blocks" in line
    assert "--kv-memory-mb 360 or more" in line and "--max-model-len 16 or less" in line


@pytest.mark.parametrize("make", [
    lambda tmp: tmp / "missing",
    lambda tmp: (tmp / "file").write_text("x") and tmp / "file",
], ids=["missing", "a-file"])
def test_a_bad_adapter_dir_fails_before_the_model_loads(tmp_path: Path, make) -> None:
    path = make(tmp_path)
    line = one_line(serve("--adapter-dir", str(path), "--model", str(tmp_path / "no-model")))
    # the adapter dir is named, not the (also missing) model: it was checked first
    assert line.startswith(f"kiln: --adapter-dir {path}: ")


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any directory")
def test_an_unreadable_adapter_dir_fails(tmp_path: Path) -> None:
    folder = tmp_path / "locked"
    folder.mkdir()
    folder.chmod(0)
    try:
        with pytest.raises(StartupError, match="cannot be read"):
            startup.check_adapter_dir(str(folder))
    finally:
        folder.chmod(0o755)


def test_a_readable_adapter_dir_and_none_pass(tmp_path: Path) -> None:
    startup.check_adapter_dir(str(tmp_path))
    startup.check_adapter_dir(None)


def test_a_port_in_use_fails_before_the_model_loads(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        line = one_line(serve("--model", str(tmp_path / "no-model"), port=port))
    assert line == f"kiln: cannot bind 127.0.0.1:{port}: already in use"


@pytest.mark.parametrize("name,content,why", [
    ("notes.txt", b"hello\n", "is neither a model folder"),
    ("model.gguf", b"not a gguf file at all", "not a GGUF file (no GGUF magic)"),
    ("empty-folder", None, "config.json"),
], ids=["text-file", "fake-gguf", "empty-folder"])
def test_a_file_that_is_not_a_model_fails(tmp_path: Path, name: str, content: bytes | None,
                                          why: str) -> None:
    path = tmp_path / name
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)
    line = one_line(serve("--model", str(path)))
    assert line.startswith(f"kiln: cannot load model {path}: ") and why in line


def test_kv_capacity_boundary() -> None:
    startup.check_kv_capacity(num_blocks=4, block_size=16, bytes_per_block=1024 * 1024,
                              max_model_len=64, kv_memory_mb=4)
    with pytest.raises(StartupError) as err:
        startup.check_kv_capacity(num_blocks=4, block_size=16, bytes_per_block=1024 * 1024,
                                  max_model_len=65, kv_memory_mb=4)
    assert "needs 5 blocks" in str(err.value)
    assert "--kv-memory-mb 5 or more" in str(err.value)
    assert "--max-model-len 64 or less" in str(err.value)


def test_max_connections_past_the_open_file_limit_fails() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        pytest.skip("no hard open-file limit here")
    with pytest.raises(StartupError, match="--max-connections"):
        startup.check_fd_limit(hard)  # plus the reserve: more than the hard limit
    startup.check_fd_limit(max(1, hard - startup.FD_RESERVE))  # fits: raised as needed, no error


def test_available_memory_is_the_smaller_of_meminfo_and_the_cgroup(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       2048000 kB\nMemAvailable:   1024000 kB\n")
    cg = tmp_path / "cg"
    cg.mkdir()
    assert startup.available_memory(meminfo, cg) == 1024000 * 1024  # no cgroup files
    (cg / "memory.max").write_text("max\n")
    (cg / "memory.current").write_text("5\n")
    assert startup.available_memory(meminfo, cg) == 1024000 * 1024  # no limit
    (cg / "memory.max").write_text(f"{600 << 20}\n")
    (cg / "memory.current").write_text(f"{100 << 20}\n")
    assert startup.available_memory(meminfo, cg) == 500 << 20  # the limit leaves less
    assert startup.available_memory(tmp_path / "none", tmp_path / "none") is None


def test_kv_memory_boundary() -> None:
    geometry = {"block_size": 16, "bytes_per_block": 1 << 20}
    startup.check_kv_memory(kv_bytes=100 << 20, available=100 << 20, kv_memory_mb=100,
                            **geometry)
    startup.check_kv_memory(kv_bytes=100 << 20, available=None, kv_memory_mb=100,  # unknown
                            **geometry)
    with pytest.raises(StartupError) as exc:
        startup.check_kv_memory(kv_bytes=(100 << 20) + 1, available=100 << 20, kv_memory_mb=101,
                                **geometry)
    assert str(exc.value) == (
        "the KV cache does not fit in memory: --kv-memory-mb 101 maps 101 MiB, and 100 MiB are "
        "available with the model loaded; use --kv-memory-mb 100 or less")


def test_a_default_kv_cache_beyond_the_memory_names_a_context_that_fits() -> None:
    """The default cache grows to one context; where that does not fit, the message names a
    context length whose cache does (100 blocks of 16 tokens in 100 MiB of 1 MiB blocks)."""
    with pytest.raises(StartupError) as exc:
        startup.check_kv_memory(kv_bytes=768 << 20, available=100 << 20, kv_memory_mb=None,
                                block_size=16, bytes_per_block=1 << 20)
    assert str(exc.value) == (
        "the KV cache does not fit in memory: the default KV cache maps 768 MiB, and 100 MiB are "
        "available with the model loaded; use --kv-memory-mb 100 or less and --max-model-len "
        "1600 or less")


def test_a_kv_cache_beyond_the_memory_available_fails_at_start(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The CPU's cache is resident only as it fills, so allocating it cannot fail for memory;
    the server checks it against the memory available instead of starting and being killed
    under load (here the machine is made to have 8 MiB available)."""
    from kiln.cli import main

    monkeypatch.setattr(startup, "available_memory", lambda: 8 << 20)
    assert main(["serve", "--host", "127.0.0.1", "--port", str(free_port()),
                 "--kv-memory-mb", "400"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("kiln: the KV cache does not fit in memory: --kv-memory-mb 400 ")
    assert err[-1].endswith("8 MiB are available with the model loaded; use --kv-memory-mb 8 "
                            "or less")
    import gc

    assert gc.get_freeze_count() == 0  # what start-up froze is the collector's again


def test_a_kv_cache_the_system_will_not_map_is_a_clear_error(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import errno
    import mmap

    import torch

    from kiln.model import kv_cache
    from tests.tiny_models import tiny_config

    def refuse(*_: object) -> mmap.mmap:
        raise OSError(errno.ENOMEM, os.strerror(errno.ENOMEM))

    monkeypatch.setattr(mmap, "mmap", refuse)  # kv_cache calls mmap.mmap
    with pytest.raises(ValueError, match=r"cannot be mapped \(Cannot allocate memory\); lower "
                                         r"--kv-memory-mb"):
        kv_cache.KVCache(tiny_config("llama"), 4, 16, torch.float32, torch.device("cpu"),
                         zero_pages=True)
