"""Start-up tiles the model's matrices while torch imports.

``kiln serve`` spends most of its start importing torch (0.65 s of ~1.1 s on the default model,
``python -X importtime``), and putting a model's weights into the CPU kernels' tiles is memory
copies, which run in C without the GIL (``kiln_kernels.tiling.tile_many``, one call a model).
So the CLI starts a thread (:func:`tiling_beside`) that reads a GGUF's index, or an HF folder's
safetensors headers, and tiles every matrix the kernels can hold while the main thread imports;
the loader takes the result (:func:`take_tiled`) and tiles only what is left. Nothing here
imports torch. Figures: ``bench/README.md``, "Start-up, scoring and the engine thread".
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kiln.model import gguf_tensors, hf_tensors
from kiln.model.gguf_index import GGUFIndex

_GPU_NODES = (Path("/dev/nvidiactl"), Path("/dev/kfd"))  # NVIDIA's and ROCm's device nodes


@dataclass(frozen=True)
class Tiled:
    """The tiles of every matrix the kernels can hold, by the checkpoint's tensor name, and a
    GGUF's index (None for an HF folder)."""

    path: Path
    reader: GGUFIndex | None
    tiles: dict[str, tuple[str, np.ndarray]]


def tiles_will_be_held(device: str | None, dtype: str | None, quant_kernels: bool) -> bool:
    """Whether the loader will hold the tiles: a float32 model on the CPU with the packed kernels
    on (``kiln.model.plan.pack_weights`` decides, once torch is imported). Elsewhere they would
    be a passing copy of the weights (a GGUF's each dequantized and dropped, an HF folder's
    unused), so start-up does not tile early. A guess made without torch ("auto" is the CPU
    where the machine has no GPU device node): a wrong one costs start-up time or that passing
    copy, never a result. It restates ``pack_weights`` for settings: a test holds the two
    together on the CPU."""
    if not quant_kernels or dtype not in (None, "auto", "float32"):
        return False
    if device in (None, "auto"):
        return not any(node.exists() for node in _GPU_NODES)
    return device == "cpu"


def tile(path: Path) -> Tiled:
    """Tile a GGUF file or an HF folder."""
    if path.is_dir():
        return Tiled(path, None, hf_tensors.tile_folder(path))
    reader, tiles = gguf_tensors.tile_file(path)
    return Tiled(path, reader, tiles)


class _Job:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.result: Tiled | None = None
        self.thread = threading.Thread(target=self._run, name="kiln-early-tiles", daemon=True)

    def _run(self) -> None:
        try:
            self.result = tile(self.path)
        except Exception:  # the loader reads the files again and says what is wrong
            self.result = None


_job: _Job | None = None
_job_lock = threading.Lock()


@contextmanager
def tiling_beside(path: Path | None) -> Iterator[None]:
    """Tile the model at ``path`` (a GGUF file or an HF folder; None: nothing to tile) on a
    thread for the body, which imports and loads; the loader takes the tiles with
    :func:`take_tiled`. On exit an untaken result is dropped. (The thread holds the GIL only to
    read the index or the headers: the tiling is one C call.)"""
    global _job
    if path is None:
        yield
        return
    job = _Job(path.resolve())
    with _job_lock:
        _job = job
    job.thread.start()
    try:
        yield
    finally:
        with _job_lock:
            if _job is job:
                _job = None
        job.thread.join()


def take_tiled(path: Path) -> Tiled | None:
    """The running job's tiles if it tiles ``path`` (waiting for them), else None."""
    global _job
    with _job_lock:
        job = _job
        if job is None or job.path != path.resolve():
            return None
        _job = None
    job.thread.join()
    return job.result
