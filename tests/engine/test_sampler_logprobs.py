"""The sampler's logprob entries: the natural top `logprobs`, or the request's logprob_token_ids."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from kiln_kernels.cpu import available

from kiln.engine.outputs import ScheduledSeq
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


@pytest.mark.parametrize("impl", IMPLS)
def test_a_temperature_past_float32_spreads_the_unmasked_tokens_evenly(impl: str) -> None:
    """JSON allows temperatures up to ~1.8e308; past float32's range one became inf in the
    samplers, and -inf / inf made a masked token's logit NaN (NaN logprobs, null on the wire)."""
    x = torch.randn((1, 16), generator=torch.Generator().manual_seed(5))
    x[0, :10] = float("-inf")  # allowed_token_ids: 10..15
    sampler = Sampler(torch.device("cpu"), impl)  # type: ignore[arg-type]
    for seed in range(8):
        s = seq(SamplingParams(temperature=1e39, logprobs=2))
        s = dataclasses.replace(s, seed=seed)
        (token,), (behaviour,) = sampler.sample(x.clone(), [s])
        (entry,) = sampler.token_logprobs(x.clone(), [s], [token])
        assert 10 <= token < 16
        assert entry is not None
        # six equally likely tokens; log_softmax in float32 is within a few ulps of -log 6
        # (its ulp there is 1.2e-7)
        for value in (behaviour, entry.logprob, *entry.top_logprobs):
            assert abs(value + math.log(6)) <= 1e-6
