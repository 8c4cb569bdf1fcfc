"""The grammar mask in C (``kiln_kernels/cpu/sampling/token_mask.c``), for float32 CPU logits.

Why C beside the torch reference: on the CPU the reference's unpack-and-fill (like the numpy
route it replaced) cost ~0.18 ms a row on the 2-core VM, a measurable part of a decode step at 8
constrained rows; the C loop skips all-allowed words and writes only the disallowed ids (0.16 ms
for 8 rows). Same contract and same bits as ``reference.apply_token_bitmask_ref``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..cpu import KernelBuildError, library


def apply_token_bitmask_native(logits: torch.Tensor, bitmask: torch.Tensor,
                               rows: Sequence[int]) -> bool:
    """In place: row ``rows[j]`` of ``logits`` masked by ``bitmask[j]``; False (nothing done)
    where the C library cannot be built here or the tensors are not float32 / int32 CPU tensors
    of the contract's shapes (the caller then runs the reference)."""
    if (logits.device.type != "cpu" or logits.dtype != torch.float32 or logits.dim() != 2
            or logits.stride(1) != 1 or bitmask.device.type != "cpu"
            or bitmask.dtype != torch.int32 or bitmask.dim() != 2
            or bitmask.shape[0] != len(rows)):
        return False
    try:
        lib = library()
    except KernelBuildError:
        return False
    if len(rows) == 0:
        return True
    b = int(logits.shape[0])
    if any(not 0 <= int(i) < b for i in rows):
        raise IndexError(f"grammar mask: a row index outside 0..{b - 1}")
    bitmask = bitmask.contiguous()
    index = torch.tensor([int(i) for i in rows], dtype=torch.int64)
    lib.kiln_apply_token_mask(logits.data_ptr(), logits.stride(0), int(logits.shape[1]),
                              bitmask.data_ptr(), int(bitmask.shape[1]), index.data_ptr(),
                              len(rows))
    return True
