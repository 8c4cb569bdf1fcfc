"""A GGUF's tensors as the model takes them, without torch: the config its index implies, the
q/k row order, which matrices the CPU kernels can hold, their tiles, float32 values for the
rest, and the HF name of each tensor (:func:`hf_name`). ``kiln.model.gguf_loader`` puts them into the model; start-up tiles with :func:`file_tile_work`
on threads while torch imports (``kiln.model.native.early_tiles``)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
from kiln_kernels.tiling import GGML_TYPES, Item, TileWork, tile_many

from kiln.model.checkpoint.config import ModelConfig, WeightLoadError, config_from_gguf
from kiln.model.checkpoint.gguf_index import GGMLType, GGUFIndex, GGUFTensor

ROPE_FREQS = "rope_freqs.weight"  # Llama 3.1+: one divisor per rotary frequency

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_BLOCK_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "ffn_gate_inp": "mlp.gate",  # a mixture of experts' router
}
# a mixture's experts, stacked in one tensor per kind: ``expert_names`` splits them
_EXPERT_NAMES = {"ffn_gate_exps": "gate_proj", "ffn_up_exps": "up_proj",
                 "ffn_down_exps": "down_proj"}
# a model with norms around each block as well as before (Gemma: ModelConfig.sandwich_norms)
# names them after what they norm: ffn_norm is the MLP's input norm there
_SANDWICH_NAMES = {
    **_BLOCK_NAMES,
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
_BLOCK_RE = re.compile(r"^blk\.(\d+)\.([a-z_]+)\.(weight|bias)$")


def hf_name(gguf_name: str, sandwich: bool = False) -> str:
    """The HF state-dict name of a GGUF tensor name (WeightLoadError for an unknown one);
    ``sandwich``: a model with norms after each block too (``ModelConfig.sandwich_norms``)."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    names = _SANDWICH_NAMES if sandwich else _BLOCK_NAMES
    m = _BLOCK_RE.match(gguf_name)
    if m is None or m.group(2) not in names:
        raise WeightLoadError(f"unknown GGUF tensor {gguf_name!r}")
    return f"model.layers.{m.group(1)}.{names[m.group(2)]}.{m.group(3)}"


def expert_names(gguf_name: str, experts: int) -> list[str] | None:
    """The HF names of a stacked experts tensor's experts, in order (None: not one)."""
    m = _BLOCK_RE.match(gguf_name)
    if m is None or m.group(2) not in _EXPERT_NAMES:
        return None
    return [f"model.layers.{m.group(1)}.mlp.experts.{e}.{_EXPERT_NAMES[m.group(2)]}."
            f"{m.group(3)}" for e in range(experts)]


def unpermute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's q/k row order (for GGML's interleaved RoPE) to HF's rotate_half order."""
    out = w.shape[0]
    rest = w.shape[1:]
    return w.reshape(n_head, out // n_head // 2, 2, *rest).swapaxes(1, 2).reshape(out, *rest)


def row_permutation(cfg: ModelConfig, name: str) -> int | None:
    """The head count whose llama.cpp q/k row order this tensor needs undone (llama only)."""
    if cfg.arch != "llama":
        return None
    if name.endswith("attn_q.weight"):
        return cfg.num_heads
    if name.endswith("attn_k.weight"):
        return cfg.num_kv_heads
    return None


def unpackable(tensor: GGUFTensor) -> str | None:
    """Why the kernels cannot hold this matrix (None: they can): its type has no kernel, or
    its rows do not come in fours (the tiles' unit)."""
    if tensor.tensor_type.name not in GGML_TYPES:
        return f"type {tensor.tensor_type.name} has no CPU kernel"
    if int(tensor.shape[-1]) % 4:
        return f"{int(tensor.shape[-1])} rows, not a multiple of 4"
    if int(tensor.shape[0]) % GGML_TYPES[tensor.tensor_type.name][0]:
        return f"{int(tensor.shape[0])} columns, not whole blocks"
    return None


def dequantize(tensor: GGUFTensor) -> np.ndarray:
    """gguf-py's float32 values of a tensor, shaped as the model holds it, writable."""
    if tensor.tensor_type in (GGMLType.F32, GGMLType.F16):  # a typed array: widened exactly
        arr = tensor.data.astype(np.float32)  # a new array (the data is the file's map)
    else:  # gguf-py imported only here: the norms and most files need none of it
        import gguf

        kind = gguf.GGMLQuantizationType(int(tensor.tensor_type))
        arr = np.asarray(gguf.quants.dequantize(tensor.data, kind), dtype=np.float32)
        if not arr.flags.writeable:
            arr = arr.copy()
    return arr.reshape(tuple(reversed(tensor.shape)))


def read_config(reader: GGUFIndex) -> ModelConfig:
    """The model's config from the file's metadata and tensor table."""
    by_name = {t.name: t for t in reader.tensors}
    embd = by_name.get("token_embd.weight")
    if embd is None:
        raise ValueError("GGUF file has no token_embd.weight")
    freqs = by_name.get(ROPE_FREQS)
    return config_from_gguf(
        reader.metadata, vocab_size=int(embd.shape[1]), has_output="output.weight" in by_name,
        has_qkv_bias="blk.0.attn_q.bias" in by_name,
        has_qk_norm="blk.0.attn_q_norm.weight" in by_name,
        rope_divisors=None if freqs is None else tuple(float(x) for x in dequantize(freqs).ravel()))


def _item(tensor: GGUFTensor, heads: int | None) -> Item:
    n = int(tensor.shape[-1])
    raw = np.ascontiguousarray(tensor.data).view(np.uint8).reshape(n, -1)
    return raw, tensor.tensor_type.name, (None if heads is None
                                          else unpermute_qk(np.arange(n, dtype=np.int64), heads))


def tile(tensor: GGUFTensor, heads: int | None) -> tuple[str, np.ndarray]:
    """A matrix the kernels can hold (``unpackable`` is None), rows in HF order, as
    ``(format, tiles)``. The file's bytes are read once, by the copy into the tiles."""
    return tile_many([_item(tensor, heads)])[0]


def tile_tensors(cfg: ModelConfig, tensors: list[GGUFTensor]) -> list[tuple[str, np.ndarray]]:
    """:func:`tile` of each of these matrices (of the model ``cfg``), in one C call."""
    return tile_many([_item(t, row_permutation(cfg, t.name)) for t in tensors])


def file_tile_work(path: Path) -> tuple[GGUFIndex, list[str], TileWork]:
    """The file's index, the GGUF names of every matrix the kernels can hold, and their tiling,
    ready for threads to run (``TileWork.run``; its ``tiles`` follow the names)."""
    reader = GGUFIndex(path)
    cfg = read_config(reader)
    todo = [t for t in reader.tensors  # (a mixture's stacked experts are not tiled)
            if len(t.shape) == 2 and t.name != ROPE_FREQS and unpackable(t) is None]
    work = TileWork([_item(t, row_permutation(cfg, t.name)) for t in todo])
    return reader, [t.name for t in todo], work
