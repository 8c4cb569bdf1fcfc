"""The sampler's logprob entries: the natural top `logprobs`, or the request's logprob_token_ids."""

from __future__ import annotations

import torch

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
