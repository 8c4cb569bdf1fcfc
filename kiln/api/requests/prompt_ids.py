"""Token-in on chat and batch: ``prompt_token_ids`` given, the ids run as given and the chat
template is skipped (a trainer renders its own prompts, so the tokens it trains on are exactly
the tokens the server ran). The messages stay what the request is about: they are checked as
always and recorded (rollout provenance's ``prompt_messages_sha256``); the reasoning state of the
prompt (whether it ends inside a thinking block) is read from the ids' text. The fields that act
only through the template cannot be honoured and are refused."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from msgspec import UNSET

from kiln.api.backend import Backend
from kiln.api.errors import ApiError
from kiln.api.wire_values import ChatRequest

# field -> the value that leaves the template alone (None: the field must not be given)
TEMPLATE_ONLY: dict[str, Any] = {
    "chat_template_kwargs": None, "add_generation_prompt": True,
    "continue_final_message": False, "echo": False, "add_special_tokens": False,
    "truncate_prompt_tokens": None}


def refuse_template_fields(req: ChatRequest, code: str, param: str = "prompt_token_ids") -> None:
    """A 400 naming the first field that only the template would act on."""
    for name, neutral in TEMPLATE_ONLY.items():
        value = getattr(req, name, UNSET)
        if value is UNSET or value is None or value == neutral:
            continue
        raise ApiError(400, code, f"{name} cannot be honoured with {param}: the ids run as "
                       "given and no chat template is rendered", param=name)


def given_prompt(backend: Backend, ids: Sequence[int], param: str, code: str
                 ) -> tuple[str, list[int]]:
    """``ids`` checked (in the vocabulary, room left in the context window for a token) with
    their text."""
    vocab, limit = backend.tokenizer.vocab_size, backend.max_model_len
    out = [int(t) for t in ids]
    bad = next((t for t in out if t >= vocab), None)
    if bad is not None:
        raise ApiError(400, code, f"{param}: token id {bad} is outside the vocabulary "
                       f"(size {vocab})", param=param)
    if len(out) >= limit:
        raise ApiError(400, "context_length_exceeded", f"maximum context length is {limit} "
                       f"tokens; {param} has {len(out)}", param=param)
    return backend.tokenizer.decode(out), out
