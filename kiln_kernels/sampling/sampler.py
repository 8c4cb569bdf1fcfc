"""Fused sampler in Triton.

Two kernels and a torch pre-pass:

* ``_penalty_kernel`` (grid B x ceil(V / BLOCK)): penalties and temperature, writes the scaled
  float32 logits ``x`` (greedy rows keep temperature 1).
* ``filter_threshold`` (torch, shared with the reference): one per-row threshold folding top-k,
  min-p and top-p. top-k/top-p need an order statistic over the row, which we take with
  ``torch.topk`` / ``torch.sort`` instead of an in-kernel sort; it runs only when some row has a
  filter on, and it is exact, so the Triton path keeps exactly the reference's token set.
* ``_kernel`` (grid B, one program per row, looping over the vocabulary in blocks): masks by the
  threshold, adds Gumbel noise from the counter hash, keeps a running argmax (ties -> lowest id)
  and an online logsumexp of the kept tokens for the behaviour logprob.
"""

# Triton @jit functions cannot carry Python type annotations (Triton reads them itself).
# mypy: disable-error-code="untyped-decorator,no-untyped-def"
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .counter_hash import split_u64
from .counter_hash_triton import tl_row_state, tl_uniform
from .params import SamplingTensors
from .reference import check_inputs, filter_threshold, greedy_rows, repetition_factor


@triton.jit
def _penalty_kernel(
    logits_ptr, counts_ptr, prompt_ptr, x_ptr,
    temp_ptr, rep_ptr, freq_ptr, pres_ptr,
    V, stride_l, stride_c, stride_p,
    BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    valid = offs < V
    x = tl.load(logits_ptr + row * stride_l + offs, mask=valid, other=0.0).to(tl.float32)
    cnt = tl.load(counts_ptr + row * stride_c + offs, mask=valid, other=0)
    in_prompt = tl.load(prompt_ptr + row * stride_p + offs, mask=valid, other=0)
    r = tl.load(rep_ptr + row)
    t = tl.load(temp_ptr + row)
    f = tl.load(freq_ptr + row)
    pr = tl.load(pres_ptr + row)
    seen = (in_prompt != 0) | (cnt > 0)
    x = tl.where(seen, tl.where(x > 0, x / r, x * r), x)
    x = x - f * cnt.to(tl.float32)
    x = x - pr * (cnt > 0).to(tl.float32)
    x = x / t
    tl.store(x_ptr + row * V + offs, x, mask=valid)


@triton.jit
def _kernel(
    x_ptr, thr_ptr, greedy_ptr, key_ptr, tok_ptr, lp_ptr,
    V,
    BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)
    thr = tl.load(thr_ptr + row)
    greedy = tl.load(greedy_ptr + row) != 0
    s_lo = tl.load(key_ptr + row * 4 + 0).to(tl.uint32)
    s_hi = tl.load(key_ptr + row * 4 + 1).to(tl.uint32)
    t_lo = tl.load(key_ptr + row * 4 + 2).to(tl.uint32)
    t_hi = tl.load(key_ptr + row * 4 + 3).to(tl.uint32)
    state = tl_row_state(s_lo, s_hi, t_lo, t_hi)
    # Loop-carried scalars are typed tensors from the start so compiled Triton keeps one type.
    best = tl.full((), -float("inf"), tl.float32)
    best_idx = tl.full((), 0, tl.int32)
    m_run = tl.full((), -3.0e38, tl.float32)
    s_run = tl.full((), 0.0, tl.float32)
    for start in range(0, V, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        valid = offs < V
        x = tl.load(x_ptr + row * V + offs, mask=valid, other=-float("inf"))
        keep = valid & (x >= thr)
        u = tl_uniform(state, offs.to(tl.uint32))
        g = -tl.log(-tl.log(u))
        noisy = tl.where(greedy, x, x + g)
        score = tl.where(keep, noisy, -float("inf"))
        bmax = tl.max(score, axis=0)
        bidx = tl.argmax(score, axis=0) + start
        take = bmax > best
        best_idx = tl.where(take, bidx, best_idx)
        best = tl.where(take, bmax, best)
        kx = tl.where(keep, x, -float("inf"))
        m_new = tl.maximum(m_run, tl.max(kx, axis=0))
        s_run = s_run * tl.exp(m_run - m_new) + tl.sum(tl.exp(kx - m_new), axis=0)
        m_run = m_new
    x_tok = tl.load(x_ptr + row * V + best_idx)
    lp = x_tok - m_run - tl.log(s_run)
    lp = tl.where(greedy, 0.0, lp)
    tl.store(tok_ptr + row, best_idx.to(tl.int64))
    tl.store(lp_ptr + row, lp)


def _block(vocab: int) -> int:
    # One row per program streams the vocabulary; 1024 lanes keep loads wide on a GPU while the
    # loop trip count stays ~150 for a 150k vocabulary. Small vocabularies use one block.
    return min(1024, int(triton.next_power_of_2(max(vocab, 16))))


def sample_triton(logits: torch.Tensor, p: SamplingTensors) -> tuple[torch.Tensor, torch.Tensor]:
    """The Triton sampler; same contract and results as ``sample_reference``."""
    check_inputs(logits, p)
    b, v = logits.shape
    dev = logits.device
    for name in ("output_counts", "prompt_mask", "temperature", "seeds"):
        if getattr(p, name).device != dev:
            raise ValueError(f"SamplingTensors.{name} is on {getattr(p, name).device}, not {dev}")
    if b == 0:
        return (torch.empty(0, dtype=torch.int64, device=dev),
                torch.empty(0, dtype=torch.float32, device=dev))  # fmt: skip
    logits = logits.contiguous()
    counts = p.output_counts.contiguous()
    prompt = p.prompt_mask.contiguous().view(torch.uint8)
    greedy = greedy_rows(p)
    temp = torch.where(greedy, torch.ones_like(p.temperature), p.temperature).contiguous()
    rep = repetition_factor(p).contiguous()
    x = torch.empty((b, v), dtype=torch.float32, device=dev)
    block = _block(v)
    _penalty_kernel[(b, triton.cdiv(v, block))](
        logits, counts, prompt, x,
        temp, rep, p.frequency_penalty.contiguous(), p.presence_penalty.contiguous(),
        v, logits.stride(0), counts.stride(0), prompt.stride(0),
        BLOCK=block,
    )  # fmt: skip
    thr = filter_threshold(x, p).contiguous()
    s_lo, s_hi = split_u64(p.seeds)
    t_lo, t_hi = split_u64(p.steps)
    key = torch.stack([s_lo, s_hi, t_lo, t_hi], dim=1).contiguous()
    tokens = torch.empty(b, dtype=torch.int64, device=dev)
    logprobs = torch.empty(b, dtype=torch.float32, device=dev)
    _kernel[(b,)](x, thr, greedy.to(torch.int8).contiguous(), key, tokens, logprobs, v, BLOCK=block)
    return tokens, logprobs
