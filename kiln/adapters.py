"""The adapter directory: names, listing, deletion, the server default, loading.

``<adapter_dir>/<name>/`` holds a PEFT adapter (``adapter_config.json`` and/or
``adapter_model.safetensors``). Names are validated strictly (no separators, traversal, control
characters or encoded forms of them), and every path is resolved and checked to lie inside
``adapter_dir`` before it is touched. No torch at import time: the API layer uses this module;
:meth:`AdapterStore.load` imports the loader lazily.
"""

from __future__ import annotations

import builtins
import shutil
import threading
import unicodedata
from collections import OrderedDict
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import TYPE_CHECKING
from urllib.parse import unquote

if TYPE_CHECKING:
    from kiln.model.checkpoint.config import ModelConfig
    from kiln.model.lora import LoraAdapter

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
MAX_NAME_LENGTH = 255


class InvalidAdapterName(ValueError):
    """The adapter name is empty, a path, or could escape the adapter directory."""


class AdapterNotFound(LookupError):
    """No adapter of that name exists."""


class AdapterActive(RuntimeError):
    """The adapter is the server default and cannot be deleted."""


def _check_plain(name: str, original: str) -> None:
    if not name:
        raise InvalidAdapterName("adapter name must not be empty")
    if any(unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp") for c in name):
        raise InvalidAdapterName(f"adapter name {original!r} contains control characters")
    if "/" in name or "\\" in name:
        raise InvalidAdapterName(f"adapter name {original!r} must not contain a path separator")
    if name in (".", "..") or ".." in name:
        raise InvalidAdapterName(f"adapter name {original!r} must not contain '..'")
    if name.startswith("."):
        raise InvalidAdapterName(f"adapter name {original!r} must not start with '.'")
    if PurePosixPath(name).is_absolute() or PureWindowsPath(name).anchor:
        raise InvalidAdapterName(f"adapter name {original!r} must not be an absolute path")


def validate_name(name: str) -> str:
    """Return ``name`` if it is a safe single directory name, else raise InvalidAdapterName.

    Rejected: empty, ``.``, ``..``, any ``..``, ``/`` or ``\\``, a leading ``.``, control
    characters, absolute or drive paths, names over 255 characters, and all of these again after
    URL-decoding (``%2e%2e``, ``..%2fx``, ``a%5cb``, double encodings ...).
    """
    if not isinstance(name, str):
        raise InvalidAdapterName("adapter name must be a string")
    if len(name) > MAX_NAME_LENGTH:
        raise InvalidAdapterName(f"adapter name is longer than {MAX_NAME_LENGTH} characters")
    current = name
    for _ in range(8):
        _check_plain(current, name)
        try:
            decoded = unquote(current, errors="strict") if "%" in current else current
        except UnicodeDecodeError as e:
            raise InvalidAdapterName(f"adapter name {name!r} is not valid UTF-8") from e
        if decoded == current:
            return name
        current = decoded
    raise InvalidAdapterName(f"adapter name {name!r} is encoded too many times")


def _iso_z(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class AdapterInfo:
    name: str
    has_config: bool
    has_weights: bool
    size_bytes: int
    modified_at: str | None  # ISO-8601 UTC with a Z, newest file's mtime
    files: tuple[str, ...]

    def to_dict(self) -> dict[str, object]:
        return {"name": self.name, "has_config": self.has_config,
                "has_weights": self.has_weights, "size_bytes": self.size_bytes,
                "modified_at": self.modified_at, "files": list(self.files)}


class AdapterStore:
    """Adapters under ``adapter_dir`` (None: no adapters), plus the server default adapter."""

    def __init__(self, adapter_dir: Path | None, max_loaded: int = 32) -> None:
        if max_loaded <= 0:
            raise ValueError(f"max_loaded must be positive, got {max_loaded}")
        self.root: Path | None = None if adapter_dir is None else Path(adapter_dir).resolve()
        self.max_loaded = max_loaded
        self.default: str | None = None
        self._lock = threading.RLock()
        # name -> (files fingerprint, adapter), least recently used first: reloaded when the
        # files change; past max_loaded the oldest is dropped (requests keep their own copies)
        self._loaded: OrderedDict[str, tuple[tuple[tuple[str, int, int], ...], LoraAdapter]] = (
            OrderedDict())

    # -- paths -------------------------------------------------------------------------------
    def _inside(self, name: str) -> Path | None:
        """The resolved directory of ``name`` if it is a direct child of root, else None."""
        if self.root is None or not self.root.is_dir():
            return None
        candidate = self.root / name
        resolved = candidate.resolve()
        if not resolved.is_relative_to(self.root) or resolved.parent != self.root:
            return None  # a symlink out of (or deeper into) the directory
        return resolved

    def path(self, name: str) -> Path:
        """The directory of adapter ``name``; AdapterNotFound unless it holds an adapter."""
        validate_name(name)
        p = self._inside(name)
        if p is None or not _is_adapter_dir(p):
            raise AdapterNotFound(f"Adapter '{name}' does not exist")
        return p

    def exists(self, name: str) -> bool:
        validate_name(name)
        p = self._inside(name)
        return p is not None and _is_adapter_dir(p)

    # -- listing -----------------------------------------------------------------------------
    def list(self) -> list[AdapterInfo]:
        """Every subdirectory holding adapter_config.json or adapter_model.safetensors."""
        if self.root is None or not self.root.is_dir():
            return []
        infos: list[AdapterInfo] = []
        for entry in self.root.iterdir():
            try:
                validate_name(entry.name)
            except InvalidAdapterName:
                continue
            p = self._inside(entry.name)
            if p is not None and _is_adapter_dir(p):
                infos.append(_info(entry.name, p))
        return sorted(infos, key=lambda i: i.name)

    def info(self, name: str) -> AdapterInfo:
        return _info(name, self.path(name))

    # -- default (``self.default``: the adapter of requests that name none, or None) ----------
    def set_default(self, name: str) -> None:
        with self._lock:
            self.path(name)
            self.default = name

    def clear_default(self) -> None:
        with self._lock:
            self.default = None

    # -- deletion ----------------------------------------------------------------------------
    def delete(self, name: str) -> builtins.list[str]:
        """Delete adapter ``name`` and its ``{name}-checkpoint-*`` directories; returns the
        deleted directory names. AdapterActive if it is the default."""
        with self._lock:
            p = self.path(name)
            if name == self.default:
                raise AdapterActive(f"Adapter '{name}' is the active default; unload it first")
            assert self.root is not None
            victims = [p]
            for entry in sorted(self.root.glob(f"{_glob_escape(name)}-checkpoint-*")):
                q = self._inside(entry.name)
                if q is not None and q.is_dir() and not entry.is_symlink():
                    victims.append(q)
            for v in victims:
                shutil.rmtree(v)
            self._loaded.pop(name, None)
            return [v.name for v in victims]

    # -- loading -----------------------------------------------------------------------------
    def cached(self, name: str) -> LoraAdapter | None:
        """The adapter ``load`` would return, if it is loaded and its files are unchanged; else
        None (no torch work: the caller may be any thread)."""
        try:
            fp = _fingerprint(self.path(name))
        except (AdapterNotFound, InvalidAdapterName):
            return None
        return self._hit(name, fp)

    def _hit(self, name: str, fp: tuple[tuple[str, int, int], ...]) -> LoraAdapter | None:
        with self._lock:
            hit = self._loaded.get(name)
            if hit is None or hit[0] != fp:
                return None
            self._loaded.move_to_end(name)
            return hit[1]

    def load(self, name: str, model_cfg: ModelConfig) -> LoraAdapter:
        """The adapter's weights as an immutable LoraAdapter (cached until its files change, or
        until ``max_loaded`` others were used more recently).

        A caller keeps the object it got even if the folder is later rewritten or deleted.
        Raises AdapterNotFound, or kiln.model.lora.AdapterLoadError for a bad adapter. The files
        are read outside the store's lock, so ``cached`` never waits on a load."""
        from kiln.model.lora import load_adapter

        p = self.path(name)
        fp = _fingerprint(p)
        hit = self._hit(name, fp)
        if hit is not None:
            return hit
        adapter = load_adapter(p, model_cfg, name=name)
        with self._lock:
            self._loaded[name] = (fp, adapter)
            self._loaded.move_to_end(name)
            while len(self._loaded) > self.max_loaded:
                self._loaded.popitem(last=False)
        return adapter


def _is_adapter_dir(p: Path) -> bool:
    return p.is_dir() and ((p / CONFIG_FILE).is_file() or (p / WEIGHTS_FILE).is_file())


def _files(p: Path) -> list[Path]:
    return sorted((f for f in p.iterdir() if f.is_file() and not f.is_symlink()),
                  key=lambda f: f.name)


def _info(name: str, p: Path) -> AdapterInfo:
    files = _files(p)
    stats = [f.stat() for f in files]
    return AdapterInfo(
        name=name, has_config=(p / CONFIG_FILE).is_file(),
        has_weights=(p / WEIGHTS_FILE).is_file(), size_bytes=sum(s.st_size for s in stats),
        modified_at=_iso_z(max(s.st_mtime for s in stats)) if stats else None,
        files=tuple(f.name for f in files))


def _fingerprint(p: Path) -> tuple[tuple[str, int, int], ...]:
    out = []
    for f in (p / CONFIG_FILE, p / WEIGHTS_FILE):
        st = f.stat() if f.is_file() else None
        out.append((f.name, st.st_size if st else -1, st.st_mtime_ns if st else -1))
    return tuple(out)


def _glob_escape(name: str) -> str:
    return "".join(f"[{c}]" if c in "*?[" else c for c in name)
