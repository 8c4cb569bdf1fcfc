"""Model hyper-parameters, shared by every architecture, and their parsing from HF / GGUF."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from kiln.model.checkpoint import rope
from kiln.model.checkpoint.errors import UnsupportedModelError, WeightLoadError
from kiln.model.checkpoint.families import (
    gemma3_from_gguf,
    gemma3_from_hf,
    gguf_float,
    moe_from_gguf,
    moe_from_hf,
)
from kiln.model.checkpoint.rope import RopeScaling

__all__ = ["SUPPORTED_ARCHS", "VARIANT_FIELDS", "ModelConfig", "UnsupportedModelError",
           "WeightLoadError", "config_from_gguf"]

SUPPORTED_ARCHS = ("llama", "qwen2", "qwen3", "gemma3", "qwen3_moe")

# HF `architectures` entries we accept, mapped to our architecture names.
_HF_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Gemma3ForCausalLM": "gemma3",
    "Qwen3MoeForCausalLM": "qwen3_moe",
}
# what Gemma 3's text decoder and the mixture-of-experts models add to the Llama block
# (``ModelConfig``'s fields after rope_scaling; their defaults are the Llama block's, and a
# config at its defaults records none)
VARIANT_FIELDS = ("layer_windows", "rope_local_theta", "embed_scale", "attn_scale", "hidden_act",
                  "sandwich_norms", "norm_shift", "final_logit_softcap", "num_experts",
                  "experts_per_token", "moe_intermediate_size", "norm_topk_prob", "moe_layers")


@dataclass(frozen=True)
class ModelConfig:
    arch: str  # "llama" | "qwen2" | "qwen3" | "gemma3"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position: int  # context window
    tie_word_embeddings: bool
    qkv_bias: bool
    qk_norm: bool
    # for a longer context than trained (kiln.model.checkpoint.rope)
    rope_scaling: RopeScaling | None = None
    # per layer, the sliding window its attention looks back over (0: the whole context);
    # () for a model without one (Gemma 3: five sliding layers to one global, window 512-1024)
    layer_windows: tuple[int, ...] = ()
    # the rotary base of the sliding layers (0: rope_theta); they take no rope_scaling
    rope_local_theta: float = 0.0
    embed_scale: float = 1.0  # the token embeddings' multiplier (Gemma: sqrt(hidden_size))
    attn_scale: float = 0.0  # the attention scores' scale (0: head_dim ** -0.5)
    hidden_act: str = "silu"  # the MLP's gate activation: "silu" | "gelu_tanh"
    # norms after the attention and the MLP as well as before (Gemma's four per layer)
    sandwich_norms: bool = False
    # added to an HF checkpoint's norm weights at load (Gemma's RMSNorm scales by 1 + w; GGUF
    # files hold the sum already)
    norm_shift: float = 0.0
    final_logit_softcap: float = 0.0  # logits = c * tanh(logits / c) (0: none)
    # mixture of experts (Qwen3-MoE): the experts of an MoE layer's MLP, how many each token is
    # routed to (softmax top-k, renormalised over the k with norm_topk_prob), their
    # intermediate size, and which layers are MoE (() for none)
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False
    moe_layers: tuple[bool, ...] = ()

    def __post_init__(self) -> None:
        if self.arch not in SUPPORTED_ARCHS:
            raise UnsupportedModelError(f"unsupported architecture {self.arch!r}")
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers",
                     "num_heads", "num_kv_heads", "head_dim", "max_position"):
            if getattr(self, name) <= 0:
                raise UnsupportedModelError(f"model config: {name} must be positive")
        if self.num_heads % self.num_kv_heads != 0:
            raise UnsupportedModelError(
                f"model config: num_heads {self.num_heads} is not a multiple of "
                f"num_kv_heads {self.num_kv_heads}")
        if self.head_dim % 2 != 0:
            raise UnsupportedModelError("model config: head_dim must be even for rotary embedding")
        if self.layer_windows and len(self.layer_windows) != self.num_layers:
            raise UnsupportedModelError("model config: one sliding window per layer")
        if self.moe_layers and (len(self.moe_layers) != self.num_layers or not
                                0 < self.experts_per_token <= self.num_experts or
                                self.moe_intermediate_size <= 0):
            raise UnsupportedModelError("model config: experts, experts per token, their size "
                                        "and one MoE flag per layer")
        if self.hidden_act not in ("silu", "gelu_tanh"):
            raise UnsupportedModelError(f"model config: hidden_act {self.hidden_act!r}")

    @property
    def plain_block(self) -> bool:
        """Whether the layers are the Llama block the C step runs (no Gemma field set)."""
        fields = ModelConfig.__dataclass_fields__
        return all(getattr(self, name) == fields[name].default for name in VARIANT_FIELDS)

    def is_moe(self, layer: int) -> bool:
        """Whether ``layer``'s MLP is a mixture of experts."""
        return bool(self.moe_layers) and self.moe_layers[layer]

    def window(self, layer: int) -> int:
        """The sliding window of ``layer``'s attention (0: the whole context)."""
        return self.layer_windows[layer] if self.layer_windows else 0

    @classmethod
    def from_hf(cls, cfg: Mapping[str, Any]) -> ModelConfig:
        """Build from a Hugging Face ``config.json`` dict."""
        arch = _hf_arch(cfg)
        if arch == "gemma3":
            return cls(**gemma3_from_hf(cfg))
        moe: dict[str, Any] = {}
        if arch == "qwen3_moe":
            moe = moe_from_hf(cfg)
        try:
            scaling = rope.from_hf(cfg)
        except rope.RopeScalingError as exc:
            raise UnsupportedModelError(str(exc)) from exc
        rope_theta = cfg.get("rope_theta")
        params = cfg.get("rope_parameters")
        if rope_theta is None and isinstance(params, Mapping):
            rope_theta = params.get("rope_theta")
        hidden = int(cfg["hidden_size"])
        heads = int(cfg["num_attention_heads"])
        head_dim = cfg.get("head_dim") or hidden // heads
        attention_bias = bool(cfg.get("attention_bias", False))
        if arch != "qwen2" and attention_bias:
            raise UnsupportedModelError("attention_bias=true is not supported for " + arch)
        return cls(
            arch=arch,
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(cfg["intermediate_size"]),
            num_layers=int(cfg["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(head_dim),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=float(rope_theta if rope_theta is not None else 10000.0),
            max_position=_context(cfg, arch),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=arch == "qwen2",
            qk_norm=arch in ("qwen3", "qwen3_moe"),
            rope_scaling=scaling,
            **moe,
        )

    def record(self) -> dict[str, Any]:
        """The config as plain values, for identities and provenance: a config without rope
        scaling has no such key, so its hashes are those of the configs before the field."""
        out = asdict(self)
        if self.rope_scaling is None:
            del out["rope_scaling"]
        defaults = ModelConfig.__dataclass_fields__
        for name in VARIANT_FIELDS:
            if out[name] == defaults[name].default:
                del out[name]
        return out

    def to_hf(self) -> dict[str, Any]:
        """A ``config.json`` dict that :meth:`from_hf` reads back to this config (the Llama
        block's architectures)."""
        if not self.plain_block:
            raise UnsupportedModelError("to_hf writes the Llama block's configs only")
        names = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                 "qwen3": "Qwen3ForCausalLM"}
        return {
            "architectures": [names[self.arch]],
            "model_type": self.arch,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "max_position_embeddings": self.max_position,
            "tie_word_embeddings": self.tie_word_embeddings,
            "hidden_act": "silu",
            **({"rope_scaling": self.rope_scaling.to_hf()} if self.rope_scaling else {}),
        }


def _context(cfg: Mapping[str, Any], arch: str) -> int:
    """``max_position_embeddings``, capped at the sliding window where the model attends
    through one (Mistral 7B v0.1 and its fine-tunes: 4,096 of 32,768; Qwen2 with
    ``use_sliding_window``). Within the window full attention is exactly sliding-window
    attention, and the engine attends to everything before a token: so the context stops there
    rather than the attention quietly reaching past the window."""
    context = int(cfg.get("max_position_embeddings", 4096))
    window = cfg.get("sliding_window")
    if arch != "llama" and cfg.get("use_sliding_window") is not True:
        window = None  # Qwen2 / Qwen3 name a window they use only when told to
    if isinstance(window, int) and not isinstance(window, bool) and 0 < window < context:
        return window
    return context


def _hf_arch(cfg: Mapping[str, Any]) -> str:
    for name in cfg.get("architectures") or []:
        if name in _HF_ARCHITECTURES:
            return _HF_ARCHITECTURES[name]
    model_type = cfg.get("model_type")
    if model_type in SUPPORTED_ARCHS:
        return str(model_type)
    if model_type == "gemma3_text":
        return "gemma3"
    if model_type == "mistral":
        return "llama"
    raise UnsupportedModelError(
        f"unsupported model: architectures={cfg.get('architectures')!r}, "
        f"model_type={model_type!r} (supported: Llama, Qwen2, Qwen3, Gemma 3's text "
        "decoder)")


# llama.cpp's architecture names that differ from ours
_GGUF_ARCHS = {"qwen3moe": "qwen3_moe"}


def config_from_gguf(meta: Mapping[str, Any], *, vocab_size: int, has_output: bool,
                     has_qkv_bias: bool, has_qk_norm: bool,
                     rope_divisors: tuple[float, ...] | None = None) -> ModelConfig:
    """Build from GGUF metadata (already decoded to Python values); ``rope_divisors``: the
    file's ``rope_freqs.weight`` (Llama 3.1+), if it has one."""
    gguf_arch = str(meta.get("general.architecture", ""))
    arch = _GGUF_ARCHS.get(gguf_arch, gguf_arch)
    if arch not in SUPPORTED_ARCHS:
        raise UnsupportedModelError(f"unsupported GGUF architecture {gguf_arch!r}")

    def key(name: str) -> Any:
        full = f"{gguf_arch}.{name}"
        if full not in meta:
            raise UnsupportedModelError(f"GGUF metadata lacks {full}")
        return meta[full]

    hidden = int(key("embedding_length"))
    heads = int(key("attention.head_count"))
    head_dim = int(meta.get(f"{gguf_arch}.attention.key_length", hidden // heads))
    try:
        scaling = rope.from_gguf(meta, gguf_arch, rope_divisors, head_dim)
    except rope.RopeScalingError as exc:
        raise UnsupportedModelError(str(exc)) from exc
    extra = gemma3_from_gguf(meta, int(key("block_count")), hidden, heads, head_dim) \
        if arch == "gemma3" else {}
    if arch == "qwen3_moe":
        extra = moe_from_gguf(meta, int(key("block_count")))
    return ModelConfig(
        arch=arch,
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=int(key("feed_forward_length")),
        num_layers=int(key("block_count")),
        num_heads=heads,
        num_kv_heads=int(meta.get(f"{gguf_arch}.attention.head_count_kv", heads)),
        head_dim=head_dim,
        rms_norm_eps=gguf_float(key("attention.layer_norm_rms_epsilon")),
        rope_theta=gguf_float(meta.get(f"{gguf_arch}.rope.freq_base", 10000.0)),
        max_position=int(key("context_length")),
        tie_word_embeddings=not has_output,
        qkv_bias=has_qkv_bias,
        qk_norm=has_qk_norm,
        rope_scaling=scaling,
        **extra,
    )
