"""Counter-based uniform random numbers for sampling: u = U(seed, step, token id).

The function is a murmur3_32-style hash of five 32-bit words
``[seed_lo, seed_hi, step_lo, step_hi, token]`` followed by the murmur3 finalizer. It uses only
32-bit wrapping multiply, xor, add, shifts and rotates, so Triton (native ``uint32`` lanes) and
torch (``int64`` lanes masked to 32 bits, with multiplies split into 16-bit halves so nothing
overflows ``int64``) produce the same bits. The top 23 bits map to ``(0, 1)``, exclusive at both
ends: ``u = ((h >> 9) + 0.5) / 2**23``. (23, not 24: ``(h >> 8) + 0.5`` needs 25 significant bits,
float32 has 24, and its top value would round to exactly 1.0, making the Gumbel noise infinite;
with 23 bits every value is exact in float32.) A row's numbers depend on nothing but its own seed, step
and the token id, so sampling is batch-invariant and backend-invariant.

The Triton twins are in ``counter_hash_triton.py``: importing Triton maps its 66 MiB compiler
library into the process, which a CPU server (C sampler) never needs.
"""

from __future__ import annotations

import torch

_M32 = 0xFFFFFFFF
_C1 = 0xCC9E2D51
_C2 = 0x1B873593
_F1 = 0x85EBCA6B
_F2 = 0xC2B2AE35
_N = 0xE6546B64
_NUM_WORDS = 5


# --------------------------------------------------------------------------- torch (int64 lanes)
def _mul32(a: torch.Tensor, b: int) -> torch.Tensor:
    """(a * b) mod 2**32 for a in [0, 2**32) without overflowing int64."""
    lo = a * (b & 0xFFFF)
    hi = ((a * (b >> 16)) & 0xFFFF) << 16
    return (lo + hi) & _M32


def _rotl32(x: torch.Tensor, r: int) -> torch.Tensor:
    return ((x << r) & _M32) | (x >> (32 - r))


def _absorb_t(h: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    k = _mul32(_rotl32(_mul32(k, _C1), 15), _C2)
    h = _rotl32(h ^ k, 13)
    return (_mul32(h, 5) + _N) & _M32


def _fmix_t(h: torch.Tensor) -> torch.Tensor:
    h = h ^ (h >> 16)
    h = _mul32(h, _F1)
    h = h ^ (h >> 13)
    h = _mul32(h, _F2)
    return h ^ (h >> 16)


def split_u64(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """int64 tensor (any bits) -> (low 32 bits, high 32 bits), each int64 in [0, 2**32)."""
    x = x.to(torch.int64)
    return x & _M32, (x >> 32) & _M32


def row_state(seeds: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """The hash state after absorbing (seed, step): int64 [B] in [0, 2**32)."""
    s_lo, s_hi = split_u64(seeds)
    t_lo, t_hi = split_u64(steps)
    h = torch.zeros_like(s_lo)
    for word in (s_lo, s_hi, t_lo, t_hi):
        h = _absorb_t(h, word)
    return h


def counter_hash(seeds: torch.Tensor, steps: torch.Tensor, vocab: int) -> torch.Tensor:
    """32-bit hash for every (row, token id): int64 [B, V] in [0, 2**32)."""
    if seeds.shape != steps.shape or seeds.dim() != 1:
        raise ValueError("seeds and steps must be 1-D tensors of the same shape")
    h = row_state(seeds, steps)[:, None]
    tok = torch.arange(vocab, device=seeds.device, dtype=torch.int64)[None, :]
    h = _absorb_t(h, tok)
    return _fmix_t(h ^ _NUM_WORDS * 4)


def counter_uniform_at(
    seeds: torch.Tensor, steps: torch.Tensor, token_ids: torch.Tensor
) -> torch.Tensor:
    """The same numbers as ``counter_uniform`` for chosen (row seed, row step, token id) triples,
    all 1-D of one length: float32 [N]. Lets a filtered row hash only its surviving tokens."""
    h = _absorb_t(row_state(seeds, steps), token_ids.to(torch.int64))
    return hash_to_uniform(_fmix_t(h ^ _NUM_WORDS * 4))


def counter_uniform(seeds: torch.Tensor, steps: torch.Tensor, vocab: int) -> torch.Tensor:
    """Uniform numbers in (0, 1), float32 [B, V], a pure function of (seed, step, token id).

    On the CPU the C library computes them (the same bits, ~40 tensor passes fewer); the torch
    lanes below are the reference and the fallback."""
    if seeds.device.type == "cpu" and steps.device.type == "cpu" and seeds.dim() == 1 \
            and seeds.shape == steps.shape:
        from kiln_kernels.sampling.native import counter_uniform_native

        native = counter_uniform_native(seeds, steps, vocab)
        if native is not None:
            return native
    return counter_uniform_torch(seeds, steps, vocab)


def counter_uniform_torch(seeds: torch.Tensor, steps: torch.Tensor, vocab: int) -> torch.Tensor:
    """``counter_uniform`` in torch int64 lanes (any device)."""
    return hash_to_uniform(counter_hash(seeds, steps, vocab))


def hash_to_uniform(h: torch.Tensor) -> torch.Tensor:
    """32-bit hashes (int64 in [0, 2**32)) -> float32 in (0, 1) from their top 23 bits."""
    return ((h >> 9).to(torch.float32) + 0.5) * (1.0 / 8388608.0)
