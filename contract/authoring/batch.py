"""The batch completion definitions (POST /v1/completions/batch)."""

from __future__ import annotations

from .common import PARALLEL_TOOL_CALLS, SAMPLING_FIELDS, F, Schema, n_choices, obj


def batch_defs() -> dict[str, Schema]:
    """The batch request, response, item and metadata."""
    defs: dict[str, Schema] = {}
    defs["BatchCompletionItem"] = obj(
        "One generated choice from one prompt in a batch request.",
        [
            F(
                "prompt_index",
                True,
                {"type": "integer", "minimum": 0},
                "Zero-based index into request.prompts.",
            ),
            F(
                "completion_index",
                True,
                {"type": "integer", "minimum": 0},
                "Zero-based choice index for this prompt.",
            ),
            F("text", True, {"type": "string"}, "Final answer content after separated reasoning."),
            F(
                "reasoning_content",
                False,
                {"type": "string"},
                "Reasoning text inside the model's thinking block; omitted when absent.",
            ),
            F(
                "tool_calls",
                False,
                {"$ref": "#/$defs/ToolCallArray"},
                "OpenAI-shaped tool calls; omitted when absent.",
            ),
            F(
                "finish_reason",
                True,
                {"$ref": "#/$defs/FinishReason"},
                "Finish reason. Why generation ended. `error` identifies a per-item batch failure; ordinary termination emits `stop`, `length`, or `tool_calls`.",
            ),
            F(
                "thinking_budget",
                False,
                {"$ref": "thinking-budget-v1.schema.json#/$defs/outcome"},
                "Completion-specific terminal thinking-budget outcome; omitted when no budget applied.",
            ),
            F(
                "usage",
                True,
                {"$ref": "#/$defs/Usage"},
                "Usage. Prompt, completion, and total token counts.",
            ),
        ],
        closed=True,
        annotations={"x-kiln-rust-type": "BatchCompletionItem"},
    )
    defs["BatchCompletionMetadata"] = obj(
        "Request-wide metadata for a completed batch response.",
        [
            F(
                "thinking_budget",
                True,
                {"$ref": "#/$defs/ThinkingBudgetConfigurationMetadata"},
                "Resolved request-wide thinking-limit configuration.",
            ),
        ],
        closed=True,
        annotations={"x-kiln-rust-type": "BatchCompletionMetadata"},
    )
    defs["BatchCompletionRequest"] = obj(
        "Generate one or more choices for each conversation in a batch.",
        [
            F(
                "model",
                False,
                {"$ref": "#/$defs/NullableString"},
                "Served model ID. Missing or null selects the configured served_model_id.",
            ),
            F(
                "prompts",
                True,
                {
                    "type": "array",
                    "items": {
                        "type": "array",
                        "items": {"$ref": "#/$defs/ChatMessageInput"},
                        "minItems": 1,
                    },
                    "minItems": 1,
                    "maxItems": 64,
                },
                "One message array per prompt. prompts.length multiplied by n must not exceed 64 outputs.",
            ),
            n_choices("Completions per prompt. Missing or null means 1."),
            *SAMPLING_FIELDS,
            F(
                "max_tokens",
                False,
                {"$ref": "#/$defs/NullableNonNegativeInteger"},
                "Maximum generated tokens per completion. Null uses the runtime default.",
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
                "Treat tokenizer EOS IDs as ordinary tokens; max_tokens and explicit stop sequences still bound generation.",
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
                "One adapter applied to every prompt. Mutually exclusive with adapters.",
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
                "Request-wide adapter composition. Mutually exclusive with adapter.",
            ),
            F(
                "tools",
                False,
                {"$ref": "#/$defs/NullableToolArray"},
                "Request-wide OpenAI-shaped tool definitions forwarded to the chat template.",
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
                "Request-wide keyword arguments forwarded to the chat template.",
            ),
            PARALLEL_TOOL_CALLS,
        ],
        closed=False,
        rules={
            "allOf": [
                {
                    "not": {
                        "required": ["adapter", "adapters"],
                        "properties": {
                            "adapter": {"type": "string"},
                            "adapters": {"type": "array"},
                        },
                    }
                }
            ]
        },
        annotations={
            "x-kiln-field-schema-status": "complete",
            "x-kiln-rust-type": "BatchCompletionRequest",
            "x-kiln-semantic-constraints": [
                "prompts.length * (n or 1) <= 64",
                "the effective max_tokens must fit the active tokenizer's reasoning close sequence when a thinking budget applies",
            ],
            "x-kiln-unknown-field-policy": "accepted_and_ignored",
        },
    )
    defs["BatchCompletionResponse"] = obj(
        "All choices, token usage, and request-wide metadata from a batch generation request.",
        [
            F(
                "id",
                True,
                {"type": "string", "pattern": "^batchcmpl-"},
                "Unique batch-completion identifier.",
            ),
            F(
                "object",
                True,
                {"const": "batch.completion"},
                "OpenAI-style object discriminator for a batch completion.",
            ),
            F(
                "created",
                True,
                {"$ref": "#/$defs/UnixSeconds"},
                "Created. Whole seconds since the Unix epoch.",
            ),
            F("model", True, {"type": "string"}, "Served model ID used for every completion."),
            F(
                "completions",
                True,
                {
                    "type": "array",
                    "items": {"$ref": "#/$defs/BatchCompletionItem"},
                    "minItems": 1,
                    "maxItems": 64,
                },
                "Generated choices in prompt order, then completion order.",
            ),
            F(
                "usage",
                True,
                {"$ref": "#/$defs/Usage"},
                "Usage. Prompt, completion, and total token counts.",
            ),
            F(
                "metadata",
                True,
                {"$ref": "#/$defs/BatchCompletionMetadata"},
                "Metadata. Request-wide metadata for a completed batch response.",
            ),
        ],
        closed=True,
        annotations={
            "x-kiln-field-schema-status": "complete",
            "x-kiln-rust-type": "BatchCompletionResponse",
        },
    )
    return defs
