"""`x-kiln-rules`: each operation's rules beyond its JSON Schema, as data in the served
/openapi.json (docs/openapi-extensions.md defines the rule kinds): chat, batch and tokenize here,
completions in kiln/api/openapi_rules_completions.py, the shared vocabulary and groups in
kiln/api/openapi_rule_parts.py.

Every number comes from the constant the handler enforces (imported, never repeated), and every
rule names the handler step that enforces it in ``where``. A rule JSON Schema can state with the
refusal still naming its field lives in the contract instead (adapter names, top_logprobs and
logprob_token_ids needing logprobs, tool_choice's forms, reserved chat_template_kwargs).

Imported lazily by kiln/api/served_openapi.py: the handler modules import the package that
serves the document.
"""

from __future__ import annotations

from typing import Any

from kiln.api.contract import MAX_BATCH_ITEMS
from kiln.api.handlers import training
from kiln.api.openapi_rule_parts import (
    STREAM,
    Rule,
    adapter_scale_rule,
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
from kiln.api.openapi_rules_agents import messages_rules, responses_rules
from kiln.api.openapi_rules_completions import completion_rules
from kiln.api.requests import rollout
from kiln.api.requests.prepare import TEMPLATE_FIELDS
from kiln.api.requests.refused import (
    BATCH_UNSUPPORTED,
    CHAT_UNSUPPORTED,
    OPENAI_CHAT_UNSUPPORTED,
    UNSUPPORTED_CODE,
)
from kiln.api.served_openapi import Bounds

# the prompt is rendered from the conversation unless prompt_token_ids gives it (prompt_ids)
RENDERED = {"not": given("prompt_token_ids")}


def token_in_rules(code: str, b: Bounds, conversation: str) -> list[Rule]:
    """``prompt_token_ids`` (kiln.api.requests.prompt_ids): no template field beside it, the
    ids leave room for a token, and batch gives one id list per prompt."""
    where = "kiln.api.requests.prompt_ids"
    ids = given("prompt_token_ids")
    template = any_of(given("chat_template_kwargs"), has("add_generation_prompt", {"const": False}),
                      has("continue_final_message", {"const": True}),
                      has("echo", {"const": True}), has("add_special_tokens", {"const": True}),
                      given("truncate_prompt_tokens"))
    out = [rule("refused_when", "prompt_token_ids", code, f"{where}.refuse_template_fields",
                "the ids run as given: no field that acts through the chat template",
                when=all_of(ids, template))]
    if conversation == "messages":
        out.append(rule("compare", "prompt_token_ids", "context_length_exceeded",
                        f"{where}.given_prompt", "the ids leave room for a token", when=ids,
                        left=field("prompt_token_ids", measure="length"), op="<",
                        right=value(b.max_model_len)))
    else:
        out += [rule("compare", "prompt_token_ids", code, "kiln.api.requests.prepare",
                     "one id list per prompt", when=ids, op=op,
                     left=field(left, measure="length"), right=field(right, measure="length"))
                for left, right, op in (("prompt_token_ids", conversation, "<="),
                                        (conversation, "prompt_token_ids", "<="))]
        out.append(rule("compare", "prompt_token_ids", "context_length_exceeded",
                        f"{where}.given_prompt", "each id list leaves room for a token",
                        when=ids, left=field("prompt_token_ids[*]", measure="length"), op="<",
                        right=value(b.max_model_len)))
    return out


def chat_shape_rules(code: str, b: Bounds, conversation: str) -> list[Rule]:
    """What chat and batch share: the model field beside adapters, the rendered prompt's
    length, and what the model's own programs (template, tokenizer) decide."""
    adapters = any_of(has("adapter", {"type": "string", "minLength": 1}),
                      has("adapters", {"type": "array"}))
    param = conversation.removesuffix("[*]")
    return [
        rule("refused_when", "model", "invalid_compose_request",
             "kiln.api.requests.params.select",
             "a model naming an adapter takes no adapter or adapters (a model naming nothing "
             "is a 404)", when=all_of(has("model", {"type": "string",
                                                   "not": {"enum": list(b.model_names)}}),
                                     adapters)),
        rule("compare", param, "context_length_exceeded",
             "kiln.api.requests.prepare", "the rendered prompt leaves room for a token",
             left=field(conversation, measure="rendered_tokens"), op="<",
             right=value(b.max_model_len), when=RENDERED),
        rule("model_dependent", param, "invalid_messages",
             "kiln.api.requests.prepare.render_prompt",
             "the model's chat template (a Jinja program) may refuse a conversation"),
        *token_in_rules(code, b, param),
        *vllm_field_rules(code, b),  # before the budget's: they name the field the server does
        rule("model_dependent", "max_tokens", code, "kiln.api.requests.prepare.apply_budget",
             "where a thinking budget applies (the prompt ends inside a reasoning block, which "
             "the template decides), max_tokens fits the tokenizer's close sequence and no stop "
             "string overlaps it",
             when={} if b.default_budget else any_of(
                 given("thinking_budget_tokens"), given("thinking_budget_ms"),
                 has("thinking_token_budget", {"minimum": 0}))),
    ]


def vllm_field_rules(code: str, b: Bounds) -> list[Rule]:
    """vLLM's request fields on chat and batch (kiln.api.requests.extras): truncation keeps a
    token, prompt_logprobs does not stream, thinking_token_budget names thinking_budget_tokens'
    limit (-1 as null) when both are set."""
    where, alias, kiln = "kiln.api.requests.extras", "thinking_token_budget", "thinking_budget_tokens"
    both = all_of(has(alias, {"type": "integer", "minimum": 0}), has(kiln, {"type": "integer"}))
    return [
        rule("refused_when", "truncate_prompt_tokens", code, f"{where}.truncation",
             "truncation keeps at least one prompt token",
             when=any_of(has("truncate_prompt_tokens", {"const": 0}), all_of(
                 has("truncate_prompt_tokens", {"const": -1}),
                 has("max_tokens", {"type": "integer", "minimum": b.max_model_len})))),
        rule("refused_when", "prompt_logprobs", UNSUPPORTED_CODE, f"{where}.prompt_logprobs_wanted",
             "prompt_logprobs is implemented for non-streaming requests",
             when=all_of(STREAM, given("prompt_logprobs"))),
        rule("refused_when", alias, code, f"{where}.thinking_tokens", "the two name one limit",
             when=any_of(all_of(has(alias, {"const": -1}), has(kiln, {"type": "integer"})),
                         all_of(has(alias, {"minimum": 0}), has(kiln, {"type": "null"})))),
        *[rule("compare", alias, code, f"{where}.thinking_tokens", "the two name one limit",
               when=both, left=field(x), op="<=", right=field(y))
          for x, y in ((alias, kiln), (kiln, alias))],
        *[rule("refused_when", name, code, "kiln.api.requests.prepare.template_kwargs",
               "the template variable is set once", when=all_of(given(name), has(
                   "chat_template_kwargs", {"type": "object", "required": [name]})))
          for name in TEMPLATE_FIELDS],
    ]


def chat_rules(b: Bounds, render: bool) -> list[Rule]:
    code, prepare = "chat_invalid_request", "kiln.api.requests.prepare"
    out = [
        *unsupported_fields(CHAT_UNSUPPORTED + OPENAI_CHAT_UNSUPPORTED),
        rule("refused_when", "tools", code, "kiln.api.contract.check_chat",
             "rollout_provenance takes no tools",
             when=all_of(has("rollout_provenance", {"const": True}),
                         has("tools", {"type": "array", "minItems": 1}))),
        rule("refused_when", "tool_choice", code, "kiln.api.contract.check_chat",
             "rollout_provenance takes no tool_choice",
             when=all_of(has("rollout_provenance", {"const": True}), given("tool_choice"))),
        rule("refused_when", "include_reasoning", code, "kiln.api.requests.extras.reasoning_shown",
             "fold_reasoning_into_content copies the reasoning that include_reasoning: false "
             "leaves out", when=all_of(has("include_reasoning", {"const": False}),
                                       has("fold_reasoning_into_content", {"const": True}))),
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
        *n_probs_rules(code),
        *chat_shape_rules(code, b, "messages"),
        *min_tokens_rules(code, field(["max_tokens", "max_completion_tokens"])),
        *repetition_rules(code),
        *constraint_rules(b, code, tools=True),
    ]
    if not render:
        out += [*rollout_rules(code), adapter_scale_rule(code), rule(
            "compare", "n", code, "kiln.api.submission.submit_all",
            "a request's engine requests fit the server's admission gate at once",
            left=field("n", if_absent=1, if_null=1), op="<=", right=value(b.capacity))]
    return out


def n_probs_rules(code: str) -> list[Rule]:
    """llama-server's n_probs beside logprobs: true asks for top_logprobs n_probs: both must
    say the same (kiln.api.requests.extras)."""
    when = all_of(has("logprobs", {"const": True}), has("n_probs", {"minimum": 1}))
    n, top = field("n_probs"), field("top_logprobs", if_absent=0, if_null=0)
    return [rule("compare", "n_probs", code, "kiln.api.requests.extras.logprobs_wanted",
                 "n_probs with logprobs: true asks for top_logprobs n_probs", when=when,
                 left=a, op="<=", right=b) for a, b in ((n, top), (top, n))]


def rollout_rules(code: str) -> list[Rule]:
    where, on = "kiln.api.requests.rollout.check", has("rollout_provenance", {"const": True})
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
        *unsupported_fields(CHAT_UNSUPPORTED),  # extras.chat_extras, as on chat
        *unsupported_fields(BATCH_UNSUPPORTED),  # handlers.batch.create
        rule("product_max", "prompts", "batch_too_large", "kiln.api.contract.check_batch",
             "prompts x n outputs per request", factors=both, max=MAX_BATCH_ITEMS),
        rule("product_max", "n", "batch_too_large", "kiln.api.submission.submit_all",
             "a request's engine requests fit the server's admission gate at once",
             factors=both, max=b.capacity),
        *chat_shape_rules(code, b, "prompts[*]"),
        *repetition_rules(code),
        *min_tokens_rules(code, field(["max_tokens", "max_completion_tokens"])),
        *constraint_rules(b, code, tools=True),
        adapter_scale_rule(code),
    ]


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
             "kiln.api.requests.prepare.render_prompt",
             "the model's chat template (a Jinja program) may refuse a conversation"),
    ]


def update_weights_rules() -> list[Rule]:
    """POST /update_weights_from_disk (kiln.api.handlers.training): SGLang's fields Kiln has no
    use for at their no-op values only, the format read from the file, and abort_all_requests
    meaning mode abort."""
    where = "kiln.api.handlers.training.update_weights_from_disk"
    return [
        *(rule("non_default_refused", name, UNSUPPORTED_CODE, where,
               "SGLang's field, accepted at its no-op value only", field=name,
               default=[None, value]) for name, value in training.NO_OP_FIELDS),
        rule("refused_when", "load_format", training.CODE, where,
             "the format is read from the file: null or \"auto\"",
             when=has("load_format", {"type": "string", "not": {"const": "auto"}})),
        rule("refused_when", "abort_all_requests", training.CODE, f"{where} (_update_mode)",
             "abort_all_requests: true is mode abort",
             when=all_of(has("abort_all_requests", {"const": True}),
                         has("mode", {"type": "string", "not": {"const": "abort"}}))),
        rule("model_dependent", "model_path", training.CODE, where,
             "the checkpoint must load and have the serving model's architecture and shapes"),
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
        ("POST", "/v1/responses"): responses_rules(b),
        ("POST", "/v1/messages"): messages_rules(b, counting=False),
        ("POST", "/v1/messages/count_tokens"): messages_rules(b, counting=True),
        ("POST", "/update_weights_from_disk"): update_weights_rules(),
    }
