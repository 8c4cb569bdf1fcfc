"""The C step's own token-embedding lookup (``cpu_step.c`` with token ids) against the model's
``embed_tokens`` run first: the same bits, and an id outside the table refused before anything
runs."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from kiln_kernels.cpu import available as kernels_available

from kiln.model import CausalLM, LoadedModel
from kiln.model.batch import build_forward_batch
from kiln.model.cpu_step import CpuStep
from tests.model.test_cpu_step import BLOCK, new_cache, quantized_tiny, tables

pytestmark = pytest.mark.skipif(not kernels_available(), reason="no C compiler for the kernels")


def embedding_in_and_out(model: CausalLM, prompts: list[list[int]]
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """The logits of a prefill step and a decode step with the embedding looked up inside the
    C step, and with the model's ``embed_tokens`` run first (each on a fresh cache)."""
    step = model.cpu_step
    assert step is not None and step.weights.embed is not None, "the embedding is held packed"
    outside = CpuStep(dataclasses.replace(step.weights, embed=None), step.flags)
    tbl = tables(len(prompts))
    runs = []
    for fn in (step.forward, outside.forward):
        kv = new_cache(model)
        first = fn(model.model.embed_tokens, build_forward_batch(
            [(p, 0, t) for p, t in zip(prompts, tbl, strict=True)], BLOCK), kv)
        nxt = fn(model.model.embed_tokens, build_forward_batch(
            [([7], len(p), t) for p, t in zip(prompts, tbl, strict=True)], BLOCK), kv)
        runs.append(torch.cat([first, nxt]))
    return runs[0], runs[1]


def test_the_embedding_inside_the_c_step_is_the_modules(smollm: LoadedModel) -> None:
    """The C step's own lookup reads the very values the PackedEmbedding module gives (the
    same blocks, dequantized alike), so the logits are the same bits."""
    for model in (quantized_tiny("llama", tie=True), smollm.model):
        inside, outside = embedding_in_and_out(model, [[5, 9, 33, 7], [100, 3]])
        assert torch.equal(inside, outside)


def test_an_id_outside_the_embedding_is_refused_before_the_step() -> None:
    model = quantized_tiny("llama", tie=True)
    step = model.cpu_step
    assert step is not None
    kv = new_cache(model)
    before = kv.k[0].clone()
    vocab = model.config.vocab_size
    for bad in (vocab, -1):
        with pytest.raises(IndexError, match=f"token id {bad} is outside"):
            step.forward(model.model.embed_tokens,
                         build_forward_batch([([1, bad], 0, tables(1)[0])], BLOCK), kv)
    assert torch.equal(kv.k[0], before), "nothing ran"
