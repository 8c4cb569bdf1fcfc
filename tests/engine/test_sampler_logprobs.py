"""The sampler's logprob entries: the natural top `logprobs`, or the request's logprob_token_ids."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest
import torch
from kiln_kernels.cpu import available

from kiln.engine.outputs import ScheduledSeq, TokenLogprobs
from kiln.engine.request import SamplingParams
from kiln.engine.sampler import LOGPROB_FLOOR, Sampler


def seq(sp: SamplingParams) -> ScheduledSeq:
    return ScheduledSeq(request_id="r", token_ids=[1], start_pos=3, block_table=[0], sample=True,
                        is_new=False, sampling=sp, seed=1, step=0, prompt_token_ids=[1, 2, 3],
                        output_token_ids=[])


def test_named_ids_replace_the_top_k_in_their_order() -> None:
    x = torch.randn((2, 16), generator=torch.Generator().manual_seed(3))
    x[1, 9] = float("-inf")  # a token the logits processors masked
    seqs = [seq(SamplingParams(temperature=0.0, logprobs=2)),
            seq(SamplingParams(temperature=0.0, logprobs=2, logprob_token_ids=(9, 4, 11)))]
    natural, named = Sampler(torch.device("cpu"), "torch").token_logprobs(x, seqs, [0, 4])
    assert natural is not None and named is not None
    lp = torch.log_softmax(x, dim=-1)  # greedy rows without penalties: log_softmax, bit for bit
    assert natural.top_ids == tuple(lp[0].topk(2).indices.tolist())
    assert named.top_ids == (9, 4, 11)
    assert named.top_logprobs == (LOGPROB_FLOOR, lp[1, 4].item(), lp[1, 11].item())
    assert named.logprob == lp[1, 4].item()



IMPLS = ["torch"] + (["c"] if available() else [])


def draws(impl: str, x: torch.Tensor, sp: SamplingParams, output: list[int]
          ) -> list[tuple[int, float, TokenLogprobs]]:
    """(token, behaviour logprob, logprob entry) for seeds 0..7 of one row."""
    sampler = Sampler(torch.device("cpu"), impl)  # type: ignore[arg-type]
    out = []
    for seed in range(8):
        s = dataclasses.replace(seq(sp), seed=seed, output_token_ids=output)
        (token,), (behaviour,) = sampler.sample(x.clone(), [s])
        (entry,) = sampler.token_logprobs(x.clone(), [s], [token])
        assert entry is not None
        out.append((token, behaviour, entry))
    return out


def row() -> torch.Tensor:
    x = torch.randn((1, 16), generator=torch.Generator().manual_seed(5))
    x[0, 3], x[0, 5] = 2.5, 0.5  # two generated tokens with positive logits
    return x


@pytest.mark.parametrize("impl", IMPLS)
def test_a_temperature_past_float32_spreads_the_unmasked_tokens_evenly(impl: str) -> None:
    """JSON allows temperatures up to ~1.8e308; past float32's range one became inf in the
    samplers, and -inf / inf made a masked token's logit NaN (NaN logprobs, null on the wire)."""
    x = row()
    x[0, :10] = float("-inf")  # allowed_token_ids: 10..15
    for token, behaviour, entry in draws(impl, x, SamplingParams(temperature=1e39, logprobs=2),
                                         []):
        assert 10 <= token < 16
        # six equally likely tokens; log_softmax in float32 is within a few ulps of -log 6
        # (its ulp there is 1.2e-7)
        for value in (behaviour, entry.logprob, *entry.top_logprobs):
            assert abs(value + math.log(6)) <= 1e-6


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("r", [1e-40, 1e-300])
def test_a_tiny_repetition_penalty_gives_the_row_to_the_largest_seen_logit(impl: str,
                                                                          r: float) -> None:
    """A seen token's positive logit over a penalty this small was +inf in float32 (NaN
    logprobs); the limit, which the samplers now give, is the largest such logit taking all."""
    for token, behaviour, entry in draws(
            impl, row(), SamplingParams(temperature=0.8, repetition_penalty=r, logprobs=2), [3, 5]):
        # 2.5 and 0.5 over 2^-80 and 0.8: 2^81 apart, so exp of the gap is 0 in float32
        assert (token, behaviour, entry.logprob, entry.top_ids) == (3, 0.0, 0.0, (3, 5))
        assert math.isfinite(entry.top_logprobs[1])


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(("huge", "same"), [({"min_p": 1e39}, {"min_p": 1.0}),
                                            ({"repetition_penalty": 1e39},
                                             {"repetition_penalty": 1e30})])
def test_values_past_float32_keep_their_meaning(impl: str, huge: dict[str, Any],
                                                same: dict[str, Any]) -> None:
    """Past float32's range a min_p or repetition penalty became inf, which the samplers read
    as "off": now min_p 1e39 keeps the top token as min_p 1 does, and a penalty of 1e39 takes a
    seen token's positive logit to 0 as 1e30 does (both leave 0 in float32 next to the row's
    other logits, so the draws are the same)."""
    a = draws(impl, row(), SamplingParams(temperature=0.8, logprobs=2, **huge), [3, 5])
    b = draws(impl, row(), SamplingParams(temperature=0.8, logprobs=2, **same), [3, 5])
    assert [(t, lp, e) for t, lp, e in a] == [(t, lp, e) for t, lp, e in b]
    off = draws(impl, row(), SamplingParams(temperature=0.8, logprobs=2), [3, 5])
    assert [t for t, _, _ in a] != [t for t, _, _ in off]  # the value did something
