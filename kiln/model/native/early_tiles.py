"""Start-up tiles the model's matrices while the server's modules import.

``kiln serve`` spends much of its start importing (torch, 0.65 s of ~1.1 s on the default model,
``python -X importtime``, where the model needs torch; the server's own modules, ~0.2 s, where
it is served without torch: ``kiln.model.native.c_model``), and putting a model's weights into the
CPU kernels' tiles is memory copies, which run in C without the GIL
(``kiln_kernels.tiling.TileWork``, one C call a thread). So the CLI starts a thread
(:func:`tiling_beside`) that reads a GGUF's index, or an HF folder's safetensors headers, and
tiles every matrix the kernels can hold while the main thread imports.
The loader takes the result (:func:`take_tiled`); where the tiling outlasts the imports (a
large model), the main thread first tiles beside the thread whatever it has not begun. The
loader tiles only what is left. Nothing here imports torch. Figures: ``bench/README.md``,
"Start-up, scoring and the engine thread".
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from kiln_kernels.tiling import TileWork

from kiln.model.checkpoint import gguf_tensors, hf_tensors
from kiln.model.checkpoint.gguf_index import GGUFIndex
from kiln.model.native.plan import isa_suits_c_step

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
    on (``kiln.model.native.plan.pack_weights`` decides, once torch is imported). Elsewhere they
    would be a passing copy of the weights (a GGUF's each dequantized and dropped, an HF folder's
    unused), so start-up does not tile early. A guess made without torch ("auto" is the CPU
    where the machine has no GPU device node): a wrong one costs start-up time or that passing
    copy, never a result. It restates ``pack_weights`` for settings: a test holds the two
    together on the CPU."""
    if not quant_kernels or dtype not in (None, "auto", "float32") or not isa_suits_c_step():
        return False
    if device in (None, "auto"):
        return not any(node.exists() for node in _GPU_NODES)
    return device == "cpu"


def tile_work(path: Path) -> tuple[GGUFIndex | None, list[str], TileWork]:
    """The index (a GGUF's; None for an HF folder), the tensor names and the tiling work of a
    GGUF file or an HF folder."""
    if path.is_dir():
        return (None, *hf_tensors.folder_tile_work(path))
    return gguf_tensors.file_tile_work(path)


def tile(path: Path) -> Tiled:
    """Tile a GGUF file or an HF folder, on this thread."""
    reader, names, work = tile_work(path)
    work.run()
    return Tiled(path, reader, dict(zip(names, work.tiles, strict=True)))


class _Job:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.result: Tiled | None = None
        self.work: TileWork | None = None  # set, then `planned`, before the thread tiles
        self.planned = threading.Event()
        self.thread = threading.Thread(target=self._run, name="kiln-early-tiles", daemon=True)

    def _run(self) -> None:
        try:
            reader, names, work = tile_work(self.path)
            self.work = work
            self.planned.set()
            work.run()
            self.result = Tiled(self.path, reader, dict(zip(names, work.tiles, strict=True)))
        except Exception:  # the loader reads the files again and says what is wrong
            self.result = None
        finally:
            self.planned.set()

    def finish(self) -> Tiled | None:
        """The tiles, this thread helping: it claims the jobs the tiling thread has not begun
        (on a large model the imports end first, and the second core would otherwise wait)."""
        self.planned.wait()
        if self.work is not None:
            self.work.run()
        self.thread.join()
        return self.result


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
    """The running job's tiles if it tiles ``path`` (finishing them with this thread's help),
    else None."""
    global _job
    with _job_lock:
        job = _job
        if job is None or job.path != path.resolve():
            return None
        _job = None
    return job.finish()
