"""Random but valid raw GGML blocks for tests and benchmarks (gguf-py cannot quantize the
K-quant types): random quants, scales and mins, and fp16 fields set so the weights stay in a
chosen range; and the model header and llama3 rope divisors of a GGUF file they write
(``add_model_header``, ``llama3_rope_freqs``).

Why it lives here: tests/ and bench/ both need these and neither may import the other, so
the generator sits beside the formats it fills. Only tests and benches import it; no serving
module does (tests/test_import_boundaries.py checks that)."""

from __future__ import annotations

import math
from typing import Any

import torch
from kiln_kernels.quant import GGML_TYPES

# byte offsets of each type's fp16 fields (random bytes there could be inf/nan or huge)
HALF_FIELDS = {"Q4_0": (0,), "Q4_1": (0, 2), "Q8_0": (0,), "Q5_0": (0,), "Q5_1": (0, 2),
               "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,), "Q2_K": (80, 82), "Q3_K": (108,),
               "IQ4_NL": (0,), "IQ4_XS": (0,)}
# |w| <= amp * (a small factor) when the fp16 fields are amp times these (quant ranges: Q4_0
# |q - 8| <= 8, Q8_0 |q| <= 128; Q5_0
# |q - 16| <= 16; Q5_1 q <= 31 with m = -amp; Q4_K / Q5_K 6-bit scale x 4/5-bit q, 6-bit min;
# Q6_K scales limited to |sc| <= 16 here, |q - 32| <= 32; Q2_K 4-bit scale x 2-bit q, 4-bit
# min; Q3_K |sc - 32| <= 32 x |q - 4| <= 4; IQ4_NL |value| <= 127; IQ4_XS |ls - 32| <= 32 x
# |value| <= 127)
_UNIT = {"Q4_0": (1 / 8,), "Q4_1": (1 / 8, -1.0), "Q8_0": (1 / 128,), "Q5_0": (1 / 16,),
         "Q5_1": (1 / 16, -1.0), "Q4_K": (1 / 504, 1 / 63),
         "Q5_K": (1 / 1008, 1 / 63), "Q6_K": (1 / 512,), "Q2_K": (1 / 45, 1 / 15),
         "Q3_K": (1 / 128,), "IQ4_NL": (1 / 127,), "IQ4_XS": (1 / 4064,)}


def random_raw(ggml_type: str, rows: int, k: int, seed: int = 0,
               amp: float | None = None) -> torch.Tensor:
    """Raw GGML rows (uint8 ``[rows, k / qk * block]``). ``amp`` None: fp16 scales of either
    sign, |d| in [1e-3, 2.1e-2] (mins negative) over fully random bytes; else weights of about +-amp (Q6_K's
    scales then in -16..16). F16 / BF16 / F32: normal floats of deviation 0.1 (or amp)."""
    gen = torch.Generator().manual_seed(seed)
    qk, size = GGML_TYPES[ggml_type]
    nb = k // qk
    if ggml_type in ("F16", "BF16", "F32"):
        w = torch.randn(rows, k, generator=gen) * (0.1 if amp is None else amp)
        dtype = {"F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32}[ggml_type]
        return w.to(dtype).contiguous().view(torch.uint8).reshape(rows, -1)
    raw = torch.randint(0, 256, (rows, nb, size), dtype=torch.uint8, generator=gen)
    if amp is not None and ggml_type == "Q6_K":
        sc = torch.randint(-16, 17, (rows, nb, 16), generator=gen, dtype=torch.int8)
        raw[:, :, 192:208] = sc.view(torch.uint8)
    for i, at in enumerate(HALF_FIELDS[ggml_type]):
        jitter = torch.rand(rows, nb, generator=gen)
        if amp is None:
            v = jitter * 0.02 + 1e-3
            if i == 1 and ggml_type in ("Q4_1", "Q5_1"):
                v = -5 * v  # Q4_1's and Q5_1's m is the block's minimum
            elif i == 0:  # scales of either sign (llama.cpp's Q5_0 / Q8_0 d is often < 0)
                v = torch.where(torch.rand(rows, nb, generator=gen) < 0.5, -v, v)
        else:
            v = (0.5 + jitter) * amp * _UNIT[ggml_type][i]
        raw[:, :, at:at + 2] = v.to(torch.float16).view(torch.uint8).reshape(rows, nb, 2)
    return raw.reshape(rows, -1)


def add_model_header(writer: Any, *, layers: int, context: int, hidden: int, ffn: int,
                     heads: int, kv_heads: int, rms_eps: float, rope_theta: float,
                     head_dim: int | None = None) -> None:
    """The architecture's hyperparameters, as llama.cpp's converter writes them, on a
    ``gguf.GGUFWriter`` (its architecture given when it was made)."""
    writer.add_block_count(layers)
    writer.add_context_length(context)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    if head_dim is not None:
        writer.add_key_length(head_dim)
    writer.add_layer_norm_rms_eps(rms_eps)
    writer.add_rope_freq_base(rope_theta)


def llama3_rope_freqs(head_dim: int, theta: float, factor: float, low_freq_factor: float,
                      high_freq_factor: float, original_context: int) -> list[float]:
    """The ``rope_freqs.weight`` llama.cpp's converter writes for a ``llama3`` rope_scaling:
    one divisor per rotary frequency (1 for short wavelengths, ``factor`` for long ones, blended
    between), for GGUF files that tests and benches write."""
    out = []
    for i in range(0, head_dim, 2):
        wavelen = 2 * math.pi * theta ** (i / head_dim)
        if wavelen < original_context / high_freq_factor:
            out.append(1.0)
        elif wavelen > original_context / low_freq_factor:
            out.append(factor)
        else:
            smooth = (original_context / wavelen - low_freq_factor) / (
                high_freq_factor - low_freq_factor)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return out
