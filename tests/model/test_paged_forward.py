"""The paged forward (chunked prefill + decode, many sequences, scattered blocks) equals a
dense causal forward of the same weights."""

from __future__ import annotations

import random

import pytest
import torch

from kiln.model import KVCache, build_forward_batch
from tests.model.dense_reference import dense_logits
from tests.numerics import assert_logits_close, forward_rtol
from tests.tiny_models import model_from_tensors, random_tensors, tiny_config

BLOCK = 4


@pytest.mark.parametrize(("arch", "tie"), [("llama", True), ("llama", False), ("qwen2", False),
                                           ("qwen3", False)])
def test_paged_equals_dense(arch: str, tie: bool) -> None:
    cfg = tiny_config(arch, tie=tie)
    weights = random_tensors(cfg, seed=3)
    model = model_from_tensors(cfg, weights)
    rng = random.Random(7)
    lengths = [13, 6, 22]
    decode_steps = 3
    seqs = [[rng.randrange(cfg.vocab_size) for _ in range(n + decode_steps)] for n in lengths]
    blocks = list(range(1, 40))
    rng.shuffle(blocks)
    tables = []
    for s in seqs:
        need = -(-len(s) // BLOCK)
        tables.append([blocks.pop() for _ in range(need)])
    kv = KVCache(cfg, num_blocks=40, block_size=BLOCK, dtype=torch.float32,
                 device=torch.device("cpu"))
    got: list[dict[int, torch.Tensor]] = [{} for _ in seqs]

    def run(plan: list[tuple[int, int, int]]) -> None:
        """plan: (seq index, start, end) of new tokens; record logits for every row."""
        batch = build_forward_batch(
            [(seqs[i][a:b], a, tables[i]) for i, a, b in plan], BLOCK, logits="all")
        logits = model(batch, kv)
        assert logits.dtype == torch.float32
        row = 0
        for i, a, b in plan:
            for pos in range(a, b):
                got[i][pos] = logits[row]
                row += 1

    split = [5, 6, 9]  # first prefill chunk per sequence (seq 1 is fully prefilled at once)
    run([(i, 0, split[i]) for i in range(3)])
    run([(i, split[i], lengths[i]) for i in range(3) if split[i] < lengths[i]]
        + [(1, 6, 7)])  # seq 1 decodes while the others finish prefill
    for step in range(decode_steps):
        run([(i, lengths[i] + step, lengths[i] + step + 1) for i in (0, 2)]
            + ([(1, 7 + step, 8 + step)] if 7 + step < len(seqs[1]) else []))

    for i, s in enumerate(seqs):
        ref = dense_logits(cfg, weights, s)
        assert sorted(got[i]) == list(range(len(s)))
        paged = torch.stack([got[i][p] for p in range(len(s))])
        assert_logits_close(paged, ref, cfg, len(s))


def test_logits_indices_select_rows() -> None:
    cfg = tiny_config("qwen3")
    weights = random_tensors(cfg, seed=1)
    model = model_from_tensors(cfg, weights)
    ids = [5, 9, 200, 31, 7, 77]
    kv = KVCache(cfg, 8, BLOCK, torch.float32, torch.device("cpu"))
    last = model(build_forward_batch([(ids, 0, [3, 1])], BLOCK, logits="last"), kv)
    assert last.shape == (1, cfg.vocab_size)
    assert_logits_close(last[0], dense_logits(cfg, weights, ids)[-1], cfg, len(ids))


def test_qk_norm_and_bias_matter() -> None:
    """Guards the dense comparison: dropping q/k norm (qwen3) changes the logits."""
    cfg = tiny_config("qwen3")
    weights = random_tensors(cfg, seed=2)
    changed = dict(weights)
    changed["model.layers.0.self_attn.q_norm.weight"] = torch.ones(cfg.head_dim)
    ids = [1, 2, 3, 4, 5]
    a = model_from_tensors(cfg, weights)
    b = model_from_tensors(cfg, changed)
    kv = KVCache(cfg, 4, BLOCK, torch.float32, torch.device("cpu"))
    la = a(build_forward_batch([(ids, 0, [0, 1])], BLOCK), kv)
    lb = b(build_forward_batch([(ids, 0, [2, 3])], BLOCK), kv)
    # the change is far past what rounding could explain (the bound the comparisons use)
    assert (la - lb).abs().max() > 100 * forward_rtol(cfg, len(ids)) * la.abs().max()
