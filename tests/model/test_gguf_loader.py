"""GGUF loading: name mapping, llama q/k un-permute, metadata tokenizer, chat template."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kiln.model import KVCache, build_forward_batch, load_model
from tests.numerics import assert_logits_close
from tests.tiny_models import (
    QWEN3_TEMPLATE,
    model_from_tensors,
    random_tensors,
    tiny_config,
    tiny_tokenizer,
    write_tiny_gguf,
)


@pytest.mark.parametrize(("arch", "tie"), [("llama", True), ("llama", False), ("qwen2", False),
                                           ("qwen3", True)])
def test_gguf_round_trip(tmp_path: Path, arch: str, tie: bool) -> None:
    cfg = tiny_config(arch, tie=tie)
    tensors = random_tensors(cfg, seed=5)
    path = write_tiny_gguf(tmp_path / f"tiny-{arch}.gguf", cfg, tensors)
    lm = load_model(str(path))
    assert lm.config == cfg
    assert lm.served_name == f"tiny-{arch}"
    direct = model_from_tensors(cfg, tensors)
    ids = [1, 40, 41, 300, 7, 9, 2, 100]
    kv = KVCache(cfg, 4, 4, torch.float32, torch.device("cpu"))
    got = lm.model(build_forward_batch([(ids, 0, [2, 0])], 4, logits="all"), kv)
    want = direct(build_forward_batch([(ids, 0, [1, 3])], 4, logits="all"), kv)
    assert_logits_close(got, want, cfg, len(ids))  # the same weights (llama q/k un-permuted)


@pytest.mark.parametrize("tie", [True, False])
def test_quantized_gguf_reads_its_embedding_from_the_blocks(tmp_path: Path, tie: bool) -> None:
    """A Q8_0 GGUF, tied or not, runs every step in C and keeps its token embedding as blocks
    only (like the projections): lookups give the dequantized rows, and the C step's logits
    match the torch path on the float32 weights."""
    from kiln.model.float32_copies import float32_state_dict, packed_disabled
    from kiln.model.quantized import PackedEmbedding

    cfg = tiny_config("llama", tie=tie)
    path = write_tiny_gguf(tmp_path / "q8.gguf", cfg, random_tensors(cfg, seed=7), q8=True)
    lm = load_model(str(path))
    if lm.model.plan.step != "c":
        pytest.skip("no C compiler: nothing is released")
    emb = lm.model.model.embed_tokens
    assert isinstance(emb, PackedEmbedding) and emb.weight.is_meta
    table = float32_state_dict(lm.model)["model.embed_tokens.weight"]
    ids = torch.tensor([0, 3, 4, 511, 200])
    assert torch.equal(emb(ids), table[ids])
    batch = build_forward_batch([([1, 40, 41, 300, 7, 9, 2, 100], 0, [0, 1])], 4, logits="all")
    got = lm.model(batch, KVCache(cfg, 4, 4, torch.float32, torch.device("cpu"),
                                  heads_major=True))
    with packed_disabled(lm.model):
        want = lm.model(batch, KVCache(cfg, 4, 4, torch.float32, torch.device("cpu")))
    assert_logits_close(got, want, cfg, 8)  # the C step against torch on the same weights
    assert emb.weight.is_meta  # released again after packed_disabled


def test_gguf_tokenizer_and_template(tmp_path: Path) -> None:
    cfg = tiny_config("qwen3")
    lm = load_model(str(write_tiny_gguf(tmp_path / "m.gguf", cfg, random_tensors(cfg))))
    ref = tiny_tokenizer()
    text = "<|im_start|>user\nHello caf\u00e9 \U0001F600 <think>x</think><|im_end|>"
    assert lm.tokenizer.encode(text) == ref.encode(text, add_special_tokens=False).ids
    assert lm.tokenizer.decode(lm.tokenizer.encode(text)) == text
    assert lm.tokenizer.eos_token_ids == {ref.token_to_id("<|im_end|>")}
    assert lm.chat_template.source == QWEN3_TEMPLATE.read_text(encoding="utf-8")
    # <think> is user-defined (type 4): not dropped by skip_special_tokens
    assert lm.tokenizer.decode(lm.tokenizer.encode("<think>a"), skip_special_tokens=True) \
        == "<think>a"

