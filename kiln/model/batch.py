"""The flat forward batch: new tokens of many sequences plus paged-attention metadata."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch


@dataclass
class ForwardBatch:
    input_ids: torch.Tensor  # int64 [T]  new tokens of all sequences, concatenated
    positions: torch.Tensor  # int64 [T]  absolute position of each new token
    query_start_loc: torch.Tensor  # int32 [B+1] new tokens of seq i are rows qsl[i]:qsl[i+1]
    seq_lens: torch.Tensor  # int32 [B]  tokens in the cache for seq i AFTER this step
    block_tables: torch.Tensor  # int32 [B, max_blocks_per_seq], padded with 0
    slot_mapping: torch.Tensor  # int64 [T]  cache slot block_id*block_size+offset per new token
    logits_indices: torch.Tensor  # int64 [L]  rows of the flat batch to return logits for
    lora: object | None = None  # filled by the LoRA issue; models ignore None

    @classmethod
    def build(cls, seqs: Sequence[tuple[Sequence[int], int, Sequence[int]]], block_size: int,
              logits: Literal["last", "all"] = "last",
              device: torch.device | str = "cpu") -> ForwardBatch:
        return build_forward_batch(seqs, block_size, logits, device)


def build_forward_batch(seqs: Sequence[tuple[Sequence[int], int, Sequence[int]]],
                        block_size: int, logits: Literal["last", "all"] = "last",
                        device: torch.device | str = "cpu") -> ForwardBatch:
    """Build a batch from ``(new_tokens, start_pos, block_table)`` per sequence.

    ``start_pos`` is the number of tokens already in the cache for that sequence; the block
    table must cover ``start_pos + len(new_tokens)`` tokens. ``logits="last"`` returns one
    row per sequence (its last new token), ``"all"`` every row.
    """
    if not seqs:
        raise ValueError("build_forward_batch: no sequences")
    ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    qsl = [0]
    seq_lens: list[int] = []
    logit_rows: list[int] = []
    max_blocks = max(len(bt) for _, _, bt in seqs) or 1
    tables: list[list[int]] = []
    for new_tokens, start, table in seqs:
        n = len(new_tokens)
        if n == 0:
            raise ValueError("build_forward_batch: a sequence has no new tokens")
        end = start + n
        if len(table) * block_size < end:
            raise ValueError(f"block table of {len(table)} blocks cannot hold {end} tokens")
        row0 = len(ids)
        ids.extend(int(t) for t in new_tokens)
        for pos in range(start, end):
            positions.append(pos)
            slots.append(int(table[pos // block_size]) * block_size + pos % block_size)
        qsl.append(len(ids))
        seq_lens.append(end)
        tables.append([int(b) for b in table] + [0] * (max_blocks - len(table)))
        logit_rows.extend(range(row0, row0 + n) if logits == "all" else [row0 + n - 1])
    dev = torch.device(device)
    return ForwardBatch(
        input_ids=torch.tensor(ids, dtype=torch.int64, device=dev),
        positions=torch.tensor(positions, dtype=torch.int64, device=dev),
        query_start_loc=torch.tensor(qsl, dtype=torch.int32, device=dev),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=dev),
        block_tables=torch.tensor(tables, dtype=torch.int32, device=dev),
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=dev),
        logits_indices=torch.tensor(logit_rows, dtype=torch.int64, device=dev),
    )
