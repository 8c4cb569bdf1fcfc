"""What the C bindings need of an array, for numpy arrays and CPU torch tensors alike, without
importing torch: its address, element type name, shape, strides in elements, whether it is
dense, and an int / float copy of it in numpy.

An argument that is not a ``numpy.ndarray`` is taken for a torch tensor (so torch is already
imported where one comes). Element types go by name: ``"float32"``, ``"float16"``, ``"int64"``,
``"int32"``, ``"uint8"`` (a torch dtype prints as ``"torch.float32"``; the prefix is dropped).
"""

from __future__ import annotations

from typing import Any

import numpy as np

Array = Any  # a numpy array or a CPU torch tensor (torch is not imported here to name it)


def is_numpy(a: Array) -> bool:
    return isinstance(a, np.ndarray)


def addr(a: Array | None) -> int:
    """The address of ``a``'s first element (0 for None)."""
    if a is None:
        return 0
    if isinstance(a, np.ndarray):
        return int(a.ctypes.data)
    return int(a.data_ptr())


def dtype_name(a: Any) -> str:
    """``a``'s element type by name (``a``: an array, a tensor, or a numpy or torch dtype)."""
    if isinstance(a, type):  # numpy.float32 and the like
        return np.dtype(a).name
    dtype = a if isinstance(a, np.dtype) else getattr(a, "dtype", a)
    return dtype.name if isinstance(dtype, np.dtype) else str(dtype).removeprefix("torch.")


def shape(a: Array) -> tuple[int, ...]:
    return tuple(int(s) for s in a.shape)


def strides(a: Array) -> tuple[int, ...]:
    """Strides in elements (numpy keeps them in bytes)."""
    if isinstance(a, np.ndarray):
        return tuple(int(s) // a.itemsize for s in a.strides)
    return tuple(int(s) for s in a.stride())


def on_cpu(a: Array) -> bool:
    return isinstance(a, np.ndarray) or a.device.type == "cpu"


def dense(shape_: tuple[int, ...], strides_: tuple[int, ...]) -> bool:
    """Whether a layout is C-contiguous (torch's rule: axes of one element may have any
    stride; an empty array is dense)."""
    if any(n == 0 for n in shape_):
        return True
    expect = 1
    for n, s in zip(reversed(shape_), reversed(strides_), strict=True):
        if n != 1:
            if s != expect:
                return False
            expect *= n
    return True


def is_contiguous(a: Array) -> bool:
    if isinstance(a, np.ndarray):
        return bool(a.flags.c_contiguous)
    return bool(a.is_contiguous())


def contiguous(a: Array) -> Array:
    """``a`` itself where dense, else a dense copy (of the same kind)."""
    if isinstance(a, np.ndarray):
        return np.ascontiguousarray(a)
    return a.contiguous()


def as_numpy(a: Array, dtype: str) -> np.ndarray:
    """A C-contiguous numpy array of ``a`` in ``dtype`` (``a`` itself where it already is one; a
    torch tensor converted by torch, ``.to(dtype).contiguous()``, then shared, not copied)."""
    if not isinstance(a, np.ndarray):
        import torch

        a = a.detach().to(device="cpu", dtype=getattr(torch, dtype)).contiguous().numpy()
    return np.ascontiguousarray(a, dtype=dtype)


def is_float32_dense(a: Array) -> bool:
    """A C-contiguous float32 array in CPU memory (what the C code reads and writes in place)."""
    return dtype_name(a) == "float32" and on_cpu(a) and is_contiguous(a)


ALIGN = 64  # bytes: a cache line, and one AVX-512 vector


def aligned_empty(shape_: int | tuple[int, ...], dtype: str = "float32",
                  zero: bool = False) -> np.ndarray:
    """An uninitialised (``zero``: zeroed) C-contiguous array whose first element sits on a
    64-byte boundary, as torch's CPU allocator places a tensor's. numpy's allocations are only
    16-byte aligned, and the C step's vectors then straddle two cache lines at every load and
    store of its scratch: with numpy's scratch and logits the default model's 8-row decode step
    took 10.7-11.2 ms in some processes against 7.7-8.5 ms (the address decides), measured
    with the engine's runner in one process per run."""
    dt = np.dtype(dtype)
    count = int(np.prod(shape_))
    raw = (np.zeros if zero else np.empty)(count * dt.itemsize + ALIGN, dtype=np.uint8)
    start = (-raw.ctypes.data) % ALIGN
    return raw[start:start + count * dt.itemsize].view(dt).reshape(shape_)

