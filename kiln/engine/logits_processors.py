"""Per-request logits processors (vLLM's ``logit_bias``, ``allowed_token_ids``, ``min_tokens``,
``bad_words``):
applied to the raw logits of the rows that set them, before penalties and sampling.

A row without any of them keeps its logits bit for bit (no copy is made when no row sets one),
so a request's tokens do not depend on what the other rows of its batch asked for.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kiln.engine.outputs import ScheduledSeq

__all__ = ["apply_logits_processors", "banned_bad_words"]


def banned_bad_words(words: Sequence[Sequence[int]], output: Sequence[int]) -> list[int]:
    """vLLM's bad_words rule: each word's last token id, when the output so far ends with the
    ids before it (a one-token word: always)."""
    banned = []
    for word in words:
        prefix = len(word) - 1
        if prefix == 0 or (len(output) >= prefix
                           and list(output[len(output) - prefix:]) == list(word[:-1])):
            banned.append(word[-1])
    return banned


def apply_logits_processors(logits: torch.Tensor, seqs: Sequence[ScheduledSeq]) -> torch.Tensor:
    """allowed_token_ids, logit_bias, min_tokens and bad_words on the rows that set them (a copy of
    ``logits`` when any row does; other rows keep their values bit for bit). A masked token's
    logit is -inf; call after the check for non-finite logits."""
    rows = [i for i, s in enumerate(seqs) if s.sampling.processes_logits]
    if not rows:
        return logits
    out = logits.clone()
    dev = out.device
    for i in rows:
        p, row = seqs[i].sampling, out[i]
        if p.allowed_token_ids is not None:
            keep = torch.tensor(p.allowed_token_ids, dtype=torch.long, device=dev)
            kept = row[keep].clone()
            row.fill_(float("-inf"))
            row[keep] = kept
        if p.logit_bias:
            ids = torch.tensor([t for t, _ in p.logit_bias], dtype=torch.long, device=dev)
            bias = torch.tensor([b for _, b in p.logit_bias], dtype=row.dtype, device=dev)
            row.index_add_(0, ids, bias)
        if p.min_tokens_ids and len(seqs[i].output_token_ids) < p.min_tokens:
            row[torch.tensor(p.min_tokens_ids, dtype=torch.long, device=dev)] = float("-inf")
        banned = banned_bad_words(p.bad_words_ids, seqs[i].output_token_ids)
        if banned:
            row[torch.tensor(banned, dtype=torch.long, device=dev)] = float("-inf")
    return out
