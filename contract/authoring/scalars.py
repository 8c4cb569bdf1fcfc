"""Shared leaf definitions: nullable scalars, enums, usage and adapter references."""

from __future__ import annotations

from .common import UINT32_MAX, UINT64_MAX, F, Schema, leaf, obj


def scalar_defs() -> dict[str, Schema]:
    """The shared scalar, union and small object definitions."""
    defs: dict[str, Schema] = {}
    defs["AdapterRef"] = obj(
        "One saved adapter and its composition scale.",
        [
            F(
                "name",
                True,
                {"type": "string", "minLength": 1},
                "Saved adapter name. The runtime also rejects path separators, traversal, and absolute paths.",
            ),
            F(
                "scale",
                True,
                {"type": "number"},
                "Composition scale used when merging request-wide adapters. The request must contain a finite JSON number; Kiln applies no narrower range.",
            ),
        ],
        closed=False,
        annotations={
            "x-kiln-rust-type": "AdapterRef",
            "x-kiln-unknown-field-policy": "accepted_and_ignored",
        },
    )
    defs["FinishReason"] = leaf(
        "Why generation ended. `error` identifies a per-item batch failure; ordinary termination emits `stop`, `length`, or `tool_calls`.",
        {"type": "string", "enum": ["error", "length", "stop", "tool_calls"]},
    )
    defs["NonNegativeInteger"] = leaf(
        "An integer greater than or equal to zero.",
        {"type": "integer", "minimum": 0},
    )
    defs["NullableBoolean"] = leaf(
        "A Boolean value or null.",
        {"oneOf": [{"type": "null"}, {"type": "boolean"}]},
    )
    defs["NullableNonNegativeInteger"] = leaf(
        "A non-negative integer or null.",
        {"oneOf": [{"type": "null"}, {"$ref": "#/$defs/NonNegativeInteger"}]},
    )
    defs["NullableNonNegativeNumber"] = leaf(
        "A non-negative finite JSON number or null.",
        {"oneOf": [{"type": "null"}, {"type": "number", "minimum": 0}]},
    )
    defs["NullableSamplingNumber"] = leaf(
        "Finite JSON number or null. The chat and batch endpoints currently apply no narrower range check before sampling.",
        {"oneOf": [{"type": "null"}, {"type": "number"}]},
        annotations={"x-kiln-runtime-validation": "finite_json_number_only"},
    )
    defs["NullableString"] = leaf(
        "A string or null.",
        {"oneOf": [{"type": "null"}, {"type": "string"}]},
    )
    defs["NullableTemplateKwargs"] = leaf(
        "Template-specific keyword arguments, or null.",
        {
            "oneOf": [
                {"type": "null"},
                {
                    "type": "object",
                    "additionalProperties": {},
                    "description": "Template-specific JSON values, including enable_thinking.",
                },
            ]
        },
    )
    defs["NullableToolArray"] = leaf(
        "OpenAI-shaped tool definitions, or null.",
        {
            "oneOf": [
                {"type": "null"},
                {
                    "type": "array",
                    "items": {},
                    "description": "Opaque OpenAI tool definitions forwarded to the chat template.",
                },
            ]
        },
    )
    defs["NullableUint32"] = leaf(
        "An unsigned 32-bit integer or null.",
        {"oneOf": [{"type": "null"}, {"type": "integer", "minimum": 0, "maximum": UINT32_MAX}]},
    )
    defs["NullableUint64"] = leaf(
        "An unsigned 64-bit integer or null.",
        {"oneOf": [{"type": "null"}, {"type": "integer", "minimum": 0, "maximum": UINT64_MAX}]},
    )
    defs["SamplingPreset"] = leaf(
        "Named sampling profile. Known values are `qwen3-thinking-general`, `qwen3-thinking-coding`, `qwen3-non-thinking-general`, `qwen3-non-thinking-reasoning`, and `greedy`. For compatibility, the current runtime maps an unknown string to `qwen3-thinking-general` instead of rejecting it.",
        {"oneOf": [{"type": "null"}, {"type": "string"}]},
        annotations={
            "x-kiln-known-values": [
                "greedy",
                "qwen3-non-thinking-general",
                "qwen3-non-thinking-reasoning",
                "qwen3-thinking-coding",
                "qwen3-thinking-general",
            ],
            "x-kiln-unknown-value-policy": "fallback_to_qwen3_thinking_general",
        },
    )
    defs["Sha256"] = leaf(
        "A lowercase SHA-256 digest prefixed with sha256:.",
        {"type": "string", "pattern": "^sha256:[0-9a-f]{64}$"},
    )
    defs["StopInput"] = leaf(
        "Missing or null means no explicit stop sequence. One string and an array of strings normalize to the same internal list.",
        {
            "oneOf": [
                {"type": "null"},
                {"type": "string"},
                {"type": "array", "items": {"type": "string"}},
            ]
        },
    )
    defs["ToolCallArray"] = leaf(
        "Opaque OpenAI-shaped tool-call values. Kiln normalizes generated Qwen tool calls but preserves prior-turn values for template round trips.",
        {"type": "array", "items": {}},
    )
    defs["UnixSeconds"] = leaf(
        "Whole seconds since the Unix epoch.",
        {"type": "integer", "minimum": 0},
    )
    defs["Usage"] = obj(
        "Prompt, completion, and total token counts.",
        [
            F(
                "prompt_tokens",
                True,
                {"$ref": "#/$defs/NonNegativeInteger"},
                "Number of prompt tokens processed.",
            ),
            F(
                "completion_tokens",
                True,
                {"$ref": "#/$defs/NonNegativeInteger"},
                "Number of generated tokens.",
            ),
            F(
                "total_tokens",
                True,
                {"$ref": "#/$defs/NonNegativeInteger"},
                "Prompt tokens plus completion tokens.",
            ),
        ],
        closed=True,
        annotations={
            "x-kiln-rust-type": "Usage",
            "x-kiln-semantic-constraints": ["total_tokens = prompt_tokens + completion_tokens"],
        },
    )
    return defs
