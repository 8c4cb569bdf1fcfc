"""The rotary frequencies (``inv_freq``) torch computed, kept on disk for processes without torch.

The C step reads the frequencies of ``kiln.model.layers.RotaryEmbedding``, which are
transformers' own: ``1 / theta ** (arange(0, dim, 2) / dim)`` in torch's float32 ``pow``, then
scaled. numpy's float32 ``pow`` differs from torch's by 1-2 ulp on most configs (measured), and
torch's vectorized ``pow`` depends on the instruction set of the CPU, so a torch-free process
(``kiln.model.c_model``) cannot compute them itself: it reads them from here, where a process
that loaded the model with torch stored them (``kiln.model.gguf_loader``). An entry is keyed by
everything the values depend on (:func:`key`): the head size, theta, the scaling, torch's
installed version and the CPU's flags.

Files are ``<key>.npy`` under ``kiln_kernels.cpu.loader.cache_dir() / "rope"``, written to a
temporary name and renamed into place; a file that cannot be read, or holds anything but
``head_dim / 2`` float32 values, is no entry. Storing never raises for the file system (a
read-only home must not break a load). Nothing here imports torch.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.metadata
import os
import tempfile
from pathlib import Path

import numpy as np
from kiln_kernels.cpu import loader

from kiln.model.rope import RopeScaling


def directory() -> Path:
    """Where the entries live (tests point it elsewhere)."""
    return loader.cache_dir() / "rope"


@functools.cache
def _torch_version() -> str | None:
    """torch's installed version, read from its metadata (torch is not imported)."""
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None


@functools.cache
def _cpu_flags() -> str:
    return loader._cpu_flags()


def key(head_dim: int, theta: float, scaling: RopeScaling | None) -> str:
    """The entry's name: a sha256 over what the frequencies depend on."""
    ident = (int(head_dim), float(theta), scaling, _torch_version(), _cpu_flags())
    return hashlib.sha256(repr(ident).encode()).hexdigest()


def _path(head_dim: int, theta: float, scaling: RopeScaling | None) -> Path:
    return directory() / f"{key(head_dim, theta, scaling)}.npy"


def lookup(head_dim: int, theta: float, scaling: RopeScaling | None) -> np.ndarray | None:
    """The stored float32 ``[head_dim / 2]`` frequencies, or None where there are none (no
    entry, or one that cannot be read or has another shape or type)."""
    try:
        values = np.load(_path(head_dim, theta, scaling), allow_pickle=False)
    except (OSError, ValueError, EOFError):
        return None
    if not isinstance(values, np.ndarray) or values.dtype != np.float32 \
            or values.shape != (head_dim // 2,):
        return None
    return np.ascontiguousarray(values)


def store(head_dim: int, theta: float, scaling: RopeScaling | None, values: np.ndarray) -> None:
    """Keep ``values`` (float32 ``[head_dim / 2]``, torch's frequencies for these arguments).
    A file system error leaves things as they were, silently; an equal entry is not rewritten.
    ValueError for values of another shape or type."""
    arr = np.asarray(values)
    if arr.dtype != np.float32 or arr.shape != (head_dim // 2,):
        raise ValueError(f"rope frequencies must be float32 [{head_dim // 2}], got "
                         f"{arr.dtype} {list(arr.shape)}")
    old = lookup(head_dim, theta, scaling)
    if old is not None and old.tobytes() == arr.tobytes():
        return
    tmp: str | None = None
    try:
        folder = directory()
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".tmp", dir=folder)
        with os.fdopen(fd, "wb") as f:
            np.save(f, np.ascontiguousarray(arr), allow_pickle=False)
        os.replace(tmp, _path(head_dim, theta, scaling))
        tmp = None
    except OSError:
        pass
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
