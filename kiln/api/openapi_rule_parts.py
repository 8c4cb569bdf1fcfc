"""The vocabulary of `x-kiln-rules` (docs/openapi-extensions.md) and the rule groups several
operations share; kiln/api/openapi_rules.py assembles each operation's list."""

from __future__ import annotations

from typing import Any

from kiln.api.requests.refused import DEFAULT_ONLY, UNSUPPORTED_CODE
from kiln.api.served_openapi import Bounds
from kiln.api.structured import constraints
from kiln.engine import repetition

Rule = dict[str, Any]
NULL_OR_FALSE = [None, False]


# -- JSON Schema fragments for `when` -----------------------------------------------------------

def has(field: str, schema: Any = True) -> dict[str, Any]:
    """The body has ``field`` and its value matches ``schema``."""
    return {"required": [field], "properties": {field: schema}}


def given(field: str) -> dict[str, Any]:
    """The body has ``field`` with a value other than null."""
    return has(field, {"not": {"type": "null"}})


def all_of(*schemas: Any) -> dict[str, Any]:
    return {"allOf": list(schemas)}


def any_of(*schemas: Any) -> dict[str, Any]:
    return {"anyOf": list(schemas)}


# The step that enforces a rule, as the served document names it: a stable id, so that moving
# or renaming the code is not a change a client sees. Keys: where the code is (a module, a
# function, or one with a note in parentheses; tests/api/test_rule_steps.py resolves each);
# values: the published ids, which stay.
STEPS: dict[str, str] = {
    "kiln.api.contract.check_batch": "batch-semantic-checks",
    "kiln.api.contract.check_chat": "chat-semantic-checks",
    "kiln.api.handlers.completions._score": "prompt-scoring",
    "kiln.api.handlers.completions.output_constraint": "completions-structured-outputs",
    "kiln.api.handlers.tokenizer.tokenize": "tokenize",
    "kiln.api.handlers.training.update_weights_from_disk": "weight-update",
    "kiln.api.handlers.training.update_weights_from_disk (_update_mode)": "weight-update-mode",
    "kiln.api.replies.chat_turn.rollout": "agent-rollout-provenance",
    "kiln.api.requests.completions_gen.prepare": "completions-preparation",
    "kiln.api.requests.extras.logits_extras": "logits-extras",
    "kiln.api.requests.extras.logprobs_wanted": "logprobs",
    "kiln.api.requests.extras.prompt_logprobs_wanted": "prompt-logprobs",
    "kiln.api.requests.extras.reasoning_shown": "reasoning-visibility",
    "kiln.api.requests.extras.repetition_detection": "repetition-detection",
    "kiln.api.requests.extras.thinking_tokens": "thinking-budget-fields",
    "kiln.api.requests.extras.truncation": "prompt-truncation",
    "kiln.api.requests.messages_input.chat_body": "messages-request",
    "kiln.api.requests.messages_input.chat_messages": "messages-input",
    "kiln.api.requests.messages_input.chat_tools": "messages-tools",
    "kiln.api.requests.messages_input.refuse_unsupported": "messages-refused-fields",
    "kiln.api.requests.messages_input.thinking_fields": "messages-thinking",
    "kiln.api.requests.params.select": "adapter-selection",
    "kiln.api.requests.prepare": "chat-preparation",
    "kiln.api.requests.prepare.apply_budget": "thinking-budget",
    "kiln.api.requests.prepare.render_prompt": "prompt-rendering",
    "kiln.api.requests.prepare.template_kwargs": "template-kwargs",
    "kiln.api.requests.prompt_ids.given_prompt": "token-prompt",
    "kiln.api.requests.prompt_ids.refuse_template_fields": "token-prompt-template-fields",
    "kiln.api.requests.refused.refuse_unsupported": "refused-fields",
    "kiln.api.requests.responses_input.chat_body": "responses-request",
    "kiln.api.requests.responses_input.chat_messages": "responses-input",
    "kiln.api.requests.responses_input.chat_tool_choice": "responses-tool-choice",
    "kiln.api.requests.responses_input.chat_tools": "responses-tools",
    "kiln.api.requests.responses_input.reasoning_fields": "responses-reasoning",
    "kiln.api.requests.responses_input.refuse_unsupported": "responses-refused-fields",
    "kiln.api.requests.responses_input.response_format": "responses-text-format",
    "kiln.api.requests.rollout.check": "rollout-provenance",
    "kiln.api.structured.constraints.constraint": "structured-outputs",
    "kiln.api.submission.submit_all": "admission",
    "kiln.engine.grammar.GrammarCompiler": "grammar-compiler",
    "kiln.engine.runner (NON_FINITE_MIX)": "engine-non-finite-mix",
    "kiln.engine.runner (NOTHING_ALLOWED)": "engine-nothing-allowed",
}


def rule(kind: str, param: str, code: str, where: str, reason: str, **fields: Any) -> Rule:
    """A rule; ``where`` is the code that enforces it (a key of ``STEPS``), published as its
    stable step id."""
    return {"kind": kind, "param": param, "code": code, **fields, "where": STEPS[where],
            "reason": reason}


def field(name: str | list[str], **how: Any) -> dict[str, Any]:
    """An operand: the first of ``name`` (a dotted path, or a list of them) present and not
    null; see docs/openapi-extensions.md for ``if_absent``, ``if_null``, ``measure``, ``add``."""
    return {"fields": [name] if isinstance(name, str) else list(name), **how}


def value(number: int) -> dict[str, Any]:
    return {"value": number}


SCORING = all_of(has("prompt_logprobs", {"type": "integer"}),
                 {"properties": {"max_tokens": {"enum": [None, 0, 1]}}})
GENERATING = {"not": SCORING}
RESPONSE_FORMAT_SET = has("response_format", {"type": "object", "required": ["type"],
                                              "properties": {"type": {"not": {"const": "text"}}}})
_SO_SET = {"not": {"enum": NULL_OR_FALSE}}
STRUCTURED_OUTPUTS_SET = has("structured_outputs", {
    "type": "object", "anyOf": [has(kind, _SO_SET) for kind in constraints.SO_KINDS]})
TOOL_CALL_FORCED = has("tool_choice", {"anyOf": [{"const": "required"}, {"type": "object"}]})
STREAM = has("stream", {"const": True})


def _pairs(*conditions: Any) -> dict[str, Any]:
    """At least two of ``conditions`` hold."""
    return any_of(*(all_of(a, b) for i, a in enumerate(conditions) for b in conditions[i + 1:]))


# -- rule groups ----------------------------------------------------------------------------------

def unsupported_fields(names: tuple[str, ...]) -> list[Rule]:
    return [rule("non_default_refused", name, UNSUPPORTED_CODE, "kiln.api.requests.refused.refuse_unsupported",
                 "a seed field this server does not implement", field=name,
                 default=list(DEFAULT_ONLY[name])) for name in names]


def constraint_rules(b: Bounds, code: str, tools: bool) -> list[Rule]:
    """constraints.constraint, in its order: each field's grammar is built (a malformed one
    refused), one constraint per request, then compiled against the model's tokenizer."""
    where = "kiln.api.structured.constraints.constraint"
    kinds = [f"structured_outputs.{kind}" for kind in constraints.SO_KINDS]
    named = [("response_format", RESPONSE_FORMAT_SET),
             ("structured_outputs", STRUCTURED_OUTPUTS_SET)]
    out = [rule("at_most_one", "structured_outputs", code, where,
                "structured_outputs takes exactly one kind", fields=kinds, unset=NULL_OR_FALSE)]
    if tools:
        named.append(("tool_choice", TOOL_CALL_FORCED))
        function = {"type": "object", "required": ["function"], "properties": {"function": {
            "type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}}}}
        out += [
            rule("refused_when", "tools", code, where,
                 'tool_choice "required" needs at least one function tool',
                 when=all_of(has("tool_choice", {"const": "required"}),
                             {"not": has("tools", {"type": "array", "contains": function})})),
            rule("refers_to", "tool_choice.function.name", code, where,
                 "a named tool_choice names one of the tools", field="tool_choice.function.name",
                 among="tools[*].function.name"),
        ]
    sets = [condition for _, condition in named]
    out += [
        rule("refused_when", "structured_outputs", code, where,
             "a request takes one output constraint", when=_pairs(*sets)),
        rule("refused_when", "ignore_eos", code, where,
             "a finished constraint ends the output with EOS",
             when=all_of(has("ignore_eos", {"const": True}), any_of(*sets))),
    ]
    held_back = [has("min_tokens", {"minimum": 1}), has("bad_words", {"minItems": 1})]
    out.append(rule(
        "model_dependent", "allowed_token_ids", code, "kiln.engine.runner (NOTHING_ALLOWED)",
        "a constraint, allowed_token_ids, min_tokens (EOS held back) and bad_words may leave no "
        "token to sample together, which the model's vocabulary decides: a 400",
        when=any_of(all_of(any_of(*sets), any_of(*held_back)),
                    all_of(given("allowed_token_ids"), any_of(*sets, *held_back)))))
    if not b.grammars:
        out += [rule("refused_when", name, code, "kiln.engine.grammar.GrammarCompiler",
                     "this model's tokenizer cannot drive a grammar", when=condition)
                for name, condition in named]
    programs = [("structured_outputs.json", "json-schema"), ("structured_outputs.regex", "regex"),
                ("structured_outputs.choice", "lark"), ("structured_outputs.grammar", "lark"),
                ("structured_outputs.structural_tag", "structural-tag"),
                ("structured_outputs.whitespace_pattern", "regex"),
                ("response_format.json_schema.schema", "json-schema"),
                ("response_format", "structural-tag")]
    if tools:
        programs.append(("tools[*].function.parameters", "json-schema"))
    whens = {"response_format": has("response_format", {
        "type": "object", "required": ["type"],
        "properties": {"type": {"const": "structural_tag"}}})}
    for path, language in programs:
        when = TOOL_CALL_FORCED if path.startswith("tools") else whens.get(path)
        out.append(rule("compiles", path.split(".")[0].removesuffix("[*]"), code, where,
                        "text the server compiles into a grammar (llguidance, checked against "
                        "the model's tokenizer)", field=path, language=language,
                        **({"when": when} if when else {})))
    return out


def min_tokens_rules(code: str, max_tokens: dict[str, Any]) -> list[Rule]:
    where = "kiln.api.requests.extras.logits_extras"
    return [
        rule("compare", "min_tokens", code, where, "min_tokens may not pass max_tokens",
             left=field("min_tokens"), op="<=", right=max_tokens),
        rule("refused_when", "min_tokens", UNSUPPORTED_CODE, where,
             "min_tokens beside stop strings is not implemented",
             when=all_of(has("min_tokens", {"minimum": 1}), has("stop", {"anyOf": [
                 {"type": "string"}, {"type": "array", "minItems": 1}]}))),
    ]

def repetition_rules(code: str, on: dict[str, Any] | None = None) -> list[Rule]:
    """extras.repetition_detection: a rule that detects something (``on``: where it is read)."""
    where, field_ = "kiln.api.requests.extras.repetition_detection", "repetition_detection"
    repeats = {"type": "object", "required": ["max_pattern_size", "min_count"], "properties": {
        "max_pattern_size": {"type": "integer", "minimum": repetition.MIN_PATTERN_SIZE},
        "min_count": {"type": "integer", "minimum": repetition.MIN_COUNT},
        "min_pattern_size": {"type": "integer", "minimum": 0}}}
    bad = has(field_, {"type": "object", "not": repeats})
    return [
        rule("refused_when", field_, code, where, "the rule must detect something",
             when=all_of(on, bad) if on else bad),
        rule("compare", field_, code, where, "the rule must detect something",
             left=field(f"{field_}.min_pattern_size"), op="<=",
             right=field(f"{field_}.max_pattern_size"), **({"when": on} if on else {})),
    ]


def adapter_scale_rule(code: str) -> Rule:
    """A composition scale whose numbers overflow (issue 52): the adapters' weights decide, so
    a scale past 1 in size may be a 400 naming ``adapters[i].scale``."""
    past_one = {"type": "object", "required": ["scale"],
                "properties": {"scale": {"not": {"minimum": -1, "maximum": 1}}}}
    return rule("model_dependent", "adapters", code, "kiln.engine.runner (NON_FINITE_MIX)",
                "a composition scale that makes the logits non-finite, which the adapters' "
                "weights decide: a 400 naming that scale",
                when=has("adapters", {"type": "array", "contains": past_one}))
