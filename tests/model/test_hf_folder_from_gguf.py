"""bench/peers/hf_folder.py: the HF folder written from a BF16 GGUF holds the GGUF's weights bit
for bit in HF order (llama q/k rows un-permuted), and Kiln serves it as it serves the GGUF: the
C step, the same weights, tokenizer, chat template and logits."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from kiln_kernels.cpu import available as kernels_available
from safetensors import safe_open

from bench.peers.hf_folder import write_folder
from kiln.model import KVCache, build_forward_batch, load_model
from kiln.model.float32_copies import float32_state_dict
from tests.tiny_models import random_tensors, tiny_config, write_tiny_gguf

pytestmark = pytest.mark.skipif(not kernels_available(), reason="no C compiler for the kernels")

ODD_NORM = "model.norm.weight"  # left float32, not bf16-exact: the folder must keep it float32


def bf16_gguf(path: Path, arch: str, tie: bool) -> tuple[Path, dict[str, torch.Tensor]]:
    """A tiny GGUF whose matrices are BF16 blocks (as llama-quantize's BF16 writes them) and
    whose 1-D tensors are F32; the weights it holds, in HF order (float32)."""
    cfg = tiny_config(arch, tie=tie)
    tensors = {n: t if n == ODD_NORM else t.to(torch.bfloat16).float()
               for n, t in random_tensors(cfg, seed=3).items()}
    blocks = {n: (t.to(torch.bfloat16).view(torch.uint8), "BF16")
              for n, t in tensors.items() if t.dim() == 2}
    return write_tiny_gguf(path, cfg, tensors, blocks=blocks), tensors


@pytest.mark.parametrize(("arch", "tie"), [("llama", True), ("qwen2", False)])
def test_folder_holds_the_gguf_weights(tmp_path: Path, arch: str, tie: bool) -> None:
    gguf_path, want = bf16_gguf(tmp_path / "tiny-BF16.gguf", arch, tie)
    folder = write_folder(gguf_path, tmp_path / "hf")
    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        held = {k: f.get_tensor(k) for k in f.keys()}
    assert set(held) == set(want)  # tied: no lm_head.weight, as the GGUF has no output.weight
    assert ("lm_head.weight" in held) is not tie
    for name, t in held.items():
        assert t.dtype == (torch.float32 if name == ODD_NORM else torch.bfloat16), name
        assert torch.equal(t.float(), want[name]), name

    from_gguf, from_folder = load_model(str(gguf_path)), load_model(str(folder))
    assert (from_folder.model.plan.step, from_folder.model.plan.weights) == ("c", "packed")
    assert from_folder.model.plan == from_gguf.model.plan
    a, b = float32_state_dict(from_gguf.model), float32_state_dict(from_folder.model)
    assert a.keys() == b.keys()
    for name in a:  # the folder's weights are the GGUF's dequantized weights, in HF order
        assert torch.equal(a[name], b[name]), name
    tok_a, tok_b = from_gguf.tokenizer, from_folder.tokenizer
    assert tok_a.content_sha256() == tok_b.content_sha256()
    assert tok_a.config_sha256() == tok_b.config_sha256()
    msgs = [{"role": "user", "content": "The capital of France is"}]
    prompt = from_gguf.chat_template.render(msgs)
    assert prompt == from_folder.chat_template.render(msgs)

    ids = tok_a.encode(prompt)[:24]
    logits = []
    for lm in (from_gguf, from_folder):
        kv = KVCache(lm.config, 4, 8, torch.float32, torch.device("cpu"), heads_major=True)
        logits.append(lm.model(build_forward_batch([(ids, 0, [0, 1, 2, 3])], 8, "all"), kv))
    assert torch.equal(logits[0], logits[1])  # the same weights through the same kernels
