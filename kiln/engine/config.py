"""Engine configuration: KV cache size and batching limits, validated when built."""

from __future__ import annotations

from dataclasses import dataclass

from kiln.engine.speculative import SpeculativeConfig

# "auto": the model's dtype (exact); "float16": K/V stored as IEEE half (CPU only), half the
# memory and bytes read per step, at the cost of rounding K and V to 11 significant bits.
KV_CACHE_DTYPES = ("auto", "float16")
# The KV cache's size when none is given: this many MiB, or one sequence of the context length
# where that needs more (a model of a long context must not fail to start on the default: a
# Qwen2.5-0.5B GGUF, 32,768 tokens of float32 K/V, needs 768 MiB). On the CPU the cache is
# mapped from zero pages and resident only as it fills, so mapping more costs no memory up front.
DEFAULT_KV_MEMORY_MB = 512


@dataclass(frozen=True)
class EngineConfig:
    block_size: int = 16
    num_blocks: int | None = None  # None -> kv_memory_mb / bytes per block
    kv_memory_mb: int | None = None  # None -> DEFAULT_KV_MEMORY_MB, or one context if more
    kv_cache_dtype: str = "auto"  # one of KV_CACHE_DTYPES
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 512
    # While sequences are decoding, a step computes at most this many prefill tokens, so a long
    # prompt being admitted delays running streams by one short chunk per step, not a long one.
    # 8: on the 2-core CPU a step of 4 decodes + 8 prefill rows takes ~1.9x a decode-only step
    # (16 rows: ~2.9x), measured with the C step (kiln.model.cpu_step.CpuStep).
    max_prefill_tokens_while_decoding: int = 8
    # ... and a chunk after c computed tokens gets at most that cap * S / (S + c), S this many
    # tokens: its attention grows with c (measured on the CPU C step: a prefill row costs
    # ~2.1 ms + ~2.4 us per context token, so S ~ 900 keeps a chunk's cost about flat).
    prefill_cap_context: int = 1024
    enable_prefix_caching: bool = True
    max_model_len: int | None = None  # None -> the model's max_position
    # Distinct LoRA adapters resident on the device at once (running requests together use at
    # most this many; a request that would exceed it waits), and the largest rank accepted.
    max_lora_slots: int = 8
    max_lora_rank: int = 256
    # the name of the weights served at start (SGLang's --weight-version); an update from disk
    # names its own (kiln.engine.loop: AsyncEngine.update_weights)
    weight_version: str = "default"
    # speculative decoding (kiln.engine.speculative; vLLM's --speculative-config): None is off
    speculative: SpeculativeConfig | None = None

    def __post_init__(self) -> None:
        for name in ("block_size", "max_num_seqs", "max_num_batched_tokens",
                     "max_prefill_tokens_while_decoding", "prefill_cap_context", "max_lora_slots",
                     "max_lora_rank"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"EngineConfig.{name} must be a positive int, got {value!r}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"EngineConfig.kv_cache_dtype must be one of {KV_CACHE_DTYPES}, "
                             f"got {self.kv_cache_dtype!r}")
        for name in ("num_blocks", "kv_memory_mb", "max_model_len"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value <= 0
            ):
                raise ValueError(
                    f"EngineConfig.{name} must be a positive int or None, got {value!r}"
                )
        if not isinstance(self.enable_prefix_caching, bool):
            raise ValueError("EngineConfig.enable_prefix_caching must be a bool")


def context_length(config: EngineConfig, max_position: int) -> int:
    """The engine's context window: ``max_model_len`` capped at the model's ``max_position``."""
    return min(config.max_model_len or max_position, max_position)


def kv_blocks(config: EngineConfig, per_block: int, max_position: int) -> int:
    """The KV cache's blocks: ``config.num_blocks``, or as many blocks of ``per_block`` bytes as
    ``kv_memory_mb`` holds; with no ``kv_memory_mb``, as many as DEFAULT_KV_MEMORY_MB holds, or
    one sequence of the context length (``max_position`` capped by the config) if that is more."""
    if config.num_blocks is not None:
        return config.num_blocks
    if config.kv_memory_mb is not None:
        return max(1, config.kv_memory_mb * 1024 * 1024 // per_block)
    one_context = -(-context_length(config, max_position) // config.block_size)
    return max(DEFAULT_KV_MEMORY_MB * 1024 * 1024 // per_block, one_context)

