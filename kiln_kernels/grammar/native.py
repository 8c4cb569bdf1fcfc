"""The grammar mask in C (``kiln_kernels/cpu/sampling/token_mask.c``), for float32 CPU logits.

Why C beside the torch reference: on the CPU the reference's unpack-and-fill (like the numpy
route it replaced) cost ~0.18 ms a row on the 2-core VM, a measurable part of a decode step at 8
constrained rows; the C loop skips all-allowed words and writes only the disallowed ids (0.16 ms
for 8 rows). Same contract and same bits as ``reference.apply_token_bitmask_ref``.

Numpy arrays and CPU torch tensors alike; importing this module does not import torch.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..cpu import KernelBuildError, library
from ..cpu.arrays import Array, addr, contiguous, dtype_name, on_cpu, shape, strides


def apply_token_bitmask_native(logits: Array, bitmask: Array, rows: Sequence[int]) -> bool:
    """In place: row ``rows[j]`` of ``logits`` masked by ``bitmask[j]``; False (nothing done)
    where the C library cannot be built here or the arrays (numpy arrays or CPU torch tensors)
    are not float32 / int32 of the contract's shapes (the caller then runs the reference)."""
    dims = shape(logits)
    if (not on_cpu(logits) or dtype_name(logits) != "float32" or len(dims) != 2
            or strides(logits)[1] != 1 or not on_cpu(bitmask)
            or dtype_name(bitmask) != "int32" or len(shape(bitmask)) != 2
            or shape(bitmask)[0] != len(rows)):
        return False
    try:
        lib = library()
    except KernelBuildError:
        return False
    if len(rows) == 0:
        return True
    b = dims[0]
    if any(not 0 <= int(i) < b for i in rows):
        raise IndexError(f"grammar mask: a row index outside 0..{b - 1}")
    bitmask = contiguous(bitmask)
    index = np.array([int(i) for i in rows], dtype=np.int64)
    lib.kiln_apply_token_mask(addr(logits), strides(logits)[0], dims[1], addr(bitmask),
                              shape(bitmask)[1], addr(index), len(rows))
    return True
