"""`x-kiln-rules`: each operation's rules beyond its JSON Schema, as data in the served
/openapi.json (docs/openapi-extensions.md defines the rule kinds).

Every number comes from the constant the handler enforces (imported here, never repeated), and
every rule names the handler step that enforces it in ``where``. A rule JSON Schema can state
with the refusal still naming its field lives in the contract instead (adapter names, top_logprobs
and logprob_token_ids needing logprobs, tool_choice's forms, reserved chat_template_kwargs).

Imported lazily by kiln/api/served_openapi.py: the handler modules import the package that
serves the document.
"""

from __future__ import annotations

from typing import Any

from kiln.api.contract import MAX_BATCH_ITEMS
from kiln.api.handlers import completions, completions_gen, constraints, rollout, unsupported
from kiln.api.served_openapi import Bounds
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


def rule(kind: str, param: str, code: str, where: str, reason: str, **fields: Any) -> Rule:
    return {"kind": kind, "param": param, "code": code, **fields, "where": where,
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
    return [rule("non_default_refused", name, unsupported.CODE, "kiln.api.handlers.unsupported",
                 "a seed field this server does not implement", field=name,
                 default=list(unsupported.NEUTRAL[name])) for name in names]


def constraint_rules(b: Bounds, code: str, tools: bool) -> list[Rule]:
    """constraints.constraint, in its order: each field's grammar is built (a malformed one
    refused), one constraint per request, then compiled against the model's tokenizer."""
    where = "kiln.api.handlers.constraints.constraint"
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
    if not b.grammars:
        out += [rule("refused_when", name, code, "kiln.engine.grammar.GrammarCompiler",
                     "this model's tokenizer cannot drive a grammar", when=condition)
                for name, condition in named]
    programs = [("structured_outputs.json", "json-schema"), ("structured_outputs.regex", "regex"),
                ("structured_outputs.choice", "lark"), ("structured_outputs.grammar", "lark"),
                ("structured_outputs.structural_tag", "structural-tag"),
                ("structured_outputs.whitespace_pattern", "regex"),
                ("response_format.json_schema.schema", "json-schema"),
                ("response_format.structures", "structural-tag"),
                ("response_format.format", "structural-tag")]
    if tools:
        programs.append(("tools[*].function.parameters", "json-schema"))
    for path, language in programs:
        when = TOOL_CALL_FORCED if path.startswith("tools") else None
        out.append(rule("compiles", path.split(".")[0].removesuffix("[*]"), code, where,
                        "text the server compiles into a grammar (llguidance, checked against "
                        "the model's tokenizer)", field=path, language=language,
                        **({"when": when} if when else {})))
    return out


def min_tokens_rules(code: str, max_tokens: dict[str, Any]) -> list[Rule]:
    where = "kiln.api.handlers.extras.logits_extras"
    return [
        rule("compare", "min_tokens", code, where, "min_tokens may not pass max_tokens",
             left=field("min_tokens"), op="<=", right=max_tokens),
        rule("refused_when", "min_tokens", unsupported.CODE, where,
             "min_tokens beside stop strings is not implemented",
             when=all_of(has("min_tokens", {"minimum": 1}), has("stop", {"anyOf": [
                 {"type": "string"}, {"type": "array", "minItems": 1}]}))),
    ]


def chat_shape_rules(code: str, b: Bounds, conversation: str) -> list[Rule]:
    """What chat and batch share: the model field beside adapters, the rendered prompt's
    length, and what the model's own programs (template, tokenizer) decide."""
    adapters = any_of(has("adapter", {"type": "string", "minLength": 1}),
                      has("adapters", {"type": "array"}))
    param = conversation.removesuffix("[*]")
    return [
        rule("refused_when", "model", "invalid_compose_request",
             "kiln.api.handlers.adapters.select",
             "a model naming an adapter takes no adapter or adapters (a model naming nothing "
             "is a 404)", when=all_of(has("model", {"type": "string",
                                                   "not": {"enum": list(b.model_names)}}),
                                     adapters)),
        rule("compare", param, "context_length_exceeded",
             "kiln.api.handlers.prepare", "the rendered prompt leaves room for a token",
             left=field(conversation, measure="rendered_tokens"), op="<",
             right=value(b.max_model_len)),
        rule("model_dependent", param, "invalid_messages",
             "kiln.api.handlers.prepare.render_prompt",
             "the model's chat template (a Jinja program) may refuse a conversation"),
        rule("model_dependent", "max_tokens", code, "kiln.api.handlers.prepare.apply_budget",
             "where a thinking budget applies (the prompt ends inside a reasoning block, which "
             "the template decides), max_tokens fits the tokenizer's close sequence and no stop "
             "string overlaps it",
             when={} if b.default_budget else any_of(given("thinking_budget_tokens"),
                                                     given("thinking_budget_ms"))),
    ]


def chat_rules(b: Bounds, render: bool) -> list[Rule]:
    code, prepare = "chat_invalid_request", "kiln.api.handlers.prepare"
    out = [
        *unsupported_fields(unsupported.CHAT_FIELDS),
        rule("refused_when", "tools", code, "kiln.api.contract.check_chat",
             "rollout_provenance takes no tools",
             when=all_of(has("rollout_provenance", {"const": True}),
                         has("tools", {"type": "array", "minItems": 1}))),
        rule("refused_when", "tool_choice", code, "kiln.api.contract.check_chat",
             "rollout_provenance takes no tool_choice",
             when=all_of(has("rollout_provenance", {"const": True}), given("tool_choice"))),
        rule("refused_when", "continue_final_message", code, prepare,
             "continue_final_message: true needs add_generation_prompt: false",
             when=all_of(has("continue_final_message", {"const": True}),
                         {"not": has("add_generation_prompt", {"const": False})})),
        rule("last_item", "continue_final_message", code, prepare,
             "continue_final_message continues the final message, the assistant's",
             when=has("continue_final_message", {"const": True}), field="messages",
             matches=has("role", {"const": "assistant"})),
        rule("model_dependent", "continue_final_message", code, prepare,
             "the template renders the final assistant message's content verbatim",
             when=has("continue_final_message", {"const": True})),
        *[rule("refused_when", name, unsupported.CODE, prepare,
               f"{name} is implemented for non-streaming chat only",
               when=all_of(STREAM, has(name, {"const": True})))
          for name in ("echo", "return_token_ids")],
        *chat_shape_rules(code, b, "messages"),
        *min_tokens_rules(code, field(["max_tokens", "max_completion_tokens"])),
        *constraint_rules(b, code, tools=True),
    ]
    if not render:
        out += [*rollout_rules(code), rule(
            "compare", "n", code, "kiln.api.handlers.generation.submit_all",
            "a request's engine requests fit the server's admission gate at once",
            left=field("n", if_absent=1, if_null=1), op="<=", right=value(b.capacity))]
    return out


def rollout_rules(code: str) -> list[Rule]:
    where, on = "kiln.api.handlers.rollout.check", has("rollout_provenance", {"const": True})
    out = [rule("refused_when", "max_tokens", code, where,
                "rollout_provenance samples at least one token",
                when=all_of(on, {"not": given("max_tokens")},
                            has("max_completion_tokens", {"const": 0})))]
    for name, (low, high) in rollout.RANGES.items():
        bound: dict[str, Any] = {"type": "number", "minimum": low}
        if high != float("inf"):
            bound["maximum"] = high
        out.append(rule("refused_when", name, code, where,
                        "rollout_provenance records sampling values in range",
                        when=all_of(on, has(name, {"type": "number", "not": bound}))))
    out += [
        rule("refused_when", "repetition_penalty", code, where,
             "rollout_provenance records a positive repetition_penalty",
             when=all_of(on, has("repetition_penalty", {"type": "number", "maximum": 0}))),
        rule("compare", "stop", code, where, "rollout_provenance bounds the stop strings",
             when=on, left=field("stop", measure="length"), op="<=",
             right=value(rollout.MAX_STOP_STRINGS)),
        rule("compare", "stop", code, where, "rollout_provenance bounds the stop strings",
             when=on, left=field("stop", measure="utf8_bytes"), op="<=",
             right=value(rollout.MAX_STOP_BYTES)),
    ]
    return out


def batch_rules(b: Bounds) -> list[Rule]:
    code = "batch_invalid_request"
    both = [field("prompts", measure="length"), field("n", if_absent=1, if_null=1)]
    return [
        rule("product_max", "prompts", "batch_too_large", "kiln.api.contract.check_batch",
             "prompts x n outputs per request", factors=both, max=MAX_BATCH_ITEMS),
        rule("product_max", "n", "batch_too_large", "kiln.api.handlers.generation.submit_all",
             "a request's engine requests fit the server's admission gate at once",
             factors=both, max=b.capacity),
        *chat_shape_rules(code, b, "prompts[*]"),
        *constraint_rules(b, code, tools=True),
    ]


def unconstrained_scoring() -> list[Rule]:
    """completions.output_constraint (both routes): prompt scoring takes no constraint."""
    return [rule("refused_when", name, unsupported.CODE,
                 "kiln.api.handlers.completions.output_constraint",
                 "prompt scoring generates no text to constrain", when=all_of(SCORING, given_set))
            for name, given_set in (("response_format", RESPONSE_FORMAT_SET),
                                    ("structured_outputs", STRUCTURED_OUTPUTS_SET))]


def scoring_rules(b: Bounds) -> list[Rule]:
    """completions._score: what prompt scoring (prompt_logprobs, max_tokens missing, null, 0 or
    1) refuses beyond the schema."""
    code, where = completions.ERROR_CODE, "kiln.api.handlers.completions._score"
    unset = unsupported.CODE
    tokens = field("prompt", measure="text_tokens")
    return [
        *unconstrained_scoring(),
        rule("refused_when", "n", code, where, "prompt scoring makes one choice",
             when=all_of(SCORING, has("n", {"not": {"enum": [None, 1]}}))),
        rule("refused_when", "stream", code, where, "prompt scoring does not stream",
             when=all_of(SCORING, STREAM)),
        *[rule("refused_when", name, unset, where, "it does not apply to prompt scoring",
               when=all_of(SCORING, has(name, {"not": {"enum": list(neutral)}})))
          for name, neutral in completions.SCORING_NEUTRAL.items()],
        *[rule("refused_when", name, unset, where, "prompt scoring generates no tokens",
               when=all_of(SCORING, has(name, {"anyOf": [{"type": "array", "minItems": 1},
                                                          {"type": "object",
                                                           "minProperties": 1}]})))
          for name in completions.SCORING_EMPTY],
        rule("refused_when", "thinking_token_budget", unset, where,
             "prompt scoring generates nothing to budget",
             when=all_of(SCORING, has("thinking_token_budget", {"minimum": 1}))),
        rule("compare", "prompt_logprobs", code, where, "at most the vocabulary", when=SCORING,
             left=field("prompt_logprobs"), op="<=", right=value(b.vocab_size)),
        rule("compare", "prompt", code, where, "the scoring cap on prompt tokens", when=SCORING,
             left=tokens, op="<=", right=value(completions.MAX_PROMPT_TOKENS)),
        rule("compare", "prompt", "context_length_exceeded", where, "the context window",
             when=SCORING, left=tokens, op="<=", right=value(b.max_model_len)),
        rule("product_max", "prompt_logprobs", code, where,
             "(prompt tokens - 1) x (prompt_logprobs + 1) candidates", when=SCORING,
             factors=[field("prompt", measure="text_tokens", add=-1),
                      field("prompt_logprobs", add=1)], max=completions.MAX_CANDIDATES),
    ]


def repetition_rules(code: str, on: dict[str, Any] | None = None) -> list[Rule]:
    """extras.repetition_detection: a rule that detects something (``on``: where it is read)."""
    where, field_ = "kiln.api.handlers.extras.repetition_detection", "repetition_detection"
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


def generation_rules(b: Bounds, render: bool) -> list[Rule]:
    """completions_gen.prepare (and its submit): what a generating completions request (not
    prompt scoring) must keep to beyond the schema."""
    code, where = completions_gen.ERROR_CODE, "kiln.api.handlers.completions_gen.prepare"
    on = GENERATING
    choices = [field("prompt", measure="prompt_count"),
               field(["best_of", "n"], if_absent=1, if_null=1)]
    n = field("n", if_absent=1, if_null=1)
    out = [
        rule("refused_when", "truncate_prompt_tokens", code, where,
             "truncation keeps at least one prompt token",
             when=all_of(on, any_of(has("truncate_prompt_tokens", {"const": 0}), all_of(
                 has("truncate_prompt_tokens", {"const": -1}),
                 has("max_tokens", {"type": "integer", "minimum": b.max_model_len}))))),
        rule("compare", "prompt", "context_length_exceeded", where,
             "each prompt leaves room for a token in the context window", when=on,
             left=field("prompt", measure="text_tokens"), op="<", right=value(b.max_model_len)),
        rule("compare", "best_of", code, where, "best_of is at least n", when=on,
             left=n, op="<=", right=field("best_of")),
        rule("compare", "best_of", code, where, "best_of above n cannot stream",
             when=all_of(on, STREAM), left=field("best_of"), op="<=", right=n),
        rule("product_max", "n", code, where, "prompts x (best_of or n) choices", when=on,
             factors=choices, max=completions_gen.MAX_CHOICES),
        rule("refused_when", "prompt_logprobs", code, where,
             "prompt_logprobs beside generation is at most --max-logprobs",
             when=all_of(on, has("prompt_logprobs", {"type": "integer",
                                                     "minimum": b.max_logprobs + 1}))),
        rule("product_max", "logprobs", code, where,
             "echoed prompt positions x (logprobs + 1) candidates",
             when=all_of(on, has("echo", {"const": True}), given("logprobs")),
             factors=[field("prompt", measure="text_tokens", add=-1), field("logprobs", add=1)],
             max=completions_gen.MAX_ECHO_CANDIDATES),
        *min_tokens_rules(code, field("max_tokens",
                                      if_absent=completions_gen.DEFAULT_MAX_TOKENS)),
        *repetition_rules(code, on),
        rule("model_dependent", "thinking_token_budget", code,
             "kiln.api.handlers.prepare.apply_budget",
             "where the prompt ends inside a reasoning block (the tokenizer's text decides), "
             "max_tokens fits the close sequence and no stop string overlaps it",
             when=all_of(on, has("thinking_token_budget", {"minimum": 0}))),
    ]
    if not render:
        out.append(rule("product_max", "n", code, "kiln.api.handlers.generation.submit_all",
                        "a request's engine requests fit the server's admission gate at once",
                        when=on, factors=choices, max=b.capacity))
    return out


def completion_rules(b: Bounds, render: bool) -> list[Rule]:
    code = completions.ERROR_CODE
    out = [
        *unsupported_fields(unsupported.COMPLETION_FIELDS),
        rule("refused_when", "prompt", code, "kiln.api.handlers.completions._score",
             "prompt scoring takes one prompt (a text or a token-ID list)",
             when=all_of(SCORING, has("prompt", {"type": "array",
                                                 "contains": {"not": {"type": "number"}}})))]
    out += constraint_rules(b, code, tools=False)  # the render route compiles it too
    out += unconstrained_scoring() if render else scoring_rules(b)
    return out + generation_rules(b, render)


def tokenize_rules(b: Bounds) -> list[Rule]:
    where = "kiln.api.handlers.tokenizer.tokenize"
    return [
        rule("compare", "prompt", "context_length_exceeded", where,
             "a prompt at most four context windows long is tokenized",
             left=field("prompt", measure="text_tokens"), op="<=", right=value(4 * b.max_model_len)),
        rule("compare", "messages", "context_length_exceeded", where,
             "a conversation at most four context windows long is tokenized",
             left=field("messages", measure="rendered_tokens"), op="<=",
             right=value(4 * b.max_model_len)),
        rule("model_dependent", "messages", "invalid_messages",
             "kiln.api.handlers.prepare.render_prompt",
             "the model's chat template (a Jinja program) may refuse a conversation"),
    ]


def operation_rules(b: Bounds) -> dict[tuple[str, str], list[Rule]]:
    """(method, path) -> the operation's `x-kiln-rules` (operations without rules are absent)."""
    return {
        ("POST", "/v1/chat/completions"): chat_rules(b, render=False),
        ("POST", "/v1/chat/completions/render"): chat_rules(b, render=True),
        ("POST", "/v1/completions"): completion_rules(b, render=False),
        ("POST", "/v1/completions/render"): completion_rules(b, render=True),
        ("POST", "/v1/completions/batch"): batch_rules(b),
        ("POST", "/tokenize"): tokenize_rules(b),
    }
