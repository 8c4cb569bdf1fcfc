"""Tiny random-weight checkpoints (HF folders) and a small byte-level BPE tokenizer for tests.

Other test packages reuse ``write_tiny_qwen3`` / ``write_tiny_llama`` to get a real model
folder that ``kiln.model.load_model`` serves. Also a process-wide cache of the default model.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np
import torch
from kiln_kernels.testing import add_model_header
from safetensors.torch import save_file
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

from kiln.model import CausalLM, LoadedModel, ModelConfig, build_model, load_model

FIXTURES = Path(__file__).parent / "fixtures"
QWEN3_TEMPLATE = FIXTURES / "qwen3_chat_template.jinja"
QWEN35_XML_TEMPLATE = FIXTURES / "qwen35_xml_chat_template.jinja"  # tool calls in the XML format

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MARKUP_TOKENS = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>",
                 "</tool_response>"]
TINY_VOCAB = 512

_CORPUS = [
    "The capital of France is Paris. The quick brown fox jumps over the lazy dog.",
    "Hello, world! How are you today? I am fine, thank you.",
    'def add(a, b):\n    return a + b\n\nprint(add(1, 2))\n{"name": "get_weather"}',
    "Numbers 0123456789 and symbols: <>&'\"[]{}()+-*/=_%$#@!?",
    "Caf\u00e9 na\u00efve r\u00e9sum\u00e9 \u00fcber stra\u00dfe \u4f60\u597d\u4e16\u754c "
    "\u65e5\u672c\u8a9e \U0001F600 \U0001F680 \u00e9t\u00e9",
    "user assistant system tool weather arguments location unit celsius",
]


def tiny_config(arch: str, *, tie: bool = False, vocab_size: int = TINY_VOCAB) -> ModelConfig:
    """A small config of ``arch`` with GQA (4 query heads, 2 KV heads)."""
    return ModelConfig(
        arch=arch, vocab_size=vocab_size, hidden_size=64, intermediate_size=96, num_layers=2,
        num_heads=4, num_kv_heads=2, head_dim=32 if arch == "qwen3" else 16,
        rms_norm_eps=1e-6, rope_theta=10000.0, max_position=2048, tie_word_embeddings=tie,
        qkv_bias=arch == "qwen2", qk_norm=arch == "qwen3")


def random_tensors(cfg: ModelConfig, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random fp32 weights for every parameter of ``cfg``'s model, keyed by HF names."""
    gen = torch.Generator().manual_seed(seed)
    with torch.device("meta"):
        shapes = {n: tuple(p.shape) for n, p in build_model(cfg).named_parameters()}
    out: dict[str, torch.Tensor] = {}
    for name in sorted(shapes):
        shape = shapes[name]
        noise = torch.randn(shape, generator=gen)
        if name.endswith("norm.weight"):
            out[name] = 1.0 + 0.1 * noise
        elif name.endswith("embed_tokens.weight"):
            out[name] = 0.5 * noise
        elif name.endswith(".bias"):
            out[name] = 0.1 * noise
        else:
            out[name] = noise / shape[-1] ** 0.5
    return out


def model_from_tensors(cfg: ModelConfig, tensors: dict[str, torch.Tensor],
                       dtype: torch.dtype = torch.float32) -> CausalLM:
    """A model built directly (no loader) holding ``tensors``."""
    model = build_model(cfg)
    model.load_state_dict(tensors, strict=True)
    return model.to(dtype).eval()


@functools.cache
def tiny_tokenizer() -> Tokenizer:
    """A byte-level BPE trained on a small corpus, with ChatML / Qwen3 markup tokens."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TINY_VOCAB - len(MARKUP_TOKENS), special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in MARKUP_TOKENS])
    assert tok.get_vocab_size(with_added_tokens=True) <= TINY_VOCAB
    return tok


def _write_checkpoint(folder: Path, cfg: ModelConfig, tensors: dict[str, torch.Tensor],
                      shards: int) -> None:
    names = sorted(tensors)
    if shards == 1:
        save_file({n: tensors[n].contiguous() for n in names}, str(folder / "model.safetensors"))
        return
    weight_map: dict[str, str] = {}
    per = -(-len(names) // shards)
    for i in range(shards):
        part = names[i * per:(i + 1) * per]
        fname = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        save_file({n: tensors[n].contiguous() for n in part}, str(folder / fname))
        weight_map.update(dict.fromkeys(part, fname))
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


def _write_folder(folder: Path, cfg: ModelConfig, seed: int, shards: int,
                  tokenizer_config: dict[str, object], generation_config: dict[str, object],
                  extra_config: dict[str, object]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    tok = tiny_tokenizer()
    tok.save(str(folder / "tokenizer.json"))
    hf = cfg.to_hf()
    hf.update(extra_config)
    hf["torch_dtype"] = "float32"
    (folder / "config.json").write_text(json.dumps(hf, indent=2))
    (folder / "generation_config.json").write_text(json.dumps(generation_config, indent=2))
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2))
    _write_checkpoint(folder, cfg, random_tensors(cfg, seed), shards)
    return folder


def write_tiny_qwen3(dir: Path, *, seed: int = 0, template: Path = QWEN3_TEMPLATE) -> Path:
    """Write a tiny random Qwen3 HF folder (2 safetensors shards + index) into ``dir``, with
    ``template`` as its chat template."""
    tok = tiny_tokenizer()
    im_end = tok.token_to_id("<|im_end|>")
    eot = tok.token_to_id("<|endoftext|>")
    return _write_folder(
        Path(dir), tiny_config("qwen3"), seed, shards=2,
        tokenizer_config={
            "bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
            "chat_template": template.read_text(encoding="utf-8"),
            "model_max_length": 2048},
        generation_config={"eos_token_id": [im_end, eot], "pad_token_id": eot,
                           "do_sample": True, "temperature": 0.6, "top_p": 0.95, "top_k": 20},
        extra_config={"eos_token_id": im_end, "bos_token_id": eot, "attention_bias": False})


def write_tiny_llama(dir: Path, seed: int = 0) -> Path:
    """Write a tiny random Llama HF folder (tied embeddings, single safetensors) into ``dir``.

    Its chat template lives in ``chat_template.jinja`` (plain ChatML)."""
    tok = tiny_tokenizer()
    folder = _write_folder(
        Path(dir), tiny_config("llama", tie=True), seed, shards=1,
        tokenizer_config={"bos_token": "<|im_start|>", "eos_token": "<|im_end|>"},
        generation_config={"eos_token_id": tok.token_to_id("<|im_end|>")},
        extra_config={})
    (folder / "chat_template.jinja").write_text(
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
        encoding="utf-8")
    return folder


@functools.cache
def default_model() -> LoadedModel:
    """The embedded default model, loaded once per test process (fp32, CPU)."""
    return load_model(None, device="cpu")


@functools.cache
def default_gguf_metadata() -> dict[str, object]:
    """The default model's GGUF metadata (no weights read): tokenizer and chat template."""
    from kiln.model.checkpoint.gguf_index import GGUFIndex
    from kiln.model.checkpoint.locate import default_model_path

    return GGUFIndex(default_model_path()).metadata


_GGUF_BLOCK = {v: k for k, v in {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj"}.items()}


# Gemma's norms around each block, as llama.cpp names them (its ffn_norm is the MLP's input norm)
_GGUF_SANDWICH = {**_GGUF_BLOCK, "post_attention_layernorm": "post_attention_norm",
                  "pre_feedforward_layernorm": "ffn_norm",
                  "post_feedforward_layernorm": "post_ffw_norm"}


def _gguf_name(hf: str, sandwich: bool = False) -> str:
    top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight":
           "output_norm.weight", "lm_head.weight": "output.weight"}
    if hf in top:
        return top[hf]
    _, _, layer, *mid, kind = hf.split(".")
    names = _GGUF_SANDWICH if sandwich else _GGUF_BLOCK
    return f"blk.{layer}.{names['.'.join(mid)]}.{kind}"


# A Llama 2 style template (the BOS token, then [INST] turns) for the SentencePiece vocabulary
LLAMA2_TEMPLATE = ("{{ bos_token }}{% for m in messages %}{% if m.role == 'user' %}[INST] "
                   "{{ m.content }} [/INST]{% else %} {{ m.content }} {{ eos_token }}{% endif %}"
                   "{% endfor %}")
SPM_SPACE = "\u2581"


@functools.cache
def toy_spm_vocab(size: int = TINY_VOCAB) -> tuple[list[str], list[float], list[int]]:
    """A SentencePiece vocabulary as a Llama 2 GGUF holds one (pieces, scores, llama.cpp token
    types): <unk>, <s>, </s>, the 256 byte pieces, then the corpus's characters (but for a few,
    left to the byte pieces) and its most frequent 2-4 character substrings of those characters
    (padded to ``size`` with made-up pieces), spaces spelled U+2581, each with its own random
    score."""
    import collections
    import random

    rng = random.Random(7)
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256))]
    types = [2, 3, 3, *([6] * 256)]
    text = " ".join(_CORPUS).replace(" ", SPM_SPACE)
    chars = sorted({c for c in text if c not in "\U0001F600\u4e16Qz"})
    grams: list[str] = []
    for n, keep in ((2, 120), (3, 24), (4, 16)):  # longer pieces: merges of merges
        counts = collections.Counter(text[i:i + n] for i in range(len(text) - n + 1))
        # every character of a piece is a piece, as in a trained vocabulary
        grams += [g for g, _ in counts.most_common() if set(g) <= set(chars)][:keep]
    pieces = (chars + grams)[:size - len(tokens)]
    pieces += [f"{SPM_SPACE}w{i}" for i in range(size - len(tokens) - len(pieces))]  # to size
    return tokens + pieces, [0.0] * len(tokens) + [-rng.random() * 100 for _ in pieces], \
        types + [1] * len(pieces)


def write_tiny_gguf(path: Path, cfg: ModelConfig, tensors: dict[str, torch.Tensor],
                    q8: bool = False,
                    blocks: dict[str, tuple[torch.Tensor, str]] | None = None,
                    spm: bool = False, rope_freqs: list[float] | None = None) -> Path:
    """Write ``tensors`` (HF names, fp32) as an F32 GGUF the way llama.cpp's converter does:
    llama q/k rows permuted for GGML RoPE, tokenizer and chat template in the metadata.
    ``q8``: every matrix (projections, embedding, head) as Q8_0 blocks instead. ``blocks``: HF
    name -> (raw GGML rows uint8 [N, bytes] in HF row order, GGML type name), written as they
    are in place of the float tensor of that name. ``spm``: the SentencePiece vocabulary of
    ``toy_spm_vocab`` and a Llama 2 template, as a Llama 2 / TinyLlama / Mistral GGUF has.
    ``rope_freqs``: a ``rope_freqs.weight`` tensor, as llama.cpp writes Llama 3.1's scaling."""
    import gguf

    w = gguf.GGUFWriter(str(path), "qwen3moe" if cfg.arch == "qwen3_moe" else cfg.arch)
    add_model_header(w, layers=cfg.num_layers, context=cfg.max_position, hidden=cfg.hidden_size,
                     ffn=cfg.intermediate_size, heads=cfg.num_heads, kv_heads=cfg.num_kv_heads,
                     rms_eps=cfg.rms_norm_eps, rope_theta=cfg.rope_theta, head_dim=cfg.head_dim)
    if spm:
        tokens, scores, types = toy_spm_vocab(cfg.vocab_size)
        w.add_tokenizer_model("llama")
        w.add_token_list(tokens)
        w.add_token_scores(scores)
        w.add_token_types(types)
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_unk_token_id(0)
        w.add_add_bos_token(True)
        w.add_chat_template(LLAMA2_TEMPLATE)
    else:
        tok = tiny_tokenizer()
        model_json = json.loads(tok.to_str())["model"]
        vocab: dict[str, int] = tok.get_vocab(with_added_tokens=True)
        tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
        merges = [m if isinstance(m, str) else " ".join(m) for m in model_json["merges"]]
        types = [3 if t in SPECIAL_TOKENS else 4 if t in MARKUP_TOKENS else 1 for t in tokens]
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("default")
        w.add_token_list(tokens)
        w.add_token_merges(merges)
        w.add_token_types(types)
        w.add_eos_token_id(vocab["<|im_end|>"])
        w.add_bos_token_id(vocab["<|im_start|>"])
        w.add_add_bos_token(False)
        w.add_chat_template(QWEN3_TEMPLATE.read_text(encoding="utf-8"))
    if rope_freqs is not None:
        w.add_tensor("rope_freqs.weight", np.asarray(rope_freqs, dtype=np.float32))
    if cfg.layer_windows:  # Gemma 3, as llama.cpp's converter writes it: the window alone
        w.add_sliding_window(max(cfg.layer_windows))
    if cfg.final_logit_softcap:
        w.add_final_logit_softcapping(cfg.final_logit_softcap)
    if cfg.num_experts:  # llama.cpp's qwen3moe: each kind of expert matrix stacked
        w.add_expert_count(cfg.num_experts)
        w.add_expert_used_count(cfg.experts_per_token)
        w.add_expert_feed_forward_length(cfg.moe_intermediate_size)
        tensors = dict(tensors)
        for i in range(cfg.num_layers):
            pre = f"model.layers.{i}.mlp."
            for kind, name in (("gate_proj", "gate_exps"), ("up_proj", "up_exps"),
                               ("down_proj", "down_exps")):
                stack = [tensors.pop(f"{pre}experts.{e}.{kind}.weight")
                         for e in range(cfg.num_experts)]
                w.add_tensor(f"blk.{i}.ffn_{name}.weight", torch.stack(stack).numpy())
            w.add_tensor(f"blk.{i}.ffn_gate_inp.weight", tensors.pop(f"{pre}gate.weight").numpy())
    for name in sorted(tensors):
        raw = None if blocks is None else blocks.get(name)
        arr = tensors[name].numpy().astype("float32") if raw is None else raw[0].numpy()
        if cfg.arch == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = cfg.num_heads if "q_proj" in name else cfg.num_kv_heads
            out, inp = arr.shape
            arr = arr.reshape(heads, 2, out // heads // 2, inp).swapaxes(1, 2).reshape(out, inp)
        gguf_name = _gguf_name(name, cfg.sandwich_norms)
        if raw is not None:
            qtype = getattr(gguf.GGMLQuantizationType, raw[1])
            w.add_tensor(gguf_name, np.ascontiguousarray(arr), raw_dtype=qtype)
        elif q8 and arr.ndim == 2:
            qtype = gguf.GGMLQuantizationType.Q8_0
            w.add_tensor(gguf_name, gguf.quants.quantize(arr, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(gguf_name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
