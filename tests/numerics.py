"""Float comparison bounds for the tests, each one derived from the arithmetic it checks.

Where the code promises bits (the C step against itself, batch invariance, seeded sampling) the
tests compare with ``torch.equal``. Everywhere else two float32 computations of the same value
differ only in the order of their additions (another matmul blocking, another thread split,
another chunking), and the bound follows from that:

- a sum of k float32 terms, evaluated in any order, is within gamma_k * sum|terms| of the exact
  sum (gamma_k = k*u / (1 - k*u), u = 2**-24; Higham, *Accuracy and Stability of Numerical
  Algorithms*, section 3.1), so two orders differ by at most 2 * gamma_k * sum|terms|;
- a value computed through a chain of such sums (a forward pass: projections, attention, MLP,
  head) takes its rounding errors from every sum of the chain. Summed worst case over a deep
  model's ~10^5 terms that bound says nothing (a 30-layer model: 1% of every logit); the
  probabilistic bound of Higham and Mary (SIAM J. Sci. Comput. 41(5), 2019, Theorem 2.4),
  lambda * sqrt(n) * u for n terms in all, holds with probability at least
  1 - 2n * exp(-lambda^2 / 2): at lambda = 8, below 1e-10 for every chain here. It is taken
  relative to the magnitude the chain carries — for logits, the row's largest |logit| (what
  log_softmax subtracts), never the value itself, which can be near zero — plus a few ulps per
  layer for elementwise functions (exp, rsqrt, silu) that two implementations round differently.

What a machine really shows is one to two orders of magnitude below these bounds, and a real bug (a wrong position, a wrong KV block, a wrong weight) moves values by
O(0.1) or more, far past them. Ranks and argmaxes are compared only where the neighbouring
values are further apart than twice the bound, so a near-tie cannot flip them on any machine.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

U32 = 2.0**-24  # float32 unit roundoff
U16 = 2.0**-11  # float16 unit roundoff
UBF16 = 2.0**-8  # bfloat16 unit roundoff


def gamma(k: int, u: float = U32) -> float:
    """Higham's gamma_k: the relative error bound of a k-term sum in precision u."""
    assert k * u < 1
    return k * u / (1 - k * u)


def reorder_rtol(*lengths: int, u: float = U32) -> float:
    """Two evaluations of a chain of sums of these lengths, in different orders: relative bound
    (to the magnitude carried) of their difference — twice the sum of the gammas."""
    return 2 * sum(gamma(k, u) for k in lengths)


def forward_lengths(cfg: object, context: int) -> list[int]:
    """The lengths of the sums one logit of a decoder passes through at ``context`` positions:
    per layer q/k/v (hidden), scores (head_dim), the softmax's sum and the weighted values
    (context), o (heads * head_dim), gate/up (hidden), down (intermediate); then the head."""
    hidden = int(cfg.hidden_size)  # type: ignore[attr-defined]
    heads_dim = int(cfg.num_heads) * int(cfg.head_dim)  # type: ignore[attr-defined]
    per_layer = [hidden, int(cfg.head_dim), context, context, heads_dim,  # type: ignore[attr-defined]
                 hidden, int(cfg.intermediate_size)]  # type: ignore[attr-defined]
    return per_layer * int(cfg.num_layers) + [hidden]  # type: ignore[attr-defined]


LAMBDA = 8.0  # probabilistic bound's multiplier: failure probability < 2n * exp(-32)
ELEMENTWISE_ULPS = 16  # per layer: rsqrt, exp, silu, sin/cos rounded by another implementation


def chain_rtol(*lengths: int, u: float = U32) -> float:
    """Two evaluations of a chain of sums of these lengths in different orders: relative bound
    (to the magnitude carried) of their difference, each side within lambda * sqrt(n) * u."""
    return 2 * LAMBDA * math.sqrt(sum(lengths)) * u


def forward_rtol(cfg: object, context: int) -> float:
    """Relative bound (to a row's largest |logit|) between two float32 forward passes of ``cfg``
    over ``context`` positions that differ only in summation order and in how elementwise
    functions round."""
    layers = int(cfg.num_layers)  # type: ignore[attr-defined]
    return chain_rtol(*forward_lengths(cfg, context)) + 2 * ELEMENTWISE_ULPS * layers * U32


def assert_logits_close(got: torch.Tensor, want: torch.Tensor, cfg: object, context: int,
                        what: str = "logits") -> None:
    """Rows of logits of two forward passes, each within forward_rtol of its row's magnitude."""
    g, w = got.double(), want.double()
    assert g.shape == w.shape, (what, g.shape, w.shape)
    rows_g, rows_w = g.reshape(-1, g.shape[-1]), w.reshape(-1, w.shape[-1])
    bound = forward_rtol(cfg, context) * rows_w.abs().amax(-1)
    worst = (rows_g - rows_w).abs().amax(-1)
    bad = worst > bound
    assert not bool(bad.any()), (
        f"{what}: row {int(bad.nonzero()[0])} differs by {float(worst.max()):.3g} "
        f"> bound {float(bound[bad.nonzero()[0]].item()):.3g}")


def assert_same_argmax(got: torch.Tensor, want: torch.Tensor, cfg: object, context: int) -> None:
    """Argmax of each row agrees wherever the top two logits of ``want`` are further apart than
    twice the forward bound (a nearer pair may swap on another machine); at least one row must
    be decided that way, so the check cannot become empty."""
    w = want.double().reshape(-1, want.shape[-1])
    g = got.double().reshape(-1, got.shape[-1])
    top2 = w.topk(2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1]) > 2 * forward_rtol(cfg, context) * w.abs().amax(-1)
    assert bool(clear.any()), "every row is a near-tie: choose another input"
    assert bool((g.argmax(-1) == w.argmax(-1))[clear].all())


def assert_close_scaled(got: torch.Tensor | Sequence[float] | float,
                        want: torch.Tensor | Sequence[float] | float,
                        rtol: float, scale: float, what: str = "") -> None:
    """|got - want| <= rtol * scale elementwise, where ``scale`` is the magnitude the
    computation carried (not each value's own size)."""
    g = torch.as_tensor(got, dtype=torch.float64)
    w = torch.as_tensor(want, dtype=torch.float64)
    assert g.shape == w.shape, (what, g.shape, w.shape)
    bound = rtol * scale
    worst = (g - w).abs().max().item() if g.numel() else 0.0
    assert worst <= bound, f"{what}: max |got - want| = {worst:.3g} > bound {bound:.3g}"


def assert_ulps(got: torch.Tensor, want: torch.Tensor, ulps: float, what: str = "") -> None:
    """Each element within ``ulps`` units in the last place of float32 at the larger of the two
    magnitudes (a relative bound; exact zeros must match exactly)."""
    g = got.double()
    w = want.double()
    assert g.shape == w.shape, (what, g.shape, w.shape)
    mag = torch.maximum(g.abs(), w.abs())
    bound = ulps * 2 * U32 * mag  # one ulp at magnitude m is at most 2u * m
    bad = (g - w).abs() > bound
    assert not bool(bad.any()), f"{what}: {int(bad.sum())} elements past {ulps} ulps"


def clear_of_ties(row: np.ndarray, value: float, margin: float) -> bool:
    """No entry of ``row`` lies within ``margin`` of ``value`` unless exactly equal to it: a rank
    or top-k decided at ``value`` cannot flip when each entry moves by margin / 2."""
    d = np.abs(row - value)
    return not bool(((d > 0) & (d <= margin)).any())


def attention_atol(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                   context: int) -> float:
    """Absolute bound between two float32 attentions softmax(scale * q k^T) v over ``context``
    positions. A score moves by at most d = 2 gamma_D * |q| |k| * scale (Cauchy-Schwarz bounds
    the sum of |terms|); a softmax weight then by 2d plus the normalizer's sum and its exp
    (2 gamma_c + 4u), and the weighted sum of values adds gamma_c: all relative to max |v|.
    Either implementation is that far from the exact value, so two are twice as far apart."""
    dim = q.shape[-1]
    smag = float(q.norm(dim=-1).max() * k.norm(dim=-1).max()) * abs(scale)
    one = 2 * (2 * gamma(dim) * smag) + 3 * gamma(context) + 4 * U32
    return 2 * one * float(v.abs().max())


def logit_magnitude(model: torch.nn.Module) -> float:
    """An upper bound of |logit| for any input: the final RMSNorm's output has RMS 1 before its
    weight g, so ||h|| <= sqrt(hidden) * max|g|, and |logit_j| <= ||h|| * ||W_j|| (the head's
    row j; the embedding when tied)."""
    state = dict(model.named_parameters())
    norm = state["model.norm.weight"].detach()
    head = state.get("lm_head.weight", state["model.embed_tokens.weight"]).detach()
    h = math.sqrt(norm.numel()) * float(norm.abs().max())
    return h * float(head.float().norm(dim=-1).max())


def sampled_logprob_atol(model: torch.nn.Module, cfg: object, context: int,
                         temperature: float) -> float:
    """Absolute bound between the logprobs of one sampled token under two forward passes that
    differ in summation order: logit / T and the log-sum-exp each move by the logit bound / T,
    and the exp-sum over the vocabulary adds its own relative error."""
    logit_move = forward_rtol(cfg, context) * logit_magnitude(model)
    return 2 * logit_move / temperature + reorder_rtol(int(cfg.vocab_size))  # type: ignore[attr-defined]


def check_rank(row: np.ndarray, obs: int, k: int, got_rank: int, got_top: list[int],
               margin: float, where: str) -> None:
    """docs/behavior.md §8 (rank by -logit then id; ties outside top-K rank by `>=`) against the
    dense row. Where no other logit lies within ``margin`` of the ones that decide the answer it
    must be exact; a near-tie may order either way, so there the answer must fit the row within
    the margin."""
    order = np.lexsort((np.arange(len(row)), -row))  # by -logit, then by id
    top = [int(t) for t in order[:k]]
    rank = top.index(obs) + 1 if obs in top else int((row >= row[obs]).sum())
    deciding = [row[t] for t in order[: k + 1]] + [row[obs]]
    if all(clear_of_ties(row, float(v), margin) for v in deciding):
        assert (got_rank, got_top) == (rank, top), where
        return
    assert len(got_top) == min(k, len(row)), where
    for a, b in itertools.pairwise(got_top):  # sorted by logit within the margin, exact ties by id
        assert row[a] >= row[b] - margin and (row[a] != row[b] or a < b), where
    if got_top:
        rest = np.delete(row, got_top)
        assert rest.size == 0 or rest.max() <= row[got_top[-1]] + margin, where
    if obs in got_top:
        assert got_rank == got_top.index(obs) + 1, where
    else:
        v = row[obs]
        assert int((row > v + margin).sum()) + 1 <= got_rank <= int((row >= v - margin).sum()), where


def matmul_bound(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Elementwise bound between two float32 evaluations of x @ w.T (w: [N, K]) in different
    orders: 2 gamma_K times the sum of |terms|, |x| @ |w|.T."""
    return reorder_rtol(int(w.shape[-1])) * (x.double().abs() @ w.double().abs().T)


def logsoftmax_atol(n: int, scale: float) -> float:
    """Absolute bound between two implementations of log_softmax over ``n`` values of magnitude
    <= ``scale``: the exp-sum's relative error (gamma_n, plus a few ulps for an exp of another
    implementation) is the log's absolute one, and x - max - lse rounds at <= 2 scale + log n;
    each implementation is that far from exact."""
    one = gamma(n) + 4 * U32 + 2 * U32 * (2 * scale + math.log(max(n, 2)))
    return 2 * one


def sampling_scale(logits: torch.Tensor, p: Any) -> float:
    """The largest |logit| after penalties and temperature: repetition multiplies, presence and
    frequency (at most 3 repeats of a token in the tests' rows) subtract, temperature divides."""
    rep = max(1.0, float(p.repetition_penalty.max()))
    pen = float(p.presence_penalty.abs().max()) + 3 * float(p.frequency_penalty.abs().max())
    temps = p.temperature[p.temperature >= 1e-5]
    t = float(temps.min()) if temps.numel() else 1.0
    return (float(logits.abs().max()) * rep + pen) / t


def same_logits_logprob_atol(vocab: int, logprob: float) -> float:
    """Two log_softmax evaluations of the *same* float32 logits (another row grouping, another
    kernel): the exp-sum over the vocabulary in another order (probabilistic, lambda sqrt(V) u
    relative, which is the log's absolute error), an exp and a log of a few ulps, and the
    subtraction x - max - lse rounding at its magnitude (<= |logprob| + 2 log V)."""
    one = LAMBDA * math.sqrt(vocab) * U32 + 4 * U32 + 2 * U32 * (abs(logprob) + 2 * math.log(vocab))
    return 2 * one
