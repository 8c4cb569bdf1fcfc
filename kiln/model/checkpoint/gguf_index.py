"""A GGUF file's index: its metadata and tensor table, read once from a memory map.

Written here rather than taken from gguf-py's ``GGUFReader`` because the reader builds numpy
views for every part of every metadata value: a vocabulary of ``n`` tokens and ``m`` merges is
~2 (n + m) numpy slices, which on the default model (49,152 tokens, 48,900 merges) was 1.1 s of
a 2.4 s start, and a 151,936-token Qwen vocabulary is three times that. Here an array of numbers
is one ``numpy.frombuffer`` and an array of strings one loop over ``struct.unpack_from``;
tensors are views of the same map (nothing is read until a tensor's bytes are used). gguf-py
stays the reference: ``tests/model/test_gguf_index.py`` checks both give the same metadata and
tensors, and its ``dequantize`` stays the loader's reference for the block formats.
"""

from __future__ import annotations

import enum
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

MAGIC = 0x46554747  # b"GGUF", little-endian
DEFAULT_ALIGNMENT = 32

# GGUF value types (the format's numbering) -> numpy dtypes of their little-endian encoding
_SCALARS: dict[int, np.dtype[Any]] = {
    0: np.dtype("<u1"), 1: np.dtype("<i1"), 2: np.dtype("<u2"), 3: np.dtype("<i2"),
    4: np.dtype("<u4"), 5: np.dtype("<i4"), 6: np.dtype("<f4"), 7: np.dtype("?"),
    10: np.dtype("<u8"), 11: np.dtype("<i8"), 12: np.dtype("<f8"),
}
_STRING, _ARRAY = 8, 9


class GGMLType(enum.IntEnum):
    """GGML's tensor element types, numbered as in the file (gguf-py's ``GGMLType``;
    ``tests/model/test_gguf_index.py`` checks the two agree). Kept here so that reading an
    index does not import gguf-py (~30 ms of every start-up)."""

    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q8_1 = 9
    Q2_K = 10
    Q3_K = 11
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    Q8_K = 15
    IQ2_XXS = 16
    IQ2_XS = 17
    IQ3_XXS = 18
    IQ1_S = 19
    IQ4_NL = 20
    IQ3_S = 21
    IQ2_S = 22
    IQ4_XS = 23
    I8 = 24
    I16 = 25
    I32 = 26
    I64 = 27
    F64 = 28
    IQ1_M = 29
    BF16 = 30
    TQ1_0 = 34
    TQ2_0 = 35
    MXFP4 = 39
    NVFP4 = 40
    Q1_0 = 41


# each type's (weights, bytes) per block (gguf-py's GGML_QUANT_SIZES)
GGML_BLOCK_SIZES: dict[GGMLType, tuple[int, int]] = {
    GGMLType.F32: (1, 4), GGMLType.F16: (1, 2), GGMLType.Q4_0: (32, 18),
    GGMLType.Q4_1: (32, 20), GGMLType.Q5_0: (32, 22), GGMLType.Q5_1: (32, 24),
    GGMLType.Q8_0: (32, 34), GGMLType.Q8_1: (32, 40), GGMLType.Q2_K: (256, 84),
    GGMLType.Q3_K: (256, 110), GGMLType.Q4_K: (256, 144), GGMLType.Q5_K: (256, 176),
    GGMLType.Q6_K: (256, 210), GGMLType.Q8_K: (256, 292), GGMLType.IQ2_XXS: (256, 66),
    GGMLType.IQ2_XS: (256, 74), GGMLType.IQ3_XXS: (256, 98), GGMLType.IQ1_S: (256, 50),
    GGMLType.IQ4_NL: (32, 18), GGMLType.IQ3_S: (256, 110), GGMLType.IQ2_S: (256, 82),
    GGMLType.IQ4_XS: (256, 136), GGMLType.I8: (1, 1), GGMLType.I16: (1, 2),
    GGMLType.I32: (1, 4), GGMLType.I64: (1, 8), GGMLType.F64: (1, 8),
    GGMLType.IQ1_M: (256, 56), GGMLType.BF16: (1, 2), GGMLType.TQ1_0: (256, 54),
    GGMLType.TQ2_0: (256, 66), GGMLType.MXFP4: (32, 17), GGMLType.NVFP4: (64, 36),
    GGMLType.Q1_0: (128, 18),
}
# tensor element types whose data is a typed array rather than raw blocks (as gguf-py has it)
_PLAIN: dict[GGMLType, np.dtype[Any]] = {
    GGMLType.F16: np.dtype("<f2"), GGMLType.F32: np.dtype("<f4"),
    GGMLType.F64: np.dtype("<f8"), GGMLType.I8: np.dtype("<i1"),
    GGMLType.I16: np.dtype("<i2"), GGMLType.I32: np.dtype("<i4"),
    GGMLType.I64: np.dtype("<i8"),
}


@dataclass(frozen=True)
class GGUFTensor:
    """One tensor of the table. ``shape`` is in GGUF order (``shape[0]`` the innermost, i.e. a
    matrix's columns); ``data`` is a read-only view of the file: a typed array for the plain
    types, else its raw blocks as ``uint8 [rows, bytes per row]``."""

    name: str
    tensor_type: GGMLType
    shape: tuple[int, ...]
    n_elements: int
    n_bytes: int
    data_offset: int
    data: np.ndarray


class _Cursor:
    """Reads little-endian values from ``buf`` (a memory map) forward from ``pos``."""

    def __init__(self, buf: mmap.mmap) -> None:
        self.buf = buf
        self.pos = 0

    def take(self, fmt: str) -> Any:
        value = struct.unpack_from(fmt, self.buf, self.pos)[0]
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        n = self.take("<Q")
        end = self.pos + n
        if end > len(self.buf):
            raise ValueError(f"a string of {n} bytes runs past the end of the file")
        text = self.buf[self.pos:end].decode("utf-8")
        self.pos = end
        return text

    def value(self, kind: int) -> Any:
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            return self.array()
        dt = _SCALARS.get(kind)
        if dt is None:
            raise ValueError(f"unknown GGUF value type {kind}")
        value = np.frombuffer(self.buf, dt, 1, self.pos)[0].item()
        self.pos += dt.itemsize
        return value

    def array(self) -> list[Any]:
        kind, count = self.take("<I"), self.take("<Q")
        if kind == _STRING:
            unpack, buf, pos, out = struct.unpack_from, self.buf, self.pos, []
            for _ in range(count):
                n = unpack("<Q", buf, pos)[0]
                pos += 8
                out.append(buf[pos:pos + n].decode("utf-8"))
                pos += n
            if pos > len(buf):
                raise ValueError("an array of strings runs past the end of the file")
            self.pos = pos
            return out
        if kind == _ARRAY:
            return [self.array() for _ in range(count)]
        dt = _SCALARS.get(kind)
        if dt is None:
            raise ValueError(f"unknown GGUF array element type {kind}")
        if self.pos + dt.itemsize * count > len(self.buf):
            raise ValueError("an array runs past the end of the file")
        values: list[Any] = np.frombuffer(self.buf, dt, count, self.pos).tolist()
        self.pos += dt.itemsize * count
        return values


class GGUFIndex:
    """The metadata (``metadata``: key -> Python value, arrays as lists) and the tensor table
    (``tensors``, in file order) of a GGUF file of version 2 or 3, little-endian. Raises
    ValueError for a file that is not one (a clear message; nothing is read past the end)."""

    def __init__(self, path: str | Path) -> None:
        with open(path, "rb") as f:
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            self._read()
        except struct.error as exc:
            raise ValueError(f"truncated GGUF header: {exc}") from exc

    def _read(self) -> None:
        cur = _Cursor(self._map)
        if len(self._map) < 24 or cur.take("<I") != MAGIC:
            raise ValueError("not a GGUF file (no GGUF magic)")
        version = cur.take("<I")
        if version not in (2, 3):
            raise ValueError(f"GGUF version {version} (Kiln reads versions 2 and 3, "
                             "little-endian)")
        n_tensors, n_kv = cur.take("<Q"), cur.take("<Q")
        self.version = version
        self.metadata: dict[str, Any] = {}
        for _ in range(n_kv):
            key = cur.string()
            self.metadata[key] = cur.value(cur.take("<I"))
        infos = []
        for _ in range(n_tensors):
            name = cur.string()
            dims = tuple(cur.take("<Q") for _ in range(cur.take("<I")))
            infos.append((name, dims, cur.take("<I"), cur.take("<Q")))
        align = int(self.metadata.get("general.alignment", DEFAULT_ALIGNMENT))
        if align <= 0 or align & (align - 1):
            raise ValueError(f"general.alignment {align} is not a power of two")
        self.data_offset = -(-cur.pos // align) * align
        self.tensors: list[GGUFTensor] = []
        seen: set[str] = set()
        for name, dims, raw_type, offset in infos:
            if name in seen:
                raise ValueError(f"tensor {name!r} appears twice")
            seen.add(name)
            self.tensors.append(self._tensor(name, dims, raw_type, offset))

    def _tensor(self, name: str, dims: tuple[int, ...], raw_type: int,
                offset: int) -> GGUFTensor:
        try:
            kind = GGMLType(raw_type)
        except ValueError as exc:
            raise ValueError(f"tensor {name!r} has unknown type {raw_type}") from exc
        block, type_size = GGML_BLOCK_SIZES[kind]
        n = int(np.prod(dims, dtype=np.int64)) if dims else 1
        if dims and dims[0] % block:
            raise ValueError(f"tensor {name!r}: {dims[0]} columns are not whole {kind.name} "
                             "blocks")
        n_bytes = n * type_size // block
        start = self.data_offset + offset
        if start + n_bytes > len(self._map):
            raise ValueError(f"tensor {name!r} runs past the end of the file")
        shape = tuple(reversed(dims))
        plain = _PLAIN.get(kind)
        if plain is not None:
            data = np.frombuffer(self._map, plain, n, start).reshape(shape)
        else:
            rows = (*shape[:-1], shape[-1] // block * type_size) if shape else (n_bytes,)
            data = np.frombuffer(self._map, np.uint8, n_bytes, start).reshape(rows)
        return GGUFTensor(name, kind, dims, n, n_bytes, start, data)
