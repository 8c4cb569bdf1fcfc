"""The contract's prose-only `x-kiln-semantic-constraints`, as hand-written checks.

`SEMANTIC_CHECKS` maps each constraint string of the contract to where it is enforced; a test
fails when the contract gains a constraint this table does not name.
"""

from __future__ import annotations

from typing import Any

from msgspec import UNSET

from kiln.api.errors import ApiError

MAX_BATCH_ITEMS = 64


def _opt(value: Any) -> Any:
    return None if value is UNSET else value


def check_chat(req: Any) -> None:
    if req.rollout_provenance is True:
        tools = _opt(req.tools)
        if tools:
            raise ApiError(
                400, "chat_invalid_request",
                "rollout_provenance=true cannot be combined with non-empty tools", param="tools",
            )
        if _opt(req.tool_choice) is not None:
            raise ApiError(
                400, "chat_invalid_request",
                "rollout_provenance=true cannot be combined with tool_choice",
                param="tool_choice",
            )


def check_batch(req: Any) -> None:
    n = _opt(req.n) or 1
    total = len(req.prompts) * int(n)
    if not 1 <= total <= MAX_BATCH_ITEMS:
        raise ApiError(
            400, "batch_too_large",
            f"prompts.length * n must be between 1 and {MAX_BATCH_ITEMS}, got {total}",
            param="prompts",
        )


# contract constraint text -> the check (or handler step) that enforces it
SEMANTIC_CHECKS: dict[str, str] = {
    "prompts.length * (n or 1) <= 64": "kiln.api.rules.check_batch",
    "rollout_provenance=true rejects non-empty tools and non-null tool_choice":
        "kiln.api.rules.check_chat",
    "rollout_provenance=true requires the real batching engine and content-addressed "
    "base-policy identity": "kiln.api.handlers.rollout.check (501)",
    "the effective max_tokens must fit the active tokenizer's reasoning close sequence when a "
    "thinking budget applies": "kiln.api.handlers.chat_prepare.apply_budget",
    "the tokenized prompt is non-empty and has at most min(4096, served context length) tokens":
        "kiln.api.handlers.completions.create",
    "raw token IDs and prompt_logprobs do not exceed the served vocabulary":
        "kiln.api.handlers.completions.create",
    "scored positions * (prompt_logprobs + 1) <= 65536": "kiln.api.handlers.completions.create",
    "real scoring rejects an active LoRA until adapter revision identity can be pinned":
        "docs/decisions.md: scoring runs under the base model or the adapter `model` names; no "
        "server-wide active LoRA to reject",
    "exactly one of prompt and messages": "kiln.api.handlers.tokenizer.tokenize",
    "token IDs are below the vocabulary size": "kiln.api.handlers.tokenizer.detokenize",
    "prompts * n <= 64; a seed field this server does not implement, set to anything but its "
    "default, is a 400 unsupported_parameter":
        "kiln.api.handlers.completions_gen.prepare, kiln.api.handlers.unsupported.check",
}

# response-side invariants: what the server guarantees about what it emits
RESPONSE_INVARIANTS: dict[str, str] = {
    "total_tokens = prompt_tokens + completion_tokens": "every handler builds usage as a sum",
    "serialized object size <= 1048576 bytes": "kiln.provenance.semantic_problems",
    "prompt_token_count <= input_token_ids.length": "kiln.provenance.semantic_problems",
    "action token sequence_index values are strictly increasing and index generated tokens":
        "kiln.provenance.semantic_problems",
    "each action token_id equals input_token_ids[sequence_index]":
        "kiln.provenance.semantic_problems",
    "at least one action token is sampled": "kiln.api.handlers.rollout.check (max_tokens)",
    "forced action token IDs belong to sampling.thinking_budget.close_token_ids":
        "kiln.provenance.semantic_problems",
    "sum of UTF-8 stop-sequence bytes <= 16384": "kiln.api.handlers.rollout.check",
}
