"""Composition rules (contract allOf branches) and prose-only semantic constraints, over HTTP."""

from __future__ import annotations

import json
from typing import Any

import pytest
from starlette.testclient import TestClient

from codegen.fields import groups, included
from kiln.api.contract import RESPONSE_INVARIANTS, RULE_MESSAGES, SEMANTIC_CHECKS, contract

ROUTE_OF = {
    "ChatCompletionRequest": "/v1/chat/completions",
    "BatchCompletionRequest": "/v1/completions/batch",
    "TextCompletionRequest": "/v1/completions",
}
CODE_OF = {
    "ChatCompletionRequest": "chat_invalid_request",
    "BatchCompletionRequest": "batch_invalid_request",
    "TextCompletionRequest": "completion_invalid_request",
}
M = [{"role": "user", "content": "hi"}]

# (definition, allOf index) -> (valid body, violating body)
CASES: dict[tuple[str, int], tuple[dict[str, Any], dict[str, Any]]] = {
    ("ChatCompletionRequest", 0): (
        {"messages": M, "adapters": None, "adapter": None},
        {"messages": M, "adapter": "a", "adapters": [{"name": "b", "scale": 1}]},
    ),
    ("ChatCompletionRequest", 1): (
        {"messages": M, "stream": True, "n": 1},
        {"messages": M, "stream": True, "n": 2},
    ),
    ("ChatCompletionRequest", 2): (
        {"messages": M, "rollout_provenance": False, "stream": True},
        {"messages": M, "rollout_provenance": True, "stream": True},
    ),
    ("ChatCompletionRequest", 3): (
        {"messages": M, "top_logprobs": 2, "logprobs": True},
        {"messages": M, "top_logprobs": 2},
    ),
    ("TextCompletionRequest", 0): (
        {"prompt": "a", "max_tokens": 1, "logprobs": 0, "logprob_token_ids": [3]},
        {"prompt": "a", "max_tokens": 1, "logprob_token_ids": [3]},
    ),
    ("BatchCompletionRequest", 1): (
        {"prompts": [M], "top_logprobs": 2, "logprobs": True},
        {"prompts": [M], "top_logprobs": 2, "logprobs": False},
    ),
    ("ChatCompletionRequest", 4): (
        {"messages": M, "logprob_token_ids": [3], "logprobs": True},
        {"messages": M, "logprob_token_ids": [3]},
    ),
    ("BatchCompletionRequest", 2): (
        {"prompts": [M], "logprob_token_ids": [3], "logprobs": True},
        {"prompts": [M], "logprob_token_ids": [3], "logprobs": False},
    ),
    ("BatchCompletionRequest", 0): (
        {"prompts": [M], "adapter": None, "adapters": None},
        {"prompts": [M], "adapter": "a", "adapters": [{"name": "b", "scale": 1}]},
    ),
}


def request_rules() -> list[tuple[str, int]]:
    """Each request's allOf branches that state a rule (not those that include a field group)."""
    defs, known = contract().definitions, groups(contract().main)
    return [(name, i) for name in ROUTE_OF for i, branch in enumerate(defs[name].get("allOf", []))
            if included(branch, known) is None]


def test_every_request_rule_has_a_message_and_a_case() -> None:
    rules = request_rules()
    assert rules, "the contract lost its composition rules"
    for rule in rules:
        assert rule in RULE_MESSAGES, f"no RULE_MESSAGES entry for {rule}"
        assert rule in CASES, f"no table case for {rule}"
    assert set(RULE_MESSAGES) == set(rules), "RULE_MESSAGES names a rule the contract lacks"


@pytest.mark.parametrize("rule", sorted(CASES))
def test_rule_valid_and_violating(client: TestClient, rule: tuple[str, int]) -> None:
    definition, _ = rule
    valid, violating = CASES[rule]
    c = contract()
    assert c.first_violation(definition, valid) is None
    violation = c.first_violation(definition, violating)
    assert violation is not None and violation.rule == rule
    r = client.post(ROUTE_OF[definition], json=violating)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    expected = "invalid_compose_request" if str(RULE_MESSAGES[rule][1]).startswith("adapters") else CODE_OF[definition]
    assert err["code"] == expected  # Kiln reports adapter-composition conflicts with their own code
    message, param = RULE_MESSAGES[rule]
    assert err["message"] == message and err["param"] == param


def test_every_semantic_constraint_is_enforced_somewhere() -> None:
    constraints = set()
    for definition in contract().definitions.values():
        constraints.update(definition.get("x-kiln-semantic-constraints", []))
    assert constraints
    missing = constraints - set(SEMANTIC_CHECKS) - set(RESPONSE_INVARIANTS)
    assert not missing, f"semantic constraints without a check: {missing}"


SEMANTIC_CASES = [
    # batch product rule
    ("/v1/completions/batch", {"prompts": [M] * 64, "n": 1}, 200, None),
    ("/v1/completions/batch", {"prompts": [M] * 32, "n": 3}, 400, "batch_too_large"),
    ("/v1/completions/batch", {"prompts": [M] * 65}, 400, "batch_invalid_request"),
    # scoring limits
    ("/v1/completions", {"prompt": "", "prompt_logprobs": 1, "add_special_tokens": False}, 400, "completion_invalid_request"),
    ("/v1/completions", {"prompt": "a" * 4097, "prompt_logprobs": 0}, 400,
     "completion_invalid_request"),
    ("/v1/completions", {"prompt": [5, 999, 1000], "prompt_logprobs": 0}, 400,
     "completion_invalid_request"),
    ("/v1/completions", {"prompt": "a" * 300, "prompt_logprobs": 255}, 400,
     "completion_invalid_request"),
    ("/v1/completions", {"prompt": "a" * 200, "prompt_logprobs": 255}, 200, None),
    # integral floats equal integer consts in JSON Schema (n: oneOf [null, const 1])
    ("/v1/completions", {"prompt": "ab", "prompt_logprobs": 1, "n": 1.0}, 200, None),
    ("/v1/completions", {"prompt": "ab", "prompt_logprobs": 1, "n": 1.5}, 400,
     "completion_invalid_request"),
    # ... and integers past 2**53, which msgspec takes as floats only below it
    ("/v1/chat/completions", {"messages": M, "seed": 1e16}, 200, None),
    ("/v1/chat/completions", {"messages": M, "seed": 1.5e19, "max_tokens": 4.0}, 200, None),
    ("/v1/completions/batch", {"prompts": [M], "seed": 1e18, "n": 2.0}, 200, None),
    # rollout provenance and tools
    (
        "/v1/chat/completions",
        {"messages": M, "rollout_provenance": True, "tools": [{"type": "function"}]},
        400, "chat_invalid_request",
    ),
    (
        "/v1/chat/completions",
        {"messages": M, "rollout_provenance": True, "tool_choice": "auto"},
        400, "chat_invalid_request",
    ),
    # rollout provenance with a content-addressed backend identity
    ("/v1/chat/completions", {"messages": M, "rollout_provenance": True}, 200, None),
]


@pytest.mark.parametrize(("path", "body", "status", "code"), SEMANTIC_CASES)
def test_semantic_constraints(
    client: TestClient, path: str, body: dict[str, Any], status: int, code: str | None
) -> None:
    r = client.post(path, content=json.dumps(body), headers={"content-type": "application/json"})
    assert r.status_code == status, r.text[:300]
    if code:
        assert r.json()["error"]["code"] == code
