"""The CPU products' weight formats and their tiled layout, in numpy only (no torch).

The tables say which GGML types the C products read (``quant.h`` mirrors the format ids) and
how many bytes a block of each holds. :func:`tile_ggml` turns a GGUF tensor's raw rows into
the tiles the products read: every 4 rows' blocks one after another, ``[N/4, nb, tile]``.
GGML Q4_0, Q4_1 and Q8_0 are repacked with float32 scales (``q4``: ``d, m`` with Q4_0's
``m = -8 d``, exact; ``q8``: ``d``); every other format keeps the file's blocks byte for byte.

No torch here: start-up tiles a GGUF's matrices on a thread while the main thread is still
importing torch (``kiln.model.checkpoint.gguf_tensors``). :func:`tile_many` tiles a whole file in
one call of ``kiln_kernels/cpu/tiling/tile.c``, which runs without the GIL throughout, and threads
share one file's tiling through :class:`TileWork` (each claims the next job left); the numpy
functions below are its reference (and its stand-in where no C compiler is found). The torch
references of the layout (``kiln_kernels.quant``: ``tile_rows``, ``untile``, ``untile_raw``)
check them in the tests.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Sequence

import numpy as np

from .cpu.loader import tiling_library

# format -> id in quant.h
FORMAT_IDS = {"q4": 0, "q8": 1, "q5_0": 2, "q5_1": 3, "q4_k": 4, "q5_k": 5, "q6_k": 6,
              "f16": 7, "bf16": 8, "f32": 9, "q2_k": 10, "q3_k": 11, "iq4_nl": 12, "iq4_xs": 13}
# weights per block along k
K_QUANTS = ("q2_k", "q3_k", "q4_k", "q5_k", "q6_k")
QK = {f: 256 if f in (*K_QUANTS, "iq4_xs") else 32 for f in FORMAT_IDS}
# bytes of one row's block, for the formats kept as the file's blocks
RAW_BLOCK = {"q5_0": 22, "q5_1": 24, "q4_k": 144, "q5_k": 176, "q6_k": 210, "f16": 64,
             "bf16": 64, "f32": 128, "q2_k": 84, "q3_k": 110, "iq4_nl": 18, "iq4_xs": 136}
# IQ4_NL's and IQ4_XS's 16 values (llama.cpp's kvalues_iq4nl), picked by each 4-bit index
IQ4_VALUES = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)
TILE_BYTES = {"q4": 96, "q8": 144, **{f: 4 * b for f, b in RAW_BLOCK.items()}}
# GGML type -> format, and that type's (weights, bytes) per block (floats: 32 per "block")
GGML_FORMAT = {"Q4_0": "q4", "Q4_1": "q4", "Q8_0": "q8", "Q5_0": "q5_0", "Q5_1": "q5_1",
               "Q4_K": "q4_k", "Q5_K": "q5_k", "Q6_K": "q6_k", "F16": "f16", "BF16": "bf16",
               "F32": "f32", "Q2_K": "q2_k", "Q3_K": "q3_k", "IQ4_NL": "iq4_nl",
               "IQ4_XS": "iq4_xs"}
GGML_TYPES = {"Q4_0": (32, 18), "Q4_1": (32, 20), "Q8_0": (32, 34),
              **{t: (QK[f], RAW_BLOCK[f]) for t, f in GGML_FORMAT.items() if f in RAW_BLOCK}}


def _tiles(parts: tuple[np.ndarray, ...]) -> np.ndarray:
    """Row blocks ``[N, nb, b_i]`` (uint8, one array per field) -> tiles ``[N/4, nb, sum 4 b_i]``:
    in each tile, every field's 4 rows one after another. One copy per field, into new memory
    (a part may be a read-only view of a mapped file)."""
    n, nb = parts[0].shape[:2]
    if n % 4:
        raise ValueError(f"{n} rows: the tiled layout needs a multiple of 4")
    g = n // 4
    tiles = np.empty((g, nb, 4 * sum(p.shape[2] for p in parts)), dtype=np.uint8)
    at = 0
    for p in parts:
        b = p.shape[2]
        # splitting the last axis of a slice is a view (copy=False raises if it were not)
        dst = tiles[:, :, at:at + 4 * b].reshape((g, nb, 4, b), copy=False)
        np.copyto(dst, p.reshape(g, 4, nb, b).transpose(0, 2, 1, 3))
        at += 4 * b
    return tiles


def tile_blocks(raw: np.ndarray, block: int) -> np.ndarray:
    """Rows of blocks kept as they are (uint8 ``[N, nb * block]``) -> tiles ``[N/4, nb, 4 block]``."""
    return _tiles((raw.reshape(raw.shape[0], -1, block),))


def _halves(blocks: np.ndarray, at: int) -> np.ndarray:
    """The fp16 field at byte ``at`` of every block, float32 ``[N, nb]`` (exact)."""
    return np.ascontiguousarray(blocks[:, :, at:at + 2]).view(np.float16)[:, :, 0].astype(
        np.float32)


def _check(raw: np.ndarray, ggml_type: str) -> int:
    """The type's block bytes, once ``raw`` is known to be its rows."""
    if ggml_type not in GGML_TYPES:
        raise ValueError(f"unsupported GGML type {ggml_type!r}")
    size = GGML_TYPES[ggml_type][1]
    if raw.dtype != np.uint8 or raw.ndim != 2 or raw.shape[1] % size or not raw.shape[1]:
        raise ValueError(f"raw {ggml_type} rows must be uint8 [N, k * {size}]")
    if raw.shape[0] % 4:
        raise ValueError(f"{raw.shape[0]} rows: the tiled layout needs a multiple of 4")
    return size


def tile_ggml_reference(raw: np.ndarray, ggml_type: str) -> tuple[str, np.ndarray]:
    """A GGUF tensor's raw rows (uint8 ``[N, row_bytes]``, N a multiple of 4) of a type in
    :data:`GGML_TYPES` -> ``(format, tiles)``, in numpy."""
    size = _check(raw, ggml_type)
    fmt = GGML_FORMAT[ggml_type]
    if fmt in RAW_BLOCK:
        return fmt, tile_blocks(raw, size)
    blocks = raw.reshape(raw.shape[0], -1, size)
    d = _halves(blocks, 0)
    if ggml_type == "Q8_0":
        return "q8", _tiles((d.view(np.uint8).reshape(*d.shape, 4), blocks[:, :, 2:]))
    m = _halves(blocks, 2) if ggml_type == "Q4_1" else -8.0 * d  # float32: a power of 2, exact
    first = 4 if ggml_type == "Q4_1" else 2
    scales = np.stack((d, m), axis=-1).view(np.uint8)  # [N, nb, 8]: d then m, float32 each
    return "q4", _tiles((scales, blocks[:, :, first:first + 16]))


class _Job(ctypes.Structure):
    """``kiln_tile_job`` of tile.c."""

    _fields_ = [("src", ctypes.c_void_p), ("dst", ctypes.c_void_p), ("rows", ctypes.c_void_p),
                ("n", ctypes.c_int64), ("nb", ctypes.c_int64), ("block", ctypes.c_int64),
                ("kind", ctypes.c_int64)]


_KINDS = {"Q4_0": 1, "Q4_1": 2, "Q8_0": 3}  # tile.c's TILE_*; every other type is copied as is

Item = tuple[np.ndarray, str, "np.ndarray | None"]


def _rows(rows: np.ndarray | None, n: int) -> np.ndarray | None:
    if rows is None:
        return None
    rows = np.ascontiguousarray(rows, dtype=np.int64)
    if rows.shape != (n,) or rows.min(initial=0) < 0 or rows.max(initial=0) >= n:
        raise ValueError(f"rows must be {n} row indices")
    return rows


class TileWork:
    """Tensors to tile (as :func:`tile_many` takes them), their jobs ready for ``tile.c`` and
    their tiles allocated: any thread may :meth:`run` it, and threads that do split the jobs
    between them (each claims the next job left, the largest first). Start-up's tiling thread
    runs it beside the imports, and the main thread joins in when it needs the tiles
    (``kiln.model.native.early_tiles``). :attr:`tiles` (``(format, tiles)`` per item, in order) are
    complete once every run has returned. Without the C library a run tiles in numpy, alone."""

    def __init__(self, items: Sequence[Item]) -> None:
        checked = [(np.ascontiguousarray(raw), t, _check(raw, t), _rows(rows, raw.shape[0]))
                   for raw, t, rows in items]
        self._lib = tiling_library()
        self._lock = threading.Lock()
        self._items = [(raw, t, rows) for raw, t, _, rows in checked]
        self.tiles: list[tuple[str, np.ndarray]] = []
        if self._lib is None:
            return
        # what the jobs point into (sources, tiles, row orders), alive as long as the work
        self._keep: list[np.ndarray] = []
        for raw, ggml_type, size, _ in checked:
            fmt = GGML_FORMAT[ggml_type]
            shape = (raw.shape[0] // 4, raw.shape[1] // size, TILE_BYTES[fmt])
            self.tiles.append((fmt, np.empty(shape, dtype=np.uint8)))
        self._jobs = (_Job * len(checked))()
        self._next = ctypes.c_int64(0)
        largest_first = sorted(range(len(checked)), key=lambda i: -checked[i][0].nbytes)
        for job, i in zip(self._jobs, largest_first, strict=True):
            raw, ggml_type, size, rows = checked[i]
            tiles = self.tiles[i][1]
            self._keep += [raw, tiles] + ([] if rows is None else [rows])
            job.src, job.dst = raw.ctypes.data, tiles.ctypes.data
            job.rows = None if rows is None else rows.ctypes.data
            job.n, job.nb, job.block = raw.shape[0], tiles.shape[1], size
            job.kind = _KINDS.get(ggml_type, 0)

    def run(self) -> None:
        """Tile the jobs this thread claims (ctypes drops the GIL for the whole call)."""
        if self._lib is not None:
            self._lib.kiln_tile_claim(self._jobs, len(self._jobs), ctypes.byref(self._next))
            return
        with self._lock:
            if not self.tiles:
                self.tiles = [tile_ggml_reference(raw if rows is None else raw[rows], t)
                              for raw, t, rows in self._items]


def tile_many(items: Sequence[Item]) -> list[tuple[str, np.ndarray]]:
    """Tile tensors: each ``(raw, ggml_type, rows)``, ``raw`` its rows in the file's order
    (uint8 ``[N, row_bytes]``), ``rows`` None or the source row of each tiled row (int64
    ``[N]``) -> ``(format, tiles)`` each, as :func:`tile_ggml_reference` gives for
    ``raw[rows]``. One C call for all of them where the tiling library builds."""
    work = TileWork(items)
    work.run()
    return work.tiles


def tile_ggml(raw: np.ndarray, ggml_type: str) -> tuple[str, np.ndarray]:
    """One tensor's rows -> ``(format, tiles)`` (:func:`tile_many`)."""
    return tile_many([(raw, ggml_type, None)])[0]
