"""The settings table (kiln.config.SETTINGS): every flag, every KILN_* variable and every config
field comes from it, and every KILN_* variable the code reads is declared in it."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path
from typing import Any

import kiln_kernels
import pytest

import kiln
from kiln.cli import build_parser, config_from_args
from kiln.config import (
    ENV_VARS,
    SETTINGS,
    ConfigError,
    ProcessSettings,
    ServerConfig,
    Setting,
    from_env,
    process_settings,
)

ROOT = Path(kiln.__file__).resolve().parent.parent
# one value per kind that differs from every default, as text and as the parsed value
SAMPLES: dict[str, tuple[str, Any]] = {
    "int": ("4097", 4097), "float": ("12.5", 12.5), "str": ("somewhere", "somewhere"),
    "list": ("k1", ("k1",)),
}


OTHER = {"int": "7777", "float": "7.5", "str": "elsewhere", "list": "e1,e2"}  # valid, not SAMPLES


SPEC = '{"method": "ngram", "num_speculative_tokens": 3}'


def _sample(s: Setting) -> tuple[str, Any]:
    if s.field == "default_sampling_preset":  # a free string that must name a preset
        return "greedy", "greedy"
    if s.field == "speculative_config":  # a string that must be vLLM's JSON
        return SPEC, SPEC
    if s.choices:
        other = next(c for c in s.choices if c != s.default)
        return other, other
    return SAMPLES[s.kind]


def _other(s: Setting) -> str:
    """A valid value for the variable, other than ``_sample``'s."""
    if s.field == "default_sampling_preset":
        return "qwen3-thinking-coding"
    if s.field == "speculative_config":
        return '{"method": "ngram"}'
    if s.choices:
        return next(c for c in s.choices if c != _sample(s)[0])
    return OTHER[s.kind]


def _declared_kiln_strings(source: Path) -> set[str]:
    """String constants in a Python file that are exactly a KILN_* variable's name."""
    tree = ast.parse(source.read_text(encoding="utf-8"))
    return {node.value for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and node.value.startswith("KILN_") and node.value[5:].replace("_", "").isalnum()
            and node.value.upper() == node.value}


def test_every_config_field_is_one_setting_and_its_default_is_the_tables() -> None:
    for record, owner in ((ServerConfig, "server"), (ProcessSettings, "process")):
        names = [f.name for f in dataclasses.fields(record) if f.name != "extra"]
        declared = [s.field for s in SETTINGS if s.owner == owner]
        assert sorted(names) == sorted(declared), owner
        built = record()
        for s in SETTINGS:
            if s.owner == owner:
                assert getattr(built, s.field) == s.default, s.field
    flags = [s.flag for s in SETTINGS if s.flag]
    assert len(flags) == len(set(flags))
    assert len(ENV_VARS) == len([s for s in SETTINGS if s.env])  # no variable declared twice


def test_every_kiln_variable_in_the_source_is_declared() -> None:
    """kiln_kernels reads KILN_KERNEL_CACHE itself (it never imports kiln): declared here."""
    packages = (Path(kiln.__file__).parent, Path(kiln_kernels.__file__).parent, ROOT / "codegen")
    found: dict[str, Path] = {}
    for package in packages:
        for source in package.rglob("*.py"):
            for name in _declared_kiln_strings(source):
                found.setdefault(name, source)
    assert {"KILN_KERNEL_CACHE", "KILN_API_KEY"} <= found.keys()  # the scan sees both packages
    undeclared = {name: str(path.relative_to(ROOT)) for name, path in found.items()
                  if name not in ENV_VARS}
    assert not undeclared, f"KILN_* variables read but not declared in kiln.config: {undeclared}"


@pytest.mark.parametrize("s", [s for s in SETTINGS if s.env and s.owner == "server"],
                         ids=lambda s: s.env)
def test_each_variable_fills_its_field(s: Setting) -> None:
    assert s.env is not None
    text, value = ("false" if s.default else "true", not s.default) if s.kind == "bool" \
        else _sample(s)
    assert getattr(from_env({s.env: text}), s.field) == value
    assert getattr(from_env({s.env: ""}), s.field) == s.default  # empty: unset


@pytest.mark.parametrize("s", [s for s in SETTINGS if s.flag], ids=lambda s: s.flag)
def test_each_flag_fills_its_field_over_the_variable(s: Setting,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    assert s.flag is not None
    if s.kind == "bool":
        for argv, value in (([s.flag], True), ([f"--no-{s.flag[2:]}"], False)):
            if s.env:
                monkeypatch.setenv(s.env, "false" if value else "true")
            config = config_from_args(build_parser().parse_args(["serve", *argv]))
            assert getattr(config, s.field) is value
        return
    text, value = _sample(s)
    if s.env:
        monkeypatch.setenv(s.env, _other(s))
    config = config_from_args(build_parser().parse_args(["serve", s.flag, text]))
    assert getattr(config, s.field) == value


def test_no_flag_keeps_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KILN_MAX_NUM_SEQS", "3")
    monkeypatch.setenv("KILN_ENABLE_PREFIX_CACHING", "off")
    config = config_from_args(build_parser().parse_args(["serve"]))
    assert (config.max_num_seqs, config.enable_prefix_caching) == (3, False)


def test_process_settings() -> None:
    assert process_settings({}).quant_kernels is True
    assert process_settings({"KILN_QUANT_KERNELS": "0"}).quant_kernels is False
    with pytest.raises(ConfigError, match="KILN_QUANT_KERNELS"):
        process_settings({"KILN_QUANT_KERNELS": "maybe"})
    # a process setting is not a server config field, and the reverse
    assert from_env({"KILN_QUANT_KERNELS": "0"}) == ServerConfig()
    assert process_settings({"KILN_PORT": "1"}) == ProcessSettings()


def test_serve_run_takes_only_server_settings() -> None:
    pytest.importorskip("ray")
    from kiln.scale.ray_serve import config_from_args as serve_run_config

    assert serve_run_config({"max_num_seqs": "5"}).max_num_seqs == 5
    for name in ("quant_kernels", "kernel_cache"):  # not a replica's config: never ignored
        with pytest.raises(ValueError, match=f"unknown Kiln settings: {name}"):
            serve_run_config({name: "0"})
