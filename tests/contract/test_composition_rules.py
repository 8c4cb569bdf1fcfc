"""Every composition rule of the contract, with a body it accepts and a body it rejects.

The rules are the contract's own behaviour, checked with jsonschema_rs (the validator the server
uses). A new rule in the contract without a row here fails ``test_every_rule_has_cases``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.contract.contract_files import (
    MAIN_FILE,
    TB_FILE,
    included_groups,
    main_schema,
    rs_validator,
    rule_branches,
    tb_schema,
)

RULE_KEYWORDS = ("allOf", "anyOf", "oneOf", "not", "if", "propertyNames", "unevaluatedProperties")

ADAPTERS = [{"name": "style", "scale": 1}]
SAMPLED = {"sequence_index": 1, "token_id": 2, "source": "sampled", "behavior_logprob": -0.5}
FORCED = {"sequence_index": 2, "token_id": 3, "source": "forced", "behavior_logprob": None}
UNLIMITED = {"configured": False, "tokens_source": "unlimited", "time_source": "unlimited"}
TOKENS_64 = {
    "configured": True,
    "max_tokens": 64,
    "tokens_source": "request",
    "time_source": "unlimited",
}
FINISHED = {"closed": True, "thinking_tokens": 64, "thinking_time_ms": 10}


@dataclass
class Rule:
    file: str
    definition: str
    path: str  # keyword, or "allOf/<i>"
    valid: list[Any] = field(default_factory=list)
    invalid: list[Any] = field(default_factory=list)

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.file, self.definition, self.path)


def chat(**kw: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": "hi"}], **kw}


def batch(**kw: Any) -> dict[str, Any]:
    return {"prompts": [[{"role": "user", "content": "hi"}]], **kw}


M, T = MAIN_FILE, TB_FILE
RULES = [
    # --- ChatCompletionRequest -------------------------------------------------------------
    Rule(
        M,
        "ChatCompletionRequest",
        "allOf/0",  # adapter and adapters are mutually exclusive (adapter of any type)
        valid=[chat(adapter="math"), chat(adapters=ADAPTERS), chat(adapter="math", adapters=None)],
        invalid=[
            chat(adapter="math", adapters=ADAPTERS),
            chat(adapter=None, adapters=ADAPTERS),
            chat(adapter="", adapters=[]),
        ],
    ),
    Rule(
        M,
        "ChatCompletionRequest",
        "allOf/1",  # stream=true forbids n >= 2
        valid=[
            chat(stream=True, n=1),
            chat(stream=True, n=None),
            chat(stream=False, n=2),
            chat(n=3),
        ],
        invalid=[chat(stream=True, n=2), chat(stream=True, n=64)],
    ),
    Rule(
        M,
        "ChatCompletionRequest",
        "allOf/2",  # rollout_provenance=true: no ignore_eos, no stream, n null/1, max_tokens >= 1
        valid=[
            chat(rollout_provenance=True),
            chat(rollout_provenance=True, ignore_eos=False, stream=False, n=1, max_tokens=1),
            chat(rollout_provenance=True, n=None, max_tokens=None),
            chat(rollout_provenance=False, ignore_eos=True, max_tokens=0),
        ],
        invalid=[
            chat(rollout_provenance=True, ignore_eos=True),
            chat(rollout_provenance=True, stream=True),
            chat(rollout_provenance=True, n=2),
            chat(rollout_provenance=True, max_tokens=0),
        ],
    ),
    Rule(
        M,
        "ChatCompletionRequest",
        "allOf/3",  # an integer top_logprobs needs logprobs: true (not a deviation: a 400 anyway)
        valid=[chat(top_logprobs=2, logprobs=True), chat(top_logprobs=None), chat(logprobs=True),
               chat(top_logprobs=0, logprobs=True)],
        invalid=[chat(top_logprobs=2), chat(top_logprobs=0, logprobs=False),
                 chat(top_logprobs=1, logprobs=None)],
    ),
    Rule(
        M,
        "ChatCompletionRequest",
        "allOf/4",  # an array logprob_token_ids needs logprobs: true (issue 25; a 400 anyway)
        valid=[chat(logprob_token_ids=[3], logprobs=True), chat(logprob_token_ids=None)],
        invalid=[chat(logprob_token_ids=[3]), chat(logprob_token_ids=[3], logprobs=False)],
    ),
    # --- TextCompletionRequest (issue 28) ---------------------------------------------------
    Rule(
        M,
        "TextCompletionRequest",
        "allOf/0",  # an array logprob_token_ids needs an integer logprobs
        valid=[{"prompt": "a", "logprob_token_ids": [3], "logprobs": 0},
               {"prompt": "a", "logprob_token_ids": None}],
        invalid=[{"prompt": "a", "logprob_token_ids": [3]},
                 {"prompt": "a", "logprob_token_ids": [3], "logprobs": None}],
    ),
    Rule(M, "ToolChoice", "oneOf",  # the forms the constraint stage accepts (issue 28)
         valid=[None, "none", "auto", "required",
                {"type": "function", "function": {"name": "f"}}],
         invalid=["bogus", {"type": "function"}, {"function": {"name": "f"}}, 1]),
    Rule(M, "RequestTemplateKwargs", "oneOf",  # not messages or tools (issue 28)
         valid=[None, {}, {"enable_thinking": True}],
         invalid=[{"messages": []}, {"tools": None}, []]),
    # --- BatchCompletionRequest ------------------------------------------------------------
    Rule(
        M,
        "BatchCompletionRequest",
        "allOf/0",  # a string adapter excludes an adapters array (null adapter is allowed)
        valid=[
            batch(adapter="style"),
            batch(adapters=ADAPTERS),
            batch(adapter=None, adapters=ADAPTERS),
            batch(adapter="style", adapters=None),
        ],
        invalid=[batch(adapter="style", adapters=ADAPTERS), batch(adapter="", adapters=[])],
    ),
    Rule(
        M,
        "BatchCompletionRequest",
        "allOf/1",  # an integer top_logprobs needs logprobs: true
        valid=[batch(top_logprobs=2, logprobs=True), batch(top_logprobs=None)],
        invalid=[batch(top_logprobs=2), batch(top_logprobs=3, logprobs=False)],
    ),
    Rule(
        M,
        "BatchCompletionRequest",
        "allOf/2",  # an array logprob_token_ids needs logprobs: true (issue 25)
        valid=[batch(logprob_token_ids=[3], logprobs=True), batch(logprob_token_ids=None)],
        invalid=[batch(logprob_token_ids=[3]), batch(logprob_token_ids=[3], logprobs=False)],
    ),
    # --- TokenizeRequest -------------------------------------------------------------------
    Rule(M, "TokenizeRequest", "oneOf",  # exactly one of prompt and messages
         valid=[{"prompt": "hi"}, {"messages": [{"role": "user", "content": "hi"}]}],
         invalid=[{}, {"prompt": "hi", "messages": [{"role": "user", "content": "hi"}]}]),
    # --- helpers with a def-level oneOf / anyOf / propertyNames ----------------------------
    Rule(M, "ResponseFormat", "allOf/0",
         valid=[{"type": "json_object"}, {"type": "json_schema", "json_schema": {"name": "x"}}],
         invalid=[{"type": "json_schema"}]),
    Rule(M, "NullableBoolean", "oneOf", valid=[None, True], invalid=[0, "true"]),
    Rule(M, "NullableNonNegativeInteger", "oneOf", valid=[None, 0, 7], invalid=[-1, 1.5]),
    Rule(M, "NullableNonNegativeNumber", "oneOf", valid=[None, 0, 2.5], invalid=[-0.1, "1"]),
    Rule(M, "NullableSamplingNumber", "oneOf", valid=[None, -3, 0.7], invalid=["0.7", True]),
    Rule(M, "NullablePenalty", "oneOf", valid=[None, -2, 0, 1.5, 2], invalid=[2.5, -3.75e287, "1", True]),
    Rule(M, "NullableTemperature", "oneOf", valid=[None, 0, 0.7, 1e300],
         invalid=[-1, -1e-9, "0.7", True]),
    Rule(M, "NullableTopP", "oneOf", valid=[None, 0, 0.95, 1], invalid=[3, 1.0001, -0.5, True]),
    Rule(M, "NullableMinP", "oneOf", valid=[None, 0, 0.05, 1], invalid=[1.5, -0.1, "0", True]),
    Rule(M, "NullableRepetitionPenalty", "oneOf", valid=[None, 1e-3, 1, 1.3],
         invalid=[0, -1.2, "1", True]),
    Rule(M, "NullableString", "oneOf", valid=[None, ""], invalid=[1, []]),
    Rule(M, "NullableAdapterSelector", "oneOf",  # null, "" (base), or an AdapterName
         valid=[None, "", "style", "my-adapter_2", "v1.2"],
         invalid=[1, "a/b", "..", ".hidden", "a..b", "x\u0003", "%2e%2e", "a b", "x" * 256]),
    Rule(
        M,
        "NullableTemplateKwargs",
        "oneOf",
        valid=[None, {"enable_thinking": False}],
        invalid=[[], "x"],
    ),
    Rule(
        M, "NullableToolArray", "oneOf", valid=[None, [], [{"type": "function"}]], invalid=[{}, "x"]
    ),
    Rule(M, "NullableUint32", "oneOf", valid=[None, 0, 2**32 - 1], invalid=[-1, 2**32]),
    Rule(M, "NullableUint64", "oneOf", valid=[None, 0, 2**64 - 1], invalid=[-1, 2**64]),
    Rule(M, "SamplingPreset", "oneOf", valid=[None, "greedy", "unknown-preset"], invalid=[1]),
    Rule(M, "StopInput", "oneOf", valid=[None, "x", ["a", "b"], []], invalid=[1, [1]]),
    Rule(
        M,
        "PromptLogprobMap",
        "propertyNames",
        valid=[{}, {"42": {"logprob": -0.1, "rank": 1, "decoded_token": "a"}}],
        invalid=[
            {"x42": {"logprob": -0.1, "rank": 1, "decoded_token": "a"}},
            {"-1": {"logprob": -0.1, "rank": 1, "decoded_token": "a"}},
        ],
    ),
    Rule(
        M,
        "RolloutActionTokenV1",
        "oneOf",  # sampled tokens carry a logprob <= 1e-6; forced tokens carry null
        valid=[SAMPLED, FORCED, {**SAMPLED, "behavior_logprob": 0.000001}],
        invalid=[
            {**SAMPLED, "behavior_logprob": None},
            {**FORCED, "behavior_logprob": -0.5},
            {**SAMPLED, "behavior_logprob": 0.5},
            {**SAMPLED, "source": "other"},
        ],
    ),
    Rule(
        M,
        "RolloutThinkingBudgetV1",
        "anyOf",  # at least one of max_tokens / max_time_ms
        valid=[
            {"max_tokens": 8, "close_token_ids": [1]},
            {"max_time_ms": 8, "close_token_ids": [1]},
            {"max_tokens": 8, "max_time_ms": 9, "close_token_ids": [1]},
        ],
        invalid=[{"close_token_ids": [1]}],
    ),
    # --- thinking-budget-v1 ----------------------------------------------------------------
    Rule(T, "limitOverride", "oneOf", valid=[None, 0, 4096], invalid=[-1, 1.5, "64"]),
    Rule(
        T,
        "effective",
        "allOf/0",  # configured <=> a limit is present
        valid=[UNLIMITED, TOKENS_64],
        invalid=[
            {**UNLIMITED, "configured": True},
            {**TOKENS_64, "configured": False},
        ],
    ),
    Rule(
        T,
        "effective",
        "allOf/1",  # tokens_source agrees with max_tokens presence
        valid=[TOKENS_64, {**TOKENS_64, "tokens_source": "unknown"}, UNLIMITED],
        invalid=[
            {**TOKENS_64, "tokens_source": "request_unlimited"},
            {**UNLIMITED, "tokens_source": "server_default"},
        ],
    ),
    Rule(
        T,
        "effective",
        "allOf/2",  # time_source agrees with max_time_ms presence
        valid=[
            {**UNLIMITED, "configured": True, "max_time_ms": 1500, "time_source": "server_default"},
            {**UNLIMITED, "time_source": "request_unlimited"},
        ],
        invalid=[
            {**UNLIMITED, "configured": True, "max_time_ms": 1500},
            {**UNLIMITED, "time_source": "request"},
        ],
    ),
    Rule(
        T,
        "outcome",
        "allOf/0",  # trigger present iff triggered
        valid=[
            {"triggered": False, **FINISHED},
            {"triggered": True, "trigger": "tokens", **FINISHED},
            {"triggered": True, "trigger": "max_tokens", **FINISHED, "closed": False},
        ],
        invalid=[
            {"triggered": True, **FINISHED},
            {"triggered": False, "trigger": "time", **FINISHED},
        ],
    ),
    Rule(
        T,
        "record",
        "allOf/0",  # the resolved limits (effective)
        valid=[{**UNLIMITED, "applied": False, "triggered": False}],
        invalid=[{**UNLIMITED, "configured": True, "applied": False, "triggered": False}],
    ),
    Rule(
        T,
        "record",
        "allOf/1",  # applied and triggered are required
        valid=[{**TOKENS_64, "applied": True, "triggered": False}],
        invalid=[{**TOKENS_64, "triggered": False}, {**TOKENS_64, "applied": True}],
    ),
    Rule(
        T,
        "record",
        "allOf/2",  # applied requires configured
        valid=[{**TOKENS_64, "applied": True, "triggered": False}],
        invalid=[{**UNLIMITED, "applied": True, "triggered": False}],
    ),
    Rule(
        T,
        "record",
        "allOf/3",  # outcome fields all-or-nothing; an outcome needs applied; trigger iff triggered
        valid=[
            {**TOKENS_64, "applied": True, "triggered": True, "trigger": "tokens", **FINISHED},
            {**TOKENS_64, "applied": True, "triggered": False, **FINISHED},
            {**TOKENS_64, "applied": False, "triggered": False},
        ],
        invalid=[
            {**TOKENS_64, "applied": True, "triggered": True, **FINISHED},
            {**TOKENS_64, "applied": True, "triggered": False, "trigger": "time", **FINISHED},
            {**TOKENS_64, "applied": False, "triggered": False, **FINISHED},
            {**TOKENS_64, "applied": True, "triggered": True, "trigger": "tokens"},
            {**TOKENS_64, "applied": True, "triggered": False, "thinking_tokens": 3},
            {**TOKENS_64, "applied": True, "triggered": False, "closed": True},
        ],
    ),
    Rule(
        T,
        "record",
        "unevaluatedProperties",
        valid=[{**UNLIMITED, "applied": False, "triggered": False}],
        invalid=[{**UNLIMITED, "applied": False, "triggered": False, "outcome": {}}],
    ),
    Rule(
        T,
        "recentRecord",
        "allOf/0",
        valid=[UNLIMITED, TOKENS_64],
        invalid=[{**UNLIMITED, "configured": True}],
    ),
    Rule(
        T,
        "recentRecord",
        "allOf/1",  # outcome fields optional but typed
        valid=[{**TOKENS_64, "applied": True}, {**TOKENS_64, **FINISHED}],
        invalid=[{**TOKENS_64, "applied": "yes"}, {**TOKENS_64, "trigger": "other"}],
    ),
    Rule(
        T,
        "recentRecord",
        "unevaluatedProperties",
        valid=[{**UNLIMITED, "triggered": False}],
        invalid=[{**UNLIMITED, "extra": 1}],
    ),
]


def contract_rules() -> set[tuple[str, str, str]]:
    """Every definition-level composition keyword (and allOf branch that states a rule, not
    one that includes a field group) in both files."""
    found: set[tuple[str, str, str]] = set()
    for file, schema in ((MAIN_FILE, main_schema()), (TB_FILE, tb_schema())):
        for name, definition in schema["$defs"].items():
            for keyword in RULE_KEYWORDS:
                if keyword not in definition:
                    continue
                if keyword == "allOf":
                    found |= {(file, name, f"allOf/{i}") for i, _ in rule_branches(definition)}
                elif keyword == "unevaluatedProperties" and definition[keyword] is not False:
                    continue
                else:
                    found.add((file, name, keyword))
    return found


def test_every_rule_has_cases() -> None:
    assert contract_rules() == {rule.key for rule in RULES}


def test_chat_rules_are_the_seed_rules() -> None:
    """The composition of ChatCompletionRequest is the seed's three allOf branches plus
    top_logprobs-needs-logprobs and logprob_token_ids-needs-logprobs (as on batch, whose one
    seed branch they follow); the branches that include field groups come after the rules, so a
    rule keeps its index (kiln/api/contract.py's RULE_MESSAGES)."""
    for name, rules in (("ChatCompletionRequest", 5), ("BatchCompletionRequest", 3),
                        ("TextCompletionRequest", 1)):
        branches = main_schema()["$defs"][name]["allOf"]
        assert [i for i, _ in rule_branches(main_schema()["$defs"][name])] == list(range(rules))
        assert len(branches) == rules + len(included_groups(name))


def _cases(kind: str) -> list[Any]:
    return [
        pytest.param(rule, body, id=f"{rule.definition}:{rule.path}:{i}")
        for rule in RULES
        for i, body in enumerate(getattr(rule, kind))
    ]


@pytest.mark.parametrize(("rule", "body"), _cases("valid"))
def test_rule_accepts(rule: Rule, body: Any) -> None:
    validator = rs_validator(rule.definition, rule.file)
    assert [e.message for e in validator.iter_errors(body)] == []


@pytest.mark.parametrize(("rule", "body"), _cases("invalid"))
def test_rule_rejects(rule: Rule, body: Any) -> None:
    validator = rs_validator(rule.definition, rule.file)
    errors = list(validator.iter_errors(body))
    assert errors, body
    # The rejection comes from this rule (or, for a oneOf helper, from the helper itself).
    wanted = rule.path.split("/")
    # evaluation_path starts at the "$ref" of the one-definition wrapper.
    paths = [[str(p) for p in e.evaluation_path] for e in errors]
    assert any(path[0] == "$ref" and path[1 : 1 + len(wanted)] == wanted for path in paths), paths
