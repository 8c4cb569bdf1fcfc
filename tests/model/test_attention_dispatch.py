"""The model's attention conventions agree with the Triton kernels': the CUDA dispatch path (and
the Triton kernels themselves, under TRITON_INTERPRET=1) give the reference's output for the same
plan — batched decodes, a mixed prefill + decode step, and scattered block tables."""

from __future__ import annotations

import os

import pytest
import torch

from kiln.model.attention import (
    _cuda_paged_attention,
    plan_attention,
    reference_paged_attention,
    store_kv,
)
from kiln.model.batch import build_forward_batch
from tests.numerics import U32, attention_atol

BS, H, KV, D = 4, 4, 2, 8


def setup(seqs: list[tuple[int, int]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, object]:
    """seqs: (cached tokens, new tokens) per sequence, with scattered blocks."""
    gen = torch.Generator().manual_seed(0)
    num_blocks = 40
    perm = torch.randperm(num_blocks, generator=gen).tolist()
    k_cache = torch.zeros(num_blocks, BS, KV, D)
    v_cache = torch.zeros(num_blocks, BS, KV, D)
    spec, used = [], 0
    for cached, new in seqs:
        n_blocks = -(-(cached + new) // BS)
        table = perm[used:used + n_blocks]
        used += n_blocks
        spec.append((list(range(new)), cached, table))
    batch = build_forward_batch(spec, BS, "all", torch.device("cpu"))
    # fill the cached prefix of every sequence with random K/V
    for (_, cached, table) in spec:
        for pos in range(cached):
            blk, off = table[pos // BS], pos % BS
            k_cache[blk, off] = torch.randn(KV, D, generator=gen)
            v_cache[blk, off] = torch.randn(KV, D, generator=gen)
    t = batch.input_ids.numel()
    q = torch.randn(t, H, D, generator=gen)
    store_kv(k_cache, v_cache, torch.randn(t, KV, D, generator=gen), torch.randn(t, KV, D, generator=gen),
             batch.slot_mapping)
    return q, k_cache, v_cache, plan_attention(batch, BS)


MAX_CONTEXT = 16  # the longest context of the cases below (12 + 1, 9 + 3)
CASES = {
    "decodes": [(5, 1), (12, 1), (1, 1), (7, 1)],
    "mixed": [(5, 1), (0, 6), (9, 3), (2, 1)],
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_dispatch_matches_reference(case: str) -> None:
    q, k, v, plan = setup(CASES[case])
    want = reference_paged_attention(q, k, v, plan, 0.3)  # type: ignore[arg-type]
    got = _cuda_paged_attention(q, k, v, plan, 0.3)  # type: ignore[arg-type]
    assert (got - want).abs().max().item() <= attention_atol(q, k, v, 0.3, MAX_CONTEXT)


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available(),
                    reason="needs TRITON_INTERPRET=1 or CUDA")
@pytest.mark.parametrize("case", sorted(CASES))
def test_triton_kernels_match_reference(case: str) -> None:
    from kiln_kernels.attention.decode import paged_decode_triton
    from kiln_kernels.attention.prefill import prefill_paged_triton

    q, k, v, plan = setup(CASES[case])
    want = reference_paged_attention(q, k, v, plan, 0.3)  # type: ignore[arg-type]
    b = plan.batch  # type: ignore[attr-defined]
    got = prefill_paged_triton(q, k, v, b.block_tables, b.query_start_loc, b.seq_lens, 0.3, None)
    bound = attention_atol(q, k, v, 0.3, MAX_CONTEXT) + 8 * U32 * float(v.abs().max())
    assert (got - want).abs().max().item() <= bound  # + the online softmax's rescalings
    if case == "decodes":
        got = paged_decode_triton(q, k, v, b.block_tables, b.seq_lens, 0.3)
        assert (got - want).abs().max().item() <= bound


def test_public_kernel_names_are_functions_after_submodule_imports() -> None:
    """A submodule named like a public function would replace it on the package once imported."""
    import importlib
    import pkgutil

    import kiln_kernels

    for info in pkgutil.walk_packages(kiln_kernels.__path__, "kiln_kernels."):
        importlib.import_module(info.name)
    from kiln_kernels import attention, cpu, lora, quant, sampling

    for package in (attention, cpu, lora, quant, sampling):
        for name in getattr(package, "__all__", []):
            if package in (attention, lora, sampling):  # ops packages: every public name a function
                assert callable(getattr(package, name)), f"{package.__name__}.{name}"
            assert not isinstance(getattr(package, name), type(attention)), name
