"""Torch references of the weight formats kept as the file's own blocks (the formats' tables
and the tiling itself: :mod:`kiln_kernels.tiling`).

``q4`` / ``q8`` (GGML Q4_0, Q4_1, Q8_0) are repacked at load with float32 scales
(:mod:`.reference`). Every other format keeps the GGUF's blocks byte for byte; its tiles are the
blocks of 4 rows one after another (``[N/4, K/qk, 4 * block_bytes]``), and its weights are
exactly gguf-py's ``dequantize`` (each format's arithmetic is exact but for at most one
rounding, which the kernels do alike: ``blocks_legacy.h``, ``blocks_k.h``, ``blocks_float.h``).
"""

from __future__ import annotations

import torch

from ..tiling import IQ4_VALUES, QK


def untile_raw(tiles: torch.Tensor, block: int) -> torch.Tensor:
    """Tiles -> the rows' blocks ``[N, nb, block]`` (the inverse of ``kiln_kernels.tiling.tile_blocks``)."""
    g, nb, _ = tiles.shape
    return tiles.reshape(g, nb, 4, block).transpose(1, 2).reshape(4 * g, nb, block).contiguous()


def _half(r: torch.Tensor, at: int) -> torch.Tensor:
    """The fp16 field at byte ``at`` of every block, float32 ``[N, nb, 1]``."""
    return r[..., at:at + 2].contiguous().view(torch.float16).to(torch.float32)


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """GGML's 32-weight nibble order: low nibbles are weights 0..15, high nibbles 16..31."""
    return torch.cat((qs & 0x0F, qs >> 4), dim=-1).to(torch.int32)


def _fifth_bits(qh: torch.Tensor) -> torch.Tensor:
    """uint8 ``[..., 4]`` (a little-endian uint32) -> bit j of it as int32 ``[..., 32]``."""
    word = qh[..., 0].to(torch.int64)
    for i in range(1, 4):
        word = word + (qh[..., i].to(torch.int64) << (8 * i))
    return ((word[..., None] >> torch.arange(32)) & 1).to(torch.int32)


def _scale_min(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K / Q5_K: the 8 six-bit scales and mins of the 12 packed bytes ``[..., 12]``."""
    s = s.to(torch.int32)
    d, m, md = s[..., 0:4], s[..., 4:8], s[..., 8:12]
    sc = torch.cat((d & 63, (md & 0x0F) | ((d >> 2) & 0x30)), dim=-1)
    mn = torch.cat((m & 63, (md >> 4) | ((m >> 2) & 0x30)), dim=-1)
    return sc.to(torch.float32), mn.to(torch.float32)


def _two_bits(qs: torch.Tensor) -> torch.Tensor:
    """Q2_K / Q3_K ``qs`` ``[N, nb, 64]`` -> int32 ``[N, nb, 256]``: weight 128 h + 32 s + i is
    bits 2s..2s+1 of byte 32 h + i."""
    n, nb, _ = qs.shape
    q = qs.reshape(n, nb, 2, 1, 32).to(torch.int32) >> (2 * torch.arange(4)).reshape(4, 1)
    return (q & 3).reshape(n, nb, 256)


def _dequantize_q2_q3(fmt: str, r: torch.Tensor) -> torch.Tensor:
    """Q2_K: (d * sc) * q - dmin * m (one rounding: the products are exact); Q3_K:
    (d * (sc - 32)) * (q - 4), q = two bits | the hmask bit << 2 (exact). ``[N, nb, 256]``."""
    n, nb, _ = r.shape
    if fmt == "q2_k":
        sm = r[..., :16].to(torch.int32)
        dl = (_half(r, 80) * (sm & 0x0F).to(torch.float32))[..., None]  # [N, nb, 16, 1]
        ml = (_half(r, 82) * (sm >> 4).to(torch.float32))[..., None]
        q = _two_bits(r[..., 16:80]).reshape(n, nb, 16, 16).to(torch.float32)
        return (dl * q - ml).reshape(n, nb, 256)
    s = r[..., 96:108].to(torch.int32)
    lo = torch.cat((s[..., :8] & 0x0F, s[..., :8] >> 4), dim=-1)
    hi = (s[..., 8:12, None] >> (2 * torch.arange(4))).transpose(-1, -2).reshape(n, nb, 16) & 3
    dl = (_half(r, 108) * ((lo | (hi << 4)) - 32).to(torch.float32))[..., None]
    hmask = r[..., :32].reshape(n, nb, 1, 32).to(torch.int32)
    bit = (hmask >> torch.arange(8).reshape(8, 1)) & 1  # [N, nb, 8, 32]: weight 32 b + i
    q = _two_bits(r[..., 32:96]) | (bit.reshape(n, nb, 256) << 2)
    return (dl * (q - 4).to(torch.float32).reshape(n, nb, 16, 16)).reshape(n, nb, 256)


def _dequantize_iq4(fmt: str, r: torch.Tensor) -> torch.Tensor:
    """IQ4_NL: d * value[q]; IQ4_XS: (d * (ls - 32)) * value[q], ls a sub-block's 6-bit scale
    (low 4 bits from scales_l, high 2 from scales_h). Every product is exact. ``[N, nb, qk]``."""
    n, nb, _ = r.shape
    values = torch.tensor(IQ4_VALUES, dtype=torch.float32)
    if fmt == "iq4_nl":
        return _half(r, 0) * values[_nibbles(r[..., 2:18])]
    lo = r[..., 4:8, None].to(torch.int32) >> torch.tensor([0, 4])  # [N, nb, 4, 2]
    hi = (r[..., 2].to(torch.int32) | (r[..., 3].to(torch.int32) << 8))[..., None] >> (
        2 * torch.arange(8))
    ls = (lo.reshape(n, nb, 8) & 0x0F) | ((hi & 3) << 4)
    dl = (_half(r, 0) * (ls - 32).to(torch.float32))[..., None]  # [N, nb, 8, 1]
    q = _nibbles(r[..., 8:136].reshape(n, nb, 8, 16))  # [N, nb, 8, 32]
    return (dl * values[q]).reshape(n, nb, 256)


def dequantize_raw(fmt: str, r: torch.Tensor) -> torch.Tensor:
    """Rows' blocks uint8 ``[N, nb, block]`` of a raw format -> float32 ``[N, nb * qk]``,
    computed as gguf-py computes them."""
    n, nb, _ = r.shape
    if fmt in ("q5_0", "q5_1"):
        d = _half(r, 0)
        at = 2 if fmt == "q5_0" else 4
        q = _nibbles(r[..., at + 4:at + 20]) | (_fifth_bits(r[..., at:at + 4]) << 4)
        w = d * (q - 16).to(torch.float32) if fmt == "q5_0" else \
            d * q.to(torch.float32) + _half(r, 2)
    elif fmt in ("q4_k", "q5_k"):
        sc, mn = _scale_min(r[..., 4:16])
        dd = (_half(r, 0) * sc)[..., None]  # [N, nb, 8, 1]: d * sc, exact
        dm = (_half(r, 2) * mn)[..., None]
        at = 16 if fmt == "q4_k" else 48
        qs = r[..., at:at + 128].reshape(n, nb, 4, 1, 32)
        q = torch.cat((qs & 0x0F, qs >> 4), dim=3).reshape(n, nb, 8, 32).to(torch.int32)
        if fmt == "q5_k":
            qh = r[..., 16:48].reshape(n, nb, 1, 32).to(torch.int32)
            q = q | (((qh >> torch.arange(8).reshape(8, 1)) & 1) << 4)
        w = dd * q.to(torch.float32) - dm
    elif fmt == "q6_k":
        ql = r[..., :128].reshape(n, nb, 2, 1, 64)
        lo = torch.cat((ql & 0x0F, ql >> 4), dim=3).reshape(n, nb, 256).to(torch.int32)
        qh = r[..., 128:192].reshape(n, nb, 2, 1, 32).to(torch.int32)
        hi = torch.cat([(qh >> s) & 3 for s in (0, 2, 4, 6)], dim=3).reshape(n, nb, 256)
        q = ((lo | (hi << 4)) - 32).to(torch.float32).reshape(n, nb, 16, 16)
        sc = r[..., 192:208].contiguous().view(torch.int8).to(torch.float32)
        w = (_half(r, 208) * sc)[..., None] * q
    elif fmt in ("q2_k", "q3_k"):
        w = _dequantize_q2_q3(fmt, r)
    elif fmt in ("iq4_nl", "iq4_xs"):
        w = _dequantize_iq4(fmt, r)
    elif fmt == "f16":
        w = r.contiguous().view(torch.float16).to(torch.float32)
    elif fmt == "bf16":
        w = (r.contiguous().view(torch.int16).to(torch.int32) << 16).view(torch.float32)
    elif fmt == "f32":
        w = r.contiguous().view(torch.float32)
    else:
        raise ValueError(f"{fmt!r} is not a raw block format")
    return w.reshape(n, nb * QK[fmt])
