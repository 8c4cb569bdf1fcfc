"""The C grammar token mask (``kiln_kernels/cpu/sampling/token_mask.c``) for float32 CPU logits."""

from __future__ import annotations

import torch

from ..cpu import KernelBuildError, library


def apply_token_mask_native(logits: torch.Tensor, masks: torch.Tensor, rows: list[int]) -> bool:
    """In place, as :func:`..reference.apply_token_mask_ref`; False (nothing done) where the C
    library cannot be built here or the tensors are not float32 / int32 on the CPU."""
    if (logits.device.type != "cpu" or logits.dtype != torch.float32 or logits.dim() != 2
            or logits.stride(1) != 1 or masks.dtype != torch.int32 or masks.dim() != 2
            or masks.shape[0] != len(rows)):
        return False
    try:
        lib = library()
    except KernelBuildError:
        return False
    if not rows:
        return True
    b = int(logits.shape[0])
    if any(not 0 <= i < b for i in rows):
        raise IndexError(f"token mask: a row index outside 0..{b - 1}")
    masks = masks.contiguous()
    index = torch.tensor(rows, dtype=torch.int64)
    lib.kiln_apply_token_mask(logits.data_ptr(), logits.stride(0), int(logits.shape[1]),
                              masks.data_ptr(), int(masks.shape[1]), index.data_ptr(), len(rows))
    return True
