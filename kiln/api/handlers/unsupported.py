"""Fields this server does not implement (the seeds' and some of vLLM's): set to anything but
their default, a 400 `unsupported_parameter` naming the field, never a silent 200
(docs/decisions.md)."""

from __future__ import annotations

from typing import Any

from msgspec import UNSET

from kiln.api.errors import ApiError

CODE = "unsupported_parameter"

# vLLM's former guided_* fields: it dropped them for structured_outputs and now ignores them, so
# a client written for them would get unconstrained text with a 200; here they are refused,
# naming the field that does it now
GUIDED_KINDS = ("json", "regex", "choice", "grammar", "whitespace_pattern")
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
    "chat_template": (None,),
    **{f"guided_{kind}": (None,) for kind in GUIDED_KINDS},
    "logits_processors": (None, []),
    "mm_processor_kwargs": (None, {}),
}
# What more there is to say of a refused field than "only the default"
REASONS: dict[str, str] = {
    "chat_template": "the server renders every conversation with its own template "
                     "(--chat-template sets it), as vLLM does unless started with "
                     "--trust-request-chat-template",
    **{f"guided_{kind}": f"vLLM replaced it with structured_outputs.{kind}, which this server "
                         "supports" for kind in GUIDED_KINDS},
    "logits_processors": "it runs no code named by a request; logit_bias, allowed_token_ids, "
                         "bad_words and min_tokens are built in",
    "mm_processor_kwargs": "its models read text only",
}
# Chat's and batch's share of them (the ones vLLM's chat request has too: issue 25; they had
# been accepted and ignored as unknown fields).
CHAT_FIELDS: tuple[str, ...] = ("use_beam_search", "length_penalty", "kv_transfer_params",
                                "vllm_xargs", "chat_template",
                                *(f"guided_{kind}" for kind in GUIDED_KINDS),
                                "logits_processors", "mm_processor_kwargs")
COMPLETION_FIELDS = tuple(k for k in NEUTRAL if k not in (
    "continue_final_message", "chat_template", "logits_processors", "mm_processor_kwargs"))


def unsupported(param: str, why: str) -> ApiError:
    return ApiError(400, CODE, f"{param} is not supported by this server: {why}", param=param)


def check(req: Any, fields: tuple[str, ...]) -> None:
    for name in fields:
        value = getattr(req, name, UNSET)
        if value is UNSET or value in NEUTRAL[name]:  # the contract keeps bools and numbers apart
            continue
        raise unsupported(name, REASONS.get(name) or f"only {NEUTRAL[name][0]!r} (the default) "
                                                     f"is accepted, got {value!r}")
