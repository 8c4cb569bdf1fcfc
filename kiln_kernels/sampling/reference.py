"""Plain-torch sampling: the reference the Triton sampler is tested against, and the CPU path.

Order of operations (docs/behavior.md §5.3, with docs/decisions.md "penalties and greedy"):

1. penalties on the raw logits, for every row (greedy too):
   repetition (HF/vLLM: a token seen in prompt or output has a positive logit divided by r and a
   non-positive one multiplied by r; active when r is finite, > 0 and != 1), then
   frequency (``-= f * count``) and presence (``-= p * (count > 0)``) over the output counts.
2. greedy rows (temperature < 1e-5, or top_k == 1) take argmax (ties -> lowest id); logprob 0.
3. other rows: x = penalized / temperature, then the filters top-k -> min-p -> top-p. Every filter
   keeps the tokens whose scaled logit is >= a per-row threshold, so they fold into one threshold
   (``filter_threshold``); tokens tied with the threshold are all kept:
     top-k: the k-th largest x (off when k <= 0 or k >= V);
     min-p: max(x) + log(min(min_p, 1)), i.e. p >= min_p * p_max (off when min_p <= 0 or not
            finite; above 1 it keeps what 1 keeps, the top token and its ties, as no filter
            may leave a row without a token);
     top-p: over the tokens still kept, sorted by descending probability, the x of the first
            token at which the cumulative probability reaches top_p (off when top_p <= 0 or >= 1).
4. Gumbel-max: token = argmax over kept tokens of x + g, g = -log(-log(u)),
   u = counter_uniform(seed, step, token id); logprob = x[token] - logsumexp(kept x).
"""

from __future__ import annotations

import torch

from .candidates import sample_topk_rows
from .counter_hash import counter_uniform, counter_uniform_at
from .params import SamplingTensors
from .top_p import top_p_threshold

GREEDY_TEMPERATURE = 1e-5


def check_inputs(logits: torch.Tensor, p: SamplingTensors) -> None:
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2:
        raise ValueError("logits must be a 2-D tensor [B, V]")
    if logits.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"logits dtype must be float32/float16/bfloat16, got {logits.dtype}")
    b, v = logits.shape
    if v == 0:
        raise ValueError("vocabulary size must be > 0")
    p.validate(b, v)


def greedy_rows(p: SamplingTensors) -> torch.Tensor:
    """bool [B]: rows that take argmax (temperature ~ 0, or top_k == 1)."""
    return (p.temperature < GREEDY_TEMPERATURE) | (p.top_k == 1)


def repetition_factor(p: SamplingTensors) -> torch.Tensor:
    """float32 [B]: the repetition penalty with inactive values (non-finite, <= 0) mapped to 1."""
    return active_repetition(p.repetition_penalty)


def active_repetition(r: torch.Tensor) -> torch.Tensor:
    """``r`` with inactive repetition penalties (non-finite, <= 0) mapped to 1."""
    return torch.where(torch.isfinite(r) & (r > 0), r, torch.ones_like(r))


def apply_penalties(logits: torch.Tensor, p: SamplingTensors) -> torch.Tensor:
    """Repetition, frequency and presence penalties; returns a new float32 [B, V] tensor.

    Only seen tokens (in the prompt mask or generated) change, so the arithmetic runs on those
    entries alone: per entry, x -> x / r (x > 0) or x * r, then - frequency * count, then
    - presence * (count > 0), in float32. An unseen entry would get x - f*0 - p*0 = x (the
    penalties are finite), so this equals the dense formula entry for entry.
    """
    x = logits.to(torch.float32, copy=True)
    counts = p.output_counts
    rows, ids = torch.nonzero(p.prompt_mask | (counts > 0), as_tuple=True)
    if rows.numel() == 0:
        return x
    v = x[rows, ids]
    r = repetition_factor(p)[rows]
    c = counts[rows, ids].to(torch.float32)
    v = torch.where(v > 0, v / r, v * r)
    v = v - p.frequency_penalty[rows] * c
    v = v - p.presence_penalty[rows] * (c > 0).to(torch.float32)
    x[rows, ids] = v
    return x


def scale_temperature(x: torch.Tensor, p: SamplingTensors) -> torch.Tensor:
    """Divide sampled rows by their temperature; greedy rows are left as they are."""
    t = torch.where(greedy_rows(p), torch.ones_like(p.temperature), p.temperature)
    return x / t[:, None]


def filter_threshold(x: torch.Tensor, p: SamplingTensors) -> torch.Tensor:
    """float32 [B]: keep token j of row i iff x[i, j] >= result[i] (-inf: keep everything).

    ``x`` are the penalized, temperature-scaled logits. Greedy rows get -inf.
    """
    b, v = x.shape
    thr = torch.full((b,), float("-inf"), dtype=torch.float32, device=x.device)
    sampled = ~greedy_rows(p)
    k = p.top_k.to(torch.int64)
    k_on = sampled & (k > 0) & (k < v)
    mp = p.min_p
    mp_on = sampled & torch.isfinite(mp) & (mp > 0)
    tp = p.top_p
    tp_on = sampled & (tp > 0) & (tp < 1)
    if not bool((k_on | mp_on | tp_on).any()):
        return thr
    if bool(k_on.any()):
        kmax = int(k[k_on].max())
        top = torch.topk(x, kmax, dim=1).values
        kth = top.gather(1, (k.clamp(1, kmax) - 1)[:, None]).squeeze(1)
        thr = torch.where(k_on, kth, thr)
    if bool(mp_on.any()):
        m = x.max(dim=1).values
        safe = torch.where(mp_on, mp.clamp(max=1.0), torch.ones_like(mp))
        thr = torch.where(mp_on, torch.maximum(thr, m + torch.log(safe)), thr)
    if bool(tp_on.any()):
        rows = torch.nonzero(tp_on).squeeze(1)
        thr[rows] = torch.maximum(thr[rows], top_p_threshold(x[rows], thr[rows], tp[rows]))
    return thr



def gumbel_noise(p: SamplingTensors, vocab: int) -> torch.Tensor:
    u = counter_uniform(p.seeds, p.steps, vocab)
    return -torch.log(-torch.log(u))


# Below this fraction of surviving tokens, noise is hashed only for the survivors (top-k / top-p /
# min-p rows keep a handful of the ~50k-150k ids); the numbers are the same either way.
SPARSE_FRACTION = 0.125


def gumbel_scores(
    xs: torch.Tensor, keep: torch.Tensor, p: SamplingTensors, neg_inf: torch.Tensor
) -> torch.Tensor:
    """x + Gumbel noise where kept, -inf elsewhere (noise from the counter hash)."""
    rows, vocab = xs.shape
    kept = torch.nonzero(keep)
    if kept.shape[0] > SPARSE_FRACTION * rows * vocab:
        return torch.where(keep, xs + gumbel_noise(p, vocab), neg_inf)
    r, t = kept[:, 0], kept[:, 1]
    u = counter_uniform_at(p.seeds[r], p.steps[r], t)
    scores = neg_inf.clone()
    scores[r, t] = xs[r, t] - torch.log(-torch.log(u))
    return scores


def penalties_active(p: SamplingTensors) -> bool:
    """Whether any row has a penalty that can change its logits (a cheap host-side check)."""
    return bool(
        (p.presence_penalty != 0).any()
        or (p.frequency_penalty != 0).any()
        or (repetition_factor(p) != 1).any()
    )


def sample_reference(logits: torch.Tensor, p: SamplingTensors) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (token ids int64 [B], logprob float32 [B] of each token under the filtered,
    temperature-scaled distribution; 0.0 for greedy rows).

    Greedy rows never pay for noise or filtering: they take the argmax of the penalized logits
    (ties to the lowest id). The counter-hash noise is drawn only for sampled rows, and it depends
    only on (seed, step, token id), so a row's token does not depend on its batch.
    """
    check_inputs(logits, p)
    b = logits.shape[0]
    x = apply_penalties(logits, p) if penalties_active(p) else logits.to(torch.float32)
    greedy = greedy_rows(p)
    logprob = torch.zeros(b, dtype=torch.float32, device=logits.device)
    if bool(greedy.all()):
        return torch.argmax(x, dim=1).to(torch.int64), logprob
    tokens = torch.zeros(b, dtype=torch.int64, device=logits.device)
    if bool(greedy.any()):
        g = torch.nonzero(greedy).squeeze(1)
        tokens[g] = torch.argmax(x[g], dim=1)
    rows = torch.nonzero(~greedy).squeeze(1)
    sub = p.select(rows)
    xs = scale_temperature(x[rows], sub)
    k = sub.top_k
    if bool(((k > 0) & (k < xs.shape[1])).all()):
        fast = sample_topk_rows(xs, sub)
        if fast is not None:
            tokens[rows], logprob[rows] = fast
            return tokens.to(torch.int64), logprob
    thr = filter_threshold(xs, sub)
    keep = xs >= thr[:, None]
    neg_inf = torch.full_like(xs, float("-inf"))
    picked = torch.argmax(gumbel_scores(xs, keep, sub, neg_inf), dim=1)
    lse = torch.logsumexp(torch.where(keep, xs, neg_inf), dim=1)
    tokens[rows] = picked
    logprob[rows] = (xs.gather(1, picked[:, None]).squeeze(1) - lse).to(torch.float32)
    return tokens.to(torch.int64), logprob
