"""A transformers reference holding the SAME weights as our loaded model (bench-only helper).

transformers' GGUF path needs ``accelerate`` (not installed), so the reference is
``LlamaForCausalLM(LlamaConfig(...))`` built from our model's config, with our model's state dict
loaded into it (our parameter names are the HF names; embeddings are tied). Everything here is
tokenizer-free: callers pass token ids.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from kiln.model.float32_copies import float32_state_dict
from kiln.model.loader import LoadedModel


def build_reference(loaded: LoadedModel) -> Any:
    """A float32 ``LlamaForCausalLM`` in eval mode holding ``loaded``'s weights."""
    from transformers import LlamaConfig, LlamaForCausalLM

    if loaded.config.arch != "llama":
        raise ValueError(f"the transformers reference covers llama only, not {loaded.config.arch}")
    hf_cfg = {k: v for k, v in loaded.config.to_hf().items()
              if k not in ("architectures", "model_type")}
    eos = sorted(loaded.tokenizer.eos_token_ids)
    pad = eos[0] if eos else 0
    ref = LlamaForCausalLM(LlamaConfig(**hf_cfg, pad_token_id=pad,
                                       eos_token_id=eos[0] if eos else None))
    ref.eval()
    missing, unexpected = ref.load_state_dict(float32_state_dict(loaded.model), strict=False)
    if unexpected or not set(missing) <= {"lm_head.weight"}:
        raise RuntimeError(f"state dict mismatch: missing={missing} unexpected={unexpected}")
    if ref.lm_head.weight.data_ptr() != ref.model.embed_tokens.weight.data_ptr() \
            and loaded.config.tie_word_embeddings:
        raise RuntimeError("the reference's lm_head is not tied to its embeddings")
    return ref


@dataclass
class GenerateResult:
    tokens: list[list[int]]  # new tokens per row
    seconds: float


def pad_left(prompts: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded ``input_ids`` and ``attention_mask`` ``[B, max_len]``."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.int64)
    mask = torch.zeros((len(prompts), width), dtype=torch.int64)
    for i, p in enumerate(prompts):
        if p:
            ids[i, width - len(p):] = torch.tensor(list(p), dtype=torch.int64)
            mask[i, width - len(p):] = 1
    return ids, mask


def hf_generate(ref: Any, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                pad_id: int) -> GenerateResult:
    """Greedy ``generate`` of exactly ``max_new_tokens`` per row (left-padded batch)."""
    ids, mask = pad_left(prompts, pad_id)
    start = time.perf_counter()
    with torch.inference_mode():
        out = ref.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens,
                           min_new_tokens=max_new_tokens, do_sample=False, pad_token_id=pad_id,
                           temperature=None, top_p=None, top_k=None)
    seconds = time.perf_counter() - start
    new = out[:, ids.shape[1]:].tolist()
    return GenerateResult(tokens=[list(map(int, row)) for row in new], seconds=seconds)


def hf_prefill(ref: Any, prompt: Sequence[int], logits_to_keep: int = 1) -> float:
    """Seconds for one ``model(input_ids)`` forward (no cache kept); ``logits_to_keep=0``
    computes logits for every position."""
    ids = torch.tensor([list(prompt)], dtype=torch.int64)
    start = time.perf_counter()
    with torch.inference_mode():
        ref(input_ids=ids, use_cache=False, logits_to_keep=logits_to_keep)
    return time.perf_counter() - start
