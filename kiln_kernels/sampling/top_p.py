"""Top-p over a row's kept tokens: the threshold x (keep x >= it), shared by the dense path
(reference.py) and the top-k candidate path (candidates.py)."""

from __future__ import annotations

import torch

# Top-p sorts only what it needs: the kept tokens when top-k / min-p left few (the rest of a
# sorted row is -inf, probability 0), else the largest TOP_P_PREFIX, which suffice whenever they
# reach top_p; a full sort only when they do not.
TOP_P_PREFIX = 1024


def top_p_threshold(xr: torch.Tensor, thr: torch.Tensor, tp: torch.Tensor) -> torch.Tensor:
    """float32 [R]: per row, over the tokens with x >= thr sorted by descending x, the x of the
    first token at which the cumulative probability reaches tp (the last kept token if none)."""
    v = xr.shape[1]
    keep = xr >= thr[:, None]
    n_kept = keep.sum(dim=1)
    neg_inf = torch.tensor(float("-inf"), dtype=xr.dtype, device=xr.device)
    kept = torch.where(keep, xr, neg_inf)
    n = int(n_kept.max())
    if n <= TOP_P_PREFIX:  # every kept token is in the prefix: the old formula, minus zeros
        srt = torch.topk(kept, max(n, 1), dim=1).values
        csum = torch.cumsum(torch.softmax(srt, dim=1), dim=1)
    else:
        srt = torch.topk(kept, min(TOP_P_PREFIX, v), dim=1).values
        lse = torch.logsumexp(kept, dim=1, keepdim=True)
        csum = torch.cumsum(torch.exp(srt - lse), dim=1)
        if not bool((csum[:, -1] >= tp).all()):
            srt = torch.sort(kept, dim=1, descending=True).values
            csum = torch.cumsum(torch.exp(srt - lse), dim=1)
    return top_p_cut(srt, csum, tp, n_kept)


def top_p_cut(srt: torch.Tensor, csum: torch.Tensor, tp: torch.Tensor, n_kept: torch.Tensor
              ) -> torch.Tensor:
    """float32 [R]: in rows of kept x sorted descending (``srt``, cumulative probabilities
    ``csum``), the x of the first token at which the cumulative probability reaches ``tp``, or
    the last kept token (``n_kept`` per row) if none does."""
    last = torch.clamp(n_kept, max=srt.shape[1]) - 1
    cut = torch.minimum((csum < tp[:, None]).sum(dim=1), last).clamp(min=0)
    return srt.gather(1, cut[:, None]).squeeze(1)
