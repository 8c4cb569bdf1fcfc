"""The Triton twins of ``counter_hash.py`` (uint32 lanes), inlined by the Triton sampler.

Kept apart from the torch version so that only a process that runs Triton kernels imports
Triton (on the CPU its library alone was 66 MiB of a server's resident memory).
"""

# Triton @jit functions cannot carry Python type annotations (Triton reads them itself).
# mypy: disable-error-code="untyped-decorator,no-untyped-def"
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _tl_rotl(x, r: tl.constexpr):
    return (x << r) | (x >> (32 - r))


@triton.jit
def _absorb(h, k):
    k = k * 0xCC9E2D51
    k = _tl_rotl(k, 15)
    k = k * 0x1B873593
    h = h ^ k
    h = _tl_rotl(h, 13)
    return h * 5 + 0xE6546B64


@triton.jit
def _fmix(h):
    h = h ^ (h >> 16)
    h = h * 0x85EBCA6B
    h = h ^ (h >> 13)
    h = h * 0xC2B2AE35
    return h ^ (h >> 16)


@triton.jit
def tl_row_state(s_lo, s_hi, t_lo, t_hi):
    """Triton twin of ``row_state``: arguments are uint32 scalars; returns uint32."""
    h = s_lo ^ s_lo
    h = _absorb(h, s_lo)
    h = _absorb(h, s_hi)
    h = _absorb(h, t_lo)
    h = _absorb(h, t_hi)
    return h


@triton.jit
def tl_uniform(state, tok):
    """Triton twin of ``counter_uniform`` for one row: ``state`` from ``tl_row_state`` (uint32),
    ``tok`` uint32 token ids. Returns float32 in (0, 1)."""
    h = _absorb(state, tok)
    h = _fmix(h ^ 20)
    return ((h >> 9).to(tl.float32) + 0.5) * (1.0 / 8388608.0)
