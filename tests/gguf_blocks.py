"""gguf-py's dequantization, the reference the tests check raw GGML blocks against (the blocks
themselves come from ``kiln_kernels.testing.random_raw``)."""

from __future__ import annotations

import gguf
import numpy as np
import torch


def gguf_dequantize(raw: torch.Tensor, ggml_type: str) -> torch.Tensor:
    """gguf-py's float32 weights of raw rows ``[rows, bytes]``."""
    qtype = getattr(gguf.GGMLQuantizationType, ggml_type)
    out = gguf.quants.dequantize(raw.numpy(), qtype)
    return torch.from_numpy(np.asarray(out, dtype=np.float32).copy()).reshape(raw.shape[0], -1)
