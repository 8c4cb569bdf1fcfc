"""The chat request definitions: ChatCompletionRequest and its input shapes."""

from __future__ import annotations

from .common import PARALLEL_TOOL_CALLS, SAMPLING_FIELDS, F, Schema, n_choices, obj
from .logprobs import CHAT_ADDED_FIELDS


def chat_request_defs() -> dict[str, Schema]:
    """ChatCompletionRequest, ChatMessageInput and StreamOptions."""
    defs: dict[str, Schema] = {}
    defs["ChatCompletionRequest"] = obj(
        "Create one or more OpenAI-compatible chat-completion choices.",
        [
            F(
                "model",
                False,
                {"$ref": "#/$defs/NullableString"},
                "Served model ID. Missing or null selects the configured served_model_id.",
            ),
            F(
                "messages",
                True,
                {"type": "array", "items": {"$ref": "#/$defs/ChatMessageInput"}, "minItems": 1},
                "Conversation messages in template order.",
            ),
            n_choices("Number of choices. Values above 1 require stream=false."),
            *SAMPLING_FIELDS,
            F(
                "max_tokens",
                False,
                {"$ref": "#/$defs/NullableNonNegativeInteger"},
                "Maximum generated tokens per choice. Null uses the runtime default.",
            ),
            F(
                "max_completion_tokens",
                False,
                {"$ref": "#/$defs/NullableNonNegativeInteger"},
                "Newer OpenAI alias. max_tokens wins when both are non-null.",
            ),
            F(
                "ignore_eos",
                False,
                {"type": "boolean"},
                "Treat tokenizer EOS IDs as ordinary tokens; incompatible with rollout_provenance=true.",
                default=False,
            ),
            F(
                "thinking_budget_tokens",
                False,
                {"$ref": "thinking-budget-v1.schema.json#/$defs/limitOverride"},
                "Per-request thinking-token limit override; null explicitly removes the limit.",
            ),
            F(
                "thinking_budget_ms",
                False,
                {"$ref": "thinking-budget-v1.schema.json#/$defs/limitOverride"},
                "Per-request thinking-time limit in milliseconds; null explicitly removes the limit.",
            ),
            F(
                "stream",
                False,
                {"type": "boolean"},
                "Return server-sent events instead of one JSON response.",
                default=False,
            ),
            F(
                "stream_options",
                False,
                {"oneOf": [{"type": "null"}, {"$ref": "#/$defs/StreamOptions"}]},
                "Additional streaming behavior; ignored for a non-streaming request.",
            ),
            F(
                "stop",
                False,
                {"$ref": "#/$defs/StopInput"},
                "One or more decoded-text stop sequences.",
            ),
            F(
                "seed",
                False,
                {"$ref": "#/$defs/NullableUint64"},
                "Request seed; null lets the runtime choose.",
            ),
            F(
                "adapter",
                False,
                {"$ref": "#/$defs/NullableString"},
                "Missing uses the server default; null or an empty string selects base; a non-empty string selects a named adapter. Mutually exclusive with adapters.",
            ),
            F(
                "adapters",
                False,
                {
                    "oneOf": [
                        {"type": "null"},
                        {
                            "type": "array",
                            "items": {"$ref": "#/$defs/AdapterRef"},
                            "minItems": 1,
                            "maxItems": 16,
                        },
                    ]
                },
                "Per-request adapter composition. Mutually exclusive with adapter.",
            ),
            F(
                "tools",
                False,
                {"$ref": "#/$defs/NullableToolArray"},
                "OpenAI-shaped tool definitions forwarded to the chat template.",
            ),
            F(
                "tool_choice",
                False,
                {},
                "Opaque OpenAI tool_choice value forwarded to the chat template.",
            ),
            F(
                "chat_template_kwargs",
                False,
                {"$ref": "#/$defs/NullableTemplateKwargs"},
                "Keyword arguments forwarded to the chat template.",
            ),
            F(
                "fold_reasoning_into_content",
                False,
                {"$ref": "#/$defs/NullableBoolean"},
                "Override whether separated reasoning is also copied into final content.",
            ),
            F(
                "include_performance",
                False,
                {"$ref": "#/$defs/NullableBoolean"},
                "Override whether the response includes request-local performance metadata.",
            ),
            F(
                "include_config_hashes",
                False,
                {"$ref": "#/$defs/NullableBoolean"},
                "Override whether the response includes content hashes for the active configuration.",
            ),
            F(
                "rollout_provenance",
                False,
                {"type": "boolean"},
                "Emit exact behavior-policy provenance. Requires one non-streaming real batched choice, ignore_eos=false, no non-empty tools or tool_choice, and positive effective generation capacity.",
                default=False,
            ),
            PARALLEL_TOOL_CALLS,
            *CHAT_ADDED_FIELDS,
        ],
        closed=False,
        rules={
            "allOf": [
                {
                    "not": {
                        "required": ["adapter", "adapters"],
                        "properties": {"adapters": {"type": "array"}},
                    }
                },
                {
                    "if": {"required": ["stream"], "properties": {"stream": {"const": True}}},
                    "then": {
                        "not": {
                            "required": ["n"],
                            "properties": {"n": {"type": "integer", "minimum": 2}},
                        }
                    },
                },
                {
                    "if": {
                        "required": ["rollout_provenance"],
                        "properties": {"rollout_provenance": {"const": True}},
                    },
                    "then": {
                        "properties": {
                            "ignore_eos": {"const": False},
                            "stream": {"const": False},
                            "n": {"oneOf": [{"type": "null"}, {"const": 1}]},
                            "max_tokens": {
                                "oneOf": [{"type": "null"}, {"type": "integer", "minimum": 1}]
                            },
                        }
                    },
                },
            ]
        },
        annotations={
            "x-kiln-field-schema-status": "complete",
            "x-kiln-rust-type": "ChatCompletionRequest",
            "x-kiln-semantic-constraints": [
                "rollout_provenance=true requires the real batching engine and content-addressed base-policy identity",
                "rollout_provenance=true rejects non-empty tools and non-null tool_choice",
                "the effective max_tokens must fit the active tokenizer's reasoning close sequence when a thinking budget applies",
            ],
            "x-kiln-unknown-field-policy": "accepted_and_ignored",
        },
    )
    defs["ChatMessageInput"] = obj(
        "One input message passed to the model's chat template.",
        [
            F(
                "role",
                True,
                {"type": "string"},
                "Template-visible role. Kiln forwards the string rather than enforcing a fixed vocabulary.",
            ),
            F(
                "content",
                False,
                {"oneOf": [{"type": "null"}, {"type": "string"}, {"type": "array", "items": {}}]},
                "String, null, or OpenAI content-part array. Text/input_text/output_text parts are concatenated and non-text parts are ignored.",
                default="",
            ),
            F(
                "reasoning_content",
                False,
                {"$ref": "#/$defs/NullableString"},
                "Prior assistant reasoning preserved for template round trips.",
            ),
            F(
                "tool_calls",
                False,
                {"oneOf": [{"type": "null"}, {"$ref": "#/$defs/ToolCallArray"}]},
                "Prior assistant tool calls preserved for the next template render.",
            ),
            F("name", False, {"$ref": "#/$defs/NullableString"}, "Optional message name."),
            F(
                "tool_call_id",
                False,
                {"$ref": "#/$defs/NullableString"},
                "Tool-call identifier associated with a tool response.",
            ),
        ],
        closed=False,
        annotations={
            "x-kiln-rust-type": "Message",
            "x-kiln-unknown-field-policy": "accepted_and_ignored",
        },
    )
    defs["StreamOptions"] = obj(
        "Options that control additional events in a streaming response.",
        [
            F(
                "include_usage",
                False,
                {"type": "boolean"},
                "Emit a final empty-choices chunk containing usage before [DONE].",
                default=False,
            ),
        ],
        closed=False,
        annotations={
            "x-kiln-rust-type": "StreamOptions",
            "x-kiln-unknown-field-policy": "accepted_and_ignored",
        },
    )
    return defs
