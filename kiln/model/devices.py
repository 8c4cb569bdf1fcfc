"""The torch device and dtypes a model runs on: the settings' and the compute plan's names
(``kiln.model.native.plan``) as torch objects."""

from __future__ import annotations

import torch

from kiln.model.native.plan import DTYPE_ALIASES, dtype_name


def resolve_device(device: str | None) -> torch.device:
    """``"auto"``/None: CUDA when available, else the CPU; a named device must exist."""
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} requested but CUDA is not available")
    return dev


def resolve_dtype(dtype: str | None, device: torch.device) -> torch.dtype:
    """``"float32"``/``"bfloat16"``/``"float16"`` or the default: bf16 on CUDA, fp32 else."""
    return torch_dtype(dtype_name(dtype, device.type))


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a plan's ``dtype``/``kv_dtype`` name (or a setting's alias)."""
    dtype: torch.dtype = getattr(torch, DTYPE_ALIASES[name])
    return dtype
