"""Seed fields this server does not implement: set to anything but their default, a 400
`unsupported_parameter` naming the field, never a silent 200 (docs/decisions.md)."""

from __future__ import annotations

from typing import Any

from msgspec import UNSET

from kiln.api.errors import ApiError

CODE = "unsupported_parameter"

# field -> the values that mean "not set" (missing is always fine)
NEUTRAL: dict[str, tuple[Any, ...]] = {
    "suffix": (None,),
    "use_beam_search": (False,),
    "watermarking": (None, False),
    "length_penalty": (1.0,),
    "prompt_embeds": (None,),
    "routed_experts_prompt_start": (0,),
    "return_token_offsets": (None, False),
    "mm_payload": ("tensors",),
    "return_mm_kwargs": (None,),
    "kv_transfer_params": (None,),
    "ec_transfer_params": (None,),
    "vllm_xargs": (None,),
    "continue_final_message": (False,),
}
# Chat's and batch's share of them (the ones vLLM's chat request has too: issue 25; they had
# been accepted and ignored as unknown fields).
CHAT_FIELDS: tuple[str, ...] = ("use_beam_search", "length_penalty", "kv_transfer_params",
                                "vllm_xargs")
COMPLETION_FIELDS = tuple(k for k in NEUTRAL if k != "continue_final_message")


def unsupported(param: str, why: str) -> ApiError:
    return ApiError(400, CODE, f"{param} is not supported by this server: {why}", param=param)


def check(req: Any, fields: tuple[str, ...]) -> None:
    for name in fields:
        value = getattr(req, name, UNSET)
        if value is UNSET or value in NEUTRAL[name]:  # the contract keeps bools and numbers apart
            continue
        raise unsupported(name, f"only {NEUTRAL[name][0]!r} (the default) is accepted, "
                                f"got {value!r}")
