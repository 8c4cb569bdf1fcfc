"""`x-kiln-rules` of the agent clients' routes (OpenAI's Responses, Anthropic's Messages): each
refusal their input stages (kiln/api/requests/responses_input.py, messages_input.py) add to the
chat path they run on, as data, from the handlers' own tables. What chat itself refuses of the
request they write (the template's verdict, a grammar that does not compile, the prompt's
length) is stated here too, in the routes' own field names."""

from __future__ import annotations

from typing import Any

from kiln.api.openapi_rule_parts import Rule, all_of, any_of, field, has, rule, value
from kiln.api.requests import messages_input, responses_input, rollout
from kiln.api.served_openapi import Bounds

TRUTHY: dict[str, Any] = {"not": {"enum": [None, False, 0, "", [], {}]}}


def _contains(item: dict[str, Any]) -> dict[str, Any]:
    return {"type": "array", "contains": item}


def _typed(kind: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "required": ["type"], "properties": {"type": kind}}


def _not(*kinds: str | None) -> dict[str, Any]:
    return {"not": {"enum": list(kinds)}}


def _shared(code: str, b: Bounds, conversation: str, where: str, extra_text: list[str]
            ) -> list[Rule]:
    """What the chat path decides of the conversation: its length and the template's verdict."""
    return [
        rule("compare", conversation, "context_length_exceeded", "kiln.api.requests.prepare",
             "the rendered prompt leaves room for a token",
             left=field([conversation, *extra_text], measure="rendered_tokens"), op="<",
             right=value(b.max_model_len)),
        rule("model_dependent", conversation, "invalid_messages",
             "kiln.api.requests.prepare.render_prompt",
             "the model's chat template (a Jinja program) may refuse a conversation"),
        rule("refused_when", "model", "invalid_compose_request",
             "kiln.api.requests.params.select", "the model names the base model or an adapter",
             when=has("model", {"type": "string", "not": {"enum": list(b.model_names)}})),
    ]


def _rollout_rules(code: str, tools: str) -> list[Rule]:
    """rollout_provenance: chat's conditions, on the chat body the input stage writes."""
    on, where = has("rollout_provenance", {"const": True}), "kiln.api.replies.chat_turn.rollout"
    out = [
        rule("refused_when", "rollout_provenance", code, where, "non-streaming",
             when=all_of(on, has("stream", {"const": True}))),
        rule("refused_when", "rollout_provenance", code, where, "without tools",
             when=all_of(on, any_of(has(tools, {"type": "array", "minItems": 1}),
                                    has("tool_choice", {"not": {"type": "null"}})))),
        rule("refused_when", "repetition_penalty", code, "kiln.api.requests.rollout.check",
             "rollout_provenance records a positive repetition_penalty",
             when=all_of(on, has("repetition_penalty", {"type": "number", "maximum": 0}))),
    ]
    for name, (low, high) in rollout.RANGES.items():
        bound: dict[str, Any] = {"type": "number", "minimum": low}
        if high != float("inf"):
            bound["maximum"] = high
        out.append(rule("refused_when", name, code, "kiln.api.requests.rollout.check",
                        "rollout_provenance records sampling values in range",
                        when=all_of(on, has(name, {"type": "number", "not": bound}))))
    return out


def responses_rules(b: Bounds) -> list[Rule]:
    code, where = responses_input.CODE, "kiln.api.requests.responses_input"
    message_parts = _contains(_typed(_not("input_text", "output_text", "refusal")))
    bad_item = {"anyOf": [
        _typed({"const": "item_reference"}),
        all_of(_typed({"enum": ["message"]}), has("content", message_parts)),
        {"type": "object", "required": ["role", "content"], "not": {"required": ["type"]},
         "properties": {"content": message_parts}},
        all_of(_typed({"const": "function_call_output"}), has("output", message_parts)),
        all_of(_typed({"const": "reasoning"}), has("encrypted_content", {
            "type": "string", "not": {"pattern": "^" + responses_input.ENCRYPTED_PREFIX}})),
    ]}
    out = [
        *[rule("refused_when", name, code, f"{where}.refuse_unsupported", why,
               when=has(name, TRUTHY)) for name, why in responses_input.REFUSED.items()],
        rule("refused_when", "include", code, f"{where}.refuse_unsupported",
             "includes that belong to hosted tools or images",
             when=has("include", _contains(_not(*responses_input.INCLUDE_HONOURED)))),
        rule("refused_when", "stream_options.include_obfuscation", code,
             f"{where}.refuse_unsupported", "no padding of stream events",
             when=has("stream_options", has("include_obfuscation", {"const": True}))),
        rule("refused_when", "service_tier", code, f"{where}.refuse_unsupported",
             "one service tier", when=has("service_tier", _not(None, "auto", "default"))),
        rule("refused_when", "prompt_cache_retention", code, f"{where}.refuse_unsupported",
             "the prefix cache lives in memory",
             when=has("prompt_cache_retention", _not(None, "in-memory"))),
        rule("refused_when", "tools", code, f"{where}.chat_tools", "function tools only",
             when=has("tools", _contains(_typed(_not("function"))))),
        rule("refused_when", "input", code, f"{where}.chat_messages",
             "text parts only; no item references; encrypted reasoning Kiln wrote",
             when=has("input", _contains(bad_item))),
        rule("refused_when", "input", code, f"{where}.chat_body",
             "the conversation holds a message",
             when=all_of(has("input", {"anyOf": [
                 {"const": ""}, {"type": "array", "not": {"contains": {"anyOf": [
                     {"required": ["role"]}, _typed({"enum": [
                         "function_call", "function_call_output"]})]}}}]}),
                 {"not": has("instructions", {"type": "string", "minLength": 1})})),
        rule("refused_when", "text.verbosity", code, f"{where}.response_format",
             "answer length is not steered",
             when=has("text", has("verbosity", _not(None, "medium")))),
        rule("refused_when", "reasoning.summary", code, f"{where}.reasoning_fields",
             "no summaries", when=has("reasoning", any_of(
                 has("summary", _not(None, "auto")), has("generate_summary", _not(None, "auto"))))),
        rule("refused_when", "tool_choice", code, f"{where}.chat_tool_choice",
             "a tool choice other than none and auto needs tools, of the function kind, that "
             "the grammar compiles (only the server's compiler can say)",
             when=has("tool_choice", {"not": {"enum": [None, "none", "auto"]}})),
        rule("refused_when", "text.format", code, "kiln.api.structured.constraints.constraint",
             "a JSON schema the grammar compiles (only the server's compiler can say)",
             when=has("text", has("format", _typed({"const": "json_schema"})))),
        rule("model_dependent", "reasoning.effort", code, "kiln.api.requests.prepare.apply_budget",
             "where a thinking budget applies, max_output_tokens fits the close sequence",
             when=has("reasoning", has("effort", _not(None, "none")))),
        *_shared(code, b, "input", where, ["instructions"]),
        *_rollout_rules(code, "tools"),
    ]
    return out


def messages_rules(b: Bounds, counting: bool) -> list[Rule]:
    code, where = messages_input.CODE, "kiln.api.requests.messages_input"
    user_bad = _contains(_typed(_not("text", "tool_result")))
    assistant_bad = _contains(_typed(_not("text", "thinking", "tool_use")))
    result_bad = _contains(_typed(_not("text")))
    bad_message = {"anyOf": [
        all_of(has("role", {"const": "system"}), has("content", result_bad)),
        all_of(has("role", {"const": "user"}), has("content", user_bad)),
        all_of(has("role", {"const": "assistant"}), has("content", assistant_bad)),
        has("content", _contains(all_of(_typed({"const": "tool_result"}),
                                        has("content", result_bad)))),
    ]}
    out = [
        *[rule("refused_when", name, code, f"{where}.refuse_unsupported", why,
               when=has(name, TRUTHY)) for name, why in messages_input.REFUSED.items()],
        rule("refused_when", "context_management", code, f"{where}.refuse_unsupported",
             "edits other than clearing thinking", when=has("context_management", {
                 "type": "object", "not": {"properties": {"edits": {"type": "array", "items": {
                     "type": "object", "required": ["type"], "properties": {"type": {
                         "type": "string", "pattern": "^(" + "|".join(
                             messages_input.CONTEXT_EDITS) + ")"}}}}}}})),
        rule("refused_when", "speed", code, f"{where}.refuse_unsupported", "one speed",
             when=has("speed", {"const": "fast"})),
        rule("refused_when", "inference_geo", code, f"{where}.refuse_unsupported",
             "Kiln runs where it is started", when=has("inference_geo", TRUTHY)),
        rule("refused_when", "diagnostics", code, f"{where}.refuse_unsupported",
             "no cache diagnostics",
             when=has("diagnostics", has("previous_message_id", TRUTHY))),
        rule("refused_when", "tools", code, f"{where}.chat_tools",
             "custom tools only, sent whole",
             when=has("tools", _contains({"anyOf": [
                 has("type", _not("custom")), has("defer_loading", {"const": True}),
                 has("allowed_callers", {"type": "array", "minItems": 1})]}))),
        rule("refused_when", "messages", code, f"{where}.chat_messages",
             "text, tool_use, tool_result and thinking blocks only",
             when=has("messages", _contains(bad_message))),
        rule("refused_when", "system", code, f"{where}.chat_messages", "text blocks only",
             when=has("system", _contains(_typed(_not("text"))))),
        rule("refused_when", "thinking", code, f"{where}.thinking_fields",
             "a budget per turn", when=has("thinking", _typed({"const": "between_tools"}))),
        rule("refused_when", "tool_choice", code, f"{where}.chat_body",
             "a tool choice other than none and auto needs tools the grammar compiles (only "
             "the server's compiler can say)",
             when=has("tool_choice", _typed(_not("auto", "none")))),
        rule("refused_when", "output_config.format", code,
             "kiln.api.structured.constraints.constraint",
             "a JSON schema the grammar compiles (only the server's compiler can say)",
             when=has("output_config", has("format", {"type": "object"}))),
        rule("model_dependent", "thinking", code, "kiln.api.requests.prepare.apply_budget",
             "where a thinking budget applies, max_tokens fits the close sequence",
             when=any_of(has("thinking", _typed({"enum": ["enabled", "adaptive"]})),
                         has("output_config", has("effort", TRUTHY)))),
        *_shared(code, b, "messages", where, ["system"]),
        *([] if counting else _rollout_rules(code, "tools")),
    ]
    if not counting:
        out.append(rule("compare", "thinking.budget_tokens", code, f"{where}.chat_body",
                        "the thinking budget is below max_tokens",
                        when=has("thinking", _typed({"const": "enabled"})),
                        left=field("thinking.budget_tokens"), op="<",
                        right=field("max_tokens")))
    return out
