"""The rotary frequencies' disk cache (kiln.model.rope_cache): round trip, keys, bad entries."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from kiln.model import rope_cache
from kiln.model.rope import RopeScaling


@pytest.fixture
def rope_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "rope"
    monkeypatch.setattr(rope_cache, "directory", lambda: folder)
    return folder


def values(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).random(n, dtype=np.float32)


def test_round_trip(rope_dir: Path) -> None:
    scaling = RopeScaling("llama3", factor=8.0, original_max_position=8192)
    assert rope_cache.lookup(64, 500000.0, scaling) is None
    want = values(32)
    rope_cache.store(64, 500000.0, scaling, want)
    got = rope_cache.lookup(64, 500000.0, scaling)
    assert got is not None and got.dtype == np.float32
    assert got.tobytes() == want.tobytes()
    assert rope_cache.lookup(64, 500000.0, None) is None  # another key
    assert [p.suffix for p in rope_dir.iterdir()] == [".npy"]  # no temporary file left


def test_an_equal_entry_is_not_rewritten(rope_dir: Path) -> None:
    rope_cache.store(16, 10000.0, None, values(8))
    path = next(rope_dir.iterdir())
    os.utime(path, ns=(0, 0))
    rope_cache.store(16, 10000.0, None, values(8))
    assert path.stat().st_mtime_ns == 0
    rope_cache.store(16, 10000.0, None, values(8, seed=1))  # different values: replaced
    got = rope_cache.lookup(16, 10000.0, None)
    assert got is not None and got.tobytes() == values(8, seed=1).tobytes()


def test_the_key_changes_with_each_input(monkeypatch: pytest.MonkeyPatch) -> None:
    base = rope_cache.key(64, 10000.0, None)
    assert rope_cache.key(64, 10000, None) == base  # theta as a float
    others = {rope_cache.key(128, 10000.0, None), rope_cache.key(64, 1000000.0, None),
              rope_cache.key(64, 10000.0, RopeScaling("linear", factor=2.0)),
              rope_cache.key(64, 10000.0, RopeScaling("linear", factor=4.0))}
    monkeypatch.setattr(rope_cache, "_torch_version", lambda: "0.0.1")
    others.add(rope_cache.key(64, 10000.0, None))
    monkeypatch.setattr(rope_cache, "_torch_version", lambda: None)
    others.add(rope_cache.key(64, 10000.0, None))
    monkeypatch.undo()
    monkeypatch.setattr(rope_cache, "_cpu_flags", lambda: "flags\t\t: fpu sse2")
    others.add(rope_cache.key(64, 10000.0, None))
    assert len(others) == 7 and base not in others


def test_the_key_names_torch_version_and_cpu_flags() -> None:
    import importlib.metadata

    from kiln_kernels.cpu import loader

    assert rope_cache._torch_version() == importlib.metadata.version("torch")
    assert rope_cache._cpu_flags() == loader._cpu_flags()


@pytest.mark.parametrize("bad", ["short", "long", "float64", "2-D", "garbage", "empty"])
def test_a_bad_entry_is_no_entry(rope_dir: Path, bad: str) -> None:
    rope_dir.mkdir()
    path = rope_dir / f"{rope_cache.key(64, 10000.0, None)}.npy"
    arrays = {"short": values(31), "long": values(33), "float64": values(32).astype(np.float64),
              "2-D": values(32).reshape(2, 16)}
    if bad in arrays:
        np.save(path, arrays[bad])
    else:
        path.write_bytes(b"not a numpy file" if bad == "garbage" else b"")
    assert rope_cache.lookup(64, 10000.0, None) is None


def test_store_into_an_unwritable_place_does_not_raise(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setattr(rope_cache, "directory", lambda: blocker / "rope")  # mkdir fails
    rope_cache.store(64, 10000.0, None, values(32))
    assert rope_cache.lookup(64, 10000.0, None) is None
    folder = tmp_path / "rope"
    folder.mkdir()
    target = folder / f"{rope_cache.key(64, 10000.0, None)}.npy"
    target.mkdir()  # os.replace onto a directory fails
    monkeypatch.setattr(rope_cache, "directory", lambda: folder)
    rope_cache.store(64, 10000.0, None, values(32))
    assert [p.name for p in folder.iterdir()] == [target.name]  # the temporary file removed


def test_store_refuses_values_of_another_shape(rope_dir: Path) -> None:
    with pytest.raises(ValueError, match="float32"):
        rope_cache.store(64, 10000.0, None, values(16))
    with pytest.raises(ValueError, match="float32"):
        rope_cache.store(64, 10000.0, None, values(32).astype(np.float64))
