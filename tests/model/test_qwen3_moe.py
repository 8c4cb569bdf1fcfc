"""Qwen3-MoE against transformers: a tiny random ``qwen3_moe`` checkpoint written by
transformers (4 experts, 2 per token, a dense layer among the sparse ones), teacher-forced
logits and the engine's greedy tokens; what it cannot serve is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from kiln.engine.config import EngineConfig
from kiln.engine.loop import build_core
from kiln.engine.request import Request, SamplingParams
from kiln.model.batch import build_forward_batch
from kiln.model.checkpoint.config import ModelConfig, UnsupportedModelError
from kiln.model.kv_cache import KVCache
from kiln.model.layers import MoEMLP
from kiln.model.loader import LoadedModel, load_model
from kiln.model.lora import AdapterLoadError, load_adapter
from tests.engine.drive import drive, token_ids
from tests.numerics import assert_logits_close, assert_same_argmax
from tests.tiny_models import TINY_VOCAB, tiny_tokenizer

transformers = pytest.importorskip("transformers")


def write_tiny_qwen3_moe(folder: Path, seed: int = 0, norm_topk: bool = True,
                         dense: tuple[int, ...] = (1,), layers: int = 3) -> Path:
    """A random Qwen3MoeForCausalLM folder (transformers' writer): ``dense`` its layers with a
    plain MLP."""
    torch.manual_seed(seed)
    cfg = transformers.Qwen3MoeConfig(
        vocab_size=TINY_VOCAB, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        num_experts=4, num_experts_per_tok=2, norm_topk_prob=norm_topk,
        max_position_embeddings=512, decoder_sparse_step=1, mlp_only_layers=list(dense))
    model = transformers.Qwen3MoeForCausalLM(cfg)
    with torch.no_grad():
        for _, p in model.named_parameters():
            p.copy_(torch.randn(p.shape) * 0.1 + (1.0 if p.dim() == 1 else 0.0))
    model.save_pretrained(str(folder))
    tiny_tokenizer().save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"eos_token": "<|im_end|>", "chat_template": "{{ messages }}"}))
    return folder


def prompt(n: int, seed: int = 1) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return [int(i) for i in torch.randint(3, TINY_VOCAB, (n,), generator=gen)]


@pytest.mark.parametrize("norm_topk", [True, False])
def test_logits_and_greedy_tokens_match_transformers(tmp_path: Path, norm_topk: bool) -> None:
    folder = write_tiny_qwen3_moe(tmp_path / "m", norm_topk=norm_topk)
    loaded = load_model(str(folder), device="cpu")
    assert isinstance(loaded, LoadedModel)
    cfg = loaded.config
    assert (cfg.arch, cfg.num_experts, cfg.experts_per_token, cfg.moe_layers) == \
        ("qwen3_moe", 4, 2, (True, False, True))
    assert loaded.model.plan.step == "torch"
    assert isinstance(loaded.model.model.layers[0].mlp, MoEMLP)
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    ids = prompt(21)
    kv = KVCache(cfg, 8, 4, torch.float32, torch.device("cpu"))
    with torch.inference_mode():
        got = loaded.model(build_forward_batch([(ids, 0, list(range(6)))], 4, "all"), kv)
        want = ref(torch.tensor([ids])).logits[0].float()
    assert_logits_close(got, want, cfg, len(ids), "qwen3_moe")
    assert_same_argmax(got, want, cfg, len(ids))
    sched, runner = build_core(loaded, EngineConfig(block_size=4, num_blocks=64))
    out = token_ids(drive(sched, runner, [Request("g", ids[:9], SamplingParams(
        temperature=0.0, max_tokens=12, ignore_eos=True))])["g"])
    with torch.inference_mode():
        gen = ref.generate(torch.tensor([ids[:9]]), max_new_tokens=12, min_new_tokens=12,
                           do_sample=False)
    assert out == gen[0, 9:].tolist()


def test_a_batch_routes_each_row_as_it_would_alone(tmp_path: Path) -> None:
    """Experts grouped over a step's rows: a row's expert choice and weights are its own."""
    loaded = load_model(str(write_tiny_qwen3_moe(tmp_path / "m")), device="cpu")
    moe = loaded.model.model.layers[0].mlp
    assert isinstance(moe, MoEMLP)
    x = torch.randn(7, 64, generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        together = moe(x)
        alone = torch.cat([moe(x[i:i + 1]) for i in range(7)])
    experts, _ = moe.route(x)
    assert len(set(experts.flatten().tolist())) > 2  # the rows do not all share two experts
    assert torch.allclose(together, alone, rtol=1e-5, atol=1e-6)


def test_what_qwen3_moe_cannot_serve_is_refused(tmp_path: Path) -> None:
    base = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
            "vocab_size": 32, "hidden_size": 8, "intermediate_size": 16,
            "num_hidden_layers": 2, "num_attention_heads": 2, "head_dim": 4,
            "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 8}
    with pytest.raises(UnsupportedModelError, match="shared experts"):
        ModelConfig.from_hf({**base, "shared_expert_intermediate_size": 8})
    with pytest.raises(UnsupportedModelError, match="experts"):
        ModelConfig.from_hf({**base, "num_experts_per_tok": 5})
    from tests.model.test_lora import write_peft

    cfg = ModelConfig.from_hf(base)
    with pytest.raises(AdapterLoadError, match="mixture of experts"):
        load_adapter(write_peft(tmp_path / "a", cfg, r=2, alpha=4, targets=("up_proj",),
                                seed=1), cfg)
    attn_only = load_adapter(write_peft(tmp_path / "b", cfg, r=2, alpha=4,
                                        targets=("q_proj",), seed=1), cfg)
    assert attn_only.target_modules == ("q_proj",)


def test_a_qwen3_moe_gguf_runs_as_its_folder(tmp_path: Path) -> None:
    """The folder's weights written as llama.cpp's converter writes a qwen3moe GGUF (each kind
    of expert matrix stacked, the router as ffn_gate_inp, every layer a mixture with its weights
    renormalised): the same config and the same logits, bit for bit."""
    from tests.tiny_models import write_tiny_gguf

    hf = load_model(str(write_tiny_qwen3_moe(tmp_path / "m", dense=(), layers=2)), device="cpu")
    tensors = {n: p.detach().clone() for n, p in hf.model.named_parameters()}
    gg = load_model(str(write_tiny_gguf(tmp_path / "m.gguf", hf.config, tensors)), device="cpu")
    assert gg.config.record() == {**hf.config.record(), "max_position": gg.config.max_position}
    ids = prompt(19, seed=6)
    logits = []
    for loaded in (hf, gg):
        kv = KVCache(loaded.config, 8, 4, torch.float32, torch.device("cpu"))
        with torch.inference_mode():
            logits.append(loaded.model(build_forward_batch([(ids, 0, list(range(5)))], 4, "all"),
                                       kv))
    assert torch.equal(logits[0], logits[1])
    # the server's load (torch_free) finds no C program for it and loads it with torch
    assert load_model(str(tmp_path / "m.gguf"), device="cpu", torch_free=True).config.arch == \
        "qwen3_moe"
