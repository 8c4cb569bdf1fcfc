"""`x-kiln-rules` of POST /v1/completions and its render route: what prompt scoring and
generation refuse beyond the JSON Schema (docs/openapi-extensions.md)."""

from __future__ import annotations

from kiln.api.handlers import completions
from kiln.api.openapi_rule_parts import (
    GENERATING,
    RESPONSE_FORMAT_SET,
    SCORING,
    STREAM,
    STRUCTURED_OUTPUTS_SET,
    Rule,
    all_of,
    any_of,
    constraint_rules,
    field,
    given,
    has,
    min_tokens_rules,
    repetition_rules,
    rule,
    unsupported_fields,
    value,
)
from kiln.api.requests import completions_gen
from kiln.api.requests.refused import COMPLETION_UNSUPPORTED, UNSUPPORTED_CODE
from kiln.api.served_openapi import Bounds


def unconstrained_scoring() -> list[Rule]:
    """completions.output_constraint: prompt scoring takes no output constraint."""
    return [rule("refused_when", name, UNSUPPORTED_CODE,
                 "kiln.api.handlers.completions.output_constraint",
                 "prompt scoring generates no text to constrain", when=all_of(SCORING, given_set))
            for name, given_set in (("response_format", RESPONSE_FORMAT_SET),
                                    ("structured_outputs", STRUCTURED_OUTPUTS_SET))]


def scoring_rules(b: Bounds) -> list[Rule]:
    """completions._score: what prompt scoring (prompt_logprobs, max_tokens missing, null, 0 or
    1) refuses beyond the schema."""
    code, where = completions.ERROR_CODE, "kiln.api.handlers.completions._score"
    unset = UNSUPPORTED_CODE
    tokens = field("prompt", measure="text_tokens")
    return [
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




def generation_rules(b: Bounds, render: bool) -> list[Rule]:
    """completions_gen.prepare (and its submit): what a generating completions request (not
    prompt scoring) must keep to beyond the schema."""
    code, where = completions_gen.ERROR_CODE, "kiln.api.requests.completions_gen.prepare"
    on = GENERATING
    choices = [field("prompt", measure="prompt_count"),
               field(["best_of", "n"], if_absent=1, if_null=1)]
    n = field("n", if_absent=1, if_null=1)
    # completions_gen.wanted_max_tokens: missing is 16, or the model's max_new_tokens if lower;
    # null is the model's max_new_tokens (without one: the rest of the window, no bound)
    model = b.max_new_tokens
    defaults: dict[str, int] = {"if_absent": completions_gen.DEFAULT_MAX_TOKENS if model is None
                                else min(completions_gen.DEFAULT_MAX_TOKENS, model)}
    if model is not None:
        defaults["if_null"] = model
    too_many: dict[str, object] = {"type": "integer", "minimum": b.max_model_len}
    if model is not None and model >= b.max_model_len:  # null keeps no prompt token either
        too_many = {"anyOf": [too_many, {"type": "null"}]}
    out = [
        rule("refused_when", "truncate_prompt_tokens", code, where,
             "truncation keeps at least one prompt token",
             when=all_of(on, any_of(has("truncate_prompt_tokens", {"const": 0}), all_of(
                 has("truncate_prompt_tokens", {"const": -1}), has("max_tokens", too_many))))),
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
        *min_tokens_rules(code, field("max_tokens", **defaults)),
        *repetition_rules(code, on),
        rule("model_dependent", "thinking_token_budget", code,
             "kiln.api.requests.prepare.apply_budget",
             "where the prompt ends inside a reasoning block (the tokenizer's text decides), "
             "max_tokens fits the close sequence and no stop string overlaps it",
             when=all_of(on, has("thinking_token_budget", {"minimum": 0}))),
    ]
    if not render:
        out.append(rule("product_max", "n", code, "kiln.api.submission.submit_all",
                        "a request's engine requests fit the server's admission gate at once",
                        when=on, factors=choices, max=b.capacity))
    return out


def completion_rules(b: Bounds, render: bool) -> list[Rule]:
    code = completions.ERROR_CODE
    out = [
        *unsupported_fields(COMPLETION_UNSUPPORTED),
        rule("refused_when", "prompt", code, "kiln.api.handlers.completions._score",
             "prompt scoring takes one prompt (a text or a token-ID list)",
             when=all_of(SCORING, has("prompt", {"type": "array",
                                                 "contains": {"not": {"type": "number"}}})))]
    out += [*constraint_rules(b, code, tools=False), *unconstrained_scoring()]
    if not render:
        out += scoring_rules(b)
    return out + generation_rules(b, render)
