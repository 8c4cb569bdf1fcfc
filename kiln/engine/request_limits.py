"""What a request can never get from this engine, checked when it is submitted (any thread):
a prompt longer than the context or the KV cache, an adapter mix the slots cannot hold, a
thinking budget that cannot close within ``max_tokens``. A request that passes may still wait
for room (the scheduler's admission); one that fails gets its 400 at once, never a hang.
Reads only settings fixed when the engine was built. Pure Python."""

from __future__ import annotations

from kiln.engine.config import EngineConfig
from kiln.engine.errors import EngineError
from kiln.engine.lora_mix import LoraMix, check_mix
from kiln.engine.request import Request
from kiln.text.thinking_budget import validate_budget


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class RequestLimits:
    """The engine's fixed limits: its context length, its KV cache's blocks, its adapter slots."""

    def __init__(self, config: EngineConfig, max_model_len: int, num_blocks: int) -> None:
        self.config = config
        self.block_size = config.block_size
        self.max_model_len = max_model_len
        self.num_blocks = num_blocks

    @property
    def kv_capacity_tokens(self) -> int:
        return self.num_blocks * self.block_size

    def check(self, req: Request) -> int:
        """Raise EngineError if ``req`` can never run; else return its clamped max_tokens."""
        n = len(req.prompt_token_ids)
        if n == 0:
            raise EngineError("empty_prompt", "The prompt must contain at least one token.", 400)
        if n >= self.max_model_len:
            raise EngineError(
                "context_length_exceeded",
                f"This model's maximum context length is {self.max_model_len} tokens, but the "
                f"prompt has {n} tokens (max_tokens {req.sampling.max_tokens}).",
            )
        if _cdiv(n + 1, self.block_size) > self.num_blocks:  # never fits: not a retry
            raise EngineError(
                "context_length_exceeded",
                f"The prompt has {n} tokens but the KV cache holds at most "
                f"{self.kv_capacity_tokens - 1} prompt tokens.",
            )
        self.check_lora(req.lora)
        window = min(self.max_model_len, self.kv_capacity_tokens) - n
        max_tokens = max(0, min(req.sampling.max_tokens, window))
        spec = req.sampling.thinking
        if spec is not None:
            error = validate_budget(True, len(spec.close_ids), max_tokens, req.sampling.stop)
            if error is not None:
                raise EngineError("chat_invalid_request", error, 400)
        return max_tokens

    def check_lora(self, mix: LoraMix) -> None:
        """Raise EngineError (400) if the adapter mix ``mix`` can never run on this engine."""
        error = check_mix(mix, self.config.max_lora_slots, self.config.max_lora_rank) if mix \
            else None  # the base model always runs (kiln.engine.lora_mix not entered)
        if error is not None:
            raise EngineError("invalid_compose_request", error, 400)


__all__ = ["RequestLimits"]
