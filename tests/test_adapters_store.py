"""The adapter directory store: strict names, listing, default, deletion, containment."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

from kiln.adapters import (
    AdapterActive,
    AdapterNotFound,
    AdapterStore,
    InvalidAdapterName,
    validate_name,
)

BAD_NAMES = ["", ".", "..", "../x", "/etc/passwd", "a/b", "a\\b", "%2e%2e", "..%2fx", "a%5cb",
             "x/../y", "%252e%252e", "a%2Fb", "a\x00b", "a\nb", "\x7f", "C:\\x", "c:x", ".hidden",
             "x..y", "%c3%28", "a" * 256, "%2F", "..\\", "a\u2028b"]
GOOD_NAMES = ["my-adapter", "a.b", "v1_2", "Qwen3 lora", "caf\u00e9", "50%off", "a" * 255]


def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """Every path under ``root`` with its size and mtime."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for n in dirnames + filenames:
            p = Path(dirpath) / n
            st = p.lstat()
            out[str(p.relative_to(root))] = (st.st_size, st.st_mtime_ns)
    return out


def _adapter(root: Path, name: str, config: bool = True, weights: bool = True) -> Path:
    d = root / name
    d.mkdir(parents=True)
    if config:
        (d / "adapter_config.json").write_text('{"r": 4, "lora_alpha": 8}')
    if weights:
        (d / "adapter_model.safetensors").write_bytes(b"\0" * 100)
    return d


@pytest.fixture
def tree(tmp_path: Path) -> tuple[Path, Path]:
    """``tmp_path/adapters`` with adapters, and a sibling ``outside`` adapter-shaped folder."""
    root = tmp_path / "adapters"
    root.mkdir()
    _adapter(root, "beta")
    _adapter(root, "alpha", weights=False)
    _adapter(root, "gamma", config=False)
    (root / "not-an-adapter").mkdir()
    (root / "stray.txt").write_text("x")
    _adapter(tmp_path, "outside")
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "passwd").write_text("root")
    return root, tmp_path


@pytest.mark.parametrize("name", BAD_NAMES)
def test_bad_names_rejected_everywhere(tree: tuple[Path, Path], name: str) -> None:
    root, top = tree
    before = _snapshot(top)
    store = AdapterStore(root)
    with pytest.raises(InvalidAdapterName):
        validate_name(name)
    for op in (store.exists, store.delete, store.set_default, store.path, store.info):
        with pytest.raises(InvalidAdapterName):
            op(name)
    assert store.default is None
    assert _snapshot(top) == before


@pytest.mark.parametrize("name", GOOD_NAMES)
def test_good_names_accepted(name: str) -> None:
    assert validate_name(name) == name


def test_list_sorted_with_details(tree: tuple[Path, Path]) -> None:
    root, _ = tree
    store = AdapterStore(root)
    infos = store.list()
    assert [i.name for i in infos] == ["alpha", "beta", "gamma"]
    alpha, beta, gamma = infos
    assert (alpha.has_config, alpha.has_weights) == (True, False)
    assert (gamma.has_config, gamma.has_weights) == (False, True)
    assert beta.files == ("adapter_config.json", "adapter_model.safetensors")
    assert beta.size_bytes == 100 + len('{"r": 4, "lora_alpha": 8}')
    assert beta.modified_at is not None
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", beta.modified_at)
    assert beta.to_dict()["files"] == list(beta.files)
    assert store.exists("beta") and not store.exists("not-an-adapter")
    assert not store.exists("missing") and not store.exists("outside")
    assert AdapterStore(None).list() == [] and not AdapterStore(None).exists("beta")
    assert AdapterStore(root / "nope").list() == []


def test_default_and_delete(tree: tuple[Path, Path]) -> None:
    root, top = tree
    store = AdapterStore(root)
    assert store.default is None
    with pytest.raises(AdapterNotFound):
        store.set_default("missing")
    store.set_default("beta")
    assert store.default == "beta"
    with pytest.raises(AdapterActive):
        store.delete("beta")
    assert (root / "beta").is_dir()
    store.clear_default()
    assert store.default is None
    _adapter(root, "beta-checkpoint-10")
    (root / "betamax-checkpoint-1").mkdir()
    assert store.delete("beta") == ["beta", "beta-checkpoint-10"]
    assert not (root / "beta").exists() and not (root / "beta-checkpoint-10").exists()
    assert (root / "betamax-checkpoint-1").is_dir()
    with pytest.raises(AdapterNotFound):
        store.delete("beta")
    with pytest.raises(AdapterNotFound):
        store.delete("not-an-adapter")
    assert (root / "not-an-adapter").is_dir() and (top / "outside").is_dir()
    assert [i.name for i in store.list()] == ["alpha", "gamma"]


@pytest.mark.skipif(sys.platform == "win32", reason="symlinks")
def test_symlinks_out_of_the_directory_are_ignored(tree: tuple[Path, Path]) -> None:
    root, top = tree
    (root / "link").symlink_to(top / "outside", target_is_directory=True)
    _adapter(root / "beta", "nested")
    (root / "deep").symlink_to(root / "beta" / "nested", target_is_directory=True)
    (root / "beta-checkpoint-1").symlink_to(top / "outside", target_is_directory=True)
    store = AdapterStore(root)
    assert "link" not in [i.name for i in store.list()]
    assert "deep" not in [i.name for i in store.list()]
    for name in ("link", "deep"):
        assert not store.exists(name)
        with pytest.raises(AdapterNotFound):
            store.delete(name)
    store.delete("beta")
    assert (top / "outside" / "adapter_config.json").is_file()
    assert (root / "beta-checkpoint-1").is_symlink()


def test_store_module_does_not_import_torch() -> None:
    import subprocess

    code = "import sys, kiln.adapters; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).resolve().parents[1])
    assert out.stdout.strip() == "False"
