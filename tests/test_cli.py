"""`kiln serve` start-up failures: one clear line on stderr, a non-zero exit, no traceback."""

from __future__ import annotations

import gc
import subprocess
from pathlib import Path

import pytest

from kiln.cli import build_parser, config_from_args
from kiln.cli import serve as serve_here
from kiln.config import ConfigError
from kiln.testing import free_port, serve_command
from tests.tiny_models import write_tiny_llama


def serve(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    # a free port: the port is bound (before the model loads) since the start-up checks
    return subprocess.run(
        serve_command(args, port=free_port()),
        capture_output=True, text=True, timeout=120, env=env,
    )


def broken_config(tmp: Path) -> Path:
    folder = write_tiny_llama(tmp / "broken")
    (folder / "config.json").write_text("{not json")
    return folder


def missing_weights(tmp: Path) -> Path:
    folder = write_tiny_llama(tmp / "noweights")
    (folder / "model.safetensors").unlink()
    return folder


def corrupt_weights(tmp: Path) -> Path:
    folder = write_tiny_llama(tmp / "corrupt")
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:200])  # truncated: had been a traceback
    return folder


@pytest.mark.parametrize(
    "make", [lambda t: t / "does-not-exist", broken_config, missing_weights, corrupt_weights],
    ids=["bad-path", "broken-config", "missing-file", "corrupt-weights"],
)
def test_bad_model_gives_one_clear_line(tmp_path: Path, make) -> None:
    result = serve("--model", str(make(tmp_path)))
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("kiln: cannot load model")
    assert "Traceback" not in result.stderr


def test_a_failed_start_turns_the_collector_back_on(tmp_path: Path) -> None:
    # serve() runs start-up with the cyclic collector off; it is on again whichever way it ends
    args = build_parser().parse_args(["serve", "--model", str(tmp_path / "absent"),
                                      "--host", "127.0.0.1", "--port", str(free_port())])
    assert gc.isenabled()
    assert serve_here(config_from_args(args)) == 2
    assert gc.isenabled()


@pytest.mark.parametrize("flag", ["--drain-timeout-s", "--request-timeout-s"])
def test_an_infinite_timeout_is_a_config_error(flag: str) -> None:
    """inf passed the checks, then int(inf) ended start-up in a traceback."""
    result = serve(flag, "inf")
    assert result.returncode == 2
    assert "finite" in result.stderr and "Traceback" not in result.stderr


def test_bad_env_value_fails_loudly() -> None:
    import os

    env = {**os.environ, "KILN_PORT": "not-a-number"}
    result = serve(env=env)
    assert result.returncode == 2
    assert "KILN_PORT" in result.stderr and "Traceback" not in result.stderr


def test_flags_override_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KILN_PORT", "9000")
    monkeypatch.setenv("KILN_API_KEY", "sk-first,sk-second")
    args = build_parser().parse_args(["serve", "--port", "9100", "--max-waiting-requests", "3"])
    cfg = config_from_args(args)
    assert (cfg.port, cfg.api_keys, cfg.max_waiting_requests) == (
        9100, ("sk-first", "sk-second"), 3)
    # the keys never show in the config's repr (it is logged); only how many there are
    assert "sk-" not in repr(cfg) and "api_keys=<2 key(s)>" in repr(cfg)


def test_kv_cache_dtype_from_flag_and_env(monkeypatch: pytest.MonkeyPatch) -> None:
    from kiln.config import ConfigError, ServerConfig, engine_config, from_env

    assert ServerConfig().kv_cache_dtype == "auto"
    assert from_env({"KILN_KV_CACHE_DTYPE": "float16"}).kv_cache_dtype == "float16"
    with pytest.raises(ConfigError, match="kv_cache_dtype"):
        from_env({"KILN_KV_CACHE_DTYPE": "fp8"})
    monkeypatch.delenv("KILN_KV_CACHE_DTYPE", raising=False)
    args = build_parser().parse_args(["serve", "--kv-cache-dtype", "float16"])
    config = config_from_args(args)
    assert config.kv_cache_dtype == "float16"
    assert engine_config(config).kv_cache_dtype == "float16"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--kv-cache-dtype", "int8"])


def test_a_bad_chat_template_file_is_named_as_such(tmp_path: Path) -> None:
    """A --chat-template that does not compile was reported as 'cannot load model (default)'."""
    folder = write_tiny_llama(tmp_path / "tiny")
    template = tmp_path / "bad.jinja"
    template.write_text("{% for m in messages %}{{ m.content }")
    result = serve("--model", str(folder), "--chat-template", str(template))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"kiln: cannot load chat template {template}")


def test_connection_flags_reach_the_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KILN_SEND_TIMEOUT_S", "7")
    args = build_parser().parse_args(
        ["serve", "--header-timeout-s", "1.5", "--body-timeout-s", "2", "--keep-alive-s", "3",
         "--max-connections", "9"])
    config = config_from_args(args)
    assert (config.header_timeout_s, config.body_timeout_s, config.keep_alive_s,
            config.max_connections, config.send_timeout_s) == (1.5, 2.0, 3.0, 9, 7.0)


@pytest.mark.parametrize("flag", ["--header-timeout-s", "--body-timeout-s", "--keep-alive-s",
                                  "--send-timeout-s"])
def test_a_zero_or_infinite_connection_timeout_is_a_config_error(flag: str) -> None:
    for value in ("0", "inf"):
        with pytest.raises(ConfigError, match=flag[2:].replace("-", "_")):
            config_from_args(build_parser().parse_args(["serve", flag, value]))
