"""A GGUF's tensors as the model takes them, without torch: the config its index implies, the
q/k row order, which matrices the CPU kernels can hold, their tiles, and float32 values for the
rest. ``kiln.model.gguf_loader`` puts them into the model.

Start-up tiles early (:func:`tiling_beside`). ``kiln serve`` spends most of its start importing
torch (0.65 s of ~1.1 s on the default model, ``python -X importtime``), and tiling a GGUF is
memory copies, which run in C without the GIL (``kiln_kernels.tiling.tile_many``, one call a
file). So the CLI starts a thread that reads the index and tiles every matrix the kernels can
hold while the main thread imports, and the loader takes the result (:func:`take_tiled`).
Figures: ``bench/README.md``, "Start-up, scoring and the engine thread".
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
from kiln_kernels.tiling import GGML_TYPES, Item, tile_many

from kiln.model.config import ModelConfig, config_from_gguf
from kiln.model.gguf_index import GGUFIndex, GGUFTensor

ROPE_FREQS = "rope_freqs.weight"  # Llama 3.1+: one divisor per rotary frequency


def unpermute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's q/k row order (for GGML's interleaved RoPE) to HF's rotate_half order."""
    out = w.shape[0]
    rest = w.shape[1:]
    return w.reshape(n_head, out // n_head // 2, 2, *rest).swapaxes(1, 2).reshape(out, *rest)


def row_permutation(cfg: ModelConfig, name: str) -> int | None:
    """The head count whose llama.cpp q/k row order this tensor needs undone (llama only)."""
    if cfg.arch != "llama":
        return None
    if name.endswith("attn_q.weight"):
        return cfg.num_heads
    if name.endswith("attn_k.weight"):
        return cfg.num_kv_heads
    return None


def unpackable(tensor: GGUFTensor) -> str | None:
    """Why the kernels cannot hold this matrix (None: they can): its type has no kernel, or
    its rows do not come in fours (the tiles' unit)."""
    if tensor.tensor_type.name not in GGML_TYPES:
        return f"type {tensor.tensor_type.name} has no CPU kernel"
    if int(tensor.shape[-1]) % 4:
        return f"{int(tensor.shape[-1])} rows, not a multiple of 4"
    if int(tensor.shape[0]) % GGML_TYPES[tensor.tensor_type.name][0]:
        return f"{int(tensor.shape[0])} columns, not whole blocks"
    return None


def dequantize(tensor: GGUFTensor) -> np.ndarray:
    """gguf-py's float32 values of a tensor, shaped as the model holds it, writable."""
    arr = np.asarray(gguf.quants.dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)
    if not arr.flags.writeable:  # F32 tensors come back as read-only views of the mmap
        arr = arr.copy()
    return arr.reshape(tuple(reversed(tensor.shape)))


def read_config(reader: GGUFIndex) -> ModelConfig:
    """The model's config from the file's metadata and tensor table."""
    by_name = {t.name: t for t in reader.tensors}
    embd = by_name.get("token_embd.weight")
    if embd is None:
        raise ValueError("GGUF file has no token_embd.weight")
    freqs = by_name.get(ROPE_FREQS)
    return config_from_gguf(
        reader.metadata, vocab_size=int(embd.shape[1]), has_output="output.weight" in by_name,
        has_qkv_bias="blk.0.attn_q.bias" in by_name,
        has_qk_norm="blk.0.attn_q_norm.weight" in by_name,
        rope_divisors=None if freqs is None else tuple(float(x) for x in dequantize(freqs).ravel()))


def _item(tensor: GGUFTensor, heads: int | None) -> Item:
    n = int(tensor.shape[-1])
    raw = np.ascontiguousarray(tensor.data).view(np.uint8).reshape(n, -1)
    return raw, tensor.tensor_type.name, (None if heads is None
                                          else unpermute_qk(np.arange(n, dtype=np.int64), heads))


def tile(tensor: GGUFTensor, heads: int | None) -> tuple[str, np.ndarray]:
    """A matrix the kernels can hold (``unpackable`` is None), rows in HF order, as
    ``(format, tiles)``. The file's bytes are read once, by the copy into the tiles."""
    return tile_many([_item(tensor, heads)])[0]


@dataclass(frozen=True)
class Tiled:
    """A file's index and the tiles of every matrix the kernels can hold, by GGUF name."""

    path: Path
    reader: GGUFIndex
    tiles: dict[str, tuple[str, np.ndarray]]


def tile_file(path: Path) -> Tiled:
    reader = GGUFIndex(path)
    cfg = read_config(reader)
    todo = [t for t in reader.tensors
            if len(t.shape) > 1 and t.name != ROPE_FREQS and unpackable(t) is None]
    done = tile_many([_item(t, row_permutation(cfg, t.name)) for t in todo])
    return Tiled(path, reader, {t.name: pair for t, pair in zip(todo, done, strict=True)})


_GPU_NODES = (Path("/dev/nvidiactl"), Path("/dev/kfd"))  # NVIDIA's and ROCm's device nodes


def tiles_will_be_held(device: str | None, dtype: str | None, quant_kernels: bool) -> bool:
    """Whether the loader will hold a GGUF's tiles: a float32 model on the CPU with the packed
    kernels on (``kiln.model.plan.pack_weights`` decides, once torch is imported). Elsewhere
    they would be a passing copy of the whole file (each is dequantized and dropped), so start-up
    does not tile early. A guess made without torch ("auto" is the CPU where the machine has no
    GPU device node): a wrong one costs start-up time or that passing copy, never a result."""
    if not quant_kernels or dtype not in (None, "auto", "float32"):
        return False
    if device in (None, "auto"):
        return not any(node.exists() for node in _GPU_NODES)
    return device == "cpu"


class _Job:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.result: Tiled | None = None
        self.thread = threading.Thread(target=self._run, name="kiln-gguf-tiling", daemon=True)

    def _run(self) -> None:
        try:
            self.result = tile_file(self.path)
        except Exception:  # the loader reads the file again and says what is wrong
            self.result = None


_job: _Job | None = None
_job_lock = threading.Lock()


@contextmanager
def tiling_beside(path: Path | None) -> Iterator[None]:
    """Tile the GGUF at ``path`` (None: nothing to tile) on a thread for the body, which imports
    and loads; the loader takes the tiles with :func:`take_tiled`. On exit an untaken result is
    dropped. (The thread holds the GIL only to read the index: the tiling is one C call.)"""
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
