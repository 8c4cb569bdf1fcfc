"""A step's input: the flat forward batch, the new tokens of many sequences plus their
paged-attention metadata, as torch tensors (the rows are flattened once, torch-free, by
``kiln.model.native.c_model.flatten``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from kiln.model.native.c_model import StepRows, flatten


@dataclass
class ForwardBatch:
    input_ids: torch.Tensor  # int64 [T]  new tokens of all sequences, concatenated
    positions: torch.Tensor  # int64 [T]  absolute position of each new token
    query_start_loc: torch.Tensor  # int32 [B+1] new tokens of seq i are rows qsl[i]:qsl[i+1]
    seq_lens: torch.Tensor  # int32 [B]  tokens in the cache for seq i AFTER this step
    block_tables: torch.Tensor  # int32 [B, max_blocks_per_seq], padded with 0
    slot_mapping: torch.Tensor  # int64 [T]  cache slot block_id*block_size+offset per new token
    logits_indices: torch.Tensor  # int64 [L]  rows of the flat batch to return logits for
    rows: StepRows  # the same rows as numpy (``flatten``'s: the C step reads them)
    lora: object | None = None  # filled by the LoRA issue; models ignore None

    @classmethod
    def build(cls, seqs: Sequence[tuple[Sequence[int], int, Sequence[int]]], block_size: int,
              logits: Literal["last", "all"] = "last",
              device: torch.device | str = "cpu") -> ForwardBatch:
        return build_forward_batch(seqs, block_size, logits, device)


def build_forward_batch(seqs: Sequence[tuple[Sequence[int], int, Sequence[int]]],
                        block_size: int,
                        logits: Literal["last", "all"] | Sequence[int] = "last",
                        device: torch.device | str = "cpu") -> ForwardBatch:
    """Build a batch from ``(new_tokens, start_pos, block_table)`` per sequence.

    ``start_pos`` is the number of tokens already in the cache for that sequence; the block
    table must cover ``start_pos + len(new_tokens)`` tokens. ``logits="last"`` returns one
    row per sequence (its last new token), ``"all"`` every row, a list of ints each sequence's
    last ``logits[s]`` rows (``kiln.model.native.c_model.flatten``).
    """
    rows = flatten(seqs, block_size, logits)  # the rows, flattened once (kiln.model.native.c_model)
    dev = torch.device(device)

    def tensor(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(a).to(dev)

    return ForwardBatch(
        input_ids=tensor(rows.ids), positions=tensor(rows.positions),
        query_start_loc=tensor(rows.query_start_loc), seq_lens=tensor(rows.seq_lens),
        block_tables=tensor(rows.tables), slot_mapping=tensor(rows.slots),
        logits_indices=tensor(rows.logit_rows), rows=rows)
