"""The contract holds every definition of the seed page, with exactly the seed's fields.

The seed (``shared/seeds/kiln-inference-contract-v1.md``) is parsed at test time. Deliberate
differences are listed here and in ``contract/CHANGELOG.md``; anything else must match.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from tests.contract.contract_files import (
    field_groups,
    flat_main_schema,
    included_groups,
    main_schema,
)
from tests.contract.seed import Seed, SeedDefinition, SeedField, load_seed

SEED = load_seed()
pytestmark = pytest.mark.skipif(
    SEED is None,
    reason="seed kiln-inference-contract-v1.md not found in <repo>/../shared/seeds",
)

SEED_UINT64 = 18446744073709552000  # what the seed prints (2**64 - 1 rounded through a float)
UINT64_MAX = 2**64 - 1

# Fields chat and batch share, defined once (issue 45, CHANGELOG.md) in a field group whose
# description words the field for every request that includes it, where the seed worded it for
# each request apart; everything else about them is the seed's.
REWORDED = {
    *((d, f) for d in ("ChatCompletionRequest", "BatchCompletionRequest")
      for f in ("n", "sampling_preset", "max_tokens", "ignore_eos", "adapter", "adapters", "tools",
                "chat_template_kwargs")),
    ("ChatCompletionRequest", "stream_options"),  # shared with completions
}
# Fields whose constraints the contract deliberately tightens (CHANGELOG.md); the seed's own
# constraints must still all be present.
TIGHTENED = {
    ("ChatCompletionRequest", "n"),
    ("BatchCompletionRequest", "n"),
    ("TextCompletionRequest", "prompt"),
    ("TextCompletionRequest", "max_tokens"),
    ("TextCompletionRequest", "n"),
    ("ChatCompletionRequest", "adapters"),
    ("BatchCompletionRequest", "adapters"),
    ("ChatCompletionRequest", "messages"),
    ("ChatMessageInput", "role"),  # issue 52: OpenAI's roles, as OpenAI and vLLM refuse others
}
# Fields the contract deliberately widens past the seed (CHANGELOG.md), with the contract's
# rendered type and the constraints it must carry instead.
WIDENED = {
    ("ChatCompletionRequest", "top_k"): ("null | integer", {"minimum": -1, "maximum": 4294967295}),
    ("BatchCompletionRequest", "top_k"): ("null | integer", {"minimum": -1, "maximum": 4294967295}),
}
# Fields whose seed type the contract narrows to a named definition (CHANGELOG.md, issue 28:
# the adapter-name rule the runtime always enforced): (seed type, contract type).
NARROWED = {
    ("AdapterRef", "name"): ("string", "AdapterName"),
    ("ChatCompletionRequest", "adapter"): ("NullableString", "NullableAdapterSelector"),
    ("BatchCompletionRequest", "adapter"): ("NullableString", "NullableAdapterSelector"),
    # OpenAI's +-2 range for the two additive penalties (a float32 overflow made NaN logprobs)
    **{(d, f): ("NullableSamplingNumber", "NullablePenalty")
       for d in ("ChatCompletionRequest", "BatchCompletionRequest")
       for f in ("presence_penalty", "frequency_penalty")},
    # issue 52: the ranges vLLM refuses outside of (a negative temperature, top_p 3, min_p
    # past 1 and a repetition penalty of 0 or less had been accepted), top_p 0 still off
    **{(d, f): ("NullableSamplingNumber", named)
       for d in ("ChatCompletionRequest", "BatchCompletionRequest")
       for f, named in (("temperature", "NullableTemperature"), ("top_p", "NullableTopP"),
                        ("min_p", "NullableMinP"),
                        ("repetition_penalty", "NullableRepetitionPenalty"))},
    # issue 28: the forms the constraint stage accepts, and the names the template reserves
    **{(d, "tool_choice"): ("any", "ToolChoice")
       for d in ("ChatCompletionRequest", "BatchCompletionRequest")},
    **{(d, "chat_template_kwargs"): ("NullableTemplateKwargs", "RequestTemplateKwargs")
       for d in ("ChatCompletionRequest", "BatchCompletionRequest")},
}
# Fields the contract carries under another name (CHANGELOG.md, issue 52: the OpenAI SDK's
# ChatCompletion.metadata is a string map, which Kiln's metadata object broke), as
# (definition, seed name) -> contract name; everything else about them is the seed's.
RENAMED = {(d, "metadata"): "kiln_metadata"
           for d in ("ChatCompletionResponse", "ChatCompletionChunk")}
# Composition branches the contract appends after the seed's (CHANGELOG.md, issue 28:
# top_logprobs needs logprobs: true; issue 25: so does logprob_token_ids), as
# (definition, keyword) -> how many.
ADDED_BRANCHES = {("ChatCompletionRequest", "allOf"): 2, ("BatchCompletionRequest", "allOf"): 2}
# Fields that are new in the contract (CHANGELOG.md), appended after the seed's fields.
ADDED_FIELDS = {
    ("ChatCompletionRequest", "parallel_tool_calls"),
    ("BatchCompletionRequest", "parallel_tool_calls"),
    # issue 25: OpenAI's chat logprobs and vLLM's sampling extras
    *(("ChatCompletionRequest", f) for f in (
        "logprobs", "top_logprobs", "stop_token_ids", "logit_bias", "min_tokens",
        "include_stop_str_in_output", "continue_final_message", "bad_words",
        "skip_special_tokens", "spaces_between_special_tokens")),
    ("Choice", "logprobs"),
    ("ChunkChoice", "logprobs"),
    # issue 26: structured outputs on chat and batch
    *((d, f) for d in ("ChatCompletionRequest", "BatchCompletionRequest")
      for f in ("response_format", "structured_outputs")),
    # issue 25, second part: batch logprobs and token ids; vLLM's chat fields
    *(("BatchCompletionRequest", f) for f in ("logprobs", "top_logprobs", "return_token_ids")),
    *(("BatchCompletionRequest", f) for f in (
        "include_stop_str_in_output", "bad_words", "skip_special_tokens",
        "spaces_between_special_tokens")),
    *(("BatchCompletionItem", f) for f in ("logprobs", "prompt_token_ids", "token_ids")),
    *(("ChatCompletionRequest", f) for f in ("add_generation_prompt", "echo", "return_token_ids")),
    ("ChatCompletionResponse", "prompt_token_ids"),
    ("Choice", "token_ids"),
    # issue 25, third part: the per-token extras, priority and cache salt on chat and batch;
    # vLLM's stop_reason on chat choices and batch items
    *((d, f) for d in ("ChatCompletionRequest", "BatchCompletionRequest")
      for f in ("logprob_token_ids", "repetition_detection", "session_id", "priority",
                "cache_salt")),
    *((d, "stop_reason") for d in ("Choice", "ChunkChoice", "BatchCompletionItem")),
    # issue 25, fourth part: the logits extras on batch as on chat
    *(("BatchCompletionRequest", f) for f in (
        "stop_token_ids", "min_tokens", "logit_bias", "allowed_token_ids")),
    ("ChatCompletionRequest", "allowed_token_ids"),
    # and vLLM's request fields on chat as on completions
    *(("ChatCompletionRequest", f) for f in (
        "thinking_token_budget", "truncate_prompt_tokens", "truncation_side",
        "return_tokens_as_token_ids", "request_id", "prompt_logprobs")),
    ("ChatCompletionResponse", "prompt_logprobs"),
    *(("BatchCompletionRequest", f) for f in (
        "thinking_token_budget", "truncate_prompt_tokens", "truncation_side",
        "return_tokens_as_token_ids", "request_id", "prompt_logprobs")),
    ("BatchCompletionItem", "prompt_logprobs"),
    # the seed's unsupported fields that vLLM's chat request has too: refused when set
    *((d, f) for d in ("ChatCompletionRequest", "BatchCompletionRequest")
      for f in ("use_beam_search", "length_penalty", "kv_transfer_params", "vllm_xargs")),
    *((d, "add_special_tokens") for d in ("ChatCompletionRequest", "BatchCompletionRequest")),
    # vLLM's per-request chat template: refused, as vLLM refuses an untrusted one
    *((d, "chat_template") for d in ("ChatCompletionRequest", "BatchCompletionRequest")),
    # vLLM's former guided_* fields: refused, naming structured_outputs (vLLM ignores them now)
    *((d, f"guided_{k}") for d in ("ChatCompletionRequest", "BatchCompletionRequest")
      for k in ("json", "regex", "choice", "grammar", "whitespace_pattern")),
    # echo and return_token_ids streamed, as vLLM streams them
    ("ChatCompletionChunk", "prompt_token_ids"),
    ("ChunkChoice", "token_ids"),
    # vLLM's chat fields that had been accepted and ignored as unknown fields: the reasoning
    # left out, template variables passed on, custom processors and multimodal kwargs refused
    *((d, f) for d in ("ChatCompletionRequest", "BatchCompletionRequest")
      for f in ("include_reasoning", "reasoning_effort", "documents", "logits_processors",
                "mm_processor_kwargs")),
    # issue 52: OpenAI's chat fields (behaviour refused, labels accepted), llama-server's
    # grammar fields and n_probs, batch's refused stream, vLLM's continuous usage and
    # cached-token count
    *(("ChatCompletionRequest", f) for f in (
        "modalities", "audio", "prediction", "web_search_options", "service_tier", "store",
        "verbosity", "user", "safety_identifier", "prompt_cache_key", "metadata", "grammar",
        "json_schema", "n_probs")),
    ("BatchCompletionRequest", "stream"),
    ("StreamOptions", "continuous_usage_stats"),
    ("Usage", "prompt_tokens_details"),
    # issue 51: the weights' name on every response, spans across a keep-mode update
    *((d, "weight_version") for d in ("ChatCompletionResponse", "ChatCompletionChunk",
                                      "BatchCompletionItem", "RolloutBehaviorPolicyIdentityV1")),
    *((d, "weight_versions") for d in ("Choice", "ChunkChoice", "BatchCompletionItem",
                                       "RolloutBehaviorPolicyIdentityV1")),
    *((d, "prompt_token_ids") for d in ("ChatCompletionRequest", "BatchCompletionRequest")),
}
# Definitions that vLLM's completions request (seed vllm-completion-request.schema.json) has
# replaced: tests/contract/test_vllm_seed_coverage.py checks them against that seed. Here they
# must keep every field of this seed (scoring is one case of the request) and the annotations'
# keys.
REPLACED = {"TextCompletionRequest", "TextCompletionChoice", "TextCompletionResponse"}

# Definitions that are new in the contract (not in the seed).
ADDED = {
    "NullablePenalty",  # OpenAI's +-2 penalty range (CHANGELOG.md, Tightened request fields)
    # issue 52: the sampling ranges vLLM enforces (CHANGELOG.md)
    "NullableTemperature", "NullableTopP", "NullableMinP", "NullableRepetitionPenalty",
    "ErrorDetail", "ErrorResponse", "HealthResponse", "ModelCard", "ModelList",
    "AdapterInfo", "AdapterList", "AdapterLoadRequest", "AdapterStatusResponse",
    "CompletionLogprobs", "ChatLogprobs", "ChatTokenLogprob", "ChatTopLogprob",
    "TextCompletionChunk", "TextCompletionChunkChoice",
    "TokenizeRequest", "TokenizeResponse", "DetokenizeRequest", "DetokenizeResponse",
    "TokenizerInfoResponse",
    "ResponseFormat", "JsonSchemaResponseFormat", "StructuredOutputsParams",  # issue 26
    "LegacyStructuralTag",  # issue 26: structural_tag structures (vLLM's name)
    "RenderedPrompt", "CompletionRenderResponse",
    "AdapterName", "NullableAdapterSelector", "TokenId",  # issue 28: bounds the server enforces
    "ToolChoice", "RequestTemplateKwargs",  # issue 28: rules the server enforces
    "ComputePlan", "ComputeImplementation",  # issue 24: /health shows the compute plan
    "WeightVersion", "WeightVersionSpan",  # issue 51: the served weights' name and spans
    # issue 45: the fields chat, completions and batch share, each defined once
    "SamplingFields", "ConversationFields", "OpenAiRequestFields",
}


def seed() -> Seed:
    assert SEED is not None
    return SEED


def defs() -> dict[str, Any]:
    """The definitions, each request with the field groups it includes flattened into it (the
    fields it takes, as the seed lists them)."""
    result: dict[str, Any] = flat_main_schema()["$defs"]
    return result


def seed_defs() -> list[SeedDefinition]:
    return list(SEED.definitions.values()) if SEED else []


def kept_defs() -> list[SeedDefinition]:
    """The seed's definitions but those vLLM's request replaced (REPLACED)."""
    return [d for d in seed_defs() if d.name not in REPLACED]


def normalize(value: Any) -> Any:
    """Map the fixed uint64 maximum back to the seed's printed value."""
    if isinstance(value, dict):
        return {k: normalize(v) for k, v in value.items()}
    if isinstance(value, list):
        return [normalize(v) for v in value]
    if type(value) is int and value == UINT64_MAX:
        return SEED_UINT64
    return value


def render_type(schema: dict[str, Any]) -> str:
    """Render a property schema the way the seed's Type column does."""
    if "$ref" in schema:
        return str(schema["$ref"]).rsplit("/", 1)[-1]
    if "oneOf" in schema:
        return " | ".join(render_type(branch) for branch in schema["oneOf"])
    kind = schema.get("type")
    if isinstance(kind, list):
        return " | ".join(kind)
    if kind == "array":
        return f"array<{render_type(schema.get('items', {}))}>"
    if kind is None:
        return "any"
    return str(kind)


_CONSTRAINT_WORDS = [
    ("minimum length ", "minLength"),
    ("maximum length ", "maxLength"),
    ("minimum items ", "minItems"),
    ("maximum items ", "maxItems"),
    ("maximum properties ", "maxProperties"),
    ("exclusive minimum ", "exclusiveMinimum"),
    ("minimum ", "minimum"),
    ("maximum ", "maximum"),
]


def parse_constraints(text: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if text == "-":
        return out
    for part in text.split("; "):
        for prefix, key in _CONSTRAINT_WORDS:
            if part.startswith(prefix):
                out[key] = json.loads(part[len(prefix) :])
                break
        else:
            word, _, rest = part.partition(" ")
            if word == "pattern":
                out["pattern"] = rest
            elif word == "enum":
                out["enum"] = json.loads(f"[{rest}]")
            elif word in ("const", "default"):
                out[word] = json.loads(rest)
            else:
                raise AssertionError(f"unknown constraint in seed: {part!r}")
    return out


_KEYWORDS = {key for _, key in _CONSTRAINT_WORDS} | {"pattern", "enum", "const"}


def contract_constraints(prop: dict[str, Any]) -> dict[str, Any]:
    """Constraint keywords of a property, looking into the branches of a ``oneOf``."""
    out = {k: v for k, v in prop.items() if k in _KEYWORDS or k == "default"}
    for branch in prop.get("oneOf", []):
        out.update({k: v for k, v in branch.items() if k in _KEYWORDS})
    return out


def test_seed_was_parsed() -> None:
    s = seed()
    assert len(s.definitions) == 55
    assert len(s.entrypoints) == 6
    assert s.root_composition and s.root_annotations


def test_every_seed_definition_is_in_the_contract() -> None:
    missing = sorted(set(seed().definitions) - set(defs()))
    assert missing == []


def test_only_documented_additions() -> None:
    assert set(defs()) - set(seed().definitions) == ADDED


def test_entrypoint_field_counts() -> None:
    for name, count in seed().entrypoints.items():
        assert len(seed_props(name)) == count, name
    assert len(seed_props("ChatCompletionRequest")) == 29
    assert len(seed_props("BatchCompletionRequest")) == 23


def seed_name(definition: str, name: str) -> str:
    """The seed's name of a contract property (RENAMED)."""
    return next((s for (d, s), c in RENAMED.items() if d == definition and c == name), name)


def seed_props(name: str) -> dict[str, Any]:
    """A definition's properties without the documented additions, by their seed names."""
    props: dict[str, Any] = {seed_name(name, k): v
                             for k, v in defs()[name].get("properties", {}).items()}
    if name in REPLACED:
        names = [f.name for f in seed().definitions[name].fields]
        return {k: props[k] for k in names if k in props}
    return {k: v for k, v in props.items() if (name, k) not in ADDED_FIELDS}


@pytest.mark.parametrize("name", sorted(REPLACED))
def test_replaced_definitions_keep_the_seed_fields(name: str) -> None:
    sdef = seed().definitions[name]
    cdef = defs()[name]
    assert [f.name for f in sdef.fields if f.name not in cdef["properties"]] == []
    assert sorted(k for k in cdef if k.startswith("x-kiln-")) == sorted(sdef.annotations or {})


def test_root_composition_and_annotations_are_exact() -> None:
    root = main_schema()
    assert root["$id"] == "https://ericflo.github.io/kiln/contracts/kiln-inference-v1.schema.json"
    assert root["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert root["title"] == "Kiln inference API contract v1"
    for key, value in seed().root_composition.items():
        assert root[key] == value, key
    for key, value in seed().root_annotations.items():
        assert root[key] == value, key
    assert sorted(k for k in root if k.startswith("x-kiln-")) == sorted(seed().root_annotations)


def sources(name: str) -> list[list[str]]:
    """The property names a definition defines itself and those of each field group it includes,
    each in its order (the flattened definition lists the groups' first)."""
    own = list(main_schema()["$defs"][name].get("properties", {}))
    return [own, *(list(field_groups()[g]["properties"]) for g in included_groups(name))]


def check_description(def_name: str, sfield: SeedField, prop: dict[str, Any]) -> None:
    if (def_name, sfield.name) in REWORDED:
        assert prop["description"] != sfield.description, "a reworded field must differ"
        shared = [g for g in included_groups(def_name)
                  if sfield.name in field_groups()[g]["properties"]]
        assert len(shared) == 1, "only a field defined in a field group is reworded"
    else:
        assert prop["description"] == sfield.description


@pytest.mark.parametrize("sdef", kept_defs(), ids=lambda d: d.name)
def test_definition_shape(sdef: SeedDefinition) -> None:
    cdef = defs()[sdef.name]
    assert cdef["description"] == sdef.description
    props = seed_props(sdef.name)
    names = [f.name for f in sdef.fields]
    assert sorted(props) == sorted(names)
    for source in sources(sdef.name):  # its own fields and each field group's, in the seed's order
        kept = [seed_name(sdef.name, k) for k in source if seed_name(sdef.name, k) in names]
        assert kept == [n for n in names if n in kept], sdef.name
    assert len(props) == sdef.field_count
    assert [seed_name(sdef.name, k) for k in cdef.get("required", [])] == [
        f.name for f in sdef.fields if f.required]
    if sdef.type_line.startswith("object."):
        assert cdef["type"] == "object"
        assert (cdef.get("additionalProperties") is False) == sdef.closed
        if not sdef.closed and sdef.fields:
            assert "additionalProperties" not in cdef
            assert cdef["x-kiln-unknown-field-policy"] == "accepted_and_ignored"


@pytest.mark.parametrize("sdef", kept_defs(), ids=lambda d: d.name)
def test_definition_rules_and_annotations_are_exact(sdef: SeedDefinition) -> None:
    cdef = defs()[sdef.name]
    for key, value in (sdef.composition or {}).items():
        added = ADDED_BRANCHES.get((sdef.name, key), 0)
        kept = cdef[key][:len(cdef[key]) - added] if added else cdef[key]
        assert normalize(kept) == value, (sdef.name, key)
    for key, value in (sdef.annotations or {}).items():
        assert cdef[key] == value, (sdef.name, key)
    assert sorted(k for k in cdef if k.startswith("x-kiln-")) == sorted(sdef.annotations or {})


@pytest.mark.parametrize("sdef", seed_defs(), ids=lambda d: d.name)
def test_definition_scalar_constraints(sdef: SeedDefinition) -> None:
    """Type-line constraints of non-object definitions (enum, pattern, bounds)."""
    _, _, constraint_text = sdef.type_line.rstrip(".").partition(". Constraints: ")
    cdef = defs()[sdef.name]
    if not constraint_text or constraint_text == "closed object":
        return
    if constraint_text.startswith("content media type "):
        assert cdef["contentMediaType"] == constraint_text.removeprefix("content media type ")
        return
    assert contract_constraints(cdef) == parse_constraints(constraint_text)


def field_cases() -> list[tuple[str, SeedField]]:
    return [(d.name, f) for d in kept_defs() for f in d.fields]


@pytest.mark.parametrize(
    ("def_name", "sfield"), field_cases(), ids=lambda v: v if isinstance(v, str) else v.name
)
def test_field(def_name: str, sfield: SeedField) -> None:
    prop = defs()[def_name]["properties"][RENAMED.get((def_name, sfield.name), sfield.name)]
    if (def_name, sfield.name) in NARROWED:
        seed_type, contract_type = NARROWED[(def_name, sfield.name)]
        assert sfield.type == seed_type and render_type(prop) == contract_type
        check_description(def_name, sfield, prop)
        return
    if (def_name, sfield.name) in WIDENED:
        kind, constraints = WIDENED[(def_name, sfield.name)]
        assert render_type(prop) == kind and sfield.type != kind
        assert contract_constraints(prop) == constraints
        return
    check_description(def_name, sfield, prop)
    assert render_type(prop) == sfield.type
    expected = parse_constraints(sfield.constraints)
    actual = normalize(contract_constraints(prop))
    if (def_name, sfield.name) in TIGHTENED:
        for key, value in expected.items():
            assert actual[key] == value, key
        assert actual != expected, "a tightened field must differ from the seed"
    else:
        assert actual == expected


def test_thinking_budget_refs_point_to_the_sibling_file() -> None:
    text = json.dumps(main_schema())
    external = set(re.findall(r'"\$ref": "(thinking-budget-v1[^"]*)"', text))
    assert external == {
        "thinking-budget-v1.schema.json#/$defs/limitOverride",
        "thinking-budget-v1.schema.json#/$defs/outcome",
        "thinking-budget-v1.schema.json#/$defs/record",
        "thinking-budget-v1.schema.json#/$defs/source",
    }
