"""Reading the generated wire structs' optional fields (a field the body left out is msgspec's
``UNSET``, one it set to null is None), and the unions of request structs the shared request
stages take: a field one member lacks is read where an ``isinstance`` says it is there, so mypy
fails when a contract field is renamed."""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec import UNSET

from kiln.api._generated import wire

# chat's and batch's requests (the OpenAI chat fields), and those with completions'
ChatRequest = wire.ChatCompletionRequest | wire.BatchCompletionRequest
GenRequest = wire.ChatCompletionRequest | wire.BatchCompletionRequest | wire.TextCompletionRequest


def opt(value: Any) -> Any:
    """UNSET (field missing) and None (explicit null) both mean 'not given' for sampling."""
    return None if value is UNSET else value


def plain(value: Any) -> Any:
    """A wire value (msgspec Struct, UNSET) as plain JSON data (None for UNSET)."""
    return None if value is UNSET else msgspec.to_builtins(value)
