"""`rollout_provenance: true` on chat (docs/behavior.md §7): admission checks and the record."""

from __future__ import annotations

import math
from typing import Any

from kiln.api.errors import ApiError
from kiln.api.requests.prepare import PreparedChat
from kiln.api.state import AppState
from kiln.api.submission import Completion
from kiln.api.weight_versions import spans_json, version_of
from kiln.provenance import ActionToken, adapter_identity, rollout_record

ERROR = "chat_invalid_request"
# the sampling values a rollout record states: name -> (lowest, highest)
RANGES: dict[str, tuple[float, float]] = {"temperature": (0.0, math.inf), "min_p": (0.0, 1.0),
                                          "presence_penalty": (-2.0, 2.0),
                                          "frequency_penalty": (-2.0, 2.0)}
MAX_STOP_STRINGS = 256
MAX_STOP_BYTES = 16384


def _range(name: str, value: float, low: float, high: float) -> None:
    if not (math.isfinite(value) and low <= value <= high):
        raise ApiError(
            400, ERROR,
            f"rollout_provenance requires {name} in [{low:g}, {high:g}], got {value:g}",
            param=name,
        )


def check(state: AppState, prepared: PreparedChat) -> None:
    """Admission after rendering: a content-addressed identity, room for a sampled action, and
    sampling values the record can state."""
    if state.backend.policy_identity() is None:
        raise ApiError(
            501, "rollout_provenance_unavailable",
            "this server has no content-addressed identity for its base model",
            param="rollout_provenance",
        )
    params = prepared.run.params[0]
    if params.max_tokens < 1:
        raise ApiError(400, ERROR, "rollout_provenance needs an effective max_tokens of at least 1",
                       param="max_tokens")
    if params.thinking is not None and params.max_tokens <= len(params.thinking.close_ids):
        raise ApiError(
            400, ERROR,
            "rollout_provenance needs max_tokens above the thinking close sequence, so that at "
            "least one action is sampled", param="max_tokens",
        )
    for name, (low, high) in RANGES.items():
        _range(name, getattr(params, name), low, high)
    if not params.repetition_penalty > 0:
        raise ApiError(400, ERROR, "rollout_provenance requires repetition_penalty > 0",
                       param="repetition_penalty")
    if (len(params.stop) > MAX_STOP_STRINGS
            or sum(len(s.encode()) for s in params.stop) > MAX_STOP_BYTES):
        raise ApiError(400, ERROR, f"rollout_provenance allows at most {MAX_STOP_STRINGS} stop "
                       f"strings and {MAX_STOP_BYTES} bytes of them", param="stop")


def record(
    state: AppState,
    prepared: PreparedChat,
    messages: list[dict[str, Any]],
    done: Completion,
    final_content: str,
    kwargs: dict[str, Any],
) -> dict[str, Any]:
    version = version_of(done.weight_spans, done.weight_version, state.backend)
    identity = state.backend.policy_identity(version)  # the weights that made the tokens
    assert identity is not None  # checked at admission
    params = prepared.run.params[0]
    actions = [
        ActionToken(t, None if forced else lp)
        for t, lp, forced in zip(
            done.token_ids, done.logprobs, done.forced or [False] * len(done.token_ids),
            strict=True,
        )
    ]
    sampling: dict[str, Any] = {
        "temperature": params.temperature,
        "top_p": params.top_p if 0 < params.top_p < 1 else (1.0 if params.top_p >= 1 else 0.0),
        "top_k": max(0, params.top_k),
        "min_p": params.min_p,
        "max_tokens": params.max_tokens,
        "repetition_penalty": params.repetition_penalty,
        "presence_penalty": params.presence_penalty,
        "frequency_penalty": params.frequency_penalty,
        "stop": list(params.stop),
    }
    if params.thinking is not None:
        budget: dict[str, Any] = {}
        if params.thinking.max_tokens is not None:
            budget["max_tokens"] = params.thinking.max_tokens
        if params.thinking.max_time_ms is not None:
            budget["max_time_ms"] = params.thinking.max_time_ms
        budget["close_token_ids"] = list(params.thinking.close_ids)
        sampling["thinking_budget"] = budget
    invocation = {"template_kwargs": kwargs} if kwargs else None
    return rollout_record(
        identity=identity,
        prompt_ids=prepared.prompt.ids,
        actions=actions,
        messages=messages,
        final_content=final_content,
        sampling=sampling,
        seed=done.seed,
        adapter=adapter_identity(prepared.run.lora),
        template_invocation=invocation,
        weight_version=version,
        weight_versions=spans_json(done.weight_spans),
    )
