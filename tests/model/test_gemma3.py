"""Gemma 3's text decoder against transformers: a tiny random ``gemma3_text`` checkpoint written
by transformers itself (norm weights randomised too, so the loader's 1 + w is checked; a sliding
window shorter than the prompt, so the sliding layers' mask and rotary base are), its logits
teacher-forced over a prompt, then decoded token by token over the paged KV cache, and
generated through the engine with the default sampler."""

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
from kiln.model.loader import LoadedModel, load_model
from tests.engine.drive import drive, token_ids
from tests.numerics import assert_logits_close, assert_same_argmax
from tests.tiny_models import TINY_VOCAB, tiny_tokenizer

transformers = pytest.importorskip("transformers")

WINDOW = 8


def write_tiny_gemma3(folder: Path, seed: int = 0, layers: int = 4, pattern: int = 2,
                      scalar: int = 24, **extra: object) -> Path:
    """A random Gemma3ForCausalLM folder (transformers' own writer), with the tiny tokenizer:
    ``layers`` layers, every ``pattern``-th global, ``scalar`` its query_pre_attn_scalar."""
    torch.manual_seed(seed)
    cfg = transformers.Gemma3TextConfig(
        vocab_size=TINY_VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=WINDOW,
        max_position_embeddings=512, query_pre_attn_scalar=scalar,
        sliding_window_pattern=pattern, rms_norm_eps=1e-6, **extra)
    model = transformers.Gemma3ForCausalLM(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):  # transformers starts them at 0 (a scale of 1)
                p.copy_(torch.randn(p.shape) * 0.2)
            else:
                p.copy_(torch.randn(p.shape) * 0.08)
    model.save_pretrained(str(folder))
    tiny_tokenizer().save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"eos_token": "<|im_end|>", "chat_template": "{% for m in messages %}"
         "<start_of_turn>{{ m.role }}\n{{ m.content }}<end_of_turn>\n{% endfor %}"}))
    return folder


@pytest.fixture(scope="module")
def gemma(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, LoadedModel]:
    folder = write_tiny_gemma3(tmp_path_factory.mktemp("gemma3") / "g")
    loaded = load_model(str(folder), device="cpu")
    assert isinstance(loaded, LoadedModel)
    return folder, loaded


def prompt(n: int, seed: int = 1) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return [int(i) for i in torch.randint(3, TINY_VOCAB, (n,), generator=gen)]


def reference(folder: Path, ids: list[int]) -> torch.Tensor:
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    with torch.inference_mode():
        return ref(torch.tensor([ids])).logits[0].float()


def test_the_config_reads_gemma3s_fields(gemma: tuple[Path, LoadedModel]) -> None:
    cfg = gemma[1].config
    assert cfg.arch == "gemma3" and cfg.layer_windows == (WINDOW, 0, WINDOW, 0)
    assert (cfg.rope_theta, cfg.rope_local_theta) == (1_000_000.0, 10_000.0)
    assert cfg.attn_scale == 24 ** -0.5 and cfg.embed_scale == float(torch.tensor(64 ** 0.5))
    assert cfg.norm_shift == 1.0 and cfg.sandwich_norms and cfg.hidden_act == "gelu_tanh"
    assert gemma[1].model.plan.step == "torch"  # the C step runs the plain block only
    assert not cfg.plain_block and set(cfg.record()) >= {"layer_windows", "norm_shift"}


def test_teacher_forced_logits_match_transformers(gemma: tuple[Path, LoadedModel]) -> None:
    folder, loaded = gemma
    ids = prompt(29)  # past the window: the sliding layers' mask matters
    blocks = -(-len(ids) // 4)
    kv = KVCache(loaded.config, blocks, 4, torch.float32, torch.device("cpu"))
    batch = build_forward_batch([(ids, 0, list(range(blocks)))], 4, "all")
    with torch.inference_mode():
        got = loaded.model(batch, kv)
    want = reference(folder, ids)
    assert_logits_close(got, want, loaded.config, len(ids), "gemma3")
    assert_same_argmax(got, want, loaded.config, len(ids))


def test_decoding_over_the_paged_cache_matches_transformers(
        gemma: tuple[Path, LoadedModel]) -> None:
    """A prefill chunk, then one token per step: each step's logits are transformers' at that
    position (the decode path's sliding mask, over blocks of 4)."""
    folder, loaded = gemma
    ids = prompt(26, seed=2)
    want = reference(folder, ids)
    kv = KVCache(loaded.config, 8, 4, torch.float32, torch.device("cpu"))
    table = list(range(7))
    with torch.inference_mode():
        first = loaded.model(build_forward_batch([(ids[:10], 0, table)], 4, "all"), kv)
        rows = [first]
        for p in range(10, len(ids)):
            rows.append(loaded.model(build_forward_batch([(ids[p:p + 1], p, table)], 4), kv))
    got = torch.cat(rows)
    assert_logits_close(got, want, loaded.config, len(ids), "gemma3 decode")


def test_the_engine_generates_transformers_greedy_tokens(
        gemma: tuple[Path, LoadedModel]) -> None:
    folder, loaded = gemma
    ids = prompt(12, seed=3)
    sched, runner = build_core(loaded, EngineConfig(block_size=4, num_blocks=64))
    got = token_ids(drive(sched, runner, [Request("g", ids, SamplingParams(
        temperature=0.0, max_tokens=16, ignore_eos=True))])["g"])
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    with torch.inference_mode():
        out = ref.generate(torch.tensor([ids]), max_new_tokens=16, do_sample=False,
                           min_new_tokens=16)
    want = out[0, len(ids):].tolist()
    # greedy tokens agree while no step's top two logits are within the forward bound; a tiny
    # random model's are far apart at these positions (checked by the teacher-forced test's
    # argmax): compare the prefix up to the first disagreement being a near tie
    assert got == want


def test_what_gemma3_cannot_serve_is_refused() -> None:
    base = {"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text",
            "vocab_size": 32, "hidden_size": 8, "intermediate_size": 16,
            "num_hidden_layers": 2, "num_attention_heads": 2, "head_dim": 4}
    with pytest.raises(UnsupportedModelError, match="attn_logit_softcapping"):
        ModelConfig.from_hf({**base, "attn_logit_softcapping": 50.0})
    with pytest.raises(UnsupportedModelError, match="multimodal"):
        ModelConfig.from_hf({"model_type": "gemma3", "text_config": base})
    cfg = ModelConfig.from_hf(base)  # transformers' defaults: sliding every layer but the 6th
    assert cfg.layer_windows == (4096, 4096)


def test_a_server_serves_a_gemma3_folder(gemma: tuple[Path, LoadedModel]) -> None:
    """`kiln serve --model FOLDER`: chat completions, streamed too, with its own template."""
    from starlette.testclient import TestClient

    from kiln.api.app import build_app
    from kiln.config import ServerConfig
    from kiln.serving import EngineBackend

    cfg = ServerConfig(model=str(gemma[0]), kv_memory_mb=16)
    body = {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 6,
            "temperature": 0, "return_token_ids": True}
    with TestClient(build_app(cfg, EngineBackend.from_config(cfg))) as c:
        r = c.post("/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        assert len(choice["token_ids"]) == 6
        plan = c.get("/health").json()["compute_plan"]
        assert plan["step"] == "torch"
        streamed = c.post("/v1/chat/completions", json={**body, "stream": True})
        assert streamed.status_code == 200 and "data: [DONE]" in streamed.text


def test_a_gemma3_gguf_runs_as_its_folder(tmp_path: Path) -> None:
    """The folder's weights written as llama.cpp's converter writes a Gemma 3 GGUF (norms
    holding 1 + w, llama.cpp's norm names, the window alone in the metadata: every sixth layer
    global, the query scale 1/sqrt(head_dim)): the same config fields and the same logits, bit
    for bit (the same float32 weights on the same path)."""
    from tests.tiny_models import write_tiny_gguf

    folder = write_tiny_gemma3(tmp_path / "g6", seed=5, layers=6, pattern=6, scalar=16)
    hf = load_model(str(folder), device="cpu")
    tensors = {n: p.detach().clone() for n, p in hf.model.named_parameters()}  # 1 + w norms
    gg = load_model(str(write_tiny_gguf(tmp_path / "g6.gguf", hf.config, tensors)),
                    device="cpu")
    assert gg.config.arch == "gemma3" and gg.model.plan.step == "torch"
    same = ("layer_windows", "rope_theta", "rope_local_theta", "embed_scale", "attn_scale",
            "hidden_act", "sandwich_norms", "qk_norm", "tie_word_embeddings")
    assert {k: getattr(gg.config, k) for k in same} == {k: getattr(hf.config, k) for k in same}
    assert gg.config.layer_windows == (WINDOW,) * 5 + (0,) and gg.config.norm_shift == 0.0
    ids = prompt(27, seed=4)
    logits = []
    for loaded in (hf, gg):
        kv = KVCache(loaded.config, 8, 4, torch.float32, torch.device("cpu"))
        with torch.inference_mode():
            logits.append(loaded.model(build_forward_batch([(ids, 0, list(range(7)))], 4, "all"),
                                       kv))
    assert torch.equal(logits[0], logits[1])
    want = reference(folder, ids)
    assert_logits_close(logits[1], want, gg.config, len(ids), "gemma3 gguf")
