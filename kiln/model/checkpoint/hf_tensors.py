"""An HF folder's weight files as the model takes them, without torch: the shards, which
matrices the CPU step holds as they are (bfloat16 / float16, rows in fours, columns in 32s),
and their tiles, read straight from the files' maps. ``kiln.model.hf_loader`` puts them into
the model; start-up tiles with :func:`folder_tile_work` on threads while torch imports
(``kiln.model.native.early_tiles``).

A safetensors file is an 8-byte little-endian header length, a JSON header (per tensor: dtype,
shape, ``data_offsets`` from the end of the header) and the tensors' bytes; the ``safetensors``
package stays the loader's reader for everything else.
"""

from __future__ import annotations

import json
import mmap
import struct
from pathlib import Path
from typing import Any

import numpy as np
from kiln_kernels.tiling import Item, TileWork

from kiln.model.checkpoint.config import ModelConfig, WeightLoadError

HALF_TYPES = ("BF16", "F16")  # safetensors' dtype names; the same names as GGML's types


def read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise WeightLoadError(f"cannot read {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise WeightLoadError(f"{path} is not a JSON object")
    return data


def safetensors_files(folder: Path) -> list[Path]:
    """The weight files, in shard order: from the index, or the single file, or all of them."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        weight_map = read_json(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise WeightLoadError(f"{index} has no weight_map")
        files = sorted({str(v) for v in weight_map.values()})
        paths = [folder / f for f in files]
        for p in paths:
            if not p.is_file():
                raise WeightLoadError(f"shard {p.name} named in the index is missing")
        return paths
    single = folder / "model.safetensors"
    if single.is_file():
        return [single]
    found = sorted(folder.glob("*.safetensors"))
    if not found:
        raise WeightLoadError(f"no safetensors weights in {folder}")
    return found


def packable(name: str, dtype: str | None, shape: tuple[int, ...], tied: bool) -> bool:
    """A bfloat16 / float16 projection, embedding or head the C step can hold as it is (rows in
    fours, columns in 32s). Float32 checkpoints keep the torch path."""
    return (dtype in HALF_TYPES and len(shape) == 2 and shape[0] % 4 == 0 and shape[1] % 32 == 0
            and ".experts." not in name  # a mixture's experts: the torch path's, unpacked
            and (name.endswith("_proj.weight") or name == "model.embed_tokens.weight"
                 or (name == "lm_head.weight" and not tied)))


def _half_matrices(path: Path, tied: bool) -> list[tuple[str, Item]]:
    """The packable matrices of one safetensors file, as views of its map."""
    with path.open("rb") as f:
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    (length,) = struct.unpack_from("<Q", buf, 0)
    header = json.loads(bytes(buf[8:8 + length]))
    start = 8 + length
    items: list[tuple[str, Item]] = []
    for name, entry in header.items():
        if name == "__metadata__" or not isinstance(entry, dict):
            continue
        dtype, shape = entry.get("dtype"), tuple(int(x) for x in entry.get("shape", ()))
        if not packable(name, dtype, shape, tied):
            continue
        begin, end = (int(x) for x in entry["data_offsets"])
        if end - begin != shape[0] * shape[1] * 2 or start + end > len(buf):
            raise ValueError(f"{path}: {name} does not fit its header")
        rows = np.frombuffer(buf, dtype=np.uint8, count=end - begin, offset=start + begin)
        items.append((name, (rows.reshape(shape[0], -1), str(dtype), None)))
    return items


def folder_tile_work(folder: Path) -> tuple[list[str], TileWork]:
    """The names of every matrix the C step holds as it is, and their tiling, ready for threads
    to run (``TileWork.run``; its ``tiles`` follow the names)."""
    cfg = ModelConfig.from_hf(read_json(folder / "config.json"))
    named = [pair for path in safetensors_files(folder)
             for pair in _half_matrices(path, cfg.tie_word_embeddings)]
    return [name for name, _ in named], TileWork([item for _, item in named])
