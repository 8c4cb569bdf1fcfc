"""Per-request logits processors: each row gets what its request set, other rows keep their bits."""

from __future__ import annotations

import torch

from kiln.engine.logits_processors import apply_logits_processors, banned_bad_words
from kiln.engine.outputs import ScheduledSeq
from kiln.engine.request import SamplingParams


def seq(sp: SamplingParams, outputs: int = 0, output: list[int] | None = None) -> ScheduledSeq:
    out = [5] * outputs if output is None else output
    return ScheduledSeq(request_id="r", token_ids=[1], start_pos=3, block_table=[0], sample=True,
                        is_new=False, sampling=sp, seed=1, step=len(out),
                        prompt_token_ids=[1, 2, 3], output_token_ids=out)


def logits(rows: int) -> torch.Tensor:
    return torch.randn((rows, 12), generator=torch.Generator().manual_seed(rows))


def test_rows_without_processors_are_untouched() -> None:
    x = logits(2)
    assert apply_logits_processors(x, [seq(SamplingParams()), seq(SamplingParams())]) is x


def test_each_row_gets_its_own_processors() -> None:
    x = logits(4)
    seqs = [seq(SamplingParams()),
            seq(SamplingParams(allowed_token_ids=(2, 7))),
            seq(SamplingParams(logit_bias=((3, 2.5), (9, -1.0)))),
            seq(SamplingParams(min_tokens=2, min_tokens_ids=(0, 4)), outputs=1)]
    y = apply_logits_processors(x, seqs)
    assert torch.equal(y[0], x[0])  # a plain row keeps its bits
    inf = float("-inf")
    assert [i for i in range(12) if y[1, i] != inf] == [2, 7]
    assert torch.equal(y[1, [2, 7]], x[1, [2, 7]])
    want = x[2].clone()
    want[3] += 2.5  # float32 addition, as index_add_ does it
    want[9] += -1.0
    assert torch.equal(y[2], want)
    assert y[3, 0] == inf and y[3, 4] == inf
    assert torch.equal(y[3, 5:], x[3, 5:]) and torch.equal(y[3, 1:4], x[3, 1:4])
    assert torch.equal(x, logits(4))  # the input was copied, never written


def test_min_tokens_lifts_once_enough_tokens_are_out() -> None:
    x = logits(1)
    sp = SamplingParams(min_tokens=2, min_tokens_ids=(0,))
    assert torch.equal(apply_logits_processors(x, [seq(sp, outputs=2)]), x)


def test_bad_words_ban_a_words_last_token_after_its_prefix() -> None:
    words = ((7,), (3, 4, 5))
    x = logits(1)
    for output, banned in (([], {7}), ([1, 3], {7}), ([3, 4], {5, 7}), ([9, 3, 4], {5, 7}),
                           ([4, 3], {7})):
        y = apply_logits_processors(x, [seq(SamplingParams(bad_words_ids=words), output=output)])
        assert {i for i in range(12) if y[0, i] == float("-inf")} == banned, output
        kept = [i for i in range(12) if i not in banned]
        assert torch.equal(y[0, kept], x[0, kept])  # every other logit keeps its bits


def test_banned_bad_words_rule() -> None:
    assert banned_bad_words([(2, 3), (5,)], [1, 2]) == [3, 5]
    assert banned_bad_words([(2, 3)], [2, 1]) == []
    assert banned_bad_words([(1, 2, 3)], [2]) == []  # shorter output than the prefix
