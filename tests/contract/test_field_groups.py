"""The fields chat, completions and batch share are each defined once (issue 45).

They live in field groups (`x-kiln-field-group`: SamplingFields for all three, ConversationFields
for chat and batch, OpenAiRequestFields for chat and completions), which each request includes
with an `allOf` branch that is only a `$ref` (codegen/fields.py). A field the requests define
apart must differ in more than its description; the flattened requests keep the fields they had.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from kiln.api._generated import wire
from tests.contract.contract_files import (
    CONTRACT_DIR,
    field_groups,
    flat_main_schema,
    included_groups,
    main_schema,
    rule_branches,
)

REQUESTS = ("ChatCompletionRequest", "TextCompletionRequest", "BatchCompletionRequest")
GROUPS = {
    "SamplingFields": list(REQUESTS),
    "ConversationFields": ["ChatCompletionRequest", "BatchCompletionRequest"],
    "OpenAiRequestFields": ["ChatCompletionRequest", "TextCompletionRequest"],
}
# How many fields each request takes (the same before and after issue 45 moved the shared ones).
FIELD_COUNTS = {"ChatCompletionRequest": 88, "TextCompletionRequest": 62,
                "BatchCompletionRequest": 66}
# The sampling fields proper: defined in SamplingFields and nowhere else.
SAMPLING = ("n", "temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
            "repetition_penalty", "sampling_preset", "logit_bias", "allowed_token_ids", "bad_words",
            "min_tokens", "ignore_eos", "stop_token_ids", "include_stop_str_in_output",
            "thinking_token_budget", "logprob_token_ids", "prompt_logprobs")
# Fields two requests define apart although their schemas agree, and why.
APART = {"stream": "batch refuses every value but false (it answers one JSON body)"}


def without_description(schema: dict[str, Any]) -> str:
    return json.dumps({k: v for k, v in schema.items() if k != "description"}, sort_keys=True)


def definitions_of(name: str) -> list[tuple[str, dict[str, Any]]]:
    """(where, schema) for every place among the requests and the groups that defines ``name``."""
    defs = main_schema()["$defs"]
    return [(where, defs[where]["properties"][name]) for where in (*REQUESTS, *GROUPS)
            if name in defs[where].get("properties", {})]


def every_field() -> list[str]:
    return sorted({f for name in REQUESTS for f in flat_main_schema()["$defs"][name]["properties"]})


def test_the_groups_and_who_includes_them() -> None:
    assert sorted(field_groups()) == sorted(GROUPS)
    for group, users in GROUPS.items():
        assert [r for r in REQUESTS if group in included_groups(r)] == users, group
    for name in main_schema()["$defs"]:
        if name not in REQUESTS:
            assert included_groups(name) == [], name


def test_includes_come_after_the_rules() -> None:
    """A rule keeps its allOf index (kiln/api/contract.py's RULE_MESSAGES name rules by it)."""
    for name in REQUESTS:
        branches = main_schema()["$defs"][name]["allOf"]
        rules = rule_branches(main_schema()["$defs"][name])
        assert [i for i, _ in rules] == list(range(len(rules)))
        assert [b["$ref"] for b in branches[len(rules):]] == [
            f"#/$defs/{g}" for g in included_groups(name)]


def test_a_group_is_referred_to_only_by_includes_and_field_pointers() -> None:
    """Nothing else names a group: `$ref`s point at one of its fields (training-v1's
    GenerateSamplingParams: "as on /v1/completions") or include it."""
    for path in sorted(CONTRACT_DIR.glob("*.schema.json")):
        for ref in _refs(json.loads(path.read_text(encoding="utf-8"))):
            target = ref.partition("#")[2]
            for group in GROUPS:
                if target == f"/$defs/{group}":
                    assert path.name == "kiln-inference-v1.schema.json", ref
                elif target.startswith(f"/$defs/{group}/"):
                    assert target.startswith(f"/$defs/{group}/properties/"), (path.name, ref)


def _refs(node: Any) -> list[str]:
    if isinstance(node, list):
        return [r for item in node for r in _refs(item)]
    if not isinstance(node, dict):
        return []
    own = [node["$ref"]] if isinstance(node.get("$ref"), str) else []
    return own + [r for v in node.values() for r in _refs(v)]


@pytest.mark.parametrize("field", every_field())
def test_no_shared_field_is_defined_twice(field: str) -> None:
    """Two places that define a field must define it differently (completions' vLLM `seed`,
    `stop`, `logprobs`, ...), else it belongs in one field group."""
    places = definitions_of(field)
    assert places, field
    if field in APART:
        return
    shapes = [without_description(schema) for _, schema in places]
    assert len(set(shapes)) == len(shapes), (
        f"{field} is defined alike in {[w for w, _ in places]}: define it once, in a field group")


@pytest.mark.parametrize("field", SAMPLING)
def test_each_sampling_field_is_defined_once(field: str) -> None:
    assert [where for where, _ in definitions_of(field)] == ["SamplingFields"]


def test_apart_fields_are_really_alike() -> None:
    """The exceptions are still needed: the requests define them alike but apart."""
    for field in APART:
        places = definitions_of(field)
        assert all(where in REQUESTS for where, _ in places)
        assert len({without_description(s) for _, s in places}) < len(places), field


@pytest.mark.parametrize("name", REQUESTS)
def test_flattened_requests_keep_their_fields(name: str) -> None:
    """The flattened request, its generated struct and its OpenAPI schema have the same fields,
    as many as before the shared ones moved into groups."""
    flat = flat_main_schema()["$defs"][name]
    struct = {f.encode_name for f in msgspec.structs.fields(getattr(wire, name))}
    openapi = json.loads((CONTRACT_DIR.parent / "kiln" / "api" / "_generated" / "openapi.json")
                         .read_text(encoding="utf-8"))["components"]["schemas"][name]
    assert set(flat["properties"]) == struct == set(openapi["properties"])
    assert len(struct) == FIELD_COUNTS[name]
    assert "allOf" not in openapi or all("$ref" not in b for b in openapi["allOf"])
    own = set(main_schema()["$defs"][name]["properties"])
    shared = [set(field_groups()[g]["properties"]) for g in included_groups(name)]
    assert own | set().union(*shared) == struct


def test_a_bad_shared_field_is_a_field_error_not_a_rule() -> None:
    """The validator reports a shared field's violation at the field, as before: its schema path
    runs through the group, not through a rule's allOf branch."""
    from kiln.api.contract import contract

    bodies: dict[str, dict[str, Any]] = {
        "ChatCompletionRequest": {"messages": [{"role": "user", "content": "hi"}]},
        "TextCompletionRequest": {"prompt": "hi"},
        "BatchCompletionRequest": {"prompts": [[{"role": "user", "content": "hi"}]]}}
    for name, body in bodies.items():
        for field, value in (("temperature", -1), ("top_k", "x"), ("n", 65)):
            got = contract().first_violation(name, {**body, field: value})
            assert got is not None and got.rule is None and got.param == field, (name, field)
            assert got.message.startswith(f"{field}: "), got.message
    got = contract().first_violation("ChatCompletionRequest",
                                     {**bodies["ChatCompletionRequest"], "top_logprobs": 2})
    assert got is not None and got.rule == ("ChatCompletionRequest", 3)  # a rule, as before
    assert contract().first_violation("BatchCompletionRequest",
                                      {**bodies["BatchCompletionRequest"], "unknown": 1}) is None
