"""The request fields this server does not implement (the seeds' and some of vLLM's and
OpenAI's): set to anything but their default, a 400 ``unsupported_parameter`` naming the field,
never a silent 200 (docs/decisions.md). Each route's share is a tuple of field names; the served
OpenAPI publishes them as ``non_default_refused`` rules (``kiln.api.openapi_rule_parts``)."""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec import UNSET

from kiln.api.errors import ApiError

# Fields this server does not implement (the seeds' and some of vLLM's): set to anything but
# their default, a 400 `unsupported_parameter` naming the field, never a silent 200
# (docs/decisions.md).
UNSUPPORTED_CODE = "unsupported_parameter"

# vLLM's former guided_* fields: it dropped them for structured_outputs and now ignores them, so
# a client written for them would get unconstrained text with a 200; here they are refused,
# naming the field that does it now
GUIDED_KINDS = ("json", "regex", "choice", "grammar", "whitespace_pattern")
# field -> the values that mean "not set" (missing is always fine)
DEFAULT_ONLY: dict[str, tuple[Any, ...]] = {
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
    # OpenAI's chat fields that ask for behaviour this server does not have (issue 52; its
    # labels, user, safety_identifier, prompt_cache_key and metadata, are accepted)
    "modalities": (None, ["text"]),
    "audio": (None,),
    "prediction": (None,),
    "web_search_options": (None,),
    "service_tier": (None, "auto", "default"),
    "store": (None, False),
    "verbosity": (None, "medium"),
    "stream": (False,),  # batch: one JSON body
}
# What more there is to say of a refused field than "only the default"
REFUSAL_REASONS: dict[str, str] = {
    "chat_template": "the server renders every conversation with its own template "
                     "(--chat-template sets it), as vLLM does unless started with "
                     "--trust-request-chat-template",
    **{f"guided_{kind}": f"vLLM replaced it with structured_outputs.{kind}, which this server "
                         "supports" for kind in GUIDED_KINDS},
    "logits_processors": "it runs no code named by a request; logit_bias, allowed_token_ids, "
                         "bad_words and min_tokens are built in",
    "mm_processor_kwargs": "its models read text only",
    "modalities": 'it writes text only (null or ["text"])',
    "audio": "it writes text only",
    "prediction": "it has no predicted-output decoding",
    "web_search_options": "it has no web search",
    "service_tier": 'it has one tier (null, "auto" or "default")',
    "store": "it stores no completions",
    "verbosity": 'it has no verbosity control (null or "medium")',
    "stream": "/v1/completions/batch answers one JSON body; stream each prompt on "
              "/v1/chat/completions",
}
# Chat's and batch's share of them (the ones vLLM's chat request has too: issue 25; they had
# been accepted and ignored as unknown fields).
CHAT_UNSUPPORTED: tuple[str, ...] = ("use_beam_search", "length_penalty", "kv_transfer_params",
                                "vllm_xargs", "chat_template",
                                *(f"guided_{kind}" for kind in GUIDED_KINDS),
                                "logits_processors", "mm_processor_kwargs")
OPENAI_CHAT_UNSUPPORTED = ("modalities", "audio", "prediction", "web_search_options",
                           "service_tier", "store", "verbosity")
BATCH_UNSUPPORTED = ("stream",)
COMPLETION_UNSUPPORTED = tuple(k for k in DEFAULT_ONLY if k not in (
    "continue_final_message", "chat_template", "logits_processors", "mm_processor_kwargs",
    *OPENAI_CHAT_UNSUPPORTED, *BATCH_UNSUPPORTED))


def unsupported(param: str, why: str) -> ApiError:
    return ApiError(400, UNSUPPORTED_CODE, f"{param} is not supported by this server: {why}", param=param)


def refuse_unsupported(req: msgspec.Struct, fields: tuple[str, ...]) -> None:
    for name in fields:
        value = getattr(req, name, UNSET)
        if value is UNSET or value in DEFAULT_ONLY[name]:  # the contract keeps bools and numbers apart
            continue
        raise unsupported(name, REFUSAL_REASONS.get(name) or f"only {DEFAULT_ONLY[name][0]!r} (the default) "
                                                     f"is accepted, got {value!r}")
